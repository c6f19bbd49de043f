"""Warm-up and allocator verdicts (mlxlab.studies.warmup.run) on synthetic events, each branch
reached; and one small allocator-cache run on the tiny model in a fresh process."""

import pandas as pd
import pytest

from mlxlab.core.claims import check_verdicts
from mlxlab.studies.warmup import run as W

WARM = (0.100, 0.098, 0.102, 0.100, 0.101)  # MAD 1 ms


def events(first_ms: dict, processes=1, warm=WARM):
    """first_ms: warm-up mode -> the first request's extra ms over the warm median (100 ms)."""
    rows = []
    for k in range(processes):
        for mode, extra in first_ms.items():
            rows.append({"model": "m", "warmup": mode, "process": k, "event": "first request",
                         "ttft_s": 0.100 + extra / 1e3 + 0.002 * k})
            rows += [{"model": "m", "warmup": mode, "process": k, "event": "warm request", "ttft_s": t} for t in warm]
            rows += [{"model": "m", "warmup": mode, "process": k, "event": "first use of chunk 2048", "ttft_s": 0.3},
                     {"model": "m", "warmup": mode, "process": k, "event": "again chunk 2048", "ttft_s": 0.25}]
    return pd.DataFrame(rows)


def alloc_rows(settings: dict, n=3):
    """settings: label -> (limit_mb, reused fraction of the 2 MiB KV, ttft_s)."""
    rows = []
    for label, (lim, reused, ttft) in settings.items():
        for i in range(n):
            held = min(lim, 3.5)
            rows.append({"limit": label, "limit_mb": lim, "memory_limit_mb": 2048.0 if "memory" in label else 19000.0,
                         "round": 0, "request": i, "ttft_s": ttft * (1 + 0.01 * i), "e2e_s": 2 * ttft,
                         "itl_s": 0.005, "faulted_mb": 2 * (1 - reused), "active_before_mb": 10.0, "held_mb": 2.0,
                         "cache_before_mb": held, "cache_low_mb": held - 2.0 * reused, "cache_after_mb": held,
                         "active_after_mb": 10.0, "peak_mb": 13.3})
    return {"rows": rows}


GOOD = {"default": (32, 1.0, 0.1), "0 MB": (0, 0.0, 0.2), "512 MB": (512, 1.0, 0.1), "1024 MB": (1024, 1.0, 0.101),
        "512 MB, memory 2048 MB": (512, 1.0, 0.1), "0.6x buffers": (2.1, 0.02, 0.1), "1.2x buffers": (4.2, 1.0, 0.1)}


def judge(ev, settings=GOOD):
    vs = W.verdicts(W.cold_table(ev), W.alloc_table(alloc_rows(settings)), scaled=(0.6, 1.2), request_buffers_mb=3.5,
                    default_limit_mb=32.0, model_note="synthetic.")
    check_verdicts(vs, experiment="warmup_memory")
    return {v["claim"]: v for v in vs}


def test_tables():
    ev = events({"off": 300, "token": 2}, processes=3)
    cold = W.cold_table(ev).set_index("warmup")
    assert cold.loc["off", "processes"] == 3
    assert cold.loc["off", "first_minus_warm_ms"] == pytest.approx(302)  # median over processes: 300, 302, 304
    assert cold.loc["off", "first_minus_warm_mad_ms"] == pytest.approx(2)
    assert cold.loc["off", "warm_mad_s"] == pytest.approx(0.001)
    fu = W.first_use_table(ev)
    assert len(fu) == 6 and fu.extra_ms.round(6).eq(50).all() and set(fu["shape"]) == {"chunk 2048"}
    a = W.alloc_table(alloc_rows(GOOD)).set_index("limit")
    assert a.loc["1.2x buffers", "reused_pct"] == pytest.approx(100)
    assert a.loc["0.6x buffers", "reused_pct"] == pytest.approx(2)
    assert a.loc["0 MB", "faulted_mb"] == pytest.approx(2)


def test_penalty_paid_and_removed():
    v = judge(events({"off": 400, "token": 3, "shapes": 1}, processes=3))
    assert v["s000-warmup-first-request"]["verdict"] == "reproduced"
    assert v["s000-warmup-first-request"]["measured"]["first_minus_warm_ms"] == pytest.approx(402)
    assert v["s000-warmup-removes"]["verdict"] == "reproduced"
    assert v["s000-warmup-removes"]["measured"]["removed_pct"] == pytest.approx(100 * (1 - 5 / 402))
    assert v["s000-memory-oom"]["verdict"] == "not measured"


def test_penalty_too_small_or_not_removed():
    v = judge(events({"off": 80, "token": 60, "shapes": 0}))
    assert v["s000-warmup-first-request"]["verdict"] == "not reproduced"  # beyond noise, under 200 ms
    assert v["s000-warmup-removes"]["verdict"] == "not reproduced"  # 60 of 80 ms left
    v = judge(events({"off": 2, "token": 1, "shapes": 0}))
    assert v["s000-warmup-first-request"]["verdict"] == "not reproduced"
    assert v["s000-warmup-removes"]["verdict"] == "not measurable on this backend"  # nothing to remove


def test_allocator_verdicts():
    v = judge(events({"off": 2, "token": 1}))
    t = v["s000-memory-throughput"]
    assert t["verdict"] == "reproduced" and t["measured"]["settings"] == "512 MB;1024 MB;512 MB, memory 2048 MB"
    assert t["measured"]["no_cache_ttft_change_pct"] == pytest.approx(100)  # 0 MB shown, not deciding
    a = v["s000-alloc-cache-1gb"]
    assert a["verdict"] == "reproduced"
    assert a["measured"]["reused_high_pct"] == pytest.approx(100) and a["measured"]["literal_reused_512_pct"] == 100

    slow = dict(GOOD, **{"1024 MB": (1024, 1.0, 0.15)})
    assert judge(events({"off": 2}), slow)["s000-memory-throughput"]["verdict"] == "not reproduced"
    same = dict(GOOD, **{"0.6x buffers": (2.1, 0.9, 0.1)})  # the lower limit already reuses
    assert judge(events({"off": 2}), same)["s000-alloc-cache-1gb"]["verdict"] == "not reproduced"
    nothing_held = {k: (0.0, 0.0, 0.1) for k in GOOD}  # an allocator that keeps no cache
    assert judge(events({"off": 2}), nothing_held)["s000-alloc-cache-1gb"]["verdict"] == "not measurable on this backend"
    v = judge(events({"off": 2}), {"default": (32, 1.0, 0.1)})
    assert v["s000-alloc-cache-1gb"]["verdict"] == "not measured"
    assert v["s000-memory-throughput"]["verdict"] == "not measured"


def test_alloc_cache_run_on_tiny():
    run = W.alloc_cache_run("tiny", prompt_tokens=64, chunk=64, max_tokens=3, limits_mb=(None, 0),
                            memory_limit_mb=4096, scaled=(0.6, 1.2), rounds=1, requests=1)
    a = W.alloc_table(run).set_index("limit")
    assert set(a.index) == {"default", "0 MB", "512 MB, memory 4096 MB", "0.6x buffers", "1.2x buffers"}
    assert run["request_buffers_mb"] > 0 and (a.kv_mb > 0).all()
    assert a.loc["0 MB", "cache_held_mb"] == 0 and a.loc["0 MB", "reused_pct"] == 0
    assert a.loc["1.2x buffers", "cache_held_mb"] >= a.loc["0.6x buffers", "cache_held_mb"] > 0
    assert a.loc["512 MB, memory 4096 MB", "memory_limit_mb"] == 4096


def test_one_slow_first_process_is_reported_beside_the_median_not_hidden():
    ev = events({"off": 300, "token": 2}, processes=3)
    first = (ev.event == "first request") & (ev.warmup == "off") & (ev.process == 0)
    ev.loc[first, "ttft_s"] = 0.100 + 60.0  # the run's first process compiled every kernel
    v = judge(ev)["s000-warmup-first-request"]
    assert v["measured"]["first_minus_warm_ms"] == pytest.approx(304)  # the median of 60 s, 302, 304 ms decides
    assert v["measured"]["worst_process_ms"] == pytest.approx(60_000)
    assert v["measured"]["worst_process_over_median_x"] == pytest.approx(60_000 / 304)
    assert v["measured"]["worst_process"] == 0 and "The run's first process paid 60.0 s" in v["fairness"]
    quiet = judge(events({"off": 300, "token": 2}, processes=3))["s000-warmup-first-request"]
    assert quiet["measured"]["worst_process_ms"] == pytest.approx(304) and "paid" not in quiet["fairness"]


def test_rescore_file_decides_a_saved_result_again_from_its_events(tmp_path):
    import json

    ev = events({"off": 300, "token": 2, "shapes": 1}, processes=3)
    alloc = W.alloc_table(alloc_rows(GOOD))
    params = {"models": ["m"], "bits": 4, "prompt_tokens": 480, "repeats": 5, "cold_repeats": 3, "alloc_scaled": [0.6, 1.2]}
    doc = {"environment": {"commit": "abc"}, "parameters": params, "verdicts": [{"claim": "stale"}],
           "events": ev.to_dict("records"), "cold": [], "alloc_cache": {"request_buffers_mb": 3.5, "default_limit_mb": 32.0},
           "cache_limits": [], "alloc_table": alloc.to_dict("records")}
    path = tmp_path / "warmup_memory.json"
    path.write_text(json.dumps(doc, indent=1))
    from mlxlab.studies.warmup import STUDY

    out = STUDY.rescore(path)
    again = json.loads(path.read_text())
    assert list(again)[:3] == ["environment", "parameters", "verdicts"] and again["environment"] == {"commit": "abc"}
    assert [v["claim"] for v in again["verdicts"]] == [v["claim"] for v in out["verdicts"]]
    assert {v["claim"]: v["verdict"] for v in again["verdicts"]}["s000-warmup-first-request"] == "reproduced"
    assert len(again["cold"]) == 3 and "nothing was re-run" in again["rescored_by"]["what"]
    assert again["events"] == json.loads(json.dumps(doc["events"]))  # the measurements stay as they were
    (tmp_path / "other.json").write_text(json.dumps({"verdicts": []}))
    with pytest.raises(ValueError, match="not a notebook-04 result"):
        STUDY.rescore(tmp_path / "other.json")


def test_a_penalty_left_within_a_band_wider_than_a_quarter_of_it_is_inconclusive():
    """110 of 400 ms left, but the warm requests spread by 40 ms (a 120 ms band, over a quarter of
    the penalty): the run cannot tell removal from noise, so neither a pass nor a fail."""
    noisy = (0.100, 0.060, 0.140, 0.050, 0.150)
    v = judge(events({"off": 400, "token": 110}, processes=3, warm=noisy))["s000-warmup-removes"]
    assert v["verdict"] == "inconclusive" and v["measured"]["within_noise"] is True
    v = judge(events({"off": 400, "token": 300}, processes=3, warm=noisy))["s000-warmup-removes"]
    assert v["verdict"] == "not reproduced"  # beyond the band too


def test_a_penalty_left_beyond_the_noise_is_not_removed_even_when_most_of_it_is():
    """100 of 400 ms left with a 3 ms band: three quarters removed, but the warm-up does not remove
    the penalty, which the run sees plainly."""
    v = judge(events({"off": 400, "token": 100}, processes=3))["s000-warmup-removes"]
    assert v["verdict"] == "not reproduced" and v["measured"]["removed_pct"] > 70


def test_unchanged_throughput_inside_a_band_wider_than_ten_percent_is_inconclusive():
    noisy = dict(GOOD, default=(32, 1.0, 0.1))
    rows = alloc_rows(noisy)
    for r in rows["rows"]:  # the default's requests spread by 10% a request: a 30% band
        if r["limit"] == "default":
            r["ttft_s"] = 0.1 * (1 + 0.1 * (r["request"] - 1))
    vs = W.verdicts(W.cold_table(events({"off": 2})), W.alloc_table(rows), scaled=(0.6, 1.2), request_buffers_mb=3.5,
                    default_limit_mb=32.0, model_note="synthetic.")
    t = {v["claim"]: v for v in vs}["s000-memory-throughput"]
    assert t["measured"]["band_pct"] > 10 and t["verdict"] == "inconclusive" and t["measured"]["within_noise"]
