"""The grids ``mlxlab tune`` simulates, and the settings a trace runs as one schedule."""

import json

import pytest

from mlxlab.studies.tune.grid import (GRIDS, WINDOWS_S, default_grid, full_grid, gate_thresholds, make_grid, same_schedule,
                                     wide_grid)


def test_the_wide_grid_varies_each_policys_own_knob_and_gates_only_below_the_longest_prompt():
    grid = wide_grid(max_prompt=3000)
    labels = [g["label"] for g in grid]
    assert len(labels) == len(set(labels)) and len(grid) > len(default_grid(max_prompt=3000))
    by = lambda p: [g for g in grid if g["policy"] == p]  # noqa: E731
    assert [g["chunk_size"] for g in by("interleave")] == [128, 256, 512, 1024, 2048, 4096]
    assert [g["options"]["token_budget"] for g in by("stall_free")] == [128, 256, 512, 1024, 2048]
    assert sorted(g["options"]["itl_target_x"] for g in by("slo")) == [1.5, 2.0, 3.0, 4.0]
    gates = {g["options"]["big_prompt_tokens"] for g in by("admission_gate")}
    assert gates == {1024, 2048} and all(t < 3000 for t in gates)
    # a short trace: no chunk past the one covering its longest prompt, no gate at or above it
    short = wide_grid(max_prompt=700)
    assert max(g["chunk_size"] for g in short if g["policy"] == "interleave") == 1024
    assert max(g["options"]["token_budget"] for g in short if g["policy"] == "stall_free") == 1024
    assert gate_thresholds(700) == [256, 512] and gate_thresholds(200) == [256]
    # every option the wide grid sets is one its policy takes
    from mlxlab.policies import make_policy

    for g in grid:
        make_policy(g["policy"], **g["options"])


def test_the_full_grid_crosses_every_policys_knobs_and_adds_the_decode_window_gate():
    from mlxlab.engine.loop import Engine
    from mlxlab.engine.models import load_model
    from mlxlab.policies import make_policy

    grid = full_grid(max_prompt=3000)
    labels = [g["label"] for g in grid]
    by = lambda p, g=grid: [s for s in g if s["policy"] == p]  # noqa: E731
    assert len(labels) == len(set(labels))
    wide = wide_grid(max_prompt=3000)
    assert by("interleave") + by("stall_free") == by("interleave", wide) + by("stall_free", wide)
    assert {(g["chunk_size"], g["options"]["itl_target_x"]) for g in by("slo")} == {
        (c, x) for c in (1024, 2048, 4096) for x in (1.5, 2.0, 3.0, 4.0)}
    assert {(g["chunk_size"], g["options"]["big_prompt_tokens"]) for g in by("admission_gate")} == {
        (c, t) for c in (1024, 2048, 4096) for t in (1024, 2048)}
    win = by("admission_gate_window")
    assert {(g["chunk_size"], g["options"]["window_s"]) for g in win} == {(c, w) for c in (2048, 4096) for w in WINDOWS_S}
    assert {g["options"]["big_prompt_tokens"] for g in win} == {1024}  # the smallest gate below the longest prompt
    assert make_grid("full", max_prompt=3000) == grid and make_grid("full", quick=True) == default_grid(quick=True)
    assert len(full_grid(max_prompt=750)) == 30  # the CPU's committed trace
    for g in grid:  # every setting builds its policy, and the window gate runs on the engine as tune runs it
        make_policy(g["policy"], **g["options"])
    Engine(load_model("tiny", dtype="float32"), policy=win[0]["policy"], chunk_size=win[0]["chunk_size"], overlap=False,
           **win[0]["options"])


def test_make_grid_names_its_grids_and_refuses_another():
    assert GRIDS == ("standard", "wide", "full")
    assert make_grid("standard", max_prompt=3000) == default_grid(max_prompt=3000)
    assert make_grid("wide", quick=True) == default_grid(quick=True)  # quick keeps the small grid
    with pytest.raises(ValueError, match="unknown grid 'huge'; choose one of standard, wide, full"):
        make_grid("huge")


def test_settings_the_simulation_runs_as_one_schedule_are_named_after_the_first_of_them():
    """admission_gate whose gate no prompt reaches holds nothing back: the simulator runs it as
    interleave at its chunk size, to the same figures; with a gate the documents reach it does not."""
    from mlxlab.core.traces import Trace, TraceRequest, to_arrivals
    from mlxlab.sim.profiles import load_profile
    from mlxlab.studies.tune.run import simulate_setting
    from mlxlab.studies.tune.slo import parse_slo

    trace = Trace([TraceRequest(0.0, "batch", 600, 4), TraceRequest(0.05, "chat", 60, 12),
                   TraceRequest(0.1, "batch", 900, 4), TraceRequest(0.2, "chat", 60, 12)], format="mlxlab")
    base = {"cost_model": load_profile("cpu-small"), "limits": {"vocab_size": 1024, "max_context": 8192},
            "arrivals": to_arrivals(trace, 1024, 0), "slos": [parse_slo("chat.itl_p99<=40ms")], "solos": {},
            "objective": "batch.ttft_p50", "tenants": ["batch", "chat"]}
    settings = [{"label": "interleave-256", "policy": "interleave", "chunk_size": 256, "options": {}},
                {"label": "gate-2048", "policy": "admission_gate", "chunk_size": 256, "options": {}},
                {"label": "gate-256", "policy": "admission_gate", "chunk_size": 256,
                 "options": {"big_prompt_tokens": 256}},
                {"label": "interleave-128", "policy": "interleave", "chunk_size": 128, "options": {}}]
    rows = [simulate_setting({**base, "setting": s}) for s in settings]
    assert same_schedule(rows) == {"gate-2048": "interleave-256"}
    assert rows[2]["objective_s"] != rows[0]["objective_s"]  # the gate held the second document back


def test_the_sweep_replays_one_setting_of_each_schedule(monkeypatch):
    import mlxlab.core.runner as runner
    import mlxlab.studies.tune.run as tune_run
    from mlxlab.studies.tune.run import sweep

    calls = []
    summary = {t: {k: {p: 0.01 for p in ("p50", "p90", "p99", "max")} for k in ("ttft_s", "itl_s", "e2e_s")}
               for t in ("chat", "batch", "all")}

    monkeypatch.setattr(tune_run, "_fresh", lambda: None)
    monkeypatch.setattr(tune_run, "_engine", lambda model, s: s["label"])
    monkeypatch.setattr(runner, "run_workload", lambda ex, wl: calls.append(ex) or type("R", (), {"summary": summary}))
    grid = [{"label": k, "policy": "interleave", "chunk_size": 64, "options": {}, "objective_s": 0.01, "slo_ratio": 1}
            for k in ("a", "b", "c")]
    doc = {"slos": ["chat.itl_p99<=3x"], "solo": {"chat": summary}, "tenants": ["batch", "chat"],
           "objective": "batch.ttft_p50", "grid": grid, "same_schedule": {"b": "a"}, "choice": {"label": "a"},
           "wall_s": {"total": 1.0}, "trace": {"requests": 0, "format": "mlxlab"}}
    block = sweep(None, [], doc, repeats=2, progress=False, say=lambda s: None)
    assert sorted(calls) == ["a", "a", "c", "c"] and [r["label"] for r in block["rows"]] == ["a", "c"]
    assert set(block["runs"]) == {"a", "c"}


def test_resume_reads_a_file_from_before_grids_were_named_as_the_standard_grid(tmp_path, monkeypatch, capsys):
    from mlxlab.cli import main

    monkeypatch.setattr("mlxlab.cli.reexec_with_fast_blas", lambda: None)
    p = tmp_path / "tune.json"
    p.write_text(json.dumps({"grid": [], "solo": {}, "choice": {}, "environment": {},
                             "parameters": {"model": "tiny", "slo": ["chat.itl_p99<=3x"]}}))
    args = ["tune", "--model", "tiny", "--workload", "chat+batch", "--slo", "chat.itl_p99<=3x", "--resume", str(p)]
    assert main(args + ["--grid", "wide"]) == 2
    assert "grid 'wide' (stored None)" in capsys.readouterr().err
    assert main(args) == 2  # other arguments differ (the stored file names none of them), the grid does not
    err = capsys.readouterr().err
    assert "these differ: workload" in err and "grid" not in err


def test_tune_refuses_a_grid_it_does_not_have_before_loading_anything(capsys):
    from mlxlab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["tune", "--model", "tiny", "--workload", "chat+batch", "--slo", "chat.itl_p99<=3x", "--grid", "huge"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'huge'" in err and "standard" in err and "wide" in err
