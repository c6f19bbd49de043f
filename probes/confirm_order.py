"""What ran just before each confirmation run, and whether it moved the run: stored tune files.

``mlxlab tune`` confirms its candidates and mlx-lm's ``BatchGenerator`` (the baseline) in one process,
repeats outermost, each repeat in an order drawn from a fixed seed per repeat
(:func:`mlxlab.studies.tune.order.run_order`), after the warm-up runs (in the first repeat's order)
where it warms up. Until 2026-12-07 #22 the order was a shuffle drawn from a fixed seed per repeat, so with
the same number of settings the same draws came back: with three candidates and the baseline, the third
candidate opened every repeat, and the run before it was the baseline's (the warm-up's last run, then the
first repeat's last). Tune now runs a balanced order (a Williams design) and keeps the sequence it ran
(``confirm_ran``), which this probe reads where it is.

Per file whose confirmed rows keep each run's SLO ratio in the order it ran (``repeat_ratios``; tunes
since 2026-12-07) and that has a sweep: each candidate's confirmation runs rebuilt in order, with the
run just before (``after``: a setting's label, ``warm-up: LABEL``, or ``solo`` for the process's solo
runs) and the run's binding SLO ratio over the median of that setting's sweep runs (the same bound).
Summed by what came before: the baseline (its kept or warm-up run), a candidate, or the solo runs.
Named history (``*_before_*``) is read too, marked, since the order of its runs is as informative.

Usage::

    python -m probes.confirm_order data/results/*/tune*.json [--save]

Prints a table and writes ``confirm_order.json`` to a new run folder, or with ``--save`` to
``data/results/sim-tune/`` (no device runs: it reads stored files).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from probes import common


def parse_args(argv=None):
    p = common.over_tunes(__doc__, "confirm_order", "tune.json files (those without per-run confirmation ratios or "
                                                    "a sweep are skipped, said so)")
    return common.parse(p, argv)


def confirmation_sequence(doc: dict) -> list:
    """``[(label, repeat or None, after)]`` for every run tune's confirmation made in ``doc``, in the order
    they ran: the warm-up runs (repeat None) where it warmed up, then each repeat's (0-based), a setting that
    sat a repeat out of the race left out of it. ``after``: the label of the run before, ``warm-up: LABEL``
    for a warm-up run, ``solo`` for the first run after the solo runs."""
    from mlxlab.studies.tune.order import run_order

    if doc.get("confirm_ran"):  # a tune since 2026-12-07 #22 keeps the sequence itself (kept runs: the label's k-th)
        runs, prev, kept = [], "solo", {}
        for label, kind in doc["confirm_ran"]:
            r = None
            if kind != "warm-up":
                r = kept[label] = kept.get(label, -1) + 1
            runs.append((label, r, prev))
            prev = label if r is not None else f"warm-up: {label}"
        return runs
    labels = [c["label"] for c in doc.get("confirmed") or []]
    sat = {lb: set(s["repeats"]) for lb, s in ((doc.get("race") or {}).get("sat_out") or {}).items()}
    repeats = max((len(c.get("repeat_ratios") or []) for c in doc.get("confirmed") or []), default=0)
    runs, prev = [], "solo"
    if doc.get("confirm_warm_up"):
        for lb in run_order(labels, 0):
            runs.append((lb, None, prev))
            prev = f"warm-up: {lb}"
    for r in range(repeats):
        for lb in run_order([lb for lb in labels if r + 1 not in sat.get(lb, ())], r):
            runs.append((lb, r, prev))
            prev = lb
    return runs


def runs_of(doc: dict) -> list:
    """Each candidate's kept confirmation run of ``doc`` with what ran before it and its SLO ratio over the
    median of its sweep runs; empty where the file lacks per-run ratios or a sweep of that setting."""
    from mlxlab.studies.tune.confirm import BASELINE
    from mlxlab.studies.tune.slo import figure, parse_slo

    sweep = (doc.get("sweep") or {}).get("runs") or {}
    same = doc.get("same_schedule") or {}
    binding = (doc.get("choice") or {}).get("binding") or doc["slos"][0]
    slo = parse_slo(binding)
    bound = doc["bounds_s"][binding]
    rows = {c["label"]: c for c in doc.get("confirmed") or []}
    base = next((c["label"] for c in rows.values() if c.get("policy") == BASELINE), None)
    seen: dict = {}
    out = []
    for lb, r, after in confirmation_sequence(doc):
        if r is None:
            continue
        k = seen[lb] = seen.get(lb, -1) + 1
        ratios = rows[lb].get("repeat_ratios") or []
        runs = [v for v in (figure(s, slo.tenant, slo.metric) for s in sweep.get(same.get(lb, lb), [])) if v is not None]
        if lb == base or k >= len(ratios) or not runs:
            continue
        sweep_median = statistics.median(runs) / bound
        kind = ("baseline" if after in (base, f"warm-up: {base}") else "solo" if after == "solo"
                else "a candidate's warm-up" if after.startswith("warm-up: ") else "a candidate")
        out.append({"label": lb, "repeat": r, "after": after, "after_kind": kind, "ratio": ratios[k],
                    "sweep_median_ratio": sweep_median, "over_sweep": ratios[k] / sweep_median,
                    "sweep_runs": len(runs)})
    return out


def summarize(files: list) -> dict:
    """Per kind of predecessor (and per device group: the GPUs apart from the CPU): the runs, and the median,
    least and largest of their ratio over the sweep's median."""
    out: dict = {}
    for f in files:
        group = "cuda" if f["platform"] in ("h100", "h200") else f["platform"]
        for s in f["runs"]:
            out.setdefault(group, {}).setdefault(s["after_kind"], []).append(s["over_sweep"])
    return {g: {k: {"runs": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
                for k, v in kinds.items()} for g, kinds in out.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    files = []
    for path, doc, runs in common.each_tune(args.tunes, lambda d, p: runs_of(d),
                                            "no per-run confirmation ratios or no sweep"):
        plat = (doc.get("environment") or {}).get("platform") or Path(path).parent.name
        files.append({"tune": path, "platform": plat, "history": "_before_" in Path(path).name,
                      "warmed_up": bool(doc.get("confirm_warm_up")), "runs": runs})
        for s in runs:
            print(f"{path[-52:]:52s} {s['label']:18s} repeat {s['repeat'] + 1} after {s['after']:24s} ratio "
                  f"{s['ratio']:5.2f}  sweep median {s['sweep_median_ratio']:5.2f}  x{s['over_sweep']:.2f}")
    summary = summarize(files)
    for g, kinds in summary.items():
        for k, v in kinds.items():
            print(f"{g}: after {k}: {v['runs']} runs, {v['median']:.2f}x the sweep's median ({v['min']:.2f}-{v['max']:.2f})")
    common.save_over_stored("confirm_order", {"parameters": {"tunes": args.tunes}, "files": files, "by_after": summary},
                            "sim-tune" if args.save else "cpu", save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
