"""probes/confirm_order.py and probes/sweep_processes.py: a stored tune's runs put back in the order and the
process they ran in, from its fixed per-repeat shuffles and its sweep's per-call records."""

from probes.confirm_order import confirmation_sequence, runs_of, summarize
from probes.sweep_processes import by_chance, compare, compare_time, compare_warmth, elapsed_of, processes_of, warmth_of
from tests.test_tune import _full_summary

BASE = "mlx_lm.BatchGenerator"


def _tune(warm: bool, ratios=None):
    labels = ["s-256", "s-512", "s-1024"]
    ratios = ratios or {lb: [1.0, 1.0] for lb in labels}
    rows = [{"label": lb, "policy": "stall_free", "repeat_ratios": ratios[lb]} for lb in labels]
    rows.append({"label": BASE, "policy": BASE, "repeat_ratios": [4.0, 4.0]})
    return {"slos": ["chat.itl_p99<=3x"], "choice": {"binding": "chat.itl_p99<=3x"},
            "bounds_s": {"chat.itl_p99<=3x": 0.1}, "confirmed": rows,
            "confirm_warm_up": {"wall_s": 1.0} if warm else None,
            "sweep": {"runs": {lb: [_full_summary(0.05, 0.5), _full_summary(0.05, 0.5)] for lb in labels}}}


def test_three_candidates_and_the_baseline_put_the_third_first_in_every_repeat_right_after_the_baseline():
    # the seeds are fixed per repeat: this is the order every such tune on the GPUs ran (its warm-up in repeat 0's)
    seq = confirmation_sequence(_tune(warm=True))
    assert [lb for lb, r, _ in seq if r is None] == ["s-1024", "s-512", "s-256", BASE]
    firsts = [(lb, after) for i, (lb, r, after) in enumerate(seq) if r is not None and (i == 0 or seq[i - 1][1] != r)]
    assert firsts == [("s-1024", f"warm-up: {BASE}"), ("s-1024", BASE)]
    cold = confirmation_sequence(_tune(warm=False))
    assert cold[0] == ("s-1024", 0, "solo") and len(cold) == 8


def test_each_kept_run_is_set_against_its_settings_sweep_median_and_summed_by_what_ran_before():
    doc = _tune(warm=True, ratios={"s-256": [0.5, 0.5], "s-512": [0.5, 0.5], "s-1024": [0.8, 0.6]})
    runs = runs_of(doc)
    assert len(runs) == 6 and all(abs(r["sweep_median_ratio"] - 0.5) < 1e-12 for r in runs)
    first = [r for r in runs if r["label"] == "s-1024"]
    assert [r["after_kind"] for r in first] == ["baseline", "baseline"]
    assert [round(r["over_sweep"], 6) for r in first] == [1.6, 1.2]  # repeat_ratios in the order they ran
    summary = summarize([{"platform": "h100", "runs": runs}])["cuda"]
    assert summary["baseline"]["runs"] == 3 and summary["a candidate"]["runs"] == 3  # s-256 follows it in repeat 2
    assert summary["baseline"]["max"] == 1.6
    assert runs_of({**doc, "sweep": {}}) == []  # no sweep: nothing to set against


def test_sweep_runs_are_placed_in_their_calls_process_and_the_first_process_compared_with_the_later_ones():
    sweep = {"runs": {"a": [_full_summary(0.12, 0.6), _full_summary(0.10, 0.5), _full_summary(0.10, 0.5)],
                      "b": [_full_summary(0.10, 0.5)]},
             "calls": [{"ran": [[0, "a"]], "written_at": "2026-12-07T10:00:00+00:00"},
                       {"ran": [[0, "b"], [1, "a"], [2, "a"]], "written_at": "2026-12-07T10:05:00+00:00"}]}
    doc = {"slos": ["chat.itl_p99<=3x"], "choice": {"binding": "chat.itl_p99<=3x"}, "objective": "batch.ttft_p50",
           "bounds_s": {"chat.itl_p99<=3x": 0.05}, "sweep": sweep}
    assert processes_of(doc) == {"a": [0, 1, 1], "b": [1]}
    (row,) = compare(doc)  # b ran only in the later process: nothing to compare
    assert row["label"] == "a" and abs(row["slo_ratio"]["first_over_later"] - 1.2) < 1e-12
    assert abs(row["objective_s"]["first_over_later"] - 1.2) < 1e-12
    # a call that kept no record of its runs: the runs cannot be placed
    assert processes_of({**doc, "sweep": {**sweep, "calls": [{"written_at": "x"}, *sweep["calls"][1:]]}}) == {}


def test_a_settings_first_run_in_a_resumed_process_is_set_against_its_runs_there_after_one_of_itself():
    # tune's process confirmed "a"; the resumed call warmed up with "b", then ran a, b, c, a, c
    sweep = {"runs": {"a": [_full_summary(0.10, 0.5), _full_summary(0.15, 0.5), _full_summary(0.10, 0.5)],
                      "b": [_full_summary(0.10, 0.5), _full_summary(0.10, 0.5)],
                      "c": [_full_summary(0.12, 0.6), _full_summary(0.10, 0.5)]},
             "calls": [{"ran": [[0, "a"], [0, "b"]], "written_at": "2026-12-07T10:00:00+00:00"},
                       {"warm_up": {"label": "b"}, "ran": [[1, "a"], [1, "b"], [0, "c"], [2, "a"], [1, "c"]],
                        "written_at": "2026-12-07T10:05:00+00:00"}]}
    doc = {"slos": ["chat.itl_p99<=3x"], "choice": {"binding": "chat.itl_p99<=3x"}, "objective": "batch.ttft_p50",
           "bounds_s": {"chat.itl_p99<=3x": 0.05}, "sweep": sweep, "confirmed": [{"label": "a"}]}
    assert warmth_of(doc) == {"a": [True, False, True], "b": [False, True], "c": [False, True]}
    rows = {r["label"]: r for r in compare_warmth(doc)}
    assert set(rows) == {"a", "c"}  # b ran only after its warm-up in the resumed call
    assert abs(rows["a"]["slo_ratio"]["cold_over_again"] - 1.5) < 1e-12
    assert abs(rows["c"]["objective_s"]["cold_over_again"] - 1.2) < 1e-12
    assert all(all(w) for w in warmth_of({**doc, "steady": True}).values())  # steady: every run after itself


def test_runs_in_a_resumed_call_are_timed_from_its_start_and_its_late_runs_set_against_its_early_ones():
    # the resumed call warmed up 5 s, then ran a (10 s), b (20 s), a (10 s), b (20 s); a's late run is 1.3x slower
    sweep = {"runs": {"a": [_full_summary(0.10, 0.5), _full_summary(0.10, 0.5), _full_summary(0.13, 0.65)],
                      "b": [_full_summary(0.10, 0.5), _full_summary(0.10, 0.5)]},
             "run_wall_s": {"a": [9.0, 10.0, 10.0], "b": [20.0, 20.0]},
             "calls": [{"ran": [[0, "a"]], "written_at": "2026-12-07T10:00:00+00:00"},
                       {"warm_up": {"label": "a", "wall_s": 5.0}, "ran": [[1, "a"], [0, "b"], [2, "a"], [1, "b"]],
                        "written_at": "2026-12-07T10:05:00+00:00"}]}
    doc = {"slos": ["chat.itl_p99<=3x"], "choice": {"binding": "chat.itl_p99<=3x"}, "objective": "batch.ttft_p50",
           "bounds_s": {"chat.itl_p99<=3x": 0.05}, "sweep": sweep}
    assert elapsed_of(doc) == {"a": [None, 5.0, 35.0], "b": [15.0, 45.0]}  # tune's own process: not timed
    rows = {r["label"]: r for r in compare_time(doc)}
    assert rows["a"]["cut_s"] == 25.0 and rows["a"]["runs_late"] == 1 and rows["a"]["runs_early"] == 1
    assert abs(rows["a"]["slo_ratio"]["late_over_early"] - 1.3) < 1e-12
    assert abs(rows["b"]["objective_s"]["late_over_early"] - 1.0) < 1e-12
    assert compare_time({**doc, "sweep": {k: v for k, v in sweep.items() if k != "run_wall_s"}}) == []


def test_the_sign_tests_chance_of_as_many_settings_running_slower():
    assert by_chance(8, 11) == 232 / 2048  # 8, 9, 10 or 11 of 11: 165 + 55 + 11 + 1 of 2**11
    assert by_chance(0, 5) == 1.0 and by_chance(5, 5) == 1 / 32 and by_chance(0, 0) == 1.0


def test_a_balanced_order_puts_every_setting_first_once_and_after_every_other_once():
    from collections import Counter

    from mlxlab.studies.tune.order import run_order

    for n in (2, 3, 4, 5):
        items = [f"s{i}" for i in range(n)]
        rows = [run_order(items, r, "balanced") for r in range(2 * n if n % 2 else n)]
        assert all(sorted(row) == items for row in rows)
        assert set(Counter(row[0] for row in rows).values()) == {2 if n % 2 else 1}
        pairs = Counter((row[i], row[i + 1]) for row in rows for i in range(n - 1))
        assert len(pairs) == n * (n - 1) and set(pairs.values()) == {2 if n % 2 else 1}
    # the shuffle this replaces: three candidates and the baseline, the third first in 4 of the first 5 repeats
    four = ["a", "b", "c", BASE]
    assert [run_order(four, r)[0] for r in range(5)].count("c") == 4
    assert [run_order(four, r, "balanced")[0] for r in range(4)] == four


def test_tune_confirms_in_the_balanced_order_and_keeps_the_sequence_the_probe_reads(monkeypatch):
    from types import SimpleNamespace

    import mlxlab.core.runner as runner
    import mlxlab.engine.fused as fused
    import mlxlab.studies.tune.run as tune_run
    from mlxlab.sim.simulator import Simulator
    from mlxlab.studies.tune.order import run_order
    from mlxlab.studies.tune.slo import parse_slo
    from probes.key_align_sim import load_point
    from tests.test_warm_carry_sim import _doc

    point = load_point(_doc(), "data/traces/samples")
    ran, real = [], runner.run_workload

    def fake_run(engine, workload):
        if not isinstance(engine, str):  # the simulator's runs
            return real(engine, workload)
        if engine != "solo":
            ran.append(engine)
        return SimpleNamespace(summary=_full_summary(0.012 if workload.name == "chat" else 0.02, 0.5))

    monkeypatch.setattr(runner, "run_workload", fake_run)
    monkeypatch.setattr(tune_run, "_engine", lambda model, s: "solo")
    monkeypatch.setattr(tune_run, "_executor", lambda model, s: s["label"])
    monkeypatch.setattr(Simulator, "limits_of", staticmethod(lambda model: point["limits"]))
    monkeypatch.setattr(fused, "cold_keying", lambda: ("shape", 256, "cuDNN"))  # a device that warms up
    grid = [{"label": f"interleave-{c}", "policy": "interleave", "chunk_size": c, "options": {}} for c in (64, 128, 256)]
    doc = tune_run.tune(None, point["arrivals"], [parse_slo("chat.itl_p99<=3x")], grid=grid, top_k=3, repeats=2,
                        cost_model=point["cost_model"], calibrate=False, progress=False, race=False, say=lambda s: None)
    labels = [c["label"] for c in doc["confirmed"]]
    assert doc["confirm_order"] == "balanced" and len(labels) == 4
    want = run_order(labels, 0, "balanced") * 2 + run_order(labels, 1, "balanced")  # warm-up, repeat 1, repeat 2
    assert ran == want and [lb for lb, _ in doc["confirm_ran"]] == want
    assert [k for _, k in doc["confirm_ran"]] == ["warm-up"] * 4 + ["kept"] * 8
    seq = confirmation_sequence(doc)  # read back as it ran, not rebuilt from the old shuffle
    assert [(lb, r) for lb, r, _ in seq][4:] == [(lb, 0) for lb in want[4:8]] + [(lb, 1) for lb in want[8:]]
    assert seq[4][2] == f"warm-up: {want[3]}" and seq[0][2] == "solo"


def test_the_process_probe_runs_each_step_then_the_settings_and_sets_each_phase_against_start_and_the_one_before():
    from probes.process_state import run_phases, summarize

    did, speed = [], {"v": 1.0}

    def slow_down():  # a step that leaves the engine 10% slower
        did.append("profile")
        speed["v"] *= 1.1

    def run_setting(label):
        did.append(label)
        base = {"a": 0.010, "b": 0.020}[label] * speed["v"]
        return {"slo_ratio": base * 100, "objective_s": base * 10, "itl_p50_s": base}

    seen = []  # what the probe would write after each phase: the phases done so far
    phases = run_phases(["start", "again", "profile", "again"], {"profile": slow_down, "solo": lambda: None},
                        ["a", "b"], 2, run_setting, say=lambda line: None,
                        on_phase=lambda done: seen.append([p["phase"] for p in done]))
    assert did == ["a", "b"] * 4 + ["profile"] + ["a", "b"] * 4
    assert seen == [["start"], ["start", "again"], ["start", "again", "profile"], ["start", "again", "profile", "again"]]
    assert [len(p["runs"]["a"]) for p in phases] == [2, 2, 2, 2]
    rows = summarize(phases)
    assert [round(r["itl_p50_s"]["over_start"], 6) for r in rows] == [1.0, 1.0, 1.1, 1.1]
    assert [round(r["slo_ratio"]["over_previous"], 6) for r in rows] == [1.0, 1.0, 1.1, 1.0]
    assert round(rows[2]["objective_s"]["settings"]["b"]["median"], 6) == 0.22
    # each run and phase keeps when it started (UTC, in order) and its wall, to line up with the GPU's clock log
    from datetime import datetime
    starts = [datetime.fromisoformat(r["started_utc"]) for p in phases for r in p["runs"]["a"]]
    assert starts == sorted(starts) and all(t.utcoffset().total_seconds() == 0 for t in starts)
    assert all(r["wall_s"] >= 0 for p in phases for r in p["runs"]["b"])
    assert datetime.fromisoformat(phases[2]["started_utc"]) <= datetime.fromisoformat(phases[2]["runs"]["a"][0]["started_utc"])


def test_a_probe_over_stored_tunes_keeps_the_files_it_can_read_and_names_each_it_skips(tmp_path, capsys):
    import json

    from probes.common import each_tune

    paths = []
    for name, runs in (("tune_a.json", {"x": [1]}), ("tune_b.json", {})):
        (tmp_path / name).write_text(json.dumps({"sweep": {"runs": runs}}))
        paths.append(str(tmp_path / name))
    got = list(each_tune(paths, lambda d, p: d["sweep"]["runs"], "no sweep runs"))
    assert [(p, found) for p, _, found in got] == [(paths[0], {"x": [1]})]
    assert capsys.readouterr().out == f"{paths[1]}: no sweep runs; skipped\n"
