"""The verdicts notebooks 02 (KV quantization) and 03 (speculative decoding) store: every branch
reached on small synthetic measurements, and the records pass the claims files' checks for the
results file that stores them."""

import pandas as pd
import pytest

from mlxlab.core.claims import check_verdicts
from mlxlab.engine.speculative import analytic_speedup, breakeven_cost_ratio
from mlxlab.studies.kv_quant import run as KS
from mlxlab.studies.speculation import run as SP
from mlxlab.studies.speculation import verdict as SPV

OK = {"4": (True, ""), "8": (True, "")}


def speed_df(table, repeats=3, jitter=0.01):
    """Decode rows from ``{context: (none tok/s, kv4 tok/s)}``, each repeat a little different."""
    rows = []
    for r in range(repeats):
        f = 1 + jitter * (r - 1)
        for c, (none, q4) in table.items():
            rows += [{"context_tokens": c, "kv_bits": "none", "repeat": r, "decode_tok_s": none * f,
                      "kv_bytes": 4 * c, "error": ""},
                     {"context_tokens": c, "kv_bits": "4", "repeat": r, "decode_tok_s": q4 * f * (1 + jitter * r),
                      "kv_bytes": c, "error": ""}]
    return pd.DataFrame(rows)


def ttft_df(table, repeats=3, jitter=0.01):
    rows = []
    for r in range(repeats):
        for c, (none, q4) in table.items():
            rows += [{"context_tokens": c, "kv_bits": "none", "repeat": r, "ttft_ms": none, "error": ""},
                     {"context_tokens": c, "kv_bits": "4", "repeat": r, "ttft_ms": q4 * (1 + jitter * r), "error": ""}]
    return pd.DataFrame(rows)


SLOW_TTFT = ttft_df({128: (10, 12), 512: (40, 48)})   # +20%, +~21%


def kv(speed, tt=SLOW_TTFT, probes=OK):
    vs = KS.verdicts(speed, tt, probes, model="tiny")
    check_verdicts(vs, experiment="kv_quantization")
    return {v["claim"]: v for v in vs}


# ----------------------------------------------------------------------------- KV quantization


def test_kv4_slower_at_short_context_and_crossing_inside_the_guess_is_reproduced():
    vs = kv(speed_df({256: (100, 70), 1024: (80, 60), 2048: (60, 80)}))
    d = vs["s000-kv4-decode"]
    assert d["verdict"] == "reproduced" and d["measured"]["context_tokens"] == 256
    assert d["measured"]["decode_change_pct"] == pytest.approx(-29.3, abs=1)
    x = vs["s000-kv4-crossover"]
    assert x["verdict"] == "not reproduced"  # crosses between 1024 and 2048, past the guessed 800-1200
    assert 1024 < x["measured"]["crossover_tokens"] < 2048
    vs = kv(speed_df({256: (100, 70), 512: (90, 81), 1536: (60, 66)}))
    assert vs["s000-kv4-crossover"]["verdict"] == "reproduced"
    assert 800 <= vs["s000-kv4-crossover"]["measured"]["crossover_tokens"] <= 1200


def test_no_decode_change_and_no_crossover_are_not_reproduced_with_the_range_said():
    vs = kv(speed_df({256: (100, 100.5), 8192: (50, 40)}))
    d, x = vs["s000-kv4-decode"], vs["s000-kv4-crossover"]
    assert d["verdict"] == "not reproduced" and abs(d["measured"]["decode_change_pct"]) < 3 * d["measured"]["spread_pct"] + 1
    assert x["verdict"] == "not reproduced" and x["measured"]["crossover_tokens"] is None
    assert x["measured"]["crossover_found"] == "none within the range measured (256-8192 tokens)"
    assert (x["measured"]["range_min_tokens"], x["measured"]["range_max_tokens"]) == (256, 8192)


def test_a_slowdown_far_beyond_the_published_band_is_not_reproduced():
    assert kv(speed_df({256: (100, 10), 1024: (80, 20)}))["s000-kv4-decode"]["verdict"] == "not reproduced"


def test_a_crossing_within_noise_at_the_top_is_no_crossover():
    # medians cross 1 at the top context, but by less than 3x the (large) repeat spread
    x = kv(speed_df({256: (100, 70), 2048: (60, 60.6)}, jitter=0.05))["s000-kv4-crossover"]
    assert x["measured"]["crossover_tokens"] is None and x["verdict"] == "not reproduced"


def test_a_range_short_of_the_guess_does_not_decide_the_crossover():
    x = kv(speed_df({128: (100, 70), 512: (90, 70)}))["s000-kv4-crossover"]
    assert x["verdict"] == "not measured" and x["measured"]["range_max_tokens"] == 512


def test_ttft_branches():
    speed = speed_df({256: (100, 70), 1024: (80, 60)})
    t = kv(speed)["s000-kv4-ttft"]
    assert t["verdict"] == "reproduced" and 19 < t["measured"]["ttft_change_pct"] < 23
    assert (t["measured"]["contexts_min_tokens"], t["measured"]["contexts_max_tokens"]) == (128, 512)
    flat = kv(speed, ttft_df({128: (10, 10), 512: (40, 40)}))["s000-kv4-ttft"]
    assert flat["verdict"] == "not reproduced"
    faster = kv(speed, ttft_df({128: (10, 8), 512: (40, 30)}))["s000-kv4-ttft"]
    assert faster["verdict"] == "not reproduced" and faster["measured"]["ttft_change_pct"] < 0
    assert kv(speed, pd.DataFrame())["s000-kv4-ttft"]["verdict"] == "not measured"
    failed = pd.DataFrame([{"context_tokens": 128, "kv_bits": "4", "repeat": 0, "ttft_ms": None, "error": "no kernel"},
                           {"context_tokens": 128, "kv_bits": "none", "repeat": 0, "ttft_ms": 9.0, "error": ""}])
    t = kv(speed, failed)["s000-kv4-ttft"]
    assert t["verdict"] == "not measurable on this backend" and t["measured"]["probe_error"] == "no kernel"


def test_one_repeat_uses_the_fallback_noise_band():
    d = kv(speed_df({256: (100, 97), 1024: (80, 60)}, repeats=1))["s000-kv4-decode"]
    assert d["measured"]["spread_pct"] is None and d["measured"]["noise_band_pct"] == KS.NOISE_FALLBACK_PCT
    assert d["verdict"] == "not reproduced"  # -3% is inside the +-5% band


def test_a_backend_without_quantized_attention_is_not_measurable_with_the_probe_error():
    why = "RuntimeError at a 33-token context, 1 new token(s): [quantized_matmul] No implementation"
    speed = pd.DataFrame([{"context_tokens": None, "kv_bits": "4", "repeat": None, "decode_tok_s": None,
                           "kv_bytes": None, "error": why},
                          {"context_tokens": 512, "kv_bits": "none", "repeat": 0, "decode_tok_s": 100.0,
                           "kv_bytes": 10.0, "error": ""}])
    vs = kv(speed, pd.DataFrame(), {"4": (False, why)})
    assert len(vs) == 3
    for v in vs.values():
        assert v["verdict"] == "not measurable on this backend" and v["measured"]["probe_error"] == why
    # the probe passed, but every real run failed at a shape it did not try
    vs = kv(speed, pd.DataFrame(), OK)
    assert {v["verdict"] for v in vs.values()} == {"not measurable on this backend"}
    assert vs["s000-kv4-decode"]["measured"]["probe_error"] == why


def test_an_unmeasurable_backend_gets_the_cpu_result_and_the_published_figure_beside_its_error(tmp_path, monkeypatch):
    import json
    why = "RuntimeError: [quantized_matmul] No implementation for problem shape"
    here = KS._unmeasurable(("s000-kv4-decode", "s000-kv4-ttft"), "4", why, "same")
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    monkeypatch.setattr(KS, "results_dir", lambda platform: tmp_path / platform)
    with pytest.raises(FileNotFoundError, match="no cpu results"):
        KS.stand_ins(here)
    (cpu / "kv_quantization.json").write_text(json.dumps({
        "environment": {"git_commit": "abc1234"},
        "verdicts": [{"claim": "s000-kv4-decode", "verdict": "not reproduced", "measured": {"decode_change_pct": -11.1}},
                     {"claim": "s000-kv4-ttft", "verdict": "reproduced", "measured": {"ttft_change_pct": 12.0}}]}))
    t = KS.stand_ins(here)
    assert list(t.claim) == ["s000-kv4-decode", "s000-kv4-ttft"]
    assert list(t["cpu verdict"]) == ["not reproduced", "reproduced"]
    assert t["cpu measured"].iloc[0].startswith("-11.1 %") and set(t["cpu commit"]) == {"abc1234"}
    assert all(t.error == why) and t["published (Apple, Metal)"].iloc[0] == "-38 to -23 % decode tok/s"
    measured = [dict(v, verdict="reproduced") for v in here]
    assert KS.stand_ins(measured).empty  # nothing to stand in for


def test_memory_saved():
    rows = KS.memory(speed_df({256: (100, 70)}, repeats=1))
    four = next(r for r in rows if r["kv_bits"] == "4")
    assert four["saved_pct"] == pytest.approx(75.0) and four["kv_mb"] == pytest.approx(256 / 2**20)


def test_ttft_sweep_is_warm_paired_and_measures_both_caches(tiny):
    df = KS.ttft_sweep(tiny, [40, 70], [None, 4], repeats=2, progress=False)
    assert len(df) == 2 * 2 * 2 and (df.error == "").all() and (df.ttft_ms > 0).all()
    assert KS.paired(df, "ttft_ms", "4", 70)["repeats"] == 2
    vs = KS.verdicts(KS.speed_sweep(tiny, [64, 900], (None, 4), decode_tokens=3, repeats=2, progress=False),
                     df, OK)
    assert [v["claim"] for v in check_verdicts(vs, experiment="kv_quantization")] == \
        ["s000-kv4-decode", "s000-kv4-ttft", "s000-kv4-crossover"]


# ----------------------------------------------------------------------------- speculation


def study(speedups, c=0.33, a=0.8, k=4, v=1.0, pred=None):
    sp = sorted(speedups)[len(speedups) // 2]
    row = {"k": k, "a_hat": a, "acceptance_rate": a * 0.8, "tokens_per_pass": 3.0, "identical": True,
           "speedup": sp, "speedup_decode": sp, "speedup_decode_repeats": list(speedups), "v": v,
           "speedup_analytic": analytic_speedup(a, k, c) if pred is None else pred,
           "speedup_analytic_v": analytic_speedup(a, k, c, v) if pred is None else pred}
    return {"config": {"ks": [1, k], "num_prompts": 4, "repeats": len(speedups)}, "cost": {"c": c},
            "rows": [dict(row, k=1), row], "models": {"target_params": 4e6, "draft_params": 1e6}}


def spec(st, k=4):
    vs = SP.verdicts(st, k=k)
    check_verdicts(vs, experiment="speculation")
    return {v["claim"]: v for v in vs}


def test_speculation_within_noise_reproduces_the_plus_one_percent_and_the_overhead():
    vs = spec(study([1.0, 1.01, 0.99, 1.02, 1.0], c=0.33, pred=1.02))
    g, o = vs["s000-spec-gain"], vs["s000-spec-overhead"]
    assert g["verdict"] == "reproduced" and g["measured"]["k"] == 4 and g["measured"]["repeats"] == 5
    assert o["verdict"] == "reproduced" and o["measured"]["draft_work_x"] == pytest.approx(1.32)
    assert o["measured"]["model_predicts"] is True and o["measured"]["speedup_predicted_x"] == pytest.approx(1.02)


def test_a_real_speedup_is_not_reproduced_and_the_model_is_compared():
    vs = spec(study([1.30, 1.31, 1.29], c=0.36, a=0.8, v=1.1))
    g, o = vs["s000-spec-gain"], vs["s000-spec-overhead"]
    assert g["verdict"] == "not reproduced" and g["measured"]["gain_pct"] == pytest.approx(30.0)
    assert o["verdict"] == "not reproduced"
    m = o["measured"]
    assert m["speedup_predicted_x"] == pytest.approx(analytic_speedup(0.8, 4, 0.36), abs=1e-3)
    assert m["speedup_predicted_v_x"] == pytest.approx(analytic_speedup(0.8, 4, 0.36, 1.1), abs=1e-3)
    assert m["prediction_error_pct"] == pytest.approx(100 * (m["speedup_predicted_x"] / 1.30 - 1), abs=0.2)


def test_a_pair_with_another_cost_ratio_uses_the_model_only_when_it_predicts():
    # c = 0.1: draft work 0.4, far from 1.33; the model predicts the measurement, so it decides at c = 0.33
    a, c = 0.8, 0.1
    good = study([analytic_speedup(a, 4, c)] * 3, c=c, a=a)
    o = spec(good)["s000-spec-overhead"]
    assert o["measured"]["model_predicts"] and o["measured"]["speedup_at_published_c_x"] == \
        pytest.approx(analytic_speedup(a, 4, 0.33), abs=1e-3)
    assert o["verdict"] == "not reproduced"  # at a = 0.8 the model says the 1.33 overhead is well paid back
    low = study([analytic_speedup(0.3, 4, c)] * 3, c=c, a=0.3)
    assert spec(low)["s000-spec-overhead"]["verdict"] == "not reproduced"  # at a = 0.3 a slowdown: not paid back
    even = study([analytic_speedup(0.6, 4, c)] * 3, c=c, a=0.6)  # breaks even at c = 0.33
    assert abs(spec(even)["s000-spec-overhead"]["measured"]["speedup_at_published_c_x"] - 1) < 0.05
    assert spec(even)["s000-spec-overhead"]["verdict"] == "reproduced"
    off = study([1.5] * 3, c=c, a=a, pred=3.0)
    assert spec(off)["s000-spec-overhead"]["verdict"] == "not measured"


def test_repeats_that_disagree_cannot_confirm_no_effect():
    vs = spec(study([0.6, 1.0, 1.5], c=0.33))
    assert vs["s000-spec-gain"]["measured"]["noise_band_pct"] > SPV.MAX_NOISE_BAND_PCT
    assert vs["s000-spec-gain"]["verdict"] == "inconclusive" and vs["s000-spec-gain"]["measured"]["within_noise"]
    assert vs["s000-spec-overhead"]["verdict"] == "inconclusive"
    # the H200 pair's case: -20% inside a 23% band is not "noise only" but a run that cannot tell
    assert spec(study([0.72, 0.80, 0.95], c=0.33))["s000-spec-gain"]["verdict"] == "inconclusive"
    # a slowdown beyond a narrow band is never barely paid back
    assert spec(study([0.80, 0.80, 0.81], c=0.33))["s000-spec-overhead"]["verdict"] == "not reproduced"
    # the verdicts use the paired speedup where the study has it
    st = study([1.3, 1.3, 1.3])
    st["rows"][1]["speedup_decode_paired"] = 1.0
    assert spec(st)["s000-spec-gain"]["measured"]["speedup_x"] == 1.0


def test_the_large_target_claim_is_an_extrapolation_with_the_breakeven():
    x = spec(study([1.1, 1.1, 1.1], a=0.7, v=1.2))["s000-spec-large-target"]
    assert x["verdict"] == "not measured"
    assert x["measured"]["breakeven_c"] == pytest.approx(breakeven_cost_ratio(0.7, 4), abs=1e-3)
    assert x["measured"]["breakeven_c_v"] == pytest.approx(breakeven_cost_ratio(0.7, 4, 1.2), abs=1e-3)
    assert x["measured"]["speedup_large_pair_x"] == pytest.approx(analytic_speedup(0.7, 4, 1 / 7), abs=1e-3)


def test_no_k4_run_means_not_measured():
    vs = spec(study([1.0, 1.0], k=2))
    assert {v["verdict"] for v in vs.values()} == {"not measured"} and len(vs) == 3


def test_the_study_records_paired_per_repeat_speedups(tiny):
    from mlxlab.studies.speculation.run import measure_cost_ratio, speculation_study

    cost = measure_cost_ratio(tiny, tiny, context=16, steps=3, ks=(4,))
    st = speculation_study(tiny, tiny, [[3, 1, 4, 1, 5]], ks=(4,), max_tokens=10, repeats=2, mlx_lm=False, cost=cost)
    row = st["rows"][0]
    assert len(row["speedup_decode_repeats"]) == 2 and len(row["speedup_repeats"]) == 2
    assert min(row["speedup_decode_repeats"]) <= row["speedup_decode_paired"] <= max(row["speedup_decode_repeats"])
    assert len(spec(st)) == 3
