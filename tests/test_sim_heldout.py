"""The held-out trace generator (mlxlab.studies.sim_validation.heldout): seeded, reproducible case by case,
clear of the values it is told to avoid, and rebuilt from its saved spec; no MLX."""

import json

import pytest

from mlxlab.core.runner import run_workload
from mlxlab.core.costmodel import StepCostModel
from mlxlab.sim.simulator import Simulator
from mlxlab.studies.sim_validation.heldout import HELDOUT_POLICIES, HeldOutCase, heldout_case, heldout_cases
from mlxlab.studies.sim_validation.scoring import format_validation, score_config, summarize

CM = StepCostModel.from_coefficients({"decode_step": 5e-3, "decode_batch": 1e-3, "prefill_chunks": 4e-3,
                                      "prefill_tokens": 5e-4, "prefill_attention": 1e-7}, n_obs=1)


def test_a_seed_fixes_every_case_whatever_the_count():
    a, b = heldout_cases(4, seed=7), heldout_cases(8, seed=7)
    assert [c.as_dict() for c in a] == [c.as_dict() for c in b[:4]]
    other = heldout_cases(4, seed=8)
    assert [c.as_dict() for c in a] != [c.as_dict() for c in other]


def test_policies_are_dealt_in_turn_and_options_follow_the_policy():
    cases = heldout_cases(6, seed=3)
    assert sorted(c.policy for c in cases) == sorted(list(HELDOUT_POLICIES) * 2)
    for c in cases:
        want = {"stall_free": {"token_budget"}, "admission_gate": {"big_prompt_tokens"}, "interleave": set()}
        assert set(c.options) == want[c.policy]
        if c.policy == "admission_gate":  # the gate sits between the chats and the documents
            chats = [a["prompt_tokens"] for a in c.arrivals if a["tenant"] == "chat"]
            docs = [a["prompt_tokens"] for a in c.arrivals if a["tenant"] == "doc"]
            assert max(chats) < c.options["big_prompt_tokens"] < min(docs)


def test_cases_avoid_the_given_chunk_sizes_and_fit_the_context():
    avoid = set(range(96, 300))  # leaves 300-352 of the chunk range
    for i in range(20):
        c = heldout_case(i, 5, "stall_free", avoid=avoid, max_context=1200)
        assert c.chunk_size not in avoid and c.options["token_budget"] not in avoid
        assert c.options["token_budget"] != c.chunk_size
        assert all(a["prompt_tokens"] + a["max_tokens"] <= 1200 - 64 for a in c.arrivals)
    with pytest.raises(ValueError, match="outside"):
        heldout_case(0, 5, "interleave", avoid=range(1, 400))
    with pytest.raises(ValueError, match="policy"):
        heldout_case(0, 5, "slo")
    with pytest.raises(ValueError, match=">= 0"):
        heldout_cases(-1, seed=0)


def test_scale_multiplies_lengths_not_times():
    a, b = heldout_case(2, 9, "interleave"), heldout_case(2, 9, "interleave", scale=8)
    assert [x["time_s"] for x in a.arrivals] == [x["time_s"] for x in b.arrivals]
    for x, y in zip(a.arrivals, b.arrivals):
        assert 7 * x["prompt_tokens"] <= y["prompt_tokens"] <= 9 * x["prompt_tokens"]
    assert 96 * 8 <= b.chunk_size <= 352 * 8


def test_a_case_round_trips_through_json_and_rebuilds_the_same_trace():
    c = heldout_cases(3, seed=11)[2]
    back = HeldOutCase.from_dict(json.loads(json.dumps(c.as_dict())))
    w1, w2 = c.workload(500), back.workload(500)
    assert [(a.time_s, a.tenant, a.key, a.prompt, a.max_tokens) for a in w1.start()] == \
           [(a.time_s, a.tenant, a.key, a.prompt, a.max_tokens) for a in w2.start()]
    assert [a.prompt_tokens for a in w1.start()] == [a["prompt_tokens"] for a in c.arrivals]
    assert all(1 <= t < 500 for a in w1.start() for t in a.prompt)


def test_a_case_runs_on_the_simulator_and_scores_per_tenant():
    c = heldout_cases(1, seed=2)[0]
    wl = c.workload(1000)
    runs = [run_workload(Simulator(CM, policy=c.policy, chunk_size=c.chunk_size, vocab_size=1000, **c.options),
                         wl).summary for _ in range(2)]
    rows = score_config(c.name, c.policy, runs, runs[:1])
    assert {r["tenant"] for r in rows} == {"chat", "doc"}
    assert all(r["rel_error"] == 0 for r in rows)  # the simulator is deterministic
    sm = summarize(rows)
    assert sm["ttft_p50_s"]["noise_median"] == 0.0
    text = format_validation({"table": [], "summary": {}, "rule": "r",
                              "heldout": {"seed": 2, "n": 1, "table": rows, "summary": sm}})
    assert "held-out traces (seed 2, 1 cases)" in text and c.name in text


def test_the_heldout_chart_has_a_panel_per_metric_and_the_engine_range():
    from mlxlab.studies.sim_validation.charts import heldout_chart

    rows = [{"workload": f"heldout-1-{i}", "policy": p, "tenant": t, "metric": m, "engine": 1.0, "sim": 1.0 + 0.01 * i,
             "engine_runs": [0.95, 1.0, 1.04], "noise": 0.05 if i < 2 else 3.0}
            for i, p in enumerate(HELDOUT_POLICIES) for t in ("chat", "doc") for m in ("ttft_p50_s", "itl_p50_s")]
    spec = heldout_chart(rows).to_dict()
    assert spec["facet"]["column"]["field"] == "metric"
    data = next(iter(spec["datasets"].values()))
    assert len(data) == len(rows)
    assert {(d["lo"], d["hi"]) for d in data if d["policy"] != HELDOUT_POLICIES[2]} == {(-5.0, 5.0)}
    assert {(d["lo"], d["hi"]) for d in data if d["policy"] == HELDOUT_POLICIES[2]} == {(-12.0, 12.0)}  # cut
    assert sorted({round(d["err"], 6) for d in data}) == [0.0, 1.0, 2.0]


def test_profile_spread_compares_the_simulations_on_each_profile():
    from mlxlab.core.presets import preset_config
    from mlxlab.studies.sim_validation.repeat import format_spread, profile_spread

    cfg = preset_config("tiny")
    slower = StepCostModel(coef=CM.coef * 1.1, n_obs=1)
    cases = heldout_cases(1, seed=2)
    res = profile_spread({"a": CM, "b": slower}, cfg, {}, (), 128, heldout=cases)
    assert res["table"] and all(r["heldout"] and len(r["values"]) == 2 for r in res["table"])
    for r in res["table"]:
        a, b = r["values"]
        assert r["spread"] == pytest.approx(abs(b - a) / ((a + b) / 2))
    ttft = [r for r in res["table"] if r["metric"] == "ttft_p50_s"]
    assert all(0.05 < r["spread"] < 0.15 for r in ttft)  # every step 10% longer: about 10% later
    assert "spread median" in format_spread(res)
    with pytest.raises(ValueError, match="two or more"):
        profile_spread({"a": CM}, cfg, {}, (), 128)


def test_compare_periods_names_the_kinds_of_step_where_the_clocks_part():
    from mlxlab.studies.sim_validation.scoring import compare_periods

    res = {"periods": {"w/p": {"engine": {"decode b1": {"median_s": 0.015, "n": 10}, "mixed b1": {"median_s": 0.5, "n": 4},
                                          "prefill b0": {"median_s": 0.3, "n": 1}},
                               "sim": {"decode b1": {"median_s": 0.012, "n": 10}, "mixed b1": {"median_s": 0.5, "n": 4},
                                       "prefill b0": {"median_s": 0.3, "n": 1}}}}}
    rows = compare_periods(res)
    assert [r["kind"] for r in rows] == ["decode b1", "mixed b1"]  # prefill b0: too few
    assert rows[0]["ratio"] == pytest.approx(0.8) and rows[1]["ratio"] == pytest.approx(1.0)
    total = 0.015 * 10 + 0.5 * 4 + 0.3
    assert rows[1]["share"] == pytest.approx(2.0 / total)
