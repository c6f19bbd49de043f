"""Does a setting run slower in tune's own process than in a later one? Stored tune files' sweeps.

A GPU tune with ``--sweep`` runs in several device calls: the first runs the profile, the solo runs, the
confirmation and the first sweep runs in one process; each ``--resume`` call is a new process that warms up
with one run and goes on. Each call's block in the sweep (``calls``) lists the ``[repeat, label]`` of the runs
it made, in order, so every stored sweep run can be placed in its process.

Per file whose first call ran sweep runs and whose later calls ran more of the same settings: per setting,
the median of its runs in the first process over the median of its runs in later ones, on the binding SLO's
ratio and on the objective, and how many settings ran slower in the first. Where the later calls came hours
later they may have run on another machine (``minutes_apart``: from the first call's end to the last's).

Usage::

    python -m probes.sweep_processes data/results/*/tune*.json [--save]

Prints a table and writes ``sweep_processes.json`` to a new run folder, or with ``--save`` to
``data/results/sim-tune/`` (no device runs: it reads stored files).
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

from probes import common


def parse_args(argv=None):
    p = common.over_tunes(__doc__, "sweep_processes", "tune.json files (those whose sweep ran in one process, or "
                                                      "keeps no runs per call, are skipped, said so)")
    return common.parse(p, argv)


def processes_of(doc: dict) -> dict:
    """``{label: [call index of its run in repeat 0, 1, ...]}`` from the sweep's ``calls`` (empty where a
    call keeps no ``ran`` list, or a setting's stored runs outnumber the calls' records of them)."""
    calls = (doc.get("sweep") or {}).get("calls") or []
    if not calls or any("ran" not in c for c in calls):
        return {}
    where: dict = {}
    for i, c in enumerate(calls):
        for r, label in c["ran"]:
            where.setdefault(label, {})[r] = i
    runs = (doc.get("sweep") or {}).get("runs") or {}
    out = {}
    for label, v in runs.items():
        if label in where and all(r in where[label] for r in range(len(v))):
            out[label] = [where[label][r] for r in range(len(v))]
    return out


def compare(doc: dict) -> list:
    """Per setting with sweep runs both in the first call's process and in later ones: its medians there
    and their ratios (first over later) on the binding SLO's ratio and the objective."""
    from mlxlab.studies.tune.slo import figure, parse_objective, parse_slo

    sweep = doc["sweep"]["runs"]
    binding = (doc.get("choice") or {}).get("binding") or doc["slos"][0]
    slo, bound = parse_slo(binding), doc["bounds_s"][binding]
    ot, om = parse_objective(doc["objective"])
    out = []
    for label, calls in processes_of(doc).items():
        first = [s for s, c in zip(sweep[label], calls) if c == 0]
        later = [s for s, c in zip(sweep[label], calls) if c > 0]
        if not first or not later:
            continue
        m = {}
        for name, fn in (("slo_ratio", lambda s: figure(s, slo.tenant, slo.metric) / bound),
                         ("objective_s", lambda s: figure(s, ot, om))):
            a, b = statistics.median(map(fn, first)), statistics.median(map(fn, later))
            m[name] = {"first": a, "later": b, "first_over_later": a / b}
        out.append({"label": label, "runs_first": len(first), "runs_later": len(later), **m})
    return out


def minutes_apart(doc: dict) -> float:
    calls = doc["sweep"]["calls"]
    t = [datetime.fromisoformat(c["written_at"]) for c in (calls[0], calls[-1])]
    return (t[1] - t[0]).total_seconds() / 60


def main(argv=None) -> int:
    args = parse_args(argv)
    files = []
    for path in args.tunes:
        doc = json.loads(Path(path).read_text())
        rows = compare(doc) if (doc.get("sweep") or {}).get("runs") else []
        if not rows:
            print(f"{path}: no sweep runs both in tune's process and a later one; skipped")
            continue
        slower = {k: sum(r[k]["first_over_later"] > 1 for r in rows) for k in ("slo_ratio", "objective_s")}
        med = {k: statistics.median(r[k]["first_over_later"] for r in rows) for k in ("slo_ratio", "objective_s")}
        plat = (doc.get("environment") or {}).get("platform") or Path(path).parent.name
        files.append({"tune": path, "platform": plat, "history": "_before_" in Path(path).name,
                      "steady": bool(doc.get("steady")), "minutes_apart": minutes_apart(doc), "settings": rows,
                      "slower_first": slower, "median_first_over_later": med})
        print(f"{path[-56:]:56s} {len(rows):2d} settings, slower in tune's process: SLO ratio {slower['slo_ratio']}, "
              f"objective {slower['objective_s']}; median first/later {med['slo_ratio']:.2f} / {med['objective_s']:.2f} "
              f"(calls {files[-1]['minutes_apart']:.0f} min apart)")
    cur = [f for f in files if not f["history"]]
    total = {k: {"settings": sum(len(f["settings"]) for f in cur), "slower_first": sum(f["slower_first"][k] for f in cur),
                 "median_first_over_later": statistics.median(r[k]["first_over_later"] for f in cur for r in f["settings"])
                 if cur else None} for k in ("slo_ratio", "objective_s")}
    for k, v in total.items():
        if v["settings"]:
            print(f"{k}: {v['slower_first']} of {v['settings']} settings ran slower in tune's own process (files not "
                  f"named history), median {v['median_first_over_later']:.2f}x")
    common.save_over_stored("sweep_processes", {"parameters": {"tunes": args.tunes}, "files": files, "total": total},
                            "sim-tune" if args.save else "cpu", save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
