"""The overview's verdicts (mlxlab.studies.engine_bench.run.verdicts) on synthetic bench results, each branch
reached; and the exactness check and the batch-cost figure on the tiny model."""

import math

import pytest

from mlxlab.core.claims import check_verdicts
from mlxlab.studies.engine_bench import run as bench


def ratio(paired):
    return {"ratio": sorted(paired)[len(paired) // 2], "paired_ratios": sorted(paired),
            "mlxlab": {"median": 1.0}, "mlx_lm": {"median": 1.0}}


def result(prefill=(1.0, 1.01, 0.99, 1.0, 1.02), decode=(1.0, 0.98, 1.01, 1.0, 0.99),
           batched=(1.0, 1.0, 1.03, 0.97, 1.0), cost=(1.3, 1.4, 1.2, 1.35, 1.3), agree=True, repeats=5):
    return {"config": {"decode_tokens": 32, "repeats": repeats},
            "single_prefill_tok_s": ratio(prefill), "single_decode_tok_s": ratio(decode),
            "batched_decode_tok_s": ratio(batched),
            "batch_step_cost": {"batch": 8, "ratio_x": sorted(cost)[len(cost) // 2], "paired_ratios": sorted(cost),
                                "step_ms_b1": {"median": 5.0}, "step_ms_batch": {"median": 6.5},
                                "aggregate_speedup_x": 6.0},
            "greedy_tokens_agree": {"single": agree, "batched": True},
            "greedy_common_prefix_min": {"single": 32 if agree else 9, "batched": 32},
            "model": {"dtype": "float32"}}


def by_claim(vs):
    check_verdicts(vs, experiment="bench_engine")
    check_verdicts(vs, experiment="overview_bench")
    return {v["claim"]: v for v in vs}


def test_all_met():
    exact = {"requests": [{"equal": True, "common_prefix": 12} for _ in range(4)]}
    v = by_claim(bench.verdicts({"a": result(), "b": result()}, exact))
    assert v["mlx-engine-exact"]["verdict"] == "reproduced"
    assert v["mlx-engine-exact"]["measured"]["exact_requests_equal"] == 4
    assert v["mlx-engine-speed"]["verdict"] == "reproduced"
    assert v["mlx-engine-speed"]["measured"]["slower"] == "" and v["mlx-engine-speed"]["measured"]["presets"] == 2
    assert v["s001-batching-cheap"]["verdict"] == "reproduced"
    assert v["s001-batching-cheap"]["measured"]["step_cost_ratio_x"] == pytest.approx(1.3)


def test_a_token_difference_is_not_reproduced_with_where_it_parted():
    v = by_claim(bench.verdicts({"a": result(agree=False)}))
    assert v["mlx-engine-exact"]["verdict"] == "not reproduced"
    assert v["mlx-engine-exact"]["measured"]["common_prefix_min_tokens"] == 9
    assert v["mlx-engine-exact"]["measured"]["exact_requests"] is None  # no staggered check given
    exact = {"requests": [{"equal": True, "common_prefix": 12}, {"equal": False, "common_prefix": 3}]}
    v = by_claim(bench.verdicts({"a": result()}, exact))
    assert v["mlx-engine-exact"]["verdict"] == "not reproduced"
    assert v["mlx-engine-exact"]["measured"]["common_prefix_min_tokens"] == 3


def test_speed_rule_uses_the_paired_spread():
    # a clear 10% decode slowdown with a tight spread is slower
    v = by_claim(bench.verdicts({"a": result(decode=(0.9, 0.91, 0.89, 0.9, 0.9))}))
    assert v["mlx-engine-speed"]["verdict"] == "not reproduced"
    assert v["mlx-engine-speed"]["measured"]["slower"] == "a:decode"
    assert v["mlx-engine-speed"]["measured"]["decode_ratio_x"] == pytest.approx(0.9)
    # the same median with a wide spread cannot tell: inconclusive, never "at least as fast"
    v = by_claim(bench.verdicts({"a": result(decode=(0.6, 0.75, 0.9, 1.05, 1.2))}))
    assert v["mlx-engine-speed"]["verdict"] == "inconclusive" and v["mlx-engine-speed"]["measured"]["within_noise"]
    assert v["mlx-engine-speed"]["measured"]["repeats_to_resolve"] > 5
    assert v["mlx-engine-speed"]["measured"]["decode_band_x"] == pytest.approx(3 * 0.15 / math.sqrt(5))
    # a 1% slowdown is inside the 2% floor even with no spread
    v = by_claim(bench.verdicts({"a": result(prefill=(0.99,) * 5)}))
    assert v["mlx-engine-speed"]["verdict"] == "reproduced"
    # nothing finite to judge
    nan = float("nan")
    v = by_claim(bench.verdicts({"a": result(batched=(nan, nan))}))
    assert v["mlx-engine-speed"]["verdict"] == "not measured"


def test_batching_cost_rule():
    v = by_claim(bench.verdicts({"a": result(), "b": result(cost=(2.6, 2.5, 2.7))}))
    assert v["s001-batching-cheap"]["verdict"] == "not reproduced"
    assert v["s001-batching-cheap"]["measured"]["model"] == "b"
    old = result()
    del old["batch_step_cost"]  # results written before the cost was measured
    v = by_claim(bench.verdicts({"a": old}))
    assert v["s001-batching-cheap"]["verdict"] == "not measured"


def test_paired_band_and_batch_step_cost():
    med, band = bench.paired_band([1.0, 1.1, 0.9], 0.02)
    assert med == 1.0 and band == pytest.approx(3 * 0.1 / math.sqrt(3))
    assert bench.paired_band([1.0, 1.0], 0.05) == (1.0, 0.05)
    c = bench.batch_step_cost([400.0, 320.0], [100.0, 100.0], 8)
    # step at batch 8: 20 ms and 25 ms; at batch 1: 10 ms
    assert c["paired_ratios"] == pytest.approx([2.0, 2.5]) and c["ratio_x"] == pytest.approx(2.25)
    assert c["aggregate_speedup_x"] == pytest.approx(3.6)


def test_exactness_check_on_tiny(tiny):
    ex = bench.exactness_check(tiny, lengths=(5, 30), max_tokens=6)
    assert [r["prompt_tokens"] for r in ex["requests"]] == [5, 30]
    for r in ex["requests"]:
        assert r["tokens"] == 6 and r["equal"] == (r["common_prefix"] == 6)
        assert (r["ref_top2_gap_at_split"] is None) == r["equal"]
