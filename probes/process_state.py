"""What in tune's process slows the engine? The settings run between tune's steps, in one process.

``probes/sweep_processes.py`` found the sweep's runs slower in tune's own process than in resumed calls, on the
chat's ITL p50 too (its decode steps ran slower, not only its tail), and still so where tune took its profile from
the cache. Tune's process differs from a resumed one by what ran in it first: the device profile (hundreds of
steps of many shapes), the solo runs (the chat alone, six times) and the confirmation, whose every repeat includes
mlx-lm's ``BatchGenerator``. This runs those steps one at a time in one process, with the same settings measured
between them, so each step's mark on the engine's speed shows as a change from the phase before it, and the
phases with no step in between (``again``) show how much the engine drifts by itself.

Per phase: its step (none for ``start`` and ``again``), then ``--rounds`` rounds of the settings (order fixed),
each run on the tune's trace as the sweep runs it (a fresh engine, caches cleared first). Per run: the binding
SLO's ratio (the tune's stored bound), the objective and the binding tenant's ITL p50. Per phase and setting the
median over its rounds over the ``start`` phase's and over the phase before.

Usage::

    python -m probes.process_state data/results/h100/tune_qwen2.5-coder-1.5b_chat_x4_cached_profile.json \\
        --settings stall_free-1024 interleave-1024 --rounds 2

Runs the tune's model (``parameters.model``, ``bits``, ``dtype``) after one run of each setting (not kept).
Writes ``data/results/<platform>/process_state_<model><--suffix>.json`` after each phase (``complete``: whether
every phase of ``phases_planned`` ran).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from probes import common

STEPS = ("profile", "solo", "baseline")  # what tune's process runs before its sweep runs; start/again: nothing
MEASURES = ("slo_ratio", "objective_s", "itl_p50_s")


def parse_args(argv=None):
    p = common.parser(__doc__, None, model=None)
    p.add_argument("tune", help="a tune.json with its trace, grid, bounds and profile grid")
    p.add_argument("--settings", nargs="+", default=None, metavar="LABEL",
                   help="grid labels to measure between the steps (default: the tune's choice and the sweep's best, "
                        "or the next setting it confirmed where they are one)")
    p.add_argument("--phases", nargs="+", default=["start", "again", "profile", "solo", "baseline", "again"],
                   help=f"in order: start, again or one of {', '.join(STEPS)} (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each setting per phase (default: %(default)s)")
    p.add_argument("--solo-runs", type=int, default=6, help="the solo step's runs, as tune's (default: %(default)s)")
    p.add_argument("--baseline-runs", type=int, default=3,
                   help="the baseline step's BatchGenerator runs, as tune's confirmation (default: %(default)s)")
    p.add_argument("--traces", default="data/traces/samples", help="the folder holding the tune's trace file")
    p.add_argument("--suffix", default="", help="appended to the file's name, process_state_<model><suffix>.json "
                                                "(e.g. _baseline for a second process with other phases)")
    p.add_argument("--follows", default=None, metavar="JSON",
                   help="the process-state file of the process that ran just before this one on the same machine (the "
                        "paper sets this process's first phase against that one's last and first)")
    args = common.parse(p, argv)
    bad = [x for x in args.phases if x not in ("start", "again", *STEPS)]
    if bad or args.phases[0] != "start" or args.rounds < 1:
        got = bad or "no start first"
        p.error(f"--phases must start with 'start' and name only start, again, {', '.join(STEPS)} (got {got}); "
                f"--rounds at least 1")
    return args


def utc_now() -> str:
    """The time now in UTC (ISO 8601, microseconds): each run and step keeps when it started, so the GPU's clock
    log beside a call (``scripts/h200_batch.sh``, nvidia-smi in UTC) can be set against it."""
    return datetime.now(timezone.utc).isoformat()


def run_phases(phases: Sequence[str], steps: Dict[str, Callable[[], None]], labels: Sequence[str], rounds: int,
               run_setting: Callable[[str], dict], say: Callable[[str], None] = print,
               on_phase: Optional[Callable[[List[dict]], None]] = None) -> List[dict]:
    """Each phase: its step (``steps[name]``; none for start/again), then ``rounds`` x ``labels`` runs of
    ``run_setting(label)`` (a dict of :data:`MEASURES`). Returns ``[{"phase", "step_s", "runs": {label: [...]}}]``;
    ``on_phase(phases so far)`` after each phase (the probe writes its file there, so a run cut short by a time
    limit keeps its finished phases). Each run also keeps ``started_utc`` and ``wall_s``, each phase ``started_utc``."""
    out = []
    for ph in phases:
        at, t = utc_now(), time.perf_counter()
        if ph in steps:
            steps[ph]()
        step_s = time.perf_counter() - t
        runs: Dict[str, List[dict]] = {lb: [] for lb in labels}
        for _ in range(rounds):
            for lb in labels:
                run_at, t = utc_now(), time.perf_counter()
                runs[lb].append({**run_setting(lb), "started_utc": run_at, "wall_s": time.perf_counter() - t})
        out.append({"phase": ph, "started_utc": at, "step_s": step_s, "runs": runs})
        say(f"[process_state] {ph:9s} step {step_s:6.1f} s  " + "  ".join(
            f"{lb} ITL p50 {statistics.median(r['itl_p50_s'] for r in runs[lb]) * 1e3:.2f} ms, SLO ratio "
            f"{statistics.median(r['slo_ratio'] for r in runs[lb]):.2f}" for lb in labels))
        if on_phase is not None:
            on_phase(out)
    return out


def summarize(phases: List[dict]) -> List[dict]:
    """Per phase and measure: per setting its median over the start phase's (``over_start``) and over the
    phase before's (``over_previous``), and the median of those over the settings."""
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    start, out = phases[0], []
    for i, ph in enumerate(phases):
        row = {"phase": ph["phase"], "step_s": ph["step_s"]}
        for k in MEASURES:
            per = {lb: {"median": med(runs, k), "over_start": med(runs, k) / med(start["runs"][lb], k),
                        "over_previous": med(runs, k) / med(phases[i - 1]["runs"][lb], k) if i else 1.0}
                   for lb, runs in ph["runs"].items()}
            row[k] = {"settings": per, "over_start": statistics.median(v["over_start"] for v in per.values()),
                      "over_previous": statistics.median(v["over_previous"] for v in per.values())}
        out.append(row)
    return out


def main(argv=None) -> int:
    import mlx.core as mx

    from mlxlab.core.runner import run_workload
    from mlxlab.engine.models import load_model
    from mlxlab.sim.measure import profile_device
    from mlxlab.studies.tune.run import BASELINE, REF, _engine, _executor, _fresh, _workload
    from mlxlab.studies.tune.slo import figure, parse_objective, parse_slo
    from probes.key_align_sim import load_point

    args = parse_args(argv)
    doc = json.loads(Path(args.tune).read_text())
    grid = {g["label"]: {k: g[k] for k in ("label", "policy", "chunk_size", "options")} for g in doc["grid"]}
    reg = next((v.get("measured") or {} for v in doc.get("verdicts") or [] if v.get("claim") == "mlx-tune-regret"), {})
    confirmed = [c["label"] for c in doc.get("confirmed") or [] if c["label"] in grid]
    labels = args.settings or list(dict.fromkeys(x for x in ((doc.get("choice") or {}).get("label"), reg.get("best"),
                                                             *confirmed) if x))[:2]
    missing = [x for x in labels if x not in grid]
    if missing or not labels:
        raise SystemExit(f"{args.tune}: no grid setting {missing or labels}; its labels: {sorted(grid)}")
    pgrid = (doc.get("profile") or {}).get("grid")
    if "profile" in args.phases and not pgrid:
        raise SystemExit(f"{args.tune}: keeps no profile grid (profile.grid): leave 'profile' out of --phases")
    point = load_point(doc, args.traces)
    p = doc["parameters"]
    binding = (doc.get("choice") or {}).get("binding") or doc["slos"][0]
    slo, bound = parse_slo(binding), doc["bounds_s"][binding]
    ot, om = parse_objective(doc["objective"])
    model = load_model(p["model"], bits=p.get("bits"), dtype=p.get("dtype"))

    def run_setting(label: str) -> dict:
        _fresh()
        s = run_workload(_engine(model, grid[label]), _workload(point["arrivals"])).summary
        return {"slo_ratio": figure(s, slo.tenant, slo.metric) / bound, "objective_s": figure(s, ot, om),
                "itl_p50_s": figure(s, slo.tenant, "itl_p50")}

    def solo() -> None:
        for _ in range(args.solo_runs):
            _fresh()
            run_workload(_engine(model, REF), _workload(point["arrivals"], slo.tenant))

    def baseline() -> None:
        for _ in range(args.baseline_runs):
            _fresh()
            run_workload(_executor(model, {"label": BASELINE, "policy": BASELINE, "chunk_size": 2048, "options": {}}),
                         _workload(point["arrivals"]))

    def profile() -> None:
        profile_device(model, **pgrid, log=lambda line: None)
        mx.clear_cache()

    common.log("process_state", f"{p['model']} ({p.get('bits')} bits): {len(point['arrivals'])} requests, settings "
                                f"{labels}, phases {args.phases}, {args.rounds} round(s)")
    t = time.perf_counter()
    for lb in labels:
        run_setting(lb)
    common.log("process_state", f"warm-up: one run of each setting, {time.perf_counter() - t:.1f} s (not kept)")
    args.platform = args.platform or (doc.get("environment") or {}).get("platform") or Path(args.tune).parent.name

    def write(phases: List[dict]) -> None:
        common.save(args, "process_state", {"tune": Path(args.tune).name, "tune_source_commit": (doc.get("environment")
                                            or {}).get("source_commit"), "settings": labels, "binding": binding,
                                            "bound_s": bound, "objective": doc["objective"], "rounds": args.rounds,
                                            "solo_runs": args.solo_runs, "baseline_runs": args.baseline_runs,
                                            "profile_grid": pgrid, "phases_planned": list(args.phases),
                                            "complete": len(phases) == len(args.phases), "phases": phases,
                                            "follows": Path(args.follows).stem if args.follows else None,
                                            "summary": summarize(phases)},
                    name=f"process_state_{p['model']}{args.suffix}")

    phases = run_phases(args.phases, {"profile": profile, "solo": solo, "baseline": baseline}, labels, args.rounds,
                        run_setting, on_phase=write)
    for row in summarize(phases):
        print(f"{row['phase']:9s} " + "  ".join(f"{k} x{row[k]['over_start']:.3f} of start, x{row[k]['over_previous']:.3f}"
                                                  f" of the phase before" for k in MEASURES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
