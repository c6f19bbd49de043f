"""Racing tune's confirmation, replayed on stored sweeps: how many repeats the confirmation needs
before its runs decide the choice, and what stopping there would have chosen.

``mlxlab tune`` confirms its top-k settings (and mlx-lm's BatchGenerator) ``repeats`` times, and on
every committed file that confirmation is most of tune's wall time (``wall_s.confirm``). A race
(:func:`mlxlab.studies.tune.slo.settled`) stops once the repeats so far decide the pick: it met every
SLO in every repeat, and every other candidate either missed one or ran worse in every repeat. This
asks, with no device, what that rule would have done on each stored tune with a sweep: the sweep
measured the same candidates on the same trace, so its first repeats stand in for the confirmation's
(one engine, one trace, the order shuffled per repeat). Per file and ``--min-repeats``: the repeat the
race stops at, its choice against the choice after every repeat, the choice's regret against the
sweep's best (as ``mlx-tune-regret`` scores it) and the confirmation's wall time saved (the sweep's
run times of the candidates' skipped repeats).

Whether waiting longer before stopping buys a safer pick: over the files whose sweep ran ``--late``
(5) repeats or more, per ``k`` below it, the settings that met every SLO in each of their first ``k``
repeats, and how many of them then missed one in the last repeat, or in any run after the ``k``-th
(``later_misses``). A miss rate that falls with ``k`` says more repeats before stopping would catch
such misses; one that does not says they are not foretold by the repeats before them.

Usage::

    python -m probes.confirm_race_sim data/results/*/tune*.json --min-repeats 2 3

Prints a table and writes ``confirm_race_sim.json`` to a new run folder
(``data/results/<platform>/runs/<time>/``, ignored by git), or with ``--save`` to
``data/results/sim-tune/`` (what the paper reads).
"""

from __future__ import annotations

import statistics
import sys

from probes import common


def parse_args(argv=None):
    p = common.over_tunes(__doc__, "confirm_race_sim", "tune.json files with a sweep (others are skipped, said so)")
    p.add_argument("--min-repeats", type=int, nargs="+", default=[2], help="the race's first stopping point(s)")
    p.add_argument("--late", type=int, default=5, help="the sweep repeats a file needs for later_misses (its last is the one looked at)")
    return common.parse(p, argv)


def rows_after(doc: dict, labels: list, runs: dict, n: int) -> list:
    """The confirmation's rows as tune builds them from each candidate's first ``n`` runs."""
    from mlxlab.studies.tune.run import _confirm_row
    from mlxlab.studies.tune.slo import parse_slo

    slos = [parse_slo(s) for s in doc["slos"]]
    return [_confirm_row({"label": lb}, runs[lb][:n], doc["tenants"], slos, doc["solo"], doc["objective"])
            for lb in labels]


def regret(doc: dict, label: str) -> float:
    """``label``'s regret against the sweep's best, as :func:`mlxlab.studies.tune.verdict.evaluation` scores the choice."""
    from mlxlab.studies.tune.verdict import evaluation

    return evaluation({**doc, "choice": {"label": label}}).get("regret")


def race(doc: dict, min_repeats: int, drop: bool = True) -> dict:
    """The race on ``doc``'s sweep runs: stopping once settled and, with ``drop``, each setting that
    :func:`mlxlab.studies.tune.slo.outrun` puts out sitting out the next repeat (as
    :func:`mlxlab.studies.tune.confirm.confirm_runs` runs it)."""
    from mlxlab.studies.tune.run import _confirm_row
    from mlxlab.studies.tune.slo import choose, outrun, parse_slo, settled

    same = doc.get("same_schedule") or {}
    sweep = doc["sweep"]
    cands = [same.get(r["label"], r["label"]) for r in doc["confirmed"] if r["policy"] != "mlx_lm.BatchGenerator"]
    total = min(int(doc["parameters"]["repeats"]), int(sweep["repeats"]))
    runs, walls = sweep["runs"], sweep.get("run_wall_s") or {}
    slos = [parse_slo(s) for s in doc["slos"]]
    ran = {lb: [] for lb in cands}  # the repeats (0-based) each candidate ran in

    def rows():
        return [_confirm_row({"label": lb}, [runs[lb][i] for i in ran[lb]], doc["tenants"], slos, doc["solo"],
                             doc["objective"]) for lb in cands]

    out, stop, why, skipped = {}, total, None, []
    for n in range(total):
        for lb in cands:
            if lb in out:
                skipped.append((lb, n))
            else:
                ran[lb].append(n)
        if n + 1 == total:
            break
        why = settled(rows(), min_repeats)
        if why:
            stop = n + 1
            break
        out = (outrun(rows(), min_repeats) or {}) if drop else {}
    pick = choose(rows())
    full = choose(rows_after(doc, cands, runs, total))
    per = {(lb, r): walls[lb][r] for lb in cands for r in range(total)} if walls else {}
    saved = (sum(per[k] for k in skipped) + sum(per[(lb, r)] for lb in cands for r in range(stop, total))) if per else None
    return {"min_repeats": min_repeats, "drop": drop, "repeats": total, "stopped_at": stop, "why": why,
            "sat_out": sorted({f"{lb}@{r + 1}" for lb, r in skipped}), "choice": pick.label,
            "choice_all_repeats": full.label, "regret": regret(doc, pick.label),
            "regret_all_repeats": regret(doc, full.label),
            "candidates_wall_s": sum(per.values()) if per else None, "saved_wall_s": saved}


def met_by_repeat(doc: dict) -> dict:
    """Per swept setting, whether each of its sweep runs met every SLO (as tune checks one repeat)."""
    from mlxlab.studies.tune.run import _confirm_row
    from mlxlab.studies.tune.slo import parse_slo

    slos = [parse_slo(s) for s in doc["slos"]]
    return {lb: [all(c["met"] for c in _confirm_row({"label": lb}, [run], doc["tenants"], slos, doc["solo"],
                                                      doc["objective"])["checks"]) for run in runs]
            for lb, runs in doc["sweep"]["runs"].items()}


def later_misses(docs: dict, late: int) -> list:
    """Per ``k`` below ``late``: over ``docs`` (path: tune) whose sweep holds ``late`` runs of a setting,
    the settings that met every SLO in each of their first ``k`` runs (``met``); those of them that missed
    one in run ``late`` (``missed``, with the files and labels in ``which``); and over their runs
    ``k + 1`` to ``late``, how many there were (``later_runs``) and how many missed (``later_run_misses``)."""
    out, met_by = [], {path: met_by_repeat(doc) for path, doc in docs.items()}
    for k in range(1, late):
        met, missed, runs, misses = 0, [], 0, 0
        for path, by in met_by.items():
            for lb, ok in by.items():
                if len(ok) >= late and all(ok[:k]):
                    met += 1
                    runs += late - k
                    misses += sum(not m for m in ok[k:late])
                    if not ok[late - 1]:
                        missed.append(f"{path}:{lb}")
        out.append({"k": k, "late": late, "met": met, "missed": len(missed), "which": missed,
                    "later_runs": runs, "later_run_misses": misses})
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    out, plat, swept = [], None, {}
    print(f"{'file':52s} {'min':>3s} {'drop':>4s} {'stop':>4s}/{'R':<2s} {'choice':22s} {'all repeats':22s} {'regret':>7s} "
          f"{'(all)':>7s} {'saved':>6s}")
    raced = lambda d, p: bool((d.get("sweep") or {}).get("runs") and (d.get("sweep") or {}).get("repeats")  # noqa: E731
                              and "checks_worst" in (d.get("confirmed") or [{}])[0])
    for path, doc, _ in common.each_tune(args.tunes, raced, "no sweep runs or no per-repeat checks"):
        plat = plat or (doc.get("environment") or {}).get("platform")
        swept[path] = doc
        for m, drop in [(m, d) for m in args.min_repeats for d in (False, True)]:
            r = race(doc, m, drop)
            out.append({"tune": path, **r})
            fr = f"{r['saved_wall_s'] / r['candidates_wall_s']:.0%}" if r["candidates_wall_s"] else "?"
            rg = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
            print(f"{path[-52:]:52s} {m:3d} {'yes' if drop else 'no':>4s} {r['stopped_at']:4d}/{r['repeats']:<2d} {r['choice'] or '-':22s} "
                  f"{r['choice_all_repeats'] or '-':22s} {rg(r['regret']):>7s} {rg(r['regret_all_repeats']):>7s} {fr:>6s}")
    late = later_misses(swept, args.late)
    for row in late:
        print(f"met the SLOs in each of the first {row['k']} repeats: {row['met']} settings; "
              f"missed one in repeat {row['late']}: {row['missed']}; in repeats {row['k'] + 1}-{row['late']}: "
              f"{row['later_run_misses']} of their {row['later_runs']} runs")
    common.save_over_stored("confirm_race_sim", {"parameters": {"tunes": args.tunes, "min_repeats": args.min_repeats, "late": args.late},
                                                  "files": out, "later_misses": late}, "sim-tune" if args.save else plat, save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
