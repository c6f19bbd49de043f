"""The overlap profile (mlxlab.studies.contention.overlap_profile): its event arithmetic, the TTFT growth
split, and one small run on tiny."""

import pytest

from mlxlab.studies.contention import overlap_profile as op


def test_thread_totals_count_only_the_window_and_split_host_from_evaluations():
    rows = [("MainThread", "model", 0.0, 1.0), ("p", "model", 0.0, 1.0), ("p", "eval", 0.2, 0.5),
            ("p", "async_eval", 0.6, 0.7), ("p", "eval", 1.5, 1.8), ("p", "model", 3.0, 4.0)]
    t = op.thread_totals(rows, "p", 0.0, 2.0)
    assert t["model"] == pytest.approx(1.0)
    assert t["eval"] == pytest.approx(0.6)  # the one inside the model call and the one after
    assert t["host"] == pytest.approx(0.6)  # model less the evaluations inside it (0.3 + 0.1)
    assert t["calls"]["model"] == 1 and t["window_s"] == 2.0


def test_growth_parts_add_up_to_the_ttft_growth():
    alone = {"host": 0.04, "eval": 0.18, "model": 0.28}
    together = {"host": 0.05, "eval": 0.20, "model": 0.35}
    g = op.growth_parts(alone, together, 0.32, 0.45)
    assert g["total"] == pytest.approx(0.13)
    assert g["python"] == pytest.approx(0.01) and g["device_wait"] == pytest.approx(0.02)
    assert g["dispatch"] == pytest.approx(0.04) and g["outside_calls"] == pytest.approx(0.06)
    assert sum(v for k, v in g.items() if k != "total") == pytest.approx(g["total"])


def test_profile_runs_on_tiny_and_refuses_settings_without_overlap(tiny):
    with pytest.raises(ValueError, match="overlap settings only"):
        op.overlap_profile(tiny, doc_tokens=256, chat_context=32, settings=["interleave-2048"])
    out = op.overlap_profile(tiny, doc_tokens=256, chat_context=32, settings=["overlap-2048-pipelined-jobs16"],
                             repeats=2, progress=False)
    r = out["runs"]["overlap-2048-pipelined-jobs16@default"]
    assert r["doc_ttft_s"]["alone"] > 0 and r["doc_ttft_s"]["together"] > 0
    assert r["chat_step_ms"]["solo"]["model"] > 0
    assert r["prefill_thread_s"]["together"]["model"] > 0  # the prefill thread's calls were timed
    assert op.rescore({"presets": {"tiny": out}})["presets"]["tiny"]["runs"] is out["runs"]
