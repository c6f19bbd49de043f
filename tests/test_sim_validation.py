"""The simulator studies: the validation against the engine on ``tiny`` (its scoring rule, its
rescoring from the saved file alone), the scoring on hand-made numbers, the saved step rows, and
seed 001 at its own scale on the published profile. Nothing here asserts how fast a run was:
the engine's side is whatever this machine measured, the checks are that every row follows from
its runs by the rule."""

import argparse
import json
import math

import numpy as np
import pytest

from mlxlab import load_model
from mlxlab.cli.sim import register
from mlxlab.core.results import jsonable
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload
from mlxlab.sim.published import seed001_cost_model
from mlxlab.studies.seed_scale.run import format_claims, seed_scale_study
from mlxlab.studies.sim_validation.scoring import (
    METRICS,
    STEP_COLUMNS,
    decode_periods,
    profile_shares,
    rescore_validation,
    score,
    score_config,
)
from mlxlab.studies.sim_validation.verdict import (
    cost_model_record,
    fingerprint,
    sim_accuracy_verdict,
    sim_heldout_verdict,
    terms_missing_at,
    validation_verdicts,
)
from mlxlab.studies.sim_validation.run import plan_validation, validate_simulator


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


def test_validation_on_tiny_scores_every_row_by_the_noise_derived_rule(tiny, tmp_path):
    """Quick mode: one small workload, one policy, 3 engine repeats, a profile share before each.
    The rule (mlxlab.studies.sim_validation.scoring): tolerance = max(10%, 3 x the engine's run-to-run
    coefficient of variation); every row's numbers follow from its runs, and the saved file
    alone scores the simulator's side again exactly."""
    wl = Workload([ChatTenant(sessions=1, turns=1, first_prompt_tokens=64, output_tokens=24, think_time_s=0.0),
                   BatchTenant(workers=1, requests=1, prompt_tokens=512, output_tokens=6)],
                  vocab_size=tiny.vocab_size, seed=0, max_context=tiny.max_context)
    grid = dict(prefill_tokens=(16, 64, 128), contexts=(0, 384), decode_batches=(1, 2), decode_contexts=(32, 512),
                repeats=1, fill_chunk=128)
    res = validate_simulator(tiny, {"chat+long": wl}, policies=("interleave",), repeats=3, chunk_size=128,
                             profile_grid=grid, save=False, heldout=1, heldout_seed=4, heldout_scale=0.25)
    rows = res["table"]
    assert len(rows) == 6 and {r["metric"] for r in rows} == {"ttft_p50_s", "itl_p50_s", "itl_p99_s"}
    for r in rows:
        assert len(r["engine_runs"]) == 3 and len(r["sim_runs"]) == 3  # 3 repeats, 3 profile shares
        assert r["engine"] == pytest.approx(float(np.median(r["engine_runs"])))
        assert r["sim"] == pytest.approx(float(np.median(r["sim_runs"])))
        assert r["rel_error"] == pytest.approx(abs(r["sim"] - r["engine"]) / r["engine"])
        assert r["noise"] == pytest.approx(float(np.std(r["engine_runs"], ddof=1) / np.mean(r["engine_runs"])))
        assert r["tolerance"] >= 0.10 and r["tolerance"] == pytest.approx(max(0.10, 3 * r["noise"]))
        assert r["passed"] == (r["rel_error"] <= r["tolerance"])
        assert len(r["paired_errors"]) == 3
    assert all(r["sim"] > 0 and r["engine"] > 0 for r in rows)
    assert res["passed"] == all(r["passed"] for r in rows)
    assert sum(s["passed"] for s in res["summary"].values()) == sum(r["passed"] for r in rows)
    # a lone chat before each profile share and each engine run, and the simulator's on each share
    held = res["heldout"]
    case = held["cases"][0]
    assert held["seed"] == 4 and held["n"] == 1 and case["chunk_size"] not in (16, 64, 128)
    hrows = held["table"]
    assert {r["tenant"] for r in hrows} == {"chat", "doc"} and {r["workload"] for r in hrows} == {case["name"]}
    assert all(len(r["engine_runs"]) == 3 and r["passed"] == (r["rel_error"] <= r["tolerance"]) for r in hrows)
    assert held["summary"]["ttft_p50_s"]["noise_median"] == pytest.approx(
        float(np.median([r["noise"] for r in hrows if r["metric"] == "ttft_p50_s"])))
    hkey = f"{case['name']}/{case['policy']}"
    assert [(x["before"], x["repeat"]) for x in res["sentinels"]["runs"]] == \
        [(b, r) for r in range(3) for b in ("profile", "chat+long/interleave", hkey)]
    assert all(x["itl_p50_s"] > 0 for x in res["sentinels"]["runs"]) and len(res["sentinels"]["sim"]) == 3
    # the profile: three shares, each fitted alone, their records kept with their share
    prof = res["profile"]
    assert len(prof["share_coefficients"]) == 3 and {r["share"] for r in prof["records"]} == {0, 1, 2}
    assert all(v >= 0 for c in prof["share_coefficients"] for v in c.values() if v is not None)
    assert res["steps"]["columns"] == list(STEP_COLUMNS)
    assert len(res["steps"]["runs"]["chat+long/interleave"]["engine"]) == 3
    assert set(res["periods"]["chat+long/interleave"]) == {"engine", "sim"}
    # scored again from the saved file alone (no model): this version refits the same shares and
    # simulates the same workloads, so every simulator value comes back exactly
    saved = json.loads(json.dumps(jsonable(res)))
    again = rescore_validation(saved)
    assert [(r["metric"], r["tenant"]) for r in again["table"]] == [(r["metric"], r["tenant"]) for r in rows]
    assert [r["sim"] for r in again["table"]] == pytest.approx([r["sim"] for r in rows], rel=1e-9)
    assert [r["sim_saved"] for r in again["table"]] == [r["sim"] for r in rows]
    assert [r["sim"] for r in again["heldout"]["table"]] == pytest.approx([r["sim"] for r in hrows], rel=1e-9)
    assert again["periods"][hkey] == json.loads(json.dumps(res["periods"][hkey]))  # the same simulation
    # and through the command line: `mlxlab validate-sim --rescore FILE` writes FILE_rescored.json
    src = tmp_path / "sim_validation.json"
    src.write_text(json.dumps(saved))
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["validate-sim", "--rescore", str(src), "--quiet", "--save"])  # --save: beside FILE
    assert args.func(args) == (0 if all(r["passed"] for r in again["table"]) else 1)
    written = json.loads((tmp_path / "sim_validation_rescored.json").read_text())
    assert [r["sim"] for r in written["table"]] == pytest.approx([r["sim"] for r in rows], rel=1e-9)
    assert written["cold_rule"] == {"key": "size", "capacity": None, "recounted": False}
    # --cold-key shape: the profile's cold chunks counted again by attention shape, under that name
    args = p.parse_args(["validate-sim", "--rescore", str(src), "--quiet", "--save", "--cold-key", "shape",
                         "--cold-capacity", "64"])
    args.func(args)
    shaped = json.loads((tmp_path / "sim_validation_rescored_cold_shape.json").read_text())
    assert shaped["cold_rule"] == {"key": "shape", "capacity": 64, "recounted": True}
    assert len(shaped["table"]) == len(rows)
    # the verdict on mlx-sim-accuracy, and the fingerprint of the cost models the simulator ran on
    v = res["verdicts"][0]
    assert v["claim"] == "mlx-sim-accuracy" and v["verdict"] in ("reproduced", "not reproduced")
    errs = sorted(r["rel_error"] for r in rows if r["metric"] == "itl_p99_s")
    assert v["measured"]["itl_p99_median_err_pct"] == pytest.approx(100 * float(np.median(errs)))
    cm = res["cost_model"]
    assert cm["fitted_in_run"] and cm["models_n"] == 3
    assert cm["fingerprint"] == fingerprint(saved["profile"]["share_coefficients"]) == v["measured"]["cost_model_fingerprint"]
    assert written["verdicts"][0]["claim"] == "mlx-sim-accuracy" and "environment" in written
    assert written["cost_model"]["fingerprint"] == fingerprint(written["coefficients"])
    # `--rescore-verdicts FILE` adds the verdict to a saved file in place, from its table alone
    args = p.parse_args(["validate-sim", "--rescore-verdicts", str(src)])
    assert args.func(args) == 0
    again = json.loads(src.read_text())
    assert again["verdicts"] == json.loads(json.dumps(res["verdicts"]))
    assert again["cost_model"]["fingerprint"] == cm["fingerprint"] and again["table"] == saved["table"]


def test_score_holds_a_quiet_metric_to_10_percent_and_a_noisy_one_to_its_noise():
    quiet = score([1.0, 1.0, 1.0], [1.05, 1.08, 1.0])
    assert quiet["engine"] == 1.0 and quiet["sim"] == 1.05 and quiet["noise"] == 0
    assert quiet["tolerance"] == 0.10 and quiet["passed"] and quiet["paired_errors"] == pytest.approx([0.05, 0.08, 0])
    assert not score([1.0, 1.0, 1.0], [1.2])["passed"]
    noisy = score([1.0, 1.5, 0.5], [2.0])  # noise 0.5: tolerance 1.5, error 1.0
    assert noisy["noise"] == pytest.approx(0.5) and noisy["tolerance"] == pytest.approx(1.5) and noisy["passed"]
    assert noisy["paired_errors"] is None  # one simulator run does not pair with three repeats
    assert score([float("nan"), 1.0, 1.0], [1.0])["engine_runs"] == [1.0, 1.0]  # a missing repeat is left out
    assert score([float("nan")], [1.0]) is None and score([1.0, 1.0], [float("nan")]) is None
    one = score([2.0], [2.1])  # a single repeat has no noise: 10%
    assert math.isnan(one["noise"]) and one["tolerance"] == 0.10 and one["passed"]


def test_score_config_gives_a_row_per_tenant_and_metric():
    def summary(ttft, itl50, itl99):
        t = {"ttft_s": {"p50": ttft}, "itl_s": {"p50": itl50, "p99": itl99}}
        return {"all": t, "chat": t, "batch": {"ttft_s": {"p50": 2 * ttft}, "itl_s": {"p50": None, "p99": None}}}

    eng = [summary(0.10, 0.010, 0.020), summary(0.11, 0.011, 0.021), summary(0.09, 0.012, 0.022)]
    rows = score_config("w", "p", eng, [summary(0.10, 0.011, 0.030)])
    assert [(r["tenant"], r["metric"]) for r in rows] == [("chat", m[2]) for m in METRICS] + [("batch", "ttft_p50_s")]
    assert [r["passed"] for r in rows] == [True, True, False, True]
    assert all(r["workload"] == "w" and r["policy"] == "p" for r in rows)


def test_plan_validation_takes_a_given_profile_or_plans_a_grid_around_the_runs(tiny):
    wl = Workload([ChatTenant(sessions=1, turns=1, first_prompt_tokens=64, output_tokens=8, think_time_s=0.0),
                   BatchTenant(workers=1, requests=1, prompt_tokens=512, output_tokens=2)],
                  vocab_size=tiny.vocab_size, seed=0, max_context=tiny.max_context)
    with pytest.raises(ValueError, match="repeats"):
        plan_validation(tiny, {"w": wl}, ("interleave",), 1)
    cm = seed001_cost_model()
    doc = {"cost_model": cm.as_dict(), "kind": "profile", "path": "data/profiles/x.json",
           "environment": {"git_commit": "abc1234", "written_at": "2026-01-01T00:00:00+00:00"}}
    given = plan_validation(tiny, {"w": wl}, ("interleave",), 2, profile=doc, say=print)
    assert not given.measure_profile and given.cost_model.coef.tolist() == cm.coef.tolist()
    # where the given cost model came from is kept with the plan (and so with the validation)
    assert given.profile_doc["path"] == "data/profiles/x.json"
    assert given.profile_doc["environment"]["git_commit"] == "abc1234"
    planned = plan_validation(tiny, {"w": wl}, ("interleave",), 2, chunk_size=128, say=lambda s: None)
    assert planned.measure_profile and planned.profile_grid["fill_chunk"] == 128
    assert 128 in planned.profile_grid["prefill_tokens"] and planned.profile_grid["repeats"] == 1
    assert max(planned.profile_grid["contexts"]) == 512 - 128  # before the longest prompt's last chunk


def test_decode_periods_picks_the_unchanged_decodes_of_a_batch_size():
    """From a validation's saved steps: decode-only steps of the asked batch that changed nothing,
    their period to the next step, per run; a step followed by a wait for an arrival, a change,
    another batch size or a larger context is left out. The profile cell's records per share."""
    def step(t, phase, b, ctx, joined=0, end=None):
        d = dict(start_s=t, end_s=end if end is not None else t + 0.001, phase=phase, decode_batch=b,
                 decode_context_tokens=ctx, prefill_tokens=0, prefill_context_tokens=0, chunks=0, joined=joined,
                 dropped=0, fused=False)
        return [d[c] for c in STEP_COLUMNS]

    run = [step(0.000, "decode", 2, 100, joined=1, end=0.009), step(0.010, "decode", 2, 102, end=0.017),
           step(0.018, "decode", 2, 104, end=0.029), step(0.030, "decode", 2, 9000, end=0.039),
           step(0.040, "decode", 2, 106, end=0.041), step(0.100, "decode", 4, 200, end=0.119),
           step(0.120, "mixed", 2, 108)]
    res = {"steps": {"columns": list(STEP_COLUMNS), "runs": {"w/p": {"engine": [run], "sim": [run[:3]]}}},
           "profile": {"records": [{"cell": "decode b2 c32", "duration_s": 0.007, "share": 0},
                                   {"cell": "decode b1 c32", "duration_s": 0.005, "share": 0},
                                   {"cell": "decode b2 c32", "duration_s": 0.012, "share": 1}]}}
    got = decode_periods(res, "w/p", 2, max_context=6000, profile_cell="decode b2 c32")
    assert got["engine"] == [pytest.approx([0.008, 0.012])]
    assert got["sim"] == [pytest.approx([0.008])]
    assert got["profile"] == [[0.007], [0.012]]


def test_profile_shares_split_by_share_or_where_the_grid_comes_round():
    tagged = [{"cell": c, "share": s} for s in (0, 1) for c in ("a", "b")]
    assert profile_shares(tagged) == [tagged[:2], tagged[2:]]
    untagged = [{"cell": c} for _ in range(3) for c in ("a", "b", "b")]
    assert [len(s) for s in profile_shares(untagged)] == [3, 3, 3]
    assert profile_shares([]) == [[]]


def test_seed_scale_study_reproduces_the_published_figures():
    """The case study's figures from the published profile (deterministic: no device): the sweet
    spot predicted and reproduced; the figures the fitted floor fixes (chunk time, 2,048 gap, crawl)
    given back as calibration residuals that agree with the published ones, never scored; every
    verdict a simulation's; the decode-window gate runs by its registered name."""
    res = seed_scale_study(chunk_sizes=(512, 1024, 2048), stall_free_budgets=(512,), slo_targets_s=(0.5,))
    verdicts = {v["claim"]: v["verdict"] for v in res["verdicts"]}
    assert verdicts == {"s001-chunk-time": "not measured", "s001-prefill-floor": "not measured",
                        "s001-chunk-2048-gap": "not measured", "s001-stall-crawl": "not measured",
                        "s001-sweet-spot": "reproduced"}, format_claims(res)
    residuals = [v for v in res["verdicts"] if (v["measured"] or {}).get("calibration_residual")]
    assert len(residuals) == 3 and all(v["measured"]["consistent_with_published"] for v in residuals)
    assert {v["source"] for v in res["verdicts"]} == {"simulation"}
    assert all(abs(f["residual_pct"]) < 5 for f in res["calibration"]["fitted"]), format_claims(res)
    assert [p["policy"] for p in res["plane"]] == ["interleave"] * 3 + ["stall_free", "slo", "admission_gate",
                                                                       "admission_gate", "admission_gate_window"]
    assert res["floor_s"] == pytest.approx(44.0, rel=0.05)
    windowed = res["crawl"]["gate + 1 s decode window"]
    assert windowed["window_gaps"] > 0 and res["crawl"]["no gate (interleave)"]["window_gaps"] >= 0


# ------------------------------------------------------------------ mlx-sim-accuracy and provenance


def _rows(errors, noise=0.02):
    """Validation rows: per metric, one row per relative error given."""
    return [{"workload": "w", "policy": "p", "tenant": "chat", "metric": m, "engine": 1.0, "sim": 1.0 + e,
             "rel_error": e, "noise": noise, "tolerance": max(0.10, 3 * noise), "passed": e <= max(0.10, 3 * noise),
             "paired_errors": [e, e]}
            for m, errs in errors.items() for e in errs]


def test_sim_accuracy_holds_the_median_error_of_each_metric_to_ten_percent():
    good = {"table": _rows({"ttft_p50_s": [0.02, 0.05, 0.30], "itl_p50_s": [0.08, 0.09, 0.5],
                            "itl_p99_s": [0.01, 0.02, 0.03]}), "config": {"repeats": 5}}
    v = sim_accuracy_verdict(good)
    m = v["measured"]
    assert v["verdict"] == "reproduced" and m["ttft_p50_median_err_pct"] == pytest.approx(5.0)
    assert m["itl_p50_median_err_pct"] == pytest.approx(9.0) and m["worst_median_err_pct"] == pytest.approx(9.0)
    assert m["rows_n"] == 9 and m["rows_within_10pct_n"] == 7 and m["rows_within_noise_rule_n"] == 7
    assert m["repeats"] == 5 and m["engine_noise_median_pct"] == pytest.approx(2.0)
    assert m["within_noise"] is True  # itl p50's 9% lies within 3 x 2% of the 10% line
    bad = {"table": _rows({"ttft_p50_s": [0.02], "itl_p50_s": [0.05], "itl_p99_s": [0.2, 0.15, 0.01]})}
    v = sim_accuracy_verdict(bad)
    assert v["verdict"] == "not reproduced" and v["measured"]["itl_p99_median_err_pct"] == pytest.approx(15.0)
    assert v["measured"]["within_noise"] is True  # 15% is within 3 x 2% of 10%
    far = sim_accuracy_verdict({"table": _rows({"ttft_p50_s": [0.5], "itl_p50_s": [0.5], "itl_p99_s": [0.5]})})
    assert far["verdict"] == "not reproduced" and far["measured"]["within_noise"] is False
    none = sim_accuracy_verdict({"table": _rows({"ttft_p50_s": [0.02], "itl_p50_s": [0.05]})})
    assert none["verdict"] == "not measured" and none["measured"]["itl_p99_median_err_pct"] is None



def test_sim_heldout_holds_median_to_five_and_worst_to_ten_percent_above_the_engine_noise():
    def doc(errors, noise=0.02):
        return {"heldout": {"n": 2, "seed": 7, "table": _rows(errors, noise)}, "config": {"repeats": 3}}

    good = sim_heldout_verdict(doc({"ttft_p50_s": [0.01, 0.04, 0.09], "itl_p50_s": [0.02, 0.05, 0.06],
                                    "itl_p99_s": [0.0, 0.03, 0.1]}))
    m = good["measured"]
    assert good["claim"] == "mlx-sim-heldout" and good["verdict"] == "reproduced"
    assert m["ttft_p50_median_err_pct"] == pytest.approx(4.0) and m["ttft_p50_worst_err_pct"] == pytest.approx(9.0)
    assert m["rows_n"] == 9 and m["cases_n"] == 2 and m["seed"] == 7 and m["itl_p99_rows_over_n"] == 0
    # a median of 6% fails at 2% noise, passes where the engine itself spreads 8% between repeats
    assert sim_heldout_verdict(doc({"ttft_p50_s": [0.06], "itl_p50_s": [0.01], "itl_p99_s": [0.01]}))["verdict"] \
        == "not reproduced"
    assert sim_heldout_verdict(doc({"ttft_p50_s": [0.06], "itl_p50_s": [0.01], "itl_p99_s": [0.01]}, 0.08))[
        "verdict"] == "reproduced"
    # one row at 12% fails the worst bound though the median is fine
    worst = sim_heldout_verdict(doc({"ttft_p50_s": [0.01, 0.01, 0.12], "itl_p50_s": [0.01], "itl_p99_s": [0.01]}))
    assert worst["verdict"] == "not reproduced" and worst["measured"]["ttft_p50_rows_over_n"] == 1
    assert sim_heldout_verdict({"table": []}) is None  # no held-out cases: no verdict
    part = sim_heldout_verdict(doc({"ttft_p50_s": [0.01]}))
    assert part["verdict"] == "not measured" and part["measured"]["itl_p50_median_err_pct"] is None
    both = validation_verdicts({**doc({"ttft_p50_s": [0.01], "itl_p50_s": [0.01], "itl_p99_s": [0.01]}),
                                "table": _rows({"ttft_p50_s": [0.01], "itl_p50_s": [0.01], "itl_p99_s": [0.01]})})
    assert [v["claim"] for v in both] == ["mlx-sim-accuracy", "mlx-sim-heldout"]
    assert [v["claim"] for v in validation_verdicts({"table": _rows({"ttft_p50_s": [0.01]})})] == ["mlx-sim-accuracy"]

def test_the_cost_model_record_fingerprints_what_the_simulator_ran_on():
    a = {"decode_step": 0.007, "packed_changes": 0.04, "join_tokens": 0.0, "overhead_s": 1e-4, "tail_s": None}
    b = dict(a, decode_step=0.0071)
    assert fingerprint([a]) == fingerprint(json.loads(json.dumps([a])))  # the saved file gives the same one
    assert fingerprint([a]) != fingerprint([b]) and fingerprint([a, b]) != fingerprint([b, a])
    rec = cost_model_record([a, b], fitted_in_run=True, source="shares")
    assert rec["models_n"] == 2 and rec["terms"] == ["decode_step", "join_tokens", "packed_changes"]
    assert rec["nonzero_terms"] == ["decode_step", "packed_changes"] and rec["terms_missing_at_commit"] is None
    given = cost_model_record([a], fitted_in_run=False, profile={"path": "p.json", "kind": "profile",
                                                                 "environment": {"git_commit": "abc", "written_at": "t"}})
    assert (given["profile_file"], given["profile_commit"], given["profile_written_at"]) == ("p.json", "abc", "t")


def test_terms_missing_at_names_the_cost_terms_a_commit_did_not_have():
    # 97f7d80 wrote the committed H200 validations; packed_changes arrived in d187244, after it
    missing = terms_missing_at("97f7d80", ["decode_step", "packed_changes"])
    if missing is None:
        pytest.skip("no git history here")
    assert missing == ["packed_changes"]
    assert terms_missing_at("d187244", ["decode_step", "packed_changes"]) == []
    assert terms_missing_at("0000000", ["decode_step"]) is None  # a commit this checkout lacks


def test_rescore_file_adds_the_verdict_and_the_cost_model_to_a_saved_validation(tmp_path):
    from mlxlab.studies.sim_validation import STUDY

    rescore_file = STUDY.rescore
    share = {"decode_step": 0.007, "prefill_tokens": 2e-5, "overhead_s": 1e-4, "tail_s": 1e-3}
    doc = {"environment": {"git_commit": None}, "rule": "r", "summary": {},
           "table": _rows({"ttft_p50_s": [0.02], "itl_p50_s": [0.05], "itl_p99_s": [0.04]}),
           "profile": {"coefficients": share, "share_coefficients": [share, share]},
           "config": {"model": "m", "policies": ["interleave"], "repeats": 2, "chunk_size": 256, "scale": 1.0}}
    path = tmp_path / "sim_validation.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    out = json.loads(json.dumps(rescore_file(path)))
    assert json.loads(path.read_text()) == out and out["table"] == doc["table"]
    assert out["verdicts"][0]["verdict"] == "reproduced" and out["cost_model"]["models_n"] == 2
    assert out["cost_model"]["fingerprint"] == fingerprint([share, share]) and "rescored_by" in out
    assert out["parameters"]["chunk_size"] == 256
    with pytest.raises(ValueError, match="validation"):
        (tmp_path / "sim_validation_x.json").write_text("{}")
        rescore_file(tmp_path / "sim_validation_x.json")


def test_recount_cold_counts_a_profiles_first_uses_again_by_shape_share_by_share():
    """recount_cold: each share counts anew (a process after other work), the first share's leading
    prefill records are warm (the profile's warm-up ran them), a chunk of a known size at a new key
    length is cold by shape and warm by size, and the rule is stamped on every record."""
    from mlxlab.studies.sim_validation.scoring import recount_cold

    def rec(kind, n, c):
        return {"kind": kind, "prefill_chunks": [[n, c]], "duration_s": 0.01}

    share = [rec("prefill", 64, 0), rec("fill", 64, 0), rec("mixed", 64, 64), rec("prefill", 64, 0)]
    by_shape = recount_cold([share, share], "shape", 8)
    assert [r["cold_chunks"] for r in by_shape[0]] == [0, 0, 1, 0]
    assert [r["cold_chunks"] for r in by_shape[1]] == [1, 0, 1, 0]
    assert all((r["cold_key"], r["cold_capacity"]) == ("shape", 8) for sh in by_shape for r in sh)
    by_size = recount_cold([share], "size")
    assert [r["cold_chunks"] for r in by_size[0]] == [0, 0, 0, 0]
    assert "cold_chunks" not in share[0]  # the saved records are left as they were
