"""``mlxlab tune`` (mlxlab.studies.tune): SLOs parsed or refused, the frontier and the choice (never
silent where nothing meets the SLOs), the regret/rank/speed verdicts from a stored sweep, the serve
settings a tune.json hands ``mlxlab serve --config``, and one quick end-to-end run on the tiny
model from a trace file to a recommendation."""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlxlab.studies.tune.run import BASELINE, default_grid, serve_command, serve_settings
from mlxlab.studies.tune.slo import check, choose, parse_objective, parse_slo, pareto
from mlxlab.studies.tune.verdict import kendall_tau, tune_verdicts

ROOT = Path(__file__).resolve().parent.parent


def _summary(chat_itl_p99, batch_ttft_p50):
    nan = float("nan")
    return {"chat": {"itl_s": {"p50": nan, "p99": chat_itl_p99, "max": nan}, "ttft_s": {"p50": 0.1}},
            "batch": {"ttft_s": {"p50": batch_ttft_p50}}}


def test_slos_parse_in_ms_s_and_times_solo_and_bad_ones_say_the_form():
    s = parse_slo("chat.itl_p99<=2x")
    assert (s.tenant, s.metric, s.value, s.unit) == ("chat", "itl_p99", 2.0, "x")
    assert parse_slo(" batch.ttft_p50 <= 1.5s ").bound_s(None) == 1.5
    assert parse_slo("chat.itl_p99<=40ms").bound_s(None) == pytest.approx(0.04)
    assert s.bound_s({"chat": {"itl_s": {"p99": 0.01}}}) == pytest.approx(0.02)
    for bad, words in [("chat.itl_p99<2x", "TENANT.METRIC<=VALUE"), ("chat.speed<=2x", "unknown metric"),
                       ("chat.itl_p99<=0x", "above 0"), ("itl_p99<=2x", "TENANT.METRIC")]:
        with pytest.raises(ValueError, match=words):
            parse_slo(bad)
    with pytest.raises(ValueError, match="no solo itl_p99"):
        s.bound_s(None)
    with pytest.raises(ValueError, match="TENANT.METRIC"):
        parse_objective("ttft")


def test_pareto_keeps_only_settings_no_other_beats_on_both():
    pts = [{"label": "a", "slo_ratio": 0.5, "objective_s": 3.0}, {"label": "b", "slo_ratio": 1.0, "objective_s": 1.0},
           {"label": "c", "slo_ratio": 1.2, "objective_s": 2.0}, {"label": "d", "slo_ratio": 0.5, "objective_s": 4.0}]
    assert [p["label"] for p in pareto(pts)] == ["a", "b"]


def _row(label, med, worst, obj):
    slos = [parse_slo("chat.itl_p99<=20ms")]
    return {"label": label, "checks": check(_summary(med, obj), slos, {}),
            "checks_worst": check(_summary(worst, obj), slos, {}), "objective_s": obj}


def test_the_choice_prefers_every_repeat_meeting_the_slos_then_the_median_and_names_the_binding_slo():
    firm, lucky, fast = _row("firm", 0.015, 0.019, 2.0), _row("lucky", 0.018, 0.03, 1.0), _row("fast", 0.05, 0.06, 0.5)
    c = choose([firm, lucky, fast])
    assert c.label == "firm" and c.meets and "every repeat" in c.why  # not the faster one that met it only at the median
    c = choose([lucky, fast])
    assert c.label == "lucky" and c.meets and "median" in c.why
    c = choose([fast, _row("slow", 0.03, 0.04, 3.0)])
    assert c.label == "slow" and not c.meets and c.binding == "chat.itl_p99<=20ms" and "1.50x its bound" in c.why


def test_where_no_setting_meets_the_slos_the_choice_takes_the_best_objective_within_the_closest_ones_spread():
    """The closest at the median (1.50x) reached 2.50x in a repeat: a setting at 2.00x is within that
    spread and 10x faster on the objective, one at 2.60x is not."""
    closest, near, far = _row("closest", 0.03, 0.05, 10.0), _row("near", 0.04, 0.045, 1.0), _row("far", 0.052, 0.06, 0.1)
    c = choose([far, near, closest])
    assert c.label == "near" and not c.meets and c.binding == "chat.itl_p99<=20ms"
    assert "the closest, closest, reached 1.50x its bound (2.50x in its worst repeat); near reached 2.00x" in c.why
    # a closest setting as steady as its median leaves nothing within its spread: it is the choice
    assert choose([far, near, _row("closest", 0.03, 0.03, 10.0)]).label == "closest"


def test_the_grid_leaves_out_chunks_past_the_longest_prompt():
    labels = [g["label"] for g in default_grid(max_prompt=700)]
    assert "interleave-256" in labels and "interleave-1024" in labels and "interleave-2048" not in labels
    assert any(g["policy"] == "stall_free" and g["options"] == {"token_budget": 512} for g in default_grid())


def _pretend_cuda_with_cudnn(monkeypatch) -> None:
    """The default device as mlx's CUDA backend with cuDNN attention on (its default)."""
    import mlx.core as mx

    class _Cuda:
        @staticmethod
        def is_available():
            return True

    monkeypatch.setattr(mx, "cuda", _Cuda, raising=False)
    monkeypatch.setattr(mx, "default_device", lambda: mx.gpu)
    monkeypatch.delenv("MLX_CUDA_USE_CUDNN_SDPA", raising=False)


def test_where_packed_steps_are_slow_the_grid_runs_stall_free_back_to_back(monkeypatch):
    """On mlx's CUDA backend with cuDNN attention on, a packed stall_free step measured 102 ms against
    36 ms back to back (h200/scheduling_cudnn.json) and the H100 tunes ran packed stall_free several
    times slower than simulated: there tune's grid asks stall_free for fuse=False, which the engine,
    the simulator and the serve line all take; elsewhere (the CPU, Metal, cuDNN off) nothing changes."""
    from mlxlab.engine.fused import packing_warning, packs_well
    from mlxlab.engine.loop import Engine
    from mlxlab.engine.models import load_model
    from mlxlab.core.costmodel import StepCostModel
    from mlxlab.sim.simulator import Simulator

    assert packs_well() == (True, "")  # this machine: the CPU
    apart = [g for g in default_grid(packed=False) if g["policy"] == "stall_free"]
    assert apart and all(g["options"]["fuse"] is False for g in apart)
    assert all("fuse" not in g["options"] for g in default_grid(packed=False) if g["policy"] != "stall_free")
    model = load_model("tiny", dtype="float32")
    s = apart[0]
    assert Engine(model, policy=s["policy"], chunk_size=s["chunk_size"], **s["options"]).fuse is False
    assert Engine(model, policy=s["policy"], chunk_size=s["chunk_size"], token_budget=256).fuse is True
    assert Simulator(StepCostModel(), policy=s["policy"], chunk_size=s["chunk_size"], **s["options"]).fuse is False
    assert "--policy-option fuse=false" in serve_command({"choice": {"label": s["label"]}, "confirmed": [s]}, "tiny")

    _pretend_cuda_with_cudnn(monkeypatch)
    ok, why = packs_well()
    assert not ok and "cuDNN" in why
    assert "fuse=false" in packing_warning(True) and packing_warning(False) == ""  # mlxlab serve warns then
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", "0")
    assert packs_well() == (True, "") and packing_warning(True) == ""


def _doc(sim, meas, tune_s=10.0, sweep_s=100.0, choice="a"):
    grid = [{"label": k, "policy": "interleave", "chunk_size": 64, "options": {}, "objective_s": o, "slo_ratio": r}
            for k, (o, r) in sim.items()]
    rows = [{"label": k, "objective_s": o, "objective_range_s": rng, "slo_ratio": r, "meets": r <= 1,
             "meets_worst": r <= 1} for k, (o, r, rng) in meas.items()]
    return {"grid": grid, "choice": {"label": choice}, "wall_s": {"total": tune_s},
            "sweep": {"rows": rows, "repeats": 3, "wall_s": sweep_s}, "trace": {"requests": 4, "format": "mlxlab"}}


def test_regret_rank_and_speed_are_decided_from_the_stored_sweep():
    sim = {"a": (1.0, 0.5), "b": (2.0, 0.7), "c": (3.0, 0.9), "d": (4.0, 1.5)}
    meas = {"a": (1.02, 0.6, [1.0, 1.05]), "b": (2.1, 0.8, [2.0, 2.2]), "c": (3.2, 0.95, [3.1, 3.3]),
            "d": (4.1, 1.6, [4.0, 4.2])}
    v = {r["claim"]: r for r in tune_verdicts(_doc(sim, meas))}
    assert v["mlx-tune-regret"]["verdict"] == "reproduced" and v["mlx-tune-regret"]["measured"]["regret"] == 0.0
    assert v["mlx-tune-rank"]["verdict"] == "reproduced" and v["mlx-tune-rank"]["measured"]["tau_objective"] == 1.0
    assert v["mlx-tune-speed"]["verdict"] == "reproduced" and v["mlx-tune-speed"]["measured"]["speed_x"] == 0.1
    # choosing b: 2.1 against a's 1.02, and their repeats do not overlap
    v = {r["claim"]: r for r in tune_verdicts(_doc(sim, meas, tune_s=50.0, choice="b"))}
    assert v["mlx-tune-regret"]["verdict"] == "not reproduced" and v["mlx-tune-speed"]["verdict"] == "not reproduced"
    # two settings the repeats cannot tell apart
    meas2 = dict(meas, b=(1.1, 0.8, [0.95, 1.2]))
    v = {r["claim"]: r for r in tune_verdicts(_doc(sim, meas2, choice="b"))}
    assert v["mlx-tune-regret"]["verdict"] == "inconclusive"
    # the simulator ranking them backwards
    v = {r["claim"]: r for r in tune_verdicts(_doc({k: (5 - o, 2 - r) for k, (o, r) in sim.items()}, meas))}
    assert v["mlx-tune-rank"]["verdict"] == "not reproduced"
    # swaps only among settings whose measured repeats overlap: the sweep cannot order them either
    tied = {"a": (1.0, 0.5, [0.9, 1.3]), "b": (1.1, 0.6, [1.0, 1.2]), "c": (1.2, 0.7, [1.05, 1.25]),
            "d": (4.1, 1.6, [4.0, 4.2])}
    swap = {"a": (3.0, 0.5), "b": (2.0, 0.6), "c": (1.0, 0.7), "d": (4.0, 1.5)}
    v = {r["claim"]: r for r in tune_verdicts(_doc(swap, tied))}
    rank = v["mlx-tune-rank"]
    assert rank["measured"]["tau_objective"] < 0.8 and rank["verdict"] == "inconclusive"
    assert all(d["measured_overlap"] for d in rank["measured"]["discordant_objective"])
    # the same swaps where the repeats separate them: the simulator misranks
    apart = {"a": (1.0, 0.5, [0.99, 1.01]), "b": (1.1, 0.6, [1.09, 1.11]), "c": (1.2, 0.7, [1.19, 1.21]),
             "d": (4.1, 1.6, [4.0, 4.2])}
    assert {r["claim"]: r for r in tune_verdicts(_doc(swap, apart))}["mlx-tune-rank"]["verdict"] == "not reproduced"
    assert all(r["verdict"] == "not measured" for r in tune_verdicts({"grid": [], "choice": {}}))
    assert kendall_tau([1, 2], [1, 2]) is None  # too few pairs to rank


def test_a_choice_that_missed_an_slo_in_a_sweep_repeat_is_no_regret_pass_however_good_its_objective():
    """cpu/tune_full.json (2026-12-07): the race stopped after 2 repeats on the decode-window gate, which
    then met the chat's SLO in 4 of the sweep's 5 repeats at a better objective than every setting that
    met it in all 5: a negative regret against settings it is not among."""
    sim = {"a": (1.0, 0.5), "b": (2.0, 0.7), "c": (3.0, 0.9), "d": (4.0, 1.5)}
    meas = {"a": (0.9, 0.6, [0.8, 1.0]), "b": (2.1, 0.8, [2.0, 2.2]), "c": (3.2, 0.95, [3.1, 3.3]),
            "d": (4.1, 1.6, [4.0, 4.2])}
    d = _doc(sim, meas)
    d["sweep"]["rows"][0]["meets_worst"] = False  # a met the SLO at the median, not in every repeat
    v = {r["claim"]: r for r in tune_verdicts(d)}["mlx-tune-regret"]
    m = v["measured"]
    assert m["best"] == "b" and m["regret"] < 0 and m["choice_in_pool"] is False
    assert v["verdict"] == "inconclusive" and "outside those settings" in v["rule"]
    d["sweep"]["rows"][0].update(meets=False, slo_ratio=1.2)  # missed it at the median too
    assert {r["claim"]: r for r in tune_verdicts(d)}["mlx-tune-regret"]["verdict"] == "not reproduced"
    # chosen among them, as before
    assert {r["claim"]: r for r in tune_verdicts(_doc(sim, meas))}["mlx-tune-regret"]["verdict"] == "reproduced"


def test_where_no_setting_meets_the_slo_a_regret_within_the_repeats_spread_of_the_ratio_is_inconclusive():
    """Regret is then on the binding SLO's ratio (medians over the sweep's repeats); above the target,
    inconclusive where the two settings' ratios over the whole repeats (each run scored alone) overlap,
    as on the objective, and not reproduced where they part."""
    def runs(*p99s):
        return [_full_summary(p, 1.0) for p in p99s]

    def doc(chosen_p99s):
        med = {"a": sorted(chosen_p99s)[len(chosen_p99s) // 2] / 0.05, "b": 1.55}
        d = _doc({"a": (1.0, 1.5), "b": (2.0, 1.6)},
                 {"a": (1.0, med["a"], [0.9, 1.1]), "b": (2.0, med["b"], [1.9, 2.1])}, choice="a")
        d["sweep"].update(repeats=3, runs={"a": runs(*chosen_p99s), "b": runs(0.075, 0.0775, 0.08)})
        return {**d, "slos": ["chat.itl_p99<=50ms"], "solo": {}}

    spread = {r["claim"]: r for r in tune_verdicts(doc([0.07, 0.09, 0.11]))}["mlx-tune-regret"]
    m = spread["measured"]
    assert m["regret_on"] == "binding SLO ratio" and m["best"] == "b" and m["regret"] == pytest.approx(1.8 / 1.55 - 1)
    assert m["choice_ratio_range"] == pytest.approx([1.4, 2.2]) and m["best_ratio_range"] == pytest.approx([1.5, 1.6])
    assert spread["verdict"] == "inconclusive" and m["within_noise"] is True
    apart = {r["claim"]: r for r in tune_verdicts(doc([0.085, 0.09, 0.11]))}["mlx-tune-regret"]
    assert apart["measured"]["choice_ratio_range"][0] > 1.6 and apart["verdict"] == "not reproduced"


def test_regret_stays_on_the_stored_choice_and_names_the_one_this_codes_rule_picks_from_the_same_confirmation():
    """A file tuned under the older rule (the closest setting at the median, none meeting the SLO)
    keeps its verdict; evaluation says which setting the current rule picks from its stored
    confirmation, with that setting's regret against the same sweep."""
    from mlxlab.studies.tune.verdict import evaluation

    sim = {"closest": (10.0, 1.4), "near": (1.0, 1.9), "far": (0.1, 2.8)}
    meas = {"closest": (10.0, 1.5, [9.0, 11.0]), "near": (1.0, 1.4, [0.9, 1.1]), "far": (0.1, 2.6, [0.1, 0.1])}
    doc = _doc(sim, meas, choice="closest")
    doc["confirmed"] = [_row("closest", 0.03, 0.05, 10.0), _row("near", 0.04, 0.045, 1.0), _row("far", 0.052, 0.06, 0.1)]
    e = evaluation(doc)
    assert e["regret_on"] == "binding SLO ratio" and e["best"] == "near" and e["regret"] == pytest.approx(1.5 / 1.4 - 1)
    again = e["rechosen"]
    assert again["label"] == "near" and again["regret"] == 0.0 and again["objective_s"] == 1.0
    assert again["stored_objective_s"] == 10.0 and "within that spread" in again["why"]
    # the rule picks the stored choice: nothing to say; a confirmation without worst-repeat checks: nothing either
    assert "rechosen" not in evaluation({**doc, "choice": {"label": "near"}})
    old = [{k: v for k, v in r.items() if k != "checks_worst"} for r in doc["confirmed"]]
    assert "rechosen" not in evaluation({**doc, "confirmed": old})


def _full_summary(chat_itl_p99, batch_ttft_p50):
    keys = ("ttft_s", "itl_s", "e2e_s")
    out = {t: {k: {p: 0.01 for p in ("p50", "p90", "p99", "max")} for k in keys} for t in ("chat", "batch", "all")}
    out["chat"]["itl_s"]["p99"], out["batch"]["ttft_s"]["p50"] = chat_itl_p99, batch_ttft_p50
    return out


def test_a_sweep_stops_at_its_time_budget_and_resume_runs_only_the_missing_runs(monkeypatch):
    import time

    import mlxlab.core.runner as runner
    import mlxlab.studies.tune.run as tune_run
    from mlxlab.studies.tune.run import run_order, sweep

    calls, saved = [], []

    class _Run:
        def __init__(self, label):
            self.summary = _full_summary(0.01, 0.5 if label == "a" else 0.8)

    monkeypatch.setattr(tune_run, "_fresh", lambda: None)
    monkeypatch.setattr(tune_run, "_engine", lambda model, s: s["label"])
    monkeypatch.setattr(runner, "run_workload", lambda ex, wl: calls.append(ex) or _Run(ex))
    grid = [{"label": k, "policy": "interleave", "chunk_size": 64, "options": {}, "objective_s": o, "slo_ratio": 0.5}
            for k, o in (("a", 0.5), ("b", 0.8))]
    doc = {"slos": ["chat.itl_p99<=3x"], "solo": {"chat": _full_summary(0.01, 0.5)}, "tenants": ["batch", "chat"],
           "objective": "batch.ttft_p50", "grid": grid, "choice": {"label": "a"}, "wall_s": {"total": 10.0},
           "trace": {"requests": 0, "format": "mlxlab"}}
    # a deadline already past: the first run runs (nothing says how long one takes), then it stops mid-repeat
    cut = sweep(None, [], doc, repeats=3, progress=False, say=lambda s: None, deadline=time.perf_counter(),
                on_progress=saved.append)
    assert calls == ["a"] and cut["repeats"] == 0 and cut["repeats_planned"] == 3 and "at 1 of 6 runs" in cut["stopped"]
    assert cut["runs"] == {"a": [cut["runs"]["a"][0]], "b": []} and len(cut["run_wall_s"]["a"]) == 1
    assert cut["rows"] == [] and all(v["verdict"] == "not measured" for v in tune_verdicts({**doc, "sweep": cut}))
    # resumed: a's run is kept and only b runs in repeat 1, then each repeat in its own shuffled order (the
    # same as a fresh sweep's: run_order); progress is saved after every run but the last
    assert cut["order"] == "shuffle" and [run_order(["a", "b"], r) for r in (1, 2)] == [["b", "a"], ["b", "a"]]
    whole = sweep(None, [], {**doc, "sweep": cut}, repeats=3, progress=False, say=lambda s: None,
                  on_progress=saved.append)
    assert calls == ["a", "b", "b", "a", "b", "a"] and whole["repeats"] == 3 and "stopped" not in whole
    assert [sum(map(len, b["runs"].values())) for b in saved] == [1, 2, 3, 4, 5] and len(whole["runs"]["b"]) == 3
    assert [b["repeats"] for b in saved] == [0, 1, 1, 2, 2] and len(whole["repeat_wall_s"]) == 3
    assert whole["wall_s"] == pytest.approx(sum(whole["run_wall_s"]["a"]) + sum(whole["run_wall_s"]["b"]))
    # the budget is read per setting: a fast setting still runs where the slowest one would not fit
    calls.clear()
    one = {**cut, "runs": {"a": whole["runs"]["a"][:1], "b": whole["runs"]["b"][:1]},
           "run_wall_s": {"a": [100.0], "b": [1.0]}}
    part = sweep(None, [], {**doc, "sweep": one}, repeats=3, progress=False, say=lambda s: None,
                 deadline=time.perf_counter() + 50)
    assert calls == ["b"] and "the next (a, 100 s at its slowest)" in part["stopped"]
    assert [r["label"] for r in whole["rows"]] == ["a", "b"] and whole["rows"][0]["objective_s"] == 0.5
    # speed: tune's 10 s against a sweep cut to 2 of 5 repeats in 40 s compares 100 s, not 40
    two = {**whole, "repeats": 2, "repeats_planned": 5, "repeat_wall_s": [20.0, 20.0], "wall_s": 40.0}
    speed = {r["claim"]: r for r in tune_verdicts({**doc, "sweep": two})}["mlx-tune-speed"]
    assert speed["measured"]["speed_x"] == pytest.approx(0.1) and speed["measured"]["sweep_wall_s"] == 40.0


def test_resume_refuses_a_file_run_with_other_arguments(tmp_path, monkeypatch, capsys):
    from mlxlab.cli import main

    monkeypatch.setattr("mlxlab.cli.reexec_with_fast_blas", lambda: None)
    p = tmp_path / "tune.json"
    p.write_text(json.dumps({"grid": [], "solo": {}, "choice": {}, "environment": {},
                             "parameters": {"model": "small", "slo": ["chat.itl_p99<=3x"]}}))
    args = ["tune", "--model", "tiny", "--workload", "chat+batch", "--slo", "chat.itl_p99<=3x", "--resume", str(p)]
    assert main(args) == 2
    assert "these differ: model 'tiny' (stored 'small')" in capsys.readouterr().err
    p.write_text("{}")
    assert main(args) == 2 and "not a tune results file" in capsys.readouterr().err


def test_calibration_uses_the_first_solo_run_with_an_itl_and_skips_without_one():
    from mlxlab.core.costmodel import StepCostModel
    from mlxlab.core.workload import Arrival
    from mlxlab.studies.tune.calibrate import calibrate_from_solos, solo_itl_p50

    cm = StepCostModel.from_coefficients({"decode_step": 3e-3, "prefill_tokens": 1e-5})
    arrivals = [Arrival(0.0, "chat", 0, [1] * 50, 20), Arrival(0.5, "batch", 1, [1] * 400, 2)]
    limits = {"vocab_size": 100, "max_context": 4096}
    solo = lambda p50: {"chat": {"itl_s": {"p50": p50}}}  # noqa: E731
    out, rec = calibrate_from_solos(cm, arrivals, limits, {"chat": solo(0.005), "all": {}})
    assert rec["tenant"] == "chat" and rec["decode_step_s"] == [pytest.approx(3e-3), pytest.approx(5e-3)]
    assert solo_itl_p50(out, arrivals, limits, "chat") == pytest.approx(0.005)
    assert calibrate_from_solos(cm, arrivals, limits, {"chat": solo(float("nan"))}) == (cm, None)
    assert calibrate_from_solos(cm, arrivals, limits, {}) == (cm, None)


def test_calibration_brackets_a_p50_that_jumps_and_never_ends_farther_than_it_began():
    """The solo p50 grows with decode_step in steps (the chats' decodes meet or part): adding the gap five
    times over, as tune did until 12-07, ended 3.3 ms off on a CPU tune that began 2.4 ms off. The search
    brackets the measured p50, bisects, and keeps the closest point it simulated."""
    from mlxlab.core.costmodel import FEATURES, StepCostModel
    from mlxlab.studies.tune.calibrate import calibrate_decode

    i = FEATURES.index("decode_step")
    cm = StepCostModel.from_coefficients({"decode_step": 0.010, "prefill_tokens": 1e-5})
    # p50 = decode_step + 1 ms, and 4 ms more once decode_step passes 11 ms (no point gives 13.35 ms)
    jump = lambda m: m.coef[i] + 0.001 + (0.004 if m.coef[i] > 0.011 else 0.0)  # noqa: E731
    out, rec = calibrate_decode(cm, [], {}, "chat", 0.01335, simulate=jump)
    before, after = rec["simulated_itl_p50_s"]
    assert before == pytest.approx(0.011) and abs(after - 0.01335) <= abs(before - 0.01335)
    assert after == pytest.approx(0.012, abs=1e-5) and out.coef[i] == pytest.approx(rec["decode_step_s"][1])
    smooth = lambda m: 2 * m.coef[i]  # noqa: E731 - twice as steep: the old loop overshot and swung
    out, rec = calibrate_decode(cm, [], {}, "chat", 0.030, simulate=smooth)
    assert rec["simulated_itl_p50_s"][1] == pytest.approx(0.030, abs=1e-6) and out.coef[i] == pytest.approx(0.015)
    # above the measured p50 even at no decode cost: the closest is 0, never below
    out, rec = calibrate_decode(cm, [], {}, "chat", 0.0005, simulate=jump)
    assert rec["decode_step_s"][1] == 0.0 and rec["simulated_itl_p50_s"][1] == pytest.approx(0.001)


def test_output_scale_takes_tenant_equals_factor_and_refuses_a_preset(monkeypatch, capsys):
    from mlxlab.cli import main
    from mlxlab.cli.tune import tenant_factor

    assert tenant_factor("chat=4") == ("chat", 4.0) and tenant_factor(" chat =0.5") == ("chat", 0.5)
    for bad in ("chat", "=4", "chat=0", "chat=x"):
        with pytest.raises(argparse.ArgumentTypeError):
            tenant_factor(bad)
    monkeypatch.setattr("mlxlab.cli.reexec_with_fast_blas", lambda: None)
    args = ["tune", "--model", "tiny", "--workload", "chat+batch", "--slo", "chat.itl_p99<=3x", "--output-scale", "chat=2"]
    assert main(args) == 2 and "--output-scale scales a trace's tenants" in capsys.readouterr().err


def test_a_tune_json_hands_serve_its_choice_and_refuses_one_without(tmp_path):
    doc = {"choice": {"label": "stall_free-512", "meets": True}, "parameters": {"model": "small"},
           "confirmed": [{"label": "stall_free-512", "policy": "stall_free", "chunk_size": 2048,
                          "options": {"token_budget": 512}},
                         {"label": BASELINE, "policy": BASELINE, "chunk_size": 2048, "options": {}}]}
    p = tmp_path / "tune.json"
    p.write_text(json.dumps(doc))
    assert serve_settings(str(p)) == {"policy": "stall_free", "chunk_size": 2048, "options": {"token_budget": 512},
                                      "model": "small", "meets": True, "overlap": False}
    assert serve_command(doc, "small") == ("mlxlab serve --model small --policy stall_free --chunk-size 2048 "
                                           "--policy-option token_budget=512 --no-overlap")
    p.write_text(json.dumps(dict(doc, choice={"label": BASELINE})))
    with pytest.raises(ValueError, match="no chosen mlxlab setting"):
        serve_settings(str(p))


def test_mlxlab_tune_on_a_trace_ends_with_a_choice_a_serve_line_and_its_files(tmp_path):
    data = tmp_path / "data"
    for sub in ("models", "claims"):
        src = ROOT / "data" / sub
        if src.is_dir():
            import shutil

            shutil.copytree(src, data / sub)
    trace = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 0, "input_length": 200, "output_length": 6, "hash_ids": [1]},
            {"timestamp": 10, "input_length": 40, "output_length": 12, "hash_ids": []},
            {"timestamp": 20, "input_length": 300, "output_length": 4, "hash_ids": [1, 2]},
            {"timestamp": 30, "input_length": 40, "output_length": 12, "hash_ids": []}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "MLXLAB_DATA": str(data)}
    cmd = [sys.executable, "-m", "mlxlab.cli", "tune", "--model", "tiny", "--dtype", "float32", "--trace", str(trace),
           "--split-tokens", "100", "--length-scale", "0.5", "--output-scale", "chat=2", "--slo", "chat.itl_p99<=3x",
           "--quick", "--repeats", "2", "--warm-up", "on",
           "--top-k", "1", "--platform", "scratch"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "serve it:" in out.stdout and "mlxlab serve --model tiny" in out.stdout
    path = Path(out.stdout.strip().splitlines()[-1].removeprefix("wrote "))
    doc = json.loads(path.read_text())
    assert doc["trace"]["tenants"] == {"batch": 2, "chat": 2} and doc["slos"] == ["chat.itl_p99<=3x"]
    # the chats' 12 tokens, halved by --length-scale, doubled by --output-scale; documents' 6 and 4 halved
    assert doc["parameters"]["output_scale"] == {"chat": 2.0} and doc["trace"]["max_tokens"]["max"] == 12
    assert doc["trace"]["max_tokens"]["min"] == 2 and doc["trace"]["notes"][-1] == "outputs scaled: chat x2"
    assert [s["slo"] for s in doc["slo_samples"]] == doc["slos"] and "samples a run in this trace" in out.stdout
    # 22 gaps: the p99 is their largest, so 20x the tokens reach the #20, over the x2 given: chat=40
    assert "thin:" in out.stdout and "--output-scale chat=40)" in out.stdout
    # the grid was simulated on the profile with its decode cost moved to the chat's solo run
    cal = doc["calibration"]
    assert cal["tenant"] == "chat" and cal["measured_itl_p50_s"] == doc["solo"]["chat"]["chat"]["itl_s"]["p50"]
    assert cal["cost_model"]["coef"] != doc["profile"]["cost_model"]["coef"] and "decode cost calibrated" in out.stdout
    assert len(doc["grid"]) == len(default_grid(True, 150)) and doc["frontier"] and doc["grid_name"] == "standard"
    assert {r["label"] for r in doc["confirmed"]} >= {BASELINE} and doc["choice"]["label"] != BASELINE
    # --warm-up on: each confirmed setting ran once first, not kept; each kept run's SLO ratio, in order
    assert set(doc["confirm_warm_up"]["runs_s"]) == {r["label"] for r in doc["confirmed"]}
    assert all(len(r["repeat_ratios"]) == r["repeats"] and max(r["repeat_ratios"]) == pytest.approx(
        max(c["ratio"] for c in r["checks_worst"])) for r in doc["confirmed"]) and doc["parameters"]["warm_up"] == "on"
    assert "warmed the process up with one run of each" in out.stdout and "after a run not kept" in out.stdout
    assert re.search(r"chat alone: itl_p99 [\d.]+ ms \(median of 2 runs, [\d.]+-[\d.]+ ms\)", out.stdout)
    assert doc["solo_runs"]["chat"]["warm_up_s"] > 0 and len(doc["solo_runs"]["chat"]["runs"]) == 2
    assert doc["solo"]["chat"] and doc["profile"]["cached"] is False and (path.parent / "tune.png").is_file()
    # the chat's solo runs are timed apart from the simulation (they are engine runs, not simulated ones)
    w = doc["wall_s"]
    assert w["solo"] > 0 and w["total"] == pytest.approx(w["profile"] + w["solo"] + w["simulate"] + w["confirm"], abs=0.5)
    assert "mooncake.jsonl" in doc["environment"]["argv"] and str(tmp_path) not in json.dumps(doc["parameters"])
    assert str(tmp_path) not in json.dumps(doc["environment"]["argv"])
    assert serve_settings(str(path))["policy"] == next(r["policy"] for r in doc["confirmed"]
                                                       if r["label"] == doc["choice"]["label"])
    again = subprocess.run(cmd + ["--top-k", "1", "--no-baseline", "--steady"], capture_output=True, text=True,
                           timeout=600, env=env, cwd=tmp_path)
    assert again.returncode == 0 and "profile from the cache" in again.stdout  # the second run reuses the profile
    # --steady: simulated on second runs, and its confirmation warmed up whatever the device
    steady = json.loads(Path(again.stdout.strip().splitlines()[-1].removeprefix("wrote ")).read_text())
    assert steady["steady"] is True and steady["parameters"]["steady"] is True
    assert set(steady["confirm_warm_up"]["runs_s"]) == {r["label"] for r in steady["confirmed"]}
    # the exhaustive sweep of the first run's grid, run later on the stored file: two repeats, verdicts, in place
    # first cut by a budget after its first run (its verdicts: not measured), then resumed to the end: the
    # file's verdicts are decided again from the whole sweep, not kept from the cut call's file
    first = cmd[:cmd.index("--top-k")]
    cut = subprocess.run(first + ["--top-k", "1", "--time-budget-s", "0.001", "--resume", str(path)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert cut.returncode == 0, cut.stderr[-3000:]
    doc = json.loads(path.read_text())
    assert doc["sweep"]["repeats"] == 0 and sum(map(len, doc["sweep"]["runs"].values())) == 1
    assert {v["verdict"] for v in doc["verdicts"]} == {"not measured"}
    swept = subprocess.run(first + ["--top-k", "1", "--resume", str(path)], capture_output=True, text=True, timeout=600,
                           env={**env, "MLXLAB_SOURCE_COMMIT": "abc1234"}, cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr[-3000:]
    doc = json.loads(path.read_text())
    # one setting of each schedule the simulation found twice is replayed, and none of the others was confirmed
    assert doc["sweep"]["repeats"] == 2 and len(doc["sweep"]["rows"]) == len(doc["grid"]) - len(doc["same_schedule"])
    assert not {r["label"] for r in doc["confirmed"]} & set(doc["same_schedule"])
    assert len(doc["sweep"]["calls"]) == 3 and {v["claim"] for v in doc["verdicts"]} >= {"mlx-tune-regret"}
    # each resuming call (a new process) warmed up first, and names the commit its caller declared
    assert all(c["warm_up"]["label"] in doc["sweep"]["runs"] for c in doc["sweep"]["calls"][1:])
    # each call names the runs it made, in order: the cut call one, the last the rest; none at top level
    ran = [c.get("ran") for c in doc["sweep"]["calls"]]
    assert ran[0] is None and len(ran[1]) == 1 and len(ran[1]) + len(ran[2]) == 2 * len(doc["sweep"]["rows"])
    assert "ran" not in doc["sweep"]
    assert doc["sweep"]["calls"][-1]["source_commit"] == "abc1234"
    assert not any("whole repeat(s) of" in v["rule"] for v in doc["verdicts"])


@pytest.mark.parametrize("top_s, log", [(16.0, True), (1.0, False)])
def test_the_tune_figure_puts_objectives_spanning_orders_of_magnitude_on_a_log_axis(top_s, log):
    """The H200 tune's objectives ran from 0.2 s to 16 s: on a linear axis every useful setting sat
    on the floor. Past a 30x spread the objective axis is logarithmic; below it, linear from zero."""
    from mlxlab.studies.tune.charts import tune_chart

    grid = [{"label": f"s{i}", "slo_ratio": 1.0 + i, "objective_s": y, "policy": "slo"}
            for i, y in enumerate([0.2, 0.5, top_s])]
    spec = tune_chart({"grid": grid, "frontier": ["s0"], "confirmed": [], "slos": ["chat.itl_p99<=2x"],
                       "objective": "batch.ttft_p50", "choice": {}}).to_dict()
    scales = [layer["encoding"]["y"].get("scale", {}) for layer in spec["layer"]
              if layer.get("encoding", {}).get("y", {}).get("field") == "y"]
    assert scales and all((s.get("type") == "log") == log for s in scales)
    assert all(s["domain"][0] > 0 for s in scales) if log else all(s["domain"][0] == 0 for s in scales)


def test_rescore_draws_a_stored_tune_files_figure_named_by_its_platform(tmp_path, monkeypatch, capsys):
    """A GPU machine has no altair, so its tune files come back without their figure: `mlxlab rescore
    --figure` draws it here from the stored file, as NAME_PLATFORM; a study without a chart says so."""
    import shutil

    import mlxlab.studies.sim_validation.charts as charts
    from mlxlab.cli import main

    monkeypatch.setattr("mlxlab.cli.reexec_with_fast_blas", lambda: None)
    monkeypatch.setattr(charts, "FIGURES", tmp_path / "figures")
    (tmp_path / "h100").mkdir()
    p = tmp_path / "h100" / "tune_small.json"
    shutil.copy(ROOT / "data" / "results" / "cpu" / "tune.json", p)
    assert main(["rescore", "--figure", str(p)]) == 0
    assert (tmp_path / "figures" / "tune_small_h100.png").stat().st_size > 1000
    assert "mlx-tune-regret" in capsys.readouterr().out
    (tmp_path / "cpu").mkdir()
    q = tmp_path / "cpu" / "admission_gate.json"
    shutil.copy(ROOT / "data" / "results" / "cpu" / "admission_gate.json", q)
    assert main(["rescore", "--figure", str(q)]) == 2
    assert "draws no figure from a stored file" in capsys.readouterr().err


def test_on_cuda_with_cudnn_attention_cold_chunks_are_counted_by_shape(monkeypatch):
    """mlx's CUDA backend with cuDNN attention keeps one graph per exact attention shape (an LRU of
    MLX_CUDA_SDPA_CACHE_SIZE, 256 by default): there the profile's rig counts a chunk cold by token
    count and key length, the fitted model keeps that key, and tune's profile cache does not hand a
    size-keyed profile to it; on the CPU (and with cuDNN attention off) nothing changes."""

    from mlxlab.engine.fused import cold_keying
    from mlxlab.engine.models import load_model
    from mlxlab.sim.fit import fit_cost_model
    from mlxlab.sim.rig import Bench
    from mlxlab.studies.tune.run import profile_key

    assert cold_keying() == ("size", None, "")  # this machine: the CPU
    model = load_model("tiny", dtype="float32")
    grid = {"prefill_tokens": [16]}
    cpu_key = profile_key(model, grid)

    _pretend_cuda_with_cudnn(monkeypatch)
    monkeypatch.delenv("MLX_CUDA_SDPA_CACHE_SIZE", raising=False)
    key, capacity, why = cold_keying()
    assert (key, capacity) == ("shape", 256) and "cuDNN" in why
    monkeypatch.setenv("MLX_CUDA_SDPA_CACHE_SIZE", "1024")
    assert cold_keying()[:2] == ("shape", 1024)
    bench = Bench(model, prefill_tokens=[16], decode_contexts=[32], repeats=1, fill_chunk=16, mixed=False, seed=0)
    assert bench._cold([[16, 0]]) == 1 and bench._cold([[16, 16]]) == 1 and bench._cold([[16, 0]]) == 0
    recs = [{"kind": "prefill", "duration_s": 0.1, "prefill_chunks": [[16, 0]], "prefill_tokens": 16,
             "cold_key": bench.warm.key, "cold_capacity": bench.warm.capacity}]
    cm = fit_cost_model(recs)
    assert (cm.cold_key, cm.cold_capacity) == ("shape", 1024)
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", "0")
    assert cold_keying() == ("size", None, "")
    monkeypatch.undo()  # the device summary in the profile key needs the real device
    import mlxlab.engine.fused as fused

    assert profile_key(model, grid) == cpu_key
    monkeypatch.setattr(fused, "cold_keying", lambda: ("shape", 256, "cuDNN"))
    assert profile_key(model, grid) != cpu_key


def test_on_a_shape_keyed_device_stall_free_aligns_its_chunks_to_half_its_budget_and_meets_fewer_shapes():
    """Where attention is prepared per exact shape (cuDNN on mlx's CUDA backend), tune's grid runs
    ``stall_free`` with ``key_align`` half its budget (and ``slo`` at 512): its chunks then end on few
    key lengths, so the shapes repeat prompt after prompt. Simulated with a shape-keyed cost model whose first use of a
    shape costs 60 ms (the H100's probe found 66 ms), the chat's median gap and the documents' wait
    both shrink; elsewhere the grid is as before."""
    from mlxlab.core.costmodel import FEATURES, StepCostModel
    from mlxlab.core.runner import run_workload
    from mlxlab.core.traces import read_trace, scale_trace, to_arrivals
    from mlxlab.core.workload import TraceWorkload
    from mlxlab.sim.simulator import Simulator

    plain = {g["label"]: g["options"] for g in default_grid()}
    keyed = {g["label"]: g["options"] for g in default_grid(shape_keyed=True)}
    assert keyed["stall_free-256"] == {"token_budget": 256, "key_align": 128}
    assert keyed["stall_free-1024"]["key_align"] == 512 and "key_align" not in plain["stall_free-256"]
    assert keyed["slo-4096"] == {"key_align": 512} and plain["slo-4096"] == {}
    assert {k: v for k, v in keyed.items() if not k.startswith(("stall_free", "slo"))} == \
        {k: v for k, v in plain.items() if not k.startswith(("stall_free", "slo"))}

    cost = {"decode_step": 5e-3, "decode_batch": 3e-4, "prefill_chunks": 10e-3, "prefill_tokens": 15e-6,
            "cold_chunks": 60e-3}
    cm = StepCostModel.from_dict({"features": list(FEATURES), "coef": [cost.get(f, 0.0) for f in FEATURES],
                                  "cold_key": "shape", "cold_capacity": 256})
    trace = scale_trace(read_trace("data/traces/samples/seed001_scene_tiny.jsonl"), length_scale=4)
    arrivals = to_arrivals(trace, 32000, 0)

    def run(options):
        sim = Simulator(cm, policy="stall_free", chunk_size=2048, vocab_size=32000, max_context=32768, **options)
        return run_workload(sim, TraceWorkload(arrivals, name="trace")).summary

    before, after = run(plain["stall_free-256"]), run(keyed["stall_free-256"])
    assert after["chat"]["itl_s"]["p50"] < 0.5 * before["chat"]["itl_s"]["p50"]
    assert after["batch"]["ttft_s"]["p50"] < before["batch"]["ttft_s"]["p50"]


def test_the_sweep_shuffles_each_repeat_the_same_way_every_time_and_an_older_file_goes_on_rotating(monkeypatch):
    """What ran before in the process moves a setting's tail, so the sweep and the confirmation run
    each repeat in its own seeded order (every setting meets other predecessors across repeats, and a
    resumed sweep or a re-run draws the same orders); a sweep stored before orders were named
    (no ``order`` in its block) goes on rotating, so one file keeps one protocol."""
    from mlxlab.core import runner
    from mlxlab.studies.tune import run as tune_run
    from mlxlab.studies.tune.run import run_order, sweep
    from mlxlab.studies.tune.verdict import tune_verdicts

    labels = [f"s{i}" for i in range(12)]
    orders = [run_order(labels, r) for r in range(3)]
    assert orders == [run_order(labels, r) for r in range(3)] and all(sorted(o) == sorted(labels) for o in orders)
    before = [{o[i + 1]: o[i] for i in range(len(o) - 1)} for o in orders]  # each setting's predecessor
    assert sum(len({b.get(s) for b in before}) > 1 for s in labels) >= 9  # rotation: none
    assert run_order(labels, 1, "rotation") == labels[1:] + labels[:1]
    with pytest.raises(ValueError, match="one of shuffle, rotation, balanced"):
        run_order(labels, 0, "random")

    calls = []

    class _Run:
        summary = _full_summary(0.01, 0.5)

    monkeypatch.setattr(tune_run, "_fresh", lambda: None)
    monkeypatch.setattr(tune_run, "_engine", lambda model, s: s["label"])
    monkeypatch.setattr(runner, "run_workload", lambda ex, wl: calls.append(ex) or _Run())
    grid = [{"label": k, "policy": "interleave", "chunk_size": 64, "options": {}, "objective_s": 0.5, "slo_ratio": 0.5}
            for k in ("a", "b", "c")]
    doc = {"slos": ["chat.itl_p99<=3x"], "solo": {"chat": _full_summary(0.01, 0.5)}, "tenants": ["batch", "chat"],
           "objective": "batch.ttft_p50", "grid": grid, "choice": {"label": "a"}, "wall_s": {"total": 10.0},
           "trace": {"requests": 0, "format": "mlxlab"}}
    fresh = sweep(None, [], doc, repeats=2, progress=False, say=lambda s: None)
    assert calls == [s["label"] for r in range(2) for s in run_order(grid, r)] and fresh["order"] == "shuffle"
    assert "shuffled per repeat" in tune_verdicts({**doc, "sweep": fresh})[0]["fairness"]
    calls.clear()
    old = {k: v for k, v in fresh.items() if k != "order"}  # as stored before: rotation from here on
    old["runs"] = {"a": old["runs"]["a"][:1], "b": [], "c": []}
    old["run_wall_s"] = {"a": [1.0], "b": [], "c": []}
    more = sweep(None, [], {**doc, "sweep": old}, repeats=2, progress=False, say=lambda s: None)
    assert calls == ["b", "c", "b", "c", "a"] and more["order"] == "rotation"
    assert "rotating order" in tune_verdicts({**doc, "sweep": more})[0]["fairness"]


def _counted_sweep(monkeypatch):
    """The sweep's engine runs replaced by a counter: the list of labels run, in order; run n's batch TTFT is
    0.5 + n, so a kept run tells which run it was."""
    from mlxlab.core import runner
    from mlxlab.studies.tune import run as tune_run

    calls = []

    class _Run:
        def __init__(self, n):
            self.summary = _full_summary(0.01, 0.5 + n)

    monkeypatch.setattr(tune_run, "_fresh", lambda: None)
    monkeypatch.setattr(tune_run, "_engine", lambda model, s: s["label"])
    monkeypatch.setattr(runner, "run_workload", lambda ex, wl: calls.append(ex) or _Run(len(calls) - 1))
    return calls


def _sweep_doc(labels) -> dict:
    """A tune document with a grid of ``labels`` (interleave, 64-token chunks) and one SLO."""
    grid = [{"label": k, "policy": "interleave", "chunk_size": 64, "options": {}, "objective_s": 0.5, "slo_ratio": 0.5}
            for k in labels]
    return {"slos": ["chat.itl_p99<=3x"], "solo": {"chat": _full_summary(0.01, 0.5)}, "tenants": ["batch", "chat"],
            "objective": "batch.ttft_p50", "grid": grid, "choice": {"label": "a"}, "wall_s": {"total": 10.0},
            "trace": {"requests": 0, "format": "mlxlab"}}


def test_a_resumed_sweep_warms_its_fresh_process_up_with_one_run_it_does_not_keep(monkeypatch):
    """A resumed sweep starts in a new process, whose first run pays first uses (on an H100, 125 s
    where the same setting's later runs took 28-30 s): ``warm_up`` runs the first setting to run once
    more before it and keeps only the second; the block names the warm-up. Nothing left: no run."""
    from mlxlab.studies.tune.run import run_order, sweep

    calls, seen = _counted_sweep(monkeypatch), []
    doc = _sweep_doc(("a", "b"))
    grid = doc["grid"]
    out = sweep(None, [], doc, repeats=1, progress=False, say=lambda s: None, warm_up=True, on_progress=seen.append)
    first = run_order(grid, 0)[0]["label"]
    assert calls == [first] + [s["label"] for s in run_order(grid, 0)]
    assert out["warm_up"]["label"] == first and out["warm_up"]["wall_s"] >= 0 and seen[0]["warm_up"] == out["warm_up"]
    # the warm-up's run (TTFT 0.5) is not kept: the first kept run of that setting is the second run
    assert [r["batch"]["ttft_s"]["p50"] for r in out["runs"][first]] == [1.5]
    assert out["ran"] == [[0, s["label"]] for s in run_order(grid, 0)]  # the kept runs, in the order they ran
    calls.clear()
    again = sweep(None, [], {**doc, "sweep": out}, repeats=1, progress=False, say=lambda s: None, warm_up=True)
    assert calls == [] and "warm_up" not in again


def test_a_steady_sweep_runs_each_setting_once_unkept_before_its_first_kept_run_in_the_process(monkeypatch):
    """A steady tune (``--steady``) scores every setting warm: its sweep runs each setting this process has
    not run yet once, not kept, before the first kept run (the fresh call's confirmed settings count as
    run), never again in later repeats, and in place of the resumed call's single warm-up."""
    from mlxlab.studies.tune.run import run_order, sweep

    calls = _counted_sweep(monkeypatch)
    doc = _sweep_doc(("a", "b", "c"))
    grid = doc["grid"]
    out = sweep(None, [], doc, repeats=2, progress=False, say=lambda s: None, warm_up=True, warm_each={"a"})
    first = [s["label"] for s in run_order(grid, 0)]
    expect = [lb for lb in first for _ in range(1 if lb == "a" else 2)] + [s["label"] for s in run_order(grid, 1)]
    assert calls == expect and set(out["warm_each"]) == {"b", "c"} and "warm_up" not in out
    # each kept first run is the one after its warm-up: b's and c's first kept runs are not the run before them
    for lb in ("b", "c"):
        kept = out["runs"][lb][0]["batch"]["ttft_s"]["p50"] - 0.5
        assert calls[int(kept)] == lb and calls[int(kept) - 1] == lb
    assert sum(map(len, out["runs"].values())) == 6 and len(out["ran"]) == 6


def test_the_steady_simulation_scores_a_settings_second_run_with_the_first_runs_shapes_warm():
    """``tune(steady=True)`` simulates each setting as ``probes/warm_carry_sim.py``'s ``steady`` way does
    (a run after one of itself): on a cost model that charges cold shapes, never slower than a cold run."""
    from mlxlab.studies.tune.run import simulate_setting
    from probes.key_align_sim import load_point
    from probes.warm_carry_sim import simulate
    from tests.test_warm_carry_sim import _doc

    doc = _doc()
    point = load_point(doc, "data/traces/samples")
    doc["sweep"] = {"repeats": 1, "runs": {}, "order": "shuffle"}  # carried: one pass (not looked at here)
    ways = simulate(doc, point)
    for g, st, fr in zip(doc["grid"], ways["steady"], ways["fresh"]):
        s = {k: g[k] for k in ("label", "policy", "chunk_size", "options")}
        steady = simulate_setting({**point, "setting": s, "steady": True})
        cold = simulate_setting({**point, "setting": s})
        assert steady["objective_s"] == st["objective_s"] and cold["objective_s"] == fr["objective_s"]
        assert steady["objective_s"] <= cold["objective_s"]
    assert any(a["objective_s"] < b["objective_s"] for a, b in zip(ways["steady"], ways["fresh"]))


def test_slo_ratio_pairs_the_sweeps_repeats_cannot_order_are_told_apart_from_misranks():
    """The binding SLO's ratio gets a per-repeat range from the stored runs (each repeat scored
    alone), so a pair the simulator swaps is flagged as within the repeats' spread only when the
    ranges overlap; with no runs the range is unknown and the pair counts as ordered."""
    from mlxlab.studies.tune.verdict import evaluation, ratio_range

    solo = {"chat": _full_summary(0.010, 0.5)}  # the chat alone: ITL p99 10 ms, so 3x is 30 ms
    runs = {"a": [_full_summary(p, 0.5) for p in (0.030, 0.045, 0.036)],   # ratios 1.0, 1.5, 1.2
            "b": [_full_summary(p, 0.5) for p in (0.033, 0.039, 0.042)],   # 1.1, 1.3, 1.4: overlaps a
            "c": [_full_summary(p, 0.5) for p in (0.090, 0.093, 0.096)]}   # 3.0-3.2: apart from both
    assert ratio_range({"slos": ["chat.itl_p99<=3x"], "solo": solo, "sweep": {"runs": runs, "repeats": 3}},
                       "a") == pytest.approx([1.0, 1.5])
    assert ratio_range({"slos": ["chat.itl_p99<=3x"], "solo": solo, "sweep": {"runs": runs, "repeats": 2}},
                       "a") == pytest.approx([1.0, 1.5])  # repeats 2: the first two runs only
    assert ratio_range({"slos": ["chat.itl_p99<=3x"], "solo": solo, "sweep": {"runs": {}, "repeats": 3}}, "a") is None
    med = {"a": 1.2, "b": 1.3, "c": 3.1}
    sim = {"a": 1.4, "b": 1.1, "c": 1.0}  # b before a (noise) and c first (a misrank)
    doc = {"slos": ["chat.itl_p99<=3x"], "solo": solo, "choice": {"label": "a"}, "wall_s": {"total": 1.0},
           "grid": [{"label": k, "objective_s": 1.0 + i, "slo_ratio": sim[k]} for i, k in enumerate("abc")],
           "sweep": {"runs": runs, "repeats": 3, "wall_s": 10.0,
                     "rows": [{"label": k, "objective_s": 1.0 + i, "objective_range_s": [1.0 + i, 1.0 + i],
                               "slo_ratio": med[k], "meets": False} for i, k in enumerate("abc")]}}
    pairs = {tuple(d["pair"]): d["measured_overlap"] for d in evaluation(doc)["discordant_slo"]}
    assert pairs == {("a", "b"): True, ("a", "c"): False, ("b", "c"): False}


def test_serve_warns_of_chunk_ends_on_new_key_lengths_where_attention_is_prepared_per_shape(monkeypatch):
    """On mlx's CUDA backend with cuDNN attention on, stall_free and slo run without an alignment of
    their own meet a new attention shape nearly every step (on an H100, coder-1.5b's stall_free-256
    gave the chat a 215 ms ITL p99, 43 ms with key_align=128): ``mlxlab serve`` says which
    key_align tune's grid would run, the same rule the grid uses; nothing on the CPU, for a fixed
    chunk size, or where the user chose an alignment."""
    from mlxlab.core.plan import SLO_KEY_ALIGN_SHAPES
    from mlxlab.engine.fused import alignment_warning, shape_alignment

    assert alignment_warning("stall_free", {}) == ""  # this machine: the CPU
    _pretend_cuda_with_cudnn(monkeypatch)
    assert "key_align=256" in alignment_warning("stall_free", {})  # stall_free's default budget, 512
    assert "key_align=128" in alignment_warning("stall_free", {"token_budget": 256})
    assert f"key_align={SLO_KEY_ALIGN_SHAPES}" in alignment_warning("slo", {})
    assert alignment_warning("stall_free", {"key_align": 64}) == "" and alignment_warning("interleave", {}) == ""
    assert shape_alignment("stall_free", {"token_budget": 8}) == 8  # never below the engine's own alignment
    grid = default_grid(shape_keyed=True)
    assert all(g["options"]["key_align"] == shape_alignment(g["policy"], g["options"]) for g in grid
               if g["policy"] in ("stall_free", "slo"))
    monkeypatch.setenv("MLX_CUDA_USE_CUDNN_SDPA", "0")
    assert alignment_warning("stall_free", {}) == ""


def test_tune_says_how_many_samples_an_slo_rests_on_in_the_trace():
    """A chat's ITL p99 over ~1,000 gaps is about its 10th largest gap, and the distribution's own
    p99 lies between its 5th and 18th largest (binomial order statistics): tune says so per SLO,
    so a figure decided by a handful of gaps is read as such. TTFT counts requests; max is the
    largest sample."""
    from mlxlab.core.workload import Arrival
    from mlxlab.studies.tune.slo import parse_slo, support

    arrivals = [Arrival(0.0, "chat", i, [1, 2, 3], 114) for i in range(9)]
    arrivals += [Arrival(0.0, "batch", i, [1] * 40, 8) for i in range(22)]
    itl = support(parse_slo("chat.itl_p99<=3x"), arrivals)
    assert itl == {"slo": "chat.itl_p99<=3x", "n": 9 * 113, "rank": 10, "rank_95": [5, 18], "thin": True, "more": 2}
    assert support(parse_slo("batch.ttft_p50<=2x"), arrivals)["n"] == 22
    assert support(parse_slo("all.ttft_p90<=2s"), arrivals)["n"] == 31
    assert support(parse_slo("chat.itl_max<=1s"), arrivals)["rank_95"] == [1, 1]
    wide, narrow = (support(parse_slo("chat.itl_p99<=3x"), arrivals * k) for k in (1, 10))
    # ten times the gaps: the interval narrows relative to the figure's rank
    spread = [(s["rank_95"][1] - s["rank_95"][0]) / s["rank"] for s in (wide, narrow)]
    assert spread[1] < spread[0]
    assert narrow["rank"] == 102 and not narrow["thin"]  # a p99 over ten times the gaps is not thin


def test_agreement_sets_the_sweeps_own_repeats_beside_the_simulation_run_by_run(capsys):
    """Beside the rank claim: how well one engine run orders the grid against another (median tau
    over the pairs of whole repeats) and the simulation against one run (median over the repeats),
    per metric; a partial repeat is left out, and fewer than two whole repeats give nothing."""
    from mlxlab.studies.tune.verdict import agreement, evaluation

    solo = {"chat": _full_summary(0.010, 0.5)}
    p99 = [(0.030, 0.033, 0.036, 0.039), (0.039, 0.036, 0.033, 0.030), (0.030, 0.033, 0.036, 0.039),
           (0.050, 0.010, 0.010, 0.010)]  # the third repeat as the first, the second reversed; a partial fourth
    objs = (1.0, 2.0, 3.0, 4.0)
    runs = {k: [_full_summary(p99[r][i], objs[i]) for r in range(4 if k == "a" else 3)] for i, k in enumerate("abcd")}
    doc = {"slos": ["chat.itl_p99<=3x"], "objective": "batch.ttft_p50", "solo": solo,
           "grid": [{"label": k, "objective_s": objs[i], "slo_ratio": 1.0 + i / 10} for i, k in enumerate("abcd")],
           "sweep": {"runs": runs, "repeats": 3}}
    a = agreement(doc)
    assert a["objective"] == {"repeats": 1.0, "simulated": 1.0}
    assert a["slo"]["repeats"] == pytest.approx(-1.0)  # pairs (1,2) and (2,3) reversed, (1,3) equal: median -1
    assert a["slo"]["simulated"] == pytest.approx(1.0)  # the simulation orders runs 1 and 3 as they are
    assert agreement({**doc, "sweep": {"runs": runs, "repeats": 1}}) == {}
    assert evaluation({**doc, "choice": {"label": "a"}, "sweep": {**doc["sweep"], "rows": []}})["agreement"] == a
    # tune prints it under the rank claim's verdict
    from mlxlab.cli.tune import _say_verdicts
    from mlxlab.studies.tune.verdict import tune_verdicts

    rows = [{"label": k, "objective_s": objs[i], "objective_range_s": [objs[i], objs[i]], "slo_ratio": 1.1 + i / 10,
             "meets": False} for i, k in enumerate("abcd")]
    _say_verdicts(tune_verdicts({**doc, "choice": {"label": "a"}, "wall_s": {"total": 1.0},
                                 "sweep": {**doc["sweep"], "rows": rows, "wall_s": 10.0}}))
    out = capsys.readouterr().out
    assert "] mlx-tune-rank\n  objective: the sweep's repeats order the grid against each other at tau 1.00" in out
    assert "slo: the sweep's repeats order the grid against each other at tau -1.00, the simulation each repeat at 1.00" in out


@pytest.mark.parametrize("flag, overlap, warned", [([], False, False), (["--overlap"], True, True),
                                                   (["--no-overlap"], False, False)])
def test_serve_with_a_tune_json_runs_the_serial_steps_tune_measured(tmp_path, monkeypatch, capsys, flag, overlap,
                                                                   warned):
    # tune confirms every setting with overlap=False; slo left to choose runs overlapped on a GPU, so --config
    # serves serial unless asked otherwise (and then says tune did not measure that mode)
    from mlxlab import serve
    from mlxlab.cli import main

    doc = {"choice": {"label": "slo-512", "meets": True}, "parameters": {"model": "tiny"},
           "confirmed": [{"label": "slo-512", "policy": "slo", "chunk_size": 512, "options": {"key_align": 64}}]}
    p = tmp_path / "tune.json"
    p.write_text(json.dumps(doc))
    seen = {}

    class Stop(Exception):
        pass

    def build(model, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr("mlxlab.cli.reexec_with_fast_blas", lambda: None)
    monkeypatch.setattr(serve, "build", build)
    with pytest.raises(Stop):
        main(["serve", "--model", "tiny", "--dtype", "float32", "--config", str(p)] + flag)
    assert (seen["policy"], seen["chunk_size"], seen["key_align"], seen["overlap"]) == ("slo", 512, 64, overlap)
    assert ("tune did not run" in capsys.readouterr().err) is warned



def _raced(label, objs, worst_p99=0.01):
    """A confirmed row as the race reads it: ``objs`` the objective of each repeat so far."""
    import statistics

    slos = [parse_slo("chat.itl_p99<=20ms")]
    return {"label": label, "checks": check(_summary(0.01, statistics.median(objs)), slos, {}),
            "checks_worst": check(_summary(worst_p99, max(objs)), slos, {}), "objective_s": statistics.median(objs),
            "objective_range_s": [min(objs), max(objs)], "repeats": len(objs)}


def test_the_race_settles_only_when_the_pick_met_the_slos_every_repeat_and_beat_every_run_of_the_others():
    from mlxlab.studies.tune.slo import settled

    # after two repeats a's runs (1.0-1.1) all beat b's (1.2-1.3); c missed the SLO in a repeat: decided
    why = settled([_raced("a", [1.0, 1.1]), _raced("b", [1.2, 1.3]), _raced("c", [0.5, 0.6], worst_p99=0.03)])
    assert why and "a met every SLO in every repeat" in why and "1 other setting(s) missed one" in why
    from mlxlab.studies.tune.slo import outrun

    # before it is decided, each setting the repeats put out is named: c missed; b overlaps a, so it stays in
    out = outrun([_raced("a", [1.0, 1.25]), _raced("b", [1.2, 1.3]), _raced("c", [0.5, 0.6], worst_p99=0.03)])
    assert list(out) == ["c"] and "missed" in out["c"]
    assert list(outrun([_raced("a", [1.0, 1.1], worst_p99=0.03), _raced("b", [2.0, 2.1])])) == ["a"]  # b the pick
    # the pick missed in a repeat: more repeats can move it, so none is out
    assert outrun([_raced("a", [1.0, 1.1], worst_p99=0.03), _raced("b", [2.0, 2.1], worst_p99=0.05)]) is None
    assert settled([_raced("a", [1.0, 1.25]), _raced("b", [1.2, 1.3])]) is None  # overlapping runs: go on
    assert settled([_raced("a", [1.0]), _raced("b", [2.0])]) is None  # one repeat shows no spread
    # nothing met the SLO in every repeat: more repeats can move the closest one, never settled
    assert settled([_raced("a", [1.0, 1.1], worst_p99=0.03), _raced("b", [2.0, 2.1], worst_p99=0.05)]) is None


@pytest.mark.parametrize("race, runs", [(True, 2), (False, 4)])
def test_the_confirmation_stops_after_the_repeat_that_decides_the_choice_unless_told_not_to_race(race, runs):
    import mlxlab.studies.tune.run as tune_run
    from mlxlab.studies.tune.confirm import confirm_runs

    calls, slos = [], [parse_slo("chat.itl_p99<=3x")]
    solo = {"chat": _full_summary(0.01, 0.5)}
    # a and the baseline steady, b always worse than a
    run_one = lambda s: calls.append(s["label"]) or _full_summary(0.01, {"a": 0.5, "b": 0.8}.get(s["label"], 2.0))  # noqa: E731
    settings = [{"label": k, "policy": p, "chunk_size": 64, "options": {}}
                for k, p in (("a", "interleave"), ("b", "stall_free"), (BASELINE, BASELINE))]
    row = lambda c, rs: tune_run._confirm_row(c, rs, ["batch", "chat"], slos, solo, "batch.ttft_p50")  # noqa: E731
    measured, raced = confirm_runs(settings, repeats=4, run_one=run_one, order=tune_run.run_order, row=row, race=race,
                                   say=lambda s: None)
    assert {k: len(v) for k, v in measured.items()} == {"a": runs, "b": runs, BASELINE: runs} and len(calls) == 3 * runs
    assert (raced is not None) == race and (not race or (raced["repeats"], raced["of"]) == (2, 4))
    assert not race or "a met every SLO in every repeat" in raced["why"]


def test_the_confirmation_warms_up_each_setting_once_in_the_first_repeats_order_on_a_shape_keyed_device(monkeypatch):
    """On mlx's CUDA backend with cuDNN attention a process's first run of a setting pays a graph per new
    attention shape (coder-1.5b's confirmation ran each stall_free candidate once 1.2-1.5x above all its
    sweep runs): tune then runs each confirmed setting once before the confirmation and keeps none of
    those runs; on the CPU it does not, unless told; told off, it never does."""
    import mlxlab.engine.fused as fused
    import mlxlab.studies.tune.run as tune_run
    from mlxlab.studies.tune.confirm import wants_warm_up, warm_runs

    assert wants_warm_up() is False and wants_warm_up(True) is True  # this machine: the CPU
    monkeypatch.setattr(fused, "cold_keying", lambda: ("shape", 256, "cuDNN"))
    assert wants_warm_up() is True and wants_warm_up(False) is False and wants_warm_up(None) is True
    assert wants_warm_up(False, steady=True) is True  # a steady tune scores warm runs whatever it was told
    calls = []
    settings = [{"label": k, "policy": "interleave", "chunk_size": 64, "options": {}} for k in ("a", "b", "c")]
    out = warm_runs(settings, run_one=lambda s: calls.append(s["label"]), order=tune_run.run_order, say=lambda s: None)
    assert calls == [s["label"] for s in tune_run.run_order(settings, 0)] and sorted(calls) == ["a", "b", "c"]
    assert set(out["runs_s"]) == {"a", "b", "c"} and out["wall_s"] == pytest.approx(sum(out["runs_s"].values()))


def test_tune_warms_its_solo_runs_and_confirmation_up_by_default_on_a_shape_keyed_device_and_not_elsewhere(monkeypatch):
    """``tune(warm_up=None)`` (``--warm-up auto``) must warm up on a device that keys attention by shape: on
    12-07 it asked ``wants_warm_up(warm_up or steady)``, which read auto as off, and the H100 confirmation ran
    cold. The solo runs, whose figures set every relative bound, get one run not kept first too; each kept
    solo run's figure is stored. On the CPU auto runs no extra run; ``steady`` always warms up."""
    from types import SimpleNamespace

    import mlxlab.core.runner as runner
    import mlxlab.engine.fused as fused
    import mlxlab.studies.tune.run as tune_run
    from mlxlab.sim.simulator import Simulator
    from probes.key_align_sim import load_point
    from tests.test_warm_carry_sim import _doc

    point = load_point(_doc(), "data/traces/samples")
    ran, real = [], runner.run_workload

    def fake_run(engine, workload):
        if not isinstance(engine, str):  # the simulator's runs
            return real(engine, workload)
        ran.append((engine, workload.name))  # the solo runs replay the chat alone
        return SimpleNamespace(summary=_full_summary(0.012 if workload.name == "chat" else 0.02, 0.5))

    monkeypatch.setattr(runner, "run_workload", fake_run)
    monkeypatch.setattr(tune_run, "_engine", lambda model, s: "solo")
    monkeypatch.setattr(tune_run, "_executor", lambda model, s: s["label"])
    monkeypatch.setattr(Simulator, "limits_of", staticmethod(lambda model: point["limits"]))
    grid = [{"label": "interleave-64", "policy": "interleave", "chunk_size": 64, "options": {}}]

    def run(**kw):
        ran.clear()
        doc = tune_run.tune(None, point["arrivals"], [parse_slo("chat.itl_p99<=3x")], grid=grid, top_k=1, repeats=2,
                            cost_model=point["cost_model"], calibrate=False, progress=False, say=lambda s: None, **kw)
        assert all((e == "solo") == (w == "chat") for e, w in ran)
        return doc, [e for e, w in ran if e == "solo"], [e for e, w in ran if e != "solo"]

    doc, solo, confirm = run()  # the CPU: auto is off; the solo runs, 5 at least (SOLO_REPEATS) where not quick
    assert len(solo) == 5 and len(confirm) == 4 and doc["confirm_warm_up"] is None
    assert doc["solo_runs"]["chat"] == {"warm_up_s": None, "runs": [{"itl_p99": 0.012}] * 5}
    assert len(run(solo_repeats=2)[1]) == 2 and len(run(quick=True)[1]) == 2  # told, or quick: as many as asked
    monkeypatch.setattr(fused, "cold_keying", lambda: ("shape", 256, "cuDNN"))
    for kw in ({}, {"warm_up": True}, {"warm_up": False, "steady": True}):
        doc, solo, confirm = run(**kw)
        assert len(solo) == 6 and len(confirm) == 6 and sorted(confirm[:2]) == sorted(["interleave-64", BASELINE])
        assert doc["solo_runs"]["chat"]["warm_up_s"] >= 0 and len(doc["solo_runs"]["chat"]["runs"]) == 5
        assert set(doc["confirm_warm_up"]["runs_s"]) == {"interleave-64", BASELINE}
    doc, solo, confirm = run(warm_up=False)  # told off: no extra run anywhere
    assert len(solo) == 5 and len(confirm) == 4 and doc["confirm_warm_up"] is None


def test_a_setting_the_repeats_put_out_sits_out_the_next_and_runs_again_once_the_pick_misses():
    import mlxlab.studies.tune.run as tune_run
    from mlxlab.studies.tune.confirm import confirm_runs

    slos, solo = [parse_slo("chat.itl_p99<=3x")], {"chat": _full_summary(0.01, 0.5)}
    ok, miss = 0.01, 0.05  # the chat's ITL p99 against a 30 ms bound
    # a and b meet the SLO in repeats 1-2 with overlapping objectives and both miss it in repeat 3;
    # c has the best objective but misses in its first repeat
    plan = {"a": [(ok, 0.5), (ok, 0.7), (miss, 0.5), (ok, 0.5)], "b": [(ok, 0.6), (ok, 0.6), (miss, 0.6), (ok, 0.6)],
            "c": [(miss, 0.4), (ok, 0.4), (ok, 0.4), (ok, 0.4)], BASELINE: [(ok, 2.0)] * 4}
    calls, said = [], []

    def run_one(s):
        calls.append(s["label"])
        return _full_summary(*plan[s["label"]][calls.count(s["label"]) - 1])

    settings = [{"label": k, "policy": "interleave" if k != BASELINE else BASELINE, "chunk_size": 64, "options": {}}
                for k in plan]
    row = lambda c, rs: tune_run._confirm_row(c, rs, ["batch", "chat"], slos, solo, "batch.ttft_p50")  # noqa: E731
    measured, raced = confirm_runs(settings, repeats=4, run_one=run_one, order=tune_run.run_order, row=row,
                                   say=said.append)
    # c missed while a met every SLO in every repeat: it sat out repeat 3; a and b missed there, so it ran in 4
    assert {k: len(v) for k, v in measured.items()} == {"a": 4, "b": 4, "c": 3, BASELINE: 4}
    assert raced["why"] is None and raced["repeats"] == 4 and list(raced["sat_out"]) == ["c"]
    assert raced["sat_out"]["c"]["repeats"] == [3] and "missed chat.itl_p99<=3x" in raced["sat_out"]["c"]["why"]
    assert any("c sits out" in s for s in said) and any("c runs again" in s for s in said)
    from mlxlab.studies.tune.confirm import race_text

    # what tune and notebook 09 print of it
    assert race_text(raced).startswith("the confirmation ran 4 of 4 repeats; c sat out repeat 3 (missed chat.itl_p99")
    assert race_text(None) == ""
    # without the race every setting runs every repeat
    calls.clear()
    measured, raced = confirm_runs(settings, repeats=4, run_one=run_one, order=tune_run.run_order, row=row,
                                   race=False, say=said.append)
    assert {len(v) for v in measured.values()} == {4} and raced is None
    # c, out after repeat 2 (worse in every run), sits out repeat 3; b misses there, so the race stops: the reason counts the
    # repeats the confirmation ran (3), not the fewest any setting ran (cpu/tune_wide.json said "after 2")
    plan.update({"a": [(ok, 0.5), (ok, 0.5), (ok, 0.5)], "b": [(ok, 0.5), (ok, 0.7), (miss, 0.6)],
                 "c": [(ok, 0.9), (ok, 0.9), (ok, 0.9)]})
    calls.clear()
    measured, raced = confirm_runs(settings, repeats=5, run_one=run_one, order=tune_run.run_order, row=row,
                                   say=said.append)
    assert {k: len(v) for k, v in measured.items()} == {"a": 3, "b": 3, "c": 2, BASELINE: 3}
    assert raced["repeats"] == 3 and raced["why"].startswith("after 3 repeats a met every SLO")
