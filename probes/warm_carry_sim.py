"""Warm-carry simulation: a stored tune's exhaustive sweep simulated again, with the shapes a run
leaves warm carried into the runs after it, as one process carries them on the device.

On mlx's CUDA backend with cuDNN attention on, a chunk's first use of an attention shape costs
~66 ms, and the graph stays in an LRU of ``MLX_CUDA_SDPA_CACHE_SIZE`` shapes for the whole
process (``probes/shape_probe.py``). ``mlxlab tune`` simulates every setting from a cold start,
while its sweep runs all settings one after another in one process: what ran before leaves
shapes warm (or evicts them). This asks, with no device and on the tune's own fitted cost model,
whether that difference explains where the simulator ranks the grid against the engine. Three
ways to simulate each setting:

* ``fresh``: every run from a cold start (what tune does; the stored simulation);
* ``carried``: the sweep's runs in the stored order (``sweep.order``: each repeat shuffled, or
  rotated in files from before), one set of warm shapes through all of them (the process's; the
  calls a sweep was split into, each a new process, are not told apart: the file does not say
  where one ended);
* ``steady``: each setting run twice in a row, scored on the second run (a server that has run
  this setting for a while).
* ``processes`` (files whose sweep names each call's runs, ``sweep.calls[].ran``, since 2026-12-07):
  each call a new process with its own warm shapes, warmed first by what ran there before the sweep
  (the first call's confirmation, a resumed call's warm-up run), then its runs in the order they ran.

For each, Kendall's tau against the measured sweep on the objective and the binding SLO's ratio,
and the simulator's median error, as the ``mlx-tune-rank`` verdict computes them
(:func:`mlxlab.studies.tune.verdict.evaluation`).

Usage::

    python -m probes.warm_carry_sim data/results/h100/tune_llama-3.2-1b.json data/results/h100/tune_*.json

Prints a table and writes ``warm_carry_sim.json`` to a new run folder
(``data/results/<platform>/runs/<time>/``, ignored by git), or with ``--save`` to
``data/results/sim-tune/`` (what the paper reads; each file named with its platform folder).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Dict, List

from probes import common

WAYS = ("fresh", "carried", "steady")


def parse_args(argv=None):
    p = common.over_tunes(__doc__, "warm_carry_sim", "tune.json files with a whole sweep and profile.cost_model")
    p.add_argument("--traces", default="data/traces/samples", help="the folder holding the tunes' trace files")
    return common.parse(p, argv)


def _run(point: dict, setting: dict, warm) -> dict:
    """One simulated run of ``setting`` on ``point`` (probes.key_align_sim.load_point), starting
    from ``warm`` (None: cold); its summary."""
    from mlxlab.core.runner import run_workload
    from mlxlab.core.workload import TraceWorkload
    from mlxlab.sim.simulator import Simulator

    sim = Simulator(point["cost_model"], policy=setting["policy"], chunk_size=int(setting["chunk_size"]),
                    warm=warm, **{**point["limits"], **setting["options"]})
    return run_workload(sim, TraceWorkload(list(point["arrivals"]), name="trace")).summary


def _row(point: dict, setting: dict, summaries: List[dict]) -> dict:
    """A grid row as tune stores it (``objective_s``, ``slo_ratio``) from these runs' summaries, scored
    as the sweep scores its repeats: the objective's median over runs, the SLO on the medians."""
    from mlxlab.studies.tune.run import _medians, _objective
    from mlxlab.studies.tune.slo import check, worst_ratio

    med = _medians(summaries, point["tenants"] + ["all"])
    return {"label": setting["label"], "objective_s": statistics.median(_objective(s, point["objective"])
                                                                         for s in summaries),
            "slo_ratio": worst_ratio(check(med, point["slos"], point["solos"]))}


def simulate(doc: dict, point: dict) -> Dict[str, List[dict]]:
    """The grid's rows simulated each way (:data:`WAYS`, and ``processes`` where the sweep names each
    call's runs: :func:`process_runs`)."""
    from mlxlab.studies.tune.run import run_order

    grid = [{k: g[k] for k in ("label", "policy", "chunk_size", "options")} for g in doc["grid"]]
    cm = point["cost_model"]
    sweep = doc["sweep"]
    out = {"fresh": [_row(point, s, [_run(point, s, None)]) for s in grid]}
    warm, runs = cm.warm_shapes(), {s["label"]: [] for s in grid}
    for r in range(sweep["repeats"]):
        for s in run_order(grid, r, sweep.get("order") or "rotation"):
            runs[s["label"]].append(_run(point, s, warm))
    out["carried"] = [_row(point, s, runs[s["label"]]) for s in grid]
    steady = []
    for s in grid:
        w = cm.warm_shapes()
        _run(point, s, w)
        steady.append(_row(point, s, [_run(point, s, w)]))
    out["steady"] = steady
    procs = process_runs(doc)
    if procs is not None:
        by, runs = {s["label"]: s for s in grid}, {s["label"]: [] for s in grid}
        for proc in procs:
            warm = cm.warm_shapes()
            for label in (lb for lb in proc["before"] if lb in by):  # mlx-lm's BatchGenerator is not simulated
                _run(point, by[label], warm)
            for _, label in proc["ran"]:
                runs[label].append(_run(point, by[label], warm))
        out["processes"] = [_row(point, s, runs[s["label"]]) for s in grid if runs[s["label"]]]
    return out


def process_runs(doc: dict):
    """The sweep's processes, where its calls name their runs (``sweep.calls[].ran``): per call, the
    settings that ran in that process before its sweep runs (the first call's confirmed ones, a
    resumed call's warm-up) and its ``[repeat, label]`` runs in order. A first call that ran no sweep
    run (tune without ``--sweep``) names none. None where the calls do not account for every stored run."""
    sweep = doc.get("sweep") or {}
    calls = sweep.get("calls") or []
    total = sum(len(v) for v in (sweep.get("runs") or {}).values())
    ran = [c.get("ran") for c in calls]
    if calls and ran[0] is None:
        ran[0] = []
    if not calls or any(r is None for r in ran) or sum(map(len, ran)) != total:
        return None
    out = []
    for i, (c, r) in enumerate(zip(calls, ran)):
        before = [row["label"] for row in doc.get("confirmed") or []] if i == 0 else \
            ([c["warm_up"]["label"]] if c.get("warm_up") else [])
        out.append({"before": before, "ran": r})
    return out


def sweep_files(paths, traces: str, need=None):
    """``(path, doc, point, platform)`` for each stored tune with a sweep of two whole repeats whose
    point :func:`probes.key_align_sim.load_point` can rebuild; ``need(doc)``: a reason to skip it too
    (or None). Each file skipped is named on stderr with why."""
    from probes.key_align_sim import load_point

    for path in paths:
        doc = json.loads(Path(path).read_text())
        why = "no sweep of two whole repeats" if (doc.get("sweep") or {}).get("repeats", 0) < 2 else \
            (need(doc) if need is not None else None)
        if why:
            print(f"{path}: {why}; skipped", file=sys.stderr)
            continue
        try:
            point = load_point(doc, traces)
        except ValueError as e:
            print(f"{path}: {e}; skipped", file=sys.stderr)
            continue
        yield path, doc, point, (doc.get("environment") or {}).get("platform") or Path(path).parent.name


def score(doc: dict, rows: List[dict]) -> dict:
    """tau and the median errors of ``rows`` against ``doc``'s measured sweep."""
    from mlxlab.studies.tune.verdict import evaluation

    e = evaluation({**doc, "grid": rows})
    return {k: e.get(k) for k in ("tau_objective", "tau_slo", "sim_error_objective", "sim_error_slo_ratio")} | {
        "apart_slo": sum(not d["measured_overlap"] for d in e["discordant_slo"]),
        "apart_objective": sum(not d["measured_overlap"] for d in e["discordant_objective"])}


def main(argv=None) -> int:

    args = parse_args(argv)
    files, plat = [], None
    print(f"{'file':48s} {'way':8s} {'tau SLO':>8s} {'tau obj':>8s} {'err obj':>8s} {'err SLO':>8s} {'apart':>6s}")
    for path, doc, point, where in sweep_files(args.tunes, args.traces):
        plat = plat or where
        ways = simulate(doc, point)
        scores = {w: score(doc, ways[w]) for w in ways}
        for w in ways:
            s = scores[w]
            print(f"{Path(path).name:48s} {w:8s} {s['tau_slo']:8.2f} {s['tau_objective']:8.2f} "
                  f"{s['sim_error_objective']:8.0%} {s['sim_error_slo_ratio']:8.0%} "
                  f"{s['apart_slo']:3d}/{s['apart_objective']:<3d}")
        files.append({"tune": f"{where}/{Path(path).name}", "order": doc["sweep"].get("order") or "rotation",
                      "calls": len(doc["sweep"].get("calls") or [None]), "scores": scores, "rows": ways})
    if not files:
        raise SystemExit("no tune file with a whole sweep")
    print("apart: swapped pairs whose measured repeats do not overlap (SLO ratio / objective)")
    common.save_over_stored("warm_carry_sim", {"parameters": {"tunes": args.tunes}, "files": files},
                            "sim-tune" if args.save else plat, save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
