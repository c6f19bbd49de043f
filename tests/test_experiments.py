"""The scheduling study (mlxlab.studies.scheduling.run) on the tiny model: structure, not speed.

No wall-clock thresholds: the numbers depend on the machine. The tests check that every claim is
there with finite numbers, that the ratios are computed from the runs' real token gaps, and that
only the asked policies run and make claims.
"""

import json
import math
import shutil
from pathlib import Path

import pytest

from mlxlab import Engine, load_model
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import Workload
from mlxlab.studies.scheduling import run as ex
from mlxlab.studies.scheduling.metrics import aggregate, run_metrics
from mlxlab.studies.scheduling.plan import batch_tenant, chat_tenant, default_scale

CLAIM_KEYS = {"name", "goal", "measured", "passed", "status", "evidence"}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


@pytest.fixture(scope="module")
def study(tiny):
    return ex.scheduling_study(tiny, platform_scale=1 / 64, chunk_sizes=(128, 512), workers=(1, 2),
                               repeats=1, warmup=False)


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_run_metrics_from_real_gaps(tiny):
    wl = Workload([chat_tenant(16, 40), batch_tenant(2, (200, 300), 2, 0.02)], vocab_size=tiny.vocab_size, seed=1)
    res = run_workload(Engine(tiny, chunk_size=128), wl)
    m = run_metrics(res, 128)
    chat = [r for r in res.submitted if r.tenant == "chat"][0]
    batch = [r for r in res.submitted if r.tenant == "batch"]
    assert m["chat_gaps_s"] == chat.itl_s and m["chat_worst_gap_s"] == max(chat.itl_s)
    assert set(m["contended_gaps_s"]) <= set(chat.itl_s) and m["contended_gaps_s"]
    assert m["long_ttft_s"] == max(r.ttft_s for r in batch)
    # one chunk time: a step that ran a single long-prompt chunk, read from the step records
    one = [s for s in res.executor.steps if len({p[0] for p in s.prefill} & {r.id for r in batch}) == 1]
    assert min(s.duration_s for s in one) <= m["chunk_time_s"] <= m["chunk_time_max_s"] == max(s.duration_s for s in one)
    agg = aggregate([m, m])
    assert agg["repeats"] == 2 and agg["chat_worst_gap_s"] == m["chat_worst_gap_s"]
    assert agg["pooled_gaps"] == 2 * len(m["contended_gaps_s"])


def test_study_structure(study):
    json.dumps(study)  # JSON-able (NaN allowed; save_results writes null)
    names = {c["name"] for c in study["claims"]}
    expected = {"stall_interleave", "stall_mlx_lm", "interleave_matches_mlx_lm", "admission_gate_bounded",
                "slo_chat_itl", "slo_alone_ttft", "slo_not_dominated", "stall_free_chat_itl", "stall_free_fusion",
                "slo_packed_chat_itl"}
    assert expected <= names
    fusion = next(c for c in study["claims"] if c["name"] == "stall_free_fusion")
    # tiny is a qwen2 model: both the packed and the back-to-back runs had mixed steps to time
    assert fusion["evidence"]["fusable_model"] and finite(fusion["measured"]) and fusion["measured"] > 0
    assert {"overlap_ttft", "overlap_chat_itl"} <= names
    for c in study["claims"]:
        assert CLAIM_KEYS <= set(c), c
        assert c["status"] in ("measured", "skipped")
        if c["status"] == "measured":
            assert isinstance(c["passed"], bool), c
    refs = study["references"]
    assert finite(refs["solo_itl_s"]) and refs["solo_itl_s"] > 0
    assert finite(refs["alone_ttft_2048_s"]) and refs["alone_ttft_2048_s"] > 0
    lo, hi = study["config"]["long_prompt_tokens"]
    assert (lo, hi) == (256, 512)


def test_stall_ratio_is_worst_gap_over_solo_itl(study):
    claims = {c["name"]: c for c in study["claims"]}
    rows = {r["config"]: r for r in study["table"]}
    solo = study["references"]["solo_itl_s"]
    c = claims["stall_interleave"]
    row = rows["stall/interleave/w2"]
    assert finite(c["measured"]) and c["measured"] == pytest.approx(row["chat_worst_gap_s"] / solo)
    assert row["chat_worst_gap_s"] == row["chat_worst_gap_runs_s"][0]  # one repeat: the run's own max gap
    # the worst gap is one of the chat's gaps: at least the median of those the long prompts contended
    assert row["chat_worst_gap_s"] >= row["pooled_itl_p50_s"] > 0
    assert row["pooled_gaps"] > 0
    gate = claims["admission_gate_bounded"]["evidence"]
    for w in (1, 2):
        assert finite(gate["worst_gap_s"][w]) and finite(gate["chunk_time_s"][w])
    slo = claims["slo_chat_itl"]["evidence"]
    for k in ("chat_itl_p50_s", "chat_itl_p99_s", "chat_itl_max_s", "long_ttft_s", "long_ttft_over_alone_2048"):
        assert finite(slo[k]), k
    assert slo["itl_target_s"] == pytest.approx(2 * solo)
    text = ex.format_table(study)
    assert "stall_interleave" in text and "gate/admission_gate/w2" in text


def test_only_the_asked_policies_run_and_claim(tiny):
    s = ex.scheduling_study(tiny, platform_scale=1 / 128, policies=("interleave", "slo"),
                            chunk_sizes=(256,), workers=(1,), repeats=1, warmup=False)
    claims = {c["name"]: c for c in s["claims"]}
    assert set(claims) == {"stall_interleave", "slo_chat_itl", "slo_packed_chat_itl", "slo_alone_ttft",
                           "slo_not_dominated"}
    assert all(c["status"] == "measured" and isinstance(c["passed"], bool) for c in claims.values())
    assert claims["stall_interleave"]["status"] == "measured"
    assert s["config"]["policies_run"] == ["interleave", "slo"]
    scenarios = {r["config"].split("/")[0] for r in s["table"]}
    assert scenarios == {"solo", "alone", "stall", "tradeoff", "contended"}
    assert not any("mlx_lm" in r["config"] or "overlap" in r["config"] for r in s["table"])
    with pytest.raises(ValueError):
        ex.scheduling_study(tiny, policies=("nope",), repeats=1)


def test_default_scale_follows_the_device_and_the_models_context(tiny):
    import mlx.core as mx

    device = 1.0 if mx.default_device().type == mx.DeviceType.gpu else 1 / 16
    assert default_scale(tiny) == min(device, tiny.max_context / 32768)
    short = {"vocab_size": 256, "max_position_embeddings": 1024}
    assert default_scale(short) == 1024 / 32768  # lowered so the longest long prompt fits the context


def test_the_study_warms_every_contention_executor_and_records_how_long_it_took(tiny, study):
    # on the H200 the first run of a new shape class held one step for 40 s: the study warms the
    # executors it will measure, and keeps the warm-up times (a backend's first-use cost)
    assert study["warmup_s"] == {}  # warmup=False
    s = ex.scheduling_study(tiny, platform_scale=1 / 128, policies=("interleave", "slo"), chunk_sizes=(256,),
                            workers=(1,), repeats=1, warmup=True)
    assert set(s["warmup_s"]) == {"executors", "contention"}
    assert all(v > 0 for v in s["warmup_s"].values()) and sum(s["warmup_s"].values()) < s["wall_s"]


def test_cli_writes_results(tiny, tmp_path, monkeypatch):
    from mlxlab.cli import build_parser

    root = Path(__file__).resolve().parent.parent / "data" / "models"
    (tmp_path / "models").mkdir()
    shutil.copy(root / "tiny.json", tmp_path / "models" / "tiny.json")
    shutil.copytree(root.parent / "claims", tmp_path / "claims")  # the verdicts are checked against them
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    args = build_parser().parse_args(["bench", "scheduling", "--model", "tiny", "--quick", "--repeats", "1",
                                      "--scale", str(1 / 128), "--workers", "1", "--chunk-sizes", "256",
                                      "--policies", "interleave", "mlx_lm", "--platform", "test", "--quiet"])
    assert args.func(args) == 0
    # a quick run writes a new run folder (never the committed results)
    (run,) = (tmp_path / "results" / "test" / "runs").iterdir()
    assert sorted(p.name for p in (tmp_path / "results" / "test").iterdir()) == ["runs"]
    doc = json.loads((run / "scheduling.json").read_text())
    assert {"environment", "config", "claims", "table", "references"} <= set(doc)
    assert doc["config"]["quick"] is True and doc["model"]["preset"] == "tiny"
    # interleave and mlx_lm ran: the one claim they decide, with the run's parameters
    assert [v["claim"] for v in doc["verdicts"]] == ["mlx-interleave-matches"]
    assert doc["parameters"]["preset"] == "tiny" and doc["parameters"]["workers"] == [1]
    # and `--rescore FILE` adds the verdicts to a saved file again, from its table alone
    path = run / "scheduling.json"
    args = build_parser().parse_args(["bench", "scheduling", "--rescore", str(path)])
    assert args.func(args) == 0
    again = json.loads(path.read_text())
    assert again["verdicts"] == doc["verdicts"] and again["table"] == doc["table"] and "rescored_by" in again
    # every finished run is also on disk as it ends, one JSON line each, so a cut run keeps them
    lines = (run / "scheduling_runs.jsonl").read_text().splitlines()
    assert len(lines) == len(doc["table"]) and all(json.loads(x)["config"] for x in lines)


# ------------------------------------------------------------------ the verdicts on data/claims


def test_the_study_decides_every_scheduling_claim_from_its_own_rows(study):
    from mlxlab.core.claims import check_verdicts
    from mlxlab.studies.scheduling.verdict import CLAIM_IDS, verdicts

    vs = {v["claim"]: v for v in check_verdicts(verdicts(study), experiment="scheduling")}
    assert set(vs) == set(CLAIM_IDS)
    # the gate ran on stall_free's terms (same prompt, chunk = budget), so the comparison is decided
    assert "contended/admission_gate/c512" in {r["config"] for r in study["table"]}
    g = vs["s001-gate-vs-stall-free"]
    assert g["measured"]["equal_prompt"] and g["verdict"] in ("reproduced", "not reproduced")
    rows = {r["config"]: r for r in study["table"]}
    assert g["measured"]["itl_p99_ratio_x"] == pytest.approx(rows["contended/admission_gate/c512"]["pooled_itl_p99_s"]
                                                             / rows["contended/stall_free/b512"]["pooled_itl_p99_s"])
    s = vs["mlx-stall-free-itl"]["measured"]
    assert s["itl_p99_over_solo_x"] == pytest.approx(rows["contended/stall_free/b512"]["pooled_itl_p99_s"]
                                                     / study["references"]["solo_itl_s"])
    assert all(v["verdict"] != "not measured" for v in vs.values()), vs


SOLO = 0.01  # the synthetic chat's solo ITL (s)


def _row(config, p99=0.015, ttft=1.0, worst=1.0, runs=3, **kw):
    return {"config": config, "pooled_itl_p99_s": p99, "long_ttft_s": ttft, "chat_worst_gap_s": worst,
            "chat_itl_p99_runs_s": [p99] * runs, "long_ttft_runs_s": [ttft] * runs,
            "chat_worst_gap_runs_s": [worst] * runs, "mixed_step_s": 0.05, **kw}


def synthetic(**rows):
    """A scheduling result where every claim holds; ``rows`` replace (dict) or drop (None) rows."""
    table = {r["config"]: r for r in [
        _row("stall/interleave/w1", worst=1.0), _row("stall/interleave/w2", worst=2.0),
        _row("stall/mlx_lm/w1", worst=1.1), _row("stall/mlx_lm/w2", worst=1.8),
        _row("contended/slo", p99=0.015, ttft=1.5, chosen_chunk_median=128.0, infeasible_fraction=0.0),
        _row("contended/slo_packed", p99=0.012, ttft=1.4), _row("alone/slo", p99=None, ttft=1.02),
        _row("alone/interleave/c2048", p99=None, ttft=1.0),
        _row("tradeoff/interleave/c256", p99=0.012, ttft=2.0), _row("tradeoff/interleave/c1024", p99=0.05, ttft=1.2),
        _row("contended/stall_free/b512", p99=0.018, ttft=1.3), _row("contended/stall_free_unfused/b512", p99=0.02),
        _row("contended/admission_gate/c512", p99=0.02, ttft=1.4), _row("gate/admission_gate/w1", p99=0.02, ttft=0.8),
        _row("overlap/interleave/c256", p99=0.015, ttft=1.1), _row("overlap/interleave/c1024", p99=0.03, ttft=1.05)]}
    for k, v in rows.items():
        k = k.replace("__", "/")
        if v is None:
            table.pop(k, None)
        else:
            table[k] = {**table.get(k, {"config": k}), **v}
    return {"config": {"policies_run": ["admission_gate", "interleave", "mlx_lm", "overlap", "slo", "stall_free"],
                       "workers": [1, 2], "chunk_sizes": [256, 1024], "stall_free_budget": 512, "gate_chunk": 512,
                       "stall_chunk": 2048, "overlap_policy": "interleave", "repeats": 3, "model": "synthetic",
                       "platform_scale": 0.05, "long_prompt_tokens": [800, 1600], "quick": False},
            "references": {"solo_itl_s": SOLO, "alone_ttft_2048_s": 1.0, "alone_ttft_best_s": 0.9,
                           "slo_itl_target_s": 2 * SOLO},
            "table": list(table.values())}


def _decide(result):
    from mlxlab.studies.scheduling.verdict import verdicts

    return {v["claim"]: v for v in verdicts(result)}


def test_every_claim_holds_on_the_synthetic_table():
    vs = _decide(synthetic())
    assert {c: v["verdict"] for c, v in vs.items()} == {c: "reproduced" for c in (
        "mlx-interleave-matches", "mlx-slo-chat-itl", "mlx-slo-alone-ttft", "mlx-slo-not-dominated",
        "mlx-stall-free-itl", "mlx-overlap", "s001-gate-vs-stall-free")}
    m = vs["mlx-interleave-matches"]["measured"]
    assert m["worst_gap_ratio_w1_x"] == pytest.approx(1 / 1.1) and m["worst_gap_ratio_max_x"] == pytest.approx(2 / 1.8)
    assert vs["mlx-slo-chat-itl"]["measured"]["itl_p99_over_solo_x"] == pytest.approx(1.5)
    assert vs["mlx-slo-chat-itl"]["measured"]["packed_itl_p99_over_solo_x"] == pytest.approx(1.2)
    assert vs["mlx-slo-alone-ttft"]["measured"]["ttft_ratio_x"] == pytest.approx(1.02)
    assert vs["mlx-slo-not-dominated"]["measured"]["dominating_chunks_n"] == 0
    o = vs["mlx-overlap"]["measured"]
    assert o["best_chunk"] == 256 and o["ttft_over_alone_x"] == pytest.approx(1.1)
    g = vs["s001-gate-vs-stall-free"]["measured"]
    assert g["equal_prompt"] and g["itl_p99_ratio_x"] == pytest.approx(0.02 / 0.018)
    assert g["ttft_ratio_x"] == pytest.approx(1.4 / 1.3)
    # identical repeats: a spread of 0, so no verdict is within noise
    assert vs["mlx-slo-chat-itl"]["measured"]["within_noise"] is False
    assert all(v["measured"]["within_noise"] in (False, None) for v in vs.values())


@pytest.mark.parametrize("claim_id, rows, verdict, also", [
    ("mlx-interleave-matches", {"stall__mlx_lm__w2": {"chat_worst_gap_s": 0.5}}, "not reproduced", set()),
    ("mlx-interleave-matches", {"stall__mlx_lm__w1": {"chat_worst_gap_s": 4.0}}, "not reproduced", set()),
    ("mlx-interleave-matches", {"stall__mlx_lm__w2": {"chat_worst_gap_s": None}}, "not measured", set()),
    ("mlx-slo-chat-itl", {"contended__slo": {"pooled_itl_p99_s": 0.03}}, "not reproduced", set()),
    ("mlx-slo-chat-itl", {"contended__slo": {"pooled_itl_p99_s": None}}, "not measured", {"mlx-slo-not-dominated"}),
    ("mlx-slo-alone-ttft", {"alone__slo": {"long_ttft_s": 1.2}}, "not reproduced", set()),
    ("mlx-slo-alone-ttft", {"alone__slo": None}, "not measured", set()),
    ("mlx-slo-not-dominated", {"tradeoff__interleave__c1024": {"pooled_itl_p99_s": 0.014, "long_ttft_s": 1.4}},
     "not reproduced", set()),
    ("mlx-slo-not-dominated", {"tradeoff__interleave__c256": None, "tradeoff__interleave__c1024": None}, "not measured", set()),
    # a baseline that fails its own bound fails the comparison made against it
    ("mlx-stall-free-itl", {"contended__stall_free__b512": {"pooled_itl_p99_s": 0.03}}, "not reproduced",
     {"s001-gate-vs-stall-free": "not reproduced"}),
    ("mlx-stall-free-itl", {"contended__stall_free__b512": None}, "not measured", {"s001-gate-vs-stall-free"}),
    ("mlx-overlap", {"overlap__interleave__c256": {"long_ttft_s": 1.3}}, "not reproduced", set()),  # TTFT misses
    # no size meets 2x solo: the lowest ITL p99 is taken, and misses
    ("mlx-overlap", {"overlap__interleave__c256": {"pooled_itl_p99_s": 0.025}}, "not reproduced", set()),
    ("mlx-overlap", {"overlap__interleave__c256": None, "overlap__interleave__c1024": None}, "not measured", set()),
    ("s001-gate-vs-stall-free", {"contended__admission_gate__c512": {"pooled_itl_p99_s": 0.03}}, "not reproduced", set()),
    ("s001-gate-vs-stall-free", {"contended__admission_gate__c512": {"long_ttft_s": 1.7}}, "not reproduced", set()),
    # a file from before the equal-prompt run: the gate's w1 run drew another prompt length
    ("s001-gate-vs-stall-free", {"contended__admission_gate__c512": None}, "not measured", set()),
])
def test_each_claim_fails_or_goes_unmeasured_on_its_own_rows(claim_id, rows, verdict, also):
    vs = _decide(synthetic(**rows))
    assert vs[claim_id]["verdict"] == verdict, vs[claim_id]
    for c in also:  # claims that read the same row go unmeasured with it (or as ``also`` says)
        assert vs[c]["verdict"] == (also[c] if isinstance(also, dict) else "not measured"), vs[c]
    others = {c: v["verdict"] for c, v in vs.items() if c != claim_id and c not in also}
    assert set(others.values()) == {"reproduced"}, others  # the change touched this claim only


def test_the_fallback_gate_comparison_reports_the_chat_only():
    g = _decide(synthetic(contended__admission_gate__c512=None))["s001-gate-vs-stall-free"]
    assert g["measured"]["equal_prompt"] is False and g["measured"]["ttft_ratio_x"] is None
    assert g["measured"]["itl_p99_ratio_x"] == pytest.approx(0.02 / 0.018) and "predates" in g["rule"]
    res = synthetic(contended__admission_gate__c512=None)
    res["config"]["gate_chunk"] = 256  # nothing at an equal chunk
    g = _decide(res)["s001-gate-vs-stall-free"]
    assert g["verdict"] == "not measured" and "equal chunk" in g["rule"]


def test_a_figure_nearer_its_bound_than_its_noise_band_is_inconclusive():
    # slo's chat ITL p99 at 2.1x solo (bound 2x), its repeats at 1.9x, 2.1x and 2.3x: band 3 x 0.2 / sqrt(3)
    near = synthetic(contended__slo={"pooled_itl_p99_s": 0.021, "chat_itl_p99_runs_s": [0.019, 0.021, 0.023]})
    m = _decide(near)["mlx-slo-chat-itl"]
    assert m["verdict"] == "inconclusive" and m["measured"]["within_noise"] is True
    assert m["measured"]["noise_band_x"]["itl_p99_over_solo"] == pytest.approx(3 * 0.2 / 3 ** 0.5, abs=1e-3)
    assert m["measured"]["repeats_to_resolve"] > 3
    assert m["measured"]["itl_p99_spread_pct"] == pytest.approx(100 * 0.004 / 0.021)  # still reported
    # the same miss with tight repeats fails beyond its band
    far = synthetic(contended__slo={"pooled_itl_p99_s": 0.04, "chat_itl_p99_runs_s": [0.039, 0.04, 0.041]})
    f = _decide(far)["mlx-slo-chat-itl"]
    assert f["verdict"] == "not reproduced" and f["measured"]["within_noise"] is False
    # one repeat has no band: the figure alone decides
    one = synthetic(contended__slo={"pooled_itl_p99_s": 0.021, "chat_itl_p99_runs_s": [0.021]})
    o = _decide(one)["mlx-slo-chat-itl"]
    assert o["verdict"] == "not reproduced" and o["measured"]["within_noise"] is None


def test_a_fixed_chunk_that_dominates_slo_by_less_than_its_band_is_inconclusive():
    dom = synthetic(tradeoff__interleave__c1024={"pooled_itl_p99_s": 0.0149, "long_ttft_s": 1.45,
                                                "chat_itl_p99_runs_s": [0.014, 0.0149, 0.016]})
    d = _decide(dom)["mlx-slo-not-dominated"]
    assert d["measured"]["dominating_chunks"] == "1024"
    assert d["verdict"] == "inconclusive" and d["measured"]["within_noise"] is True
    clear = synthetic(tradeoff__interleave__c1024={"pooled_itl_p99_s": 0.012, "long_ttft_s": 1.2,
                                                  "chat_itl_p99_runs_s": [0.0119, 0.012, 0.0121]})
    c = _decide(clear)["mlx-slo-not-dominated"]
    assert c["verdict"] == "not reproduced" and c["measured"]["within_noise"] is False


def test_the_band_pairs_the_two_sides_by_repeat_so_a_drift_both_share_cancels():
    # both long prompts drift 40% over the rounds together: each round's ratio is ~1.02, inside the 1.05 bound
    drift = synthetic(alone__slo={"long_ttft_s": 1.2 * 1.02, "long_ttft_runs_s": [1.02, 1.2 * 1.02, 1.4 * 1.021]},
                      alone__interleave__c2048={"long_ttft_s": 1.2, "long_ttft_runs_s": [1.0, 1.2, 1.4]})
    drift["references"]["alone_ttft_2048_s"] = 1.2
    a = _decide(drift)["mlx-slo-alone-ttft"]
    assert a["verdict"] == "reproduced" and a["measured"]["within_noise"] is False
    assert a["measured"]["ttft_spread_pct"] > 30  # the unpaired spread alone would have called it noise


def test_a_failure_beyond_its_band_outweighs_an_inconclusive_elsewhere():
    # the gate's chat p99 misses clearly (2x stall_free, tight), its TTFT sits on its bound inside a wide band
    res = synthetic(contended__admission_gate__c512={"pooled_itl_p99_s": 0.036, "long_ttft_s": 1.3 * 1.25,
                                                     "chat_itl_p99_runs_s": [0.0359, 0.036, 0.0361],
                                                     "long_ttft_runs_s": [1.3, 1.3 * 1.25, 1.3 * 1.5]})
    g = _decide(res)["s001-gate-vs-stall-free"]
    assert g["verdict"] == "not reproduced" and g["measured"]["within_noise"] is False
    res["table"] = [{**t, "chat_itl_p99_runs_s": [0.02] * 3, "pooled_itl_p99_s": 0.02}
                    if t["config"] == "contended/admission_gate/c512" else t for t in res["table"]]
    assert _decide(res)["s001-gate-vs-stall-free"]["verdict"] == "inconclusive"  # the TTFT alone is unresolved


def test_a_subset_of_policies_decides_only_its_claims():
    from mlxlab.core.claims import check_verdicts

    res = synthetic()
    res["config"]["policies_run"] = ["interleave", "slo"]
    vs = check_verdicts(_decide(res).values(), experiment="scheduling_slo")
    assert {v["claim"] for v in vs} == {"mlx-slo-chat-itl", "mlx-slo-alone-ttft", "mlx-slo-not-dominated"}
    res["config"]["policies_run"] = ["interleave", "stall_free"]
    assert set(_decide(res)) == {"mlx-stall-free-itl"}
    res["config"]["policies_run"] = ["interleave"]
    assert _decide(res) == {}


def test_rescore_file_adds_the_verdicts_and_leaves_the_measurements(tmp_path):
    from mlxlab.studies.scheduling import STUDY

    rescore_file = STUDY.rescore

    doc = {"environment": {"git_commit": "abc1234", "written_at": "then"}, **synthetic(), "claims": [], "notes": ["n"],
           "model": {"preset": "tiny", "bits": None, "dtype": "float32"}}
    path = tmp_path / "scheduling_slo.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    out = rescore_file(path)
    again = json.loads(path.read_text())
    assert again == json.loads(json.dumps(out))
    assert path.read_text().startswith('{\n "environment"')  # written indented as it was
    assert again["environment"] == doc["environment"] and again["table"] == doc["table"]
    assert again["notes"] == ["n"] and again["claims"] == []
    assert {v["claim"] for v in again["verdicts"]} == {"mlx-interleave-matches", "mlx-slo-chat-itl",
                                                       "mlx-slo-alone-ttft", "mlx-slo-not-dominated",
                                                       "mlx-stall-free-itl", "mlx-overlap", "s001-gate-vs-stall-free"}
    assert set(again["rescored_by"]) == {"commit", "dirty", "at", "what"}
    assert again["parameters"]["repeats"] == 3 and again["parameters"]["dtype"] == "float32"
    assert rescore_file(path)["verdicts"] == again["verdicts"]  # idempotent
    with pytest.raises(ValueError, match="scheduling result"):
        (tmp_path / "scheduling_x.json").write_text("{}")
        rescore_file(tmp_path / "scheduling_x.json")


def test_decide_gives_one_claim_even_where_its_policy_did_not_run():
    from mlxlab.studies.scheduling.verdict import CLAIM_IDS, decide

    res = synthetic()
    assert all(decide(c, res)["verdict"] == "reproduced" for c in CLAIM_IDS)
    res["table"] = [r for r in res["table"] if not r["config"].startswith("overlap/")]
    assert decide("mlx-overlap", res)["verdict"] == "not measured"
    assert "case study" in decide("s001-gate-vs-stall-free", res)["fairness"]
    assert "case study" not in decide("mlx-overlap", res)["fairness"]
