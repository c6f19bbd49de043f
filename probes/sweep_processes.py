"""Does a setting run slower in tune's own process than in a later one? Stored tune files' sweeps.

A GPU tune with ``--sweep`` runs in several device calls: the first runs the profile, the solo runs, the
confirmation and the first sweep runs in one process; each ``--resume`` call is a new process that warms up
with one run and goes on. Each call's block in the sweep (``calls``) lists the ``[repeat, label]`` of the runs
it made, in order, so every stored sweep run can be placed in its process.

Per file whose first call ran sweep runs and whose later calls ran more of the same settings: per setting,
the median of its runs in the first process over the median of its runs in later ones, on the binding SLO's
ratio, on the objective and on the binding tenant's ITL p50 (how fast its decode steps ran: thousands of gaps, so
far less noisy than a p99), and how many settings ran slower in the first. Where the later calls came hours
later they may have run on another machine (``minutes_apart``: from the first call's end to the last's).

A second comparison holds the process fixed: within the resumed calls only, a setting's first run in its process
(``cold``: nothing of that setting ran there before; the call's warm-up run counts, as the confirmation does in
tune's own process) against its runs there after one of itself (``again``). Tune's first process meets most of
the grid's settings cold (only the confirmed ones ran there before), so a cold-setting cost alone would make it
look slower; this says whether it does.

A third holds the process kind fixed and varies the time: within the resumed calls, a setting's runs that began
after the median start of those calls' runs (timed from the call's start: its warm-up and the runs before, from
``run_wall_s``) against its runs before it (``late_over_early``). Tune's own process starts its sweep minutes into
its call; where the engine slowed with the time a call had run, the resumed calls' late runs would be slower too.

Usage::

    python -m probes.sweep_processes data/results/*/tune*.json [--save]

Prints a table and writes ``sweep_processes.json`` to a new run folder, or with ``--save`` to
``data/results/sim-tune/`` (no device runs: it reads stored files).
"""

from __future__ import annotations

import math
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

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


def warmth_of(doc: dict) -> dict:
    """``{label: [True where that repeat's run came after a run of the same setting in its process]}`` (empty
    where the runs cannot be placed). A steady tune runs each setting once before every kept run: all True."""
    calls = (doc.get("sweep") or {}).get("calls") or []
    where = processes_of(doc)
    if not where:
        return {}
    if doc.get("steady"):
        return {label: [True] * len(c) for label, c in where.items()}
    seen = [{row["label"] for row in doc.get("confirmed") or []}] + [set() for _ in calls[1:]]
    for i, c in enumerate(calls[1:], 1):
        if (c.get("warm_up") or {}).get("label"):
            seen[i].add(c["warm_up"]["label"])
    out = {label: [False] * len(c) for label, c in where.items()}
    for i, c in enumerate(calls):
        for r, label in c["ran"]:
            if label in out and r < len(out[label]):
                out[label][r] = label in seen[i]
            seen[i].add(label)
    return out


def elapsed_of(doc: dict) -> dict:
    """``{label: [seconds since its call's first sweep run (the resumed call's warm-up run counted) when that
    repeat's run began, or None where it ran in tune's own process]}``, from the calls' ``ran`` order and the
    sweep's ``run_wall_s`` (empty where either is missing)."""
    calls = (doc.get("sweep") or {}).get("calls") or []
    walls = (doc.get("sweep") or {}).get("run_wall_s") or {}
    where = processes_of(doc)
    if not where or not walls:
        return {}
    out = {label: [None] * len(c) for label, c in where.items()}
    for c in calls[1:]:
        t = ((c.get("warm_up") or {}).get("wall_s") or 0.0)
        for r, label in c["ran"]:
            if label in out and r < len(out[label]):
                out[label][r] = t
            t += (walls.get(label) or [])[r] if r < len(walls.get(label) or []) else 0.0
    return out


def compare_time(doc: dict) -> list:
    """Within the resumed calls only, per setting with runs both before and after the median start time of those
    calls' runs (:func:`elapsed_of`): medians of its late and early runs and ``late_over_early`` per
    :data:`MEASURES`. Tune's own process runs its sweep after the profile, solo runs and confirmation (minutes of
    work); where the engine slows with the time a call has run, late runs in a resumed call show it too."""
    el = elapsed_of(doc)
    starts = [t for v in el.values() for t in v if t is not None]
    if not starts:
        return []
    cut = statistics.median(starts)
    sweep, out = doc["sweep"]["runs"], []
    for label, v in el.items():
        early = [r for r, t in enumerate(v) if t is not None and t <= cut]
        late = [r for r, t in enumerate(v) if t is not None and t > cut]
        if early and late:
            m = _medians(sweep[label], late, early, *_binding(doc))
            out.append({"label": label, "runs_late": len(late), "runs_early": len(early), "cut_s": cut,
                        **{k: {"late": v["a"], "early": v["b"], "late_over_early": v["a_over_b"]}
                           for k, v in m.items()}})
    return out


def _medians(sweep_runs: list, a: list, b: list, slo, bound, ot, om) -> dict:
    """Medians of runs ``a`` and ``b`` (indices into a setting's runs) and ``a`` over ``b``, per :data:`MEASURES`."""
    from mlxlab.studies.tune.slo import figure

    m = {}
    for name, fn in (("slo_ratio", lambda s: figure(s, slo.tenant, slo.metric) / bound),
                     ("objective_s", lambda s: figure(s, ot, om)),
                     ("itl_p50_s", lambda s: figure(s, slo.tenant, "itl_p50"))):
        x, y = (statistics.median(fn(sweep_runs[i]) for i in idx) for idx in (a, b))
        m[name] = {"a": x, "b": y, "a_over_b": x / y}
    return m


def _binding(doc: dict):
    from mlxlab.studies.tune.slo import parse_objective, parse_slo

    binding = (doc.get("choice") or {}).get("binding") or doc["slos"][0]
    return (parse_slo(binding), doc["bounds_s"][binding], *parse_objective(doc["objective"]))


def compare_warmth(doc: dict) -> list:
    """Per setting with, in the resumed calls, both a run that was its first in its process and a run after one
    of itself there: medians of each and ``cold_over_again`` per :data:`MEASURES`."""
    sweep, warm, calls = doc["sweep"]["runs"], warmth_of(doc), processes_of(doc)
    out = []
    for label, w in warm.items():
        cold = [r for r, (x, c) in enumerate(zip(w, calls[label])) if c > 0 and not x]
        again = [r for r, (x, c) in enumerate(zip(w, calls[label])) if c > 0 and x]
        if cold and again:
            m = _medians(sweep[label], cold, again, *_binding(doc))
            out.append({"label": label, "runs_cold": len(cold), "runs_again": len(again),
                        **{k: {"cold": v["a"], "again": v["b"], "cold_over_again": v["a_over_b"]}
                           for k, v in m.items()}})
    return out


def compare(doc: dict) -> list:
    """Per setting with sweep runs both in the first call's process and in later ones: its medians there
    and their ratios (first over later) per :data:`MEASURES`."""
    sweep = doc["sweep"]["runs"]
    out = []
    for label, calls in processes_of(doc).items():
        first = [r for r, c in enumerate(calls) if c == 0]
        later = [r for r, c in enumerate(calls) if c > 0]
        if not first or not later:
            continue
        m = _medians(sweep[label], first, later, *_binding(doc))
        out.append({"label": label, "runs_first": len(first), "runs_later": len(later),
                    **{k: {"first": v["a"], "later": v["b"], "first_over_later": v["a_over_b"]} for k, v in m.items()}})
    return out


def minutes_apart(doc: dict) -> float:
    calls = doc["sweep"]["calls"]
    t = [datetime.fromisoformat(c["written_at"]) for c in (calls[0], calls[-1])]
    return (t[1] - t[0]).total_seconds() / 60


def comparisons(doc: dict, path: str = "") -> Optional[tuple]:
    """``(compare(doc), compare_warmth(doc), compare_time(doc))`` where any has a row, else None (no sweep runs to
    place)."""
    if not (doc.get("sweep") or {}).get("runs"):
        return None
    rows, warm, late = compare(doc), compare_warmth(doc), compare_time(doc)
    return (rows, warm, late) if rows or warm or late else None


def _count(rows: list, key: str) -> tuple:
    """How many rows have ``key`` over 1, and its median, per measure."""
    return ({k: sum(r[k][key] > 1 for r in rows) for k in MEASURES},
            {k: statistics.median(r[k][key] for r in rows) if rows else None for k in MEASURES})


def by_chance(k: int, n: int) -> float:
    """The sign test's one-sided chance: at least ``k`` of ``n`` settings slower where each is as likely either way."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n if n else 1.0


MEASURES = ("slo_ratio", "objective_s", "itl_p50_s")  # the last: the binding tenant's ITL p50, a step
# speed (half its gaps under it: thousands in the chat x4 traces, where the p99 rests on a few dozen)


def main(argv=None) -> int:
    args = parse_args(argv)
    files = []
    for path, doc, (rows, warm, late) in common.each_tune(args.tunes, comparisons, "no sweep runs both in tune's process "
                                                    "and a later one, nor cold and again in a resumed one"):
        slower, med = _count(rows, "first_over_later")
        wslower, wmed = _count(warm, "cold_over_again")
        lslower, lmed = _count(late, "late_over_early")
        plat = (doc.get("environment") or {}).get("platform") or Path(path).parent.name
        files.append({"tune": path, "platform": plat, "history": "_before_" in Path(path).name,
                      "steady": bool(doc.get("steady")), "minutes_apart": minutes_apart(doc), "settings": rows,
                      "profile_cached": bool((doc.get("profile") or {}).get("cached")),
                      "slower_first": slower, "median_first_over_later": med,
                      "by_chance": {k: by_chance(slower[k], len(rows)) for k in MEASURES},
                      "warmth": warm, "slower_cold": wslower, "median_cold_over_again": wmed,
                      "time": late, "slower_late": lslower, "median_late_over_early": lmed})
        line = f"{path[-56:]:56s}"
        if rows:
            line += (f" {len(rows):2d} settings, slower in tune's process: SLO ratio {slower['slo_ratio']}, objective "
                     f"{slower['objective_s']}, ITL p50 {slower['itl_p50_s']}; median first/later {med['slo_ratio']:.2f} / "
                     f"{med['objective_s']:.2f} / {med['itl_p50_s']:.2f} "
                     f"(calls {files[-1]['minutes_apart']:.0f} min apart)")
        if warm:
            line += (f"; resumed calls, {len(warm)} settings slower cold than again: {wslower['slo_ratio']} / "
                     f"{wslower['objective_s']} / {wslower['itl_p50_s']}, median {wmed['slo_ratio']:.2f} / "
                     f"{wmed['objective_s']:.2f} / {wmed['itl_p50_s']:.2f}")
        if late:
            line += (f"; resumed calls, {len(late)} settings slower late (after {late[0]['cut_s']:.0f} s) than early: "
                     f"{lslower['slo_ratio']} / {lslower['objective_s']} / {lslower['itl_p50_s']}, median "
                     f"{lmed['slo_ratio']:.2f} / {lmed['objective_s']:.2f} / {lmed['itl_p50_s']:.2f}")
        print(line)
    cur = [f for f in files if not f["history"]]
    total = {}
    for name, rows_key, key in (("process", "settings", "first_over_later"), ("warmth", "warmth", "cold_over_again"),
                                ("time", "time", "late_over_early")):
        rows = [r for f in cur for r in f[rows_key]]
        n, med = _count(rows, key)
        total[name] = {k: {"settings": len(rows), "slower": n[k], "median": med[k],
                           "by_chance": by_chance(n[k], len(rows))} for k in MEASURES}
        for k, v in total[name].items():
            if v["settings"]:
                what = {"process": "in tune's own process", "warmth": "cold than again, in resumed calls",
                        "time": "late than early in resumed calls"}[name]
                print(f"{k}: {v['slower']} of {v['settings']} settings ran slower {what} (files not named history), "
                      f"median {v['median']:.2f}x")
    common.save_over_stored("sweep_processes", {"parameters": {"tunes": args.tunes}, "files": files, "total": total},
                            "sim-tune" if args.save else "cpu", save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
