"""Tune's confirmation on the engine: the simulation's top settings and mlx-lm's ``BatchGenerator``
replayed on the trace, repeats outermost, in a balanced order per repeat (:data:`CONFIRM_ORDER`), as a race.

A race, as configuration racing does, drops a candidate once its runs separate it from the best:
from the second repeat on, where the pick has met every SLO in every repeat, a setting that missed one
in some repeat or ran worse than the pick in every repeat (:func:`mlxlab.studies.tune.slo.outrun`) sits
out the next repeat; it runs again if the pick misses later. The confirmation stops after a repeat
whose runs decide the choice (:func:`mlxlab.studies.tune.slo.settled`: every other setting out), so the
repeats asked for are a ceiling. ``BatchGenerator``, the reference every ratio is taken against, runs in
every repeat the confirmation runs. Replayed on the 18 tunes stored with a sweep before it, their
sweeps' runs standing in for the confirmation's (``probes/confirm_race_sim.py``,
``data/results/sim-tune/confirm_race_sim.json``), the race chose what all the repeats chose in every
file, with and without candidates sitting out; stopping alone ended early in 4 of them, and a
candidate sat out a repeat in 5.

On a device that prepares attention per exact shape (mlx's CUDA backend with cuDNN attention:
:func:`mlxlab.engine.fused.cold_keying`) the confirmation's first run of each candidate pays that
process's first uses of the candidate's shapes; :func:`warm_runs` runs each once before it, not kept.
On an H100 and an H200 coder-1.5b's three ``stall_free`` candidates each ran one confirmation repeat
1.2-1.5x above every one of their sweep runs, and the other below them (``probes/confirm_cold.py``,
``data/results/sim-tune/confirm_cold.json``), and tune chose a setting that met no SLO where the sweep
found two that met it in every repeat.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

BASELINE = "mlx_lm.BatchGenerator"
# the fewest solo runs whose median sets a relative bound: on the CPU, over random sets of k of 20 solo runs of the
# chat (probes/solo_estimators.py, data/results/cpu/solo_estimators*.json), the median's 10-90% range was 17-22% of
# it at k=2 and 12-13% at k=5; pooling the runs' gaps instead was steadier on the 119-gap trace and less steady on
# the 1,015-gap one, so the median stays
SOLO_REPEATS = 5
# the order of each confirmation repeat (mlxlab.studies.tune.order.run_order): a Williams design, so no setting always
# opens a repeat or follows the same run; tunes before 2026-12-07 #22 ran "shuffle" (no "confirm_order" in the file)
CONFIRM_ORDER = "balanced"


def median_summary(summaries: Sequence[dict], tenants: Sequence[str]) -> dict:
    """The per-figure median summary over repeats (the shape of one run's summary)."""
    import math
    import statistics

    out: dict = {}
    for t in tenants:
        out[t] = {}
        for key in ("ttft_s", "itl_s", "e2e_s"):
            out[t][key] = {}
            for pct in ("p50", "p90", "p99", "max"):
                vals = [s[t][key][pct] for s in summaries if t in s and not math.isnan(s[t][key][pct])]
                out[t][key][pct] = statistics.median(vals) if vals else float("nan")
    return out


def confirm_runs(settings: Sequence[dict], *, repeats: int, run_one: Callable[[dict], dict],
                 order: Callable[[List[dict], int], List[dict]], row: Callable[[dict, List[dict]], dict],
                 race: bool = True, bar=None, say: Callable[[str], None] = print
                 ) -> Tuple[Dict[str, List[dict]], Optional[dict]]:
    """Each of ``settings`` (tune's rows: ``label``, ``policy``, ``chunk_size``, ``options``; the
    baseline's policy :data:`BASELINE`) run up to ``repeats`` times, repeats outermost. ``run_one(setting)``:
    one fresh replay of the trace on the engine, its run summary; ``order(settings, r)``: the order repeat
    ``r`` runs them in (:func:`mlxlab.studies.tune.run.run_order`); ``row(setting, runs)``: the confirmed row
    of a setting's runs so far (what the race reads); ``bar``: a progress bar updated after each run.
    Returns each label's run summaries and, where the race dropped a setting from a repeat or stopped
    early, ``{"repeats", "of", "why", "sat_out"}`` (``why``: None where it did not stop; ``sat_out``: label ->
    the repeats, 1-based, it sat out and why the last time), else None."""
    from mlxlab.studies.tune.slo import outrun, settled

    measured: Dict[str, List[dict]] = {c["label"]: [] for c in settings}
    out: Dict[str, str] = {}
    sat_out: Dict[str, dict] = {}
    why, done = None, 0
    for r in range(repeats):
        for c in order([c for c in settings if c["label"] not in out], r):
            measured[c["label"]].append(run_one(c))
            if bar is not None:
                bar.update(1)
        for lb, reason in out.items():
            sat_out.setdefault(lb, {"repeats": [], "why": reason})["repeats"].append(r + 1)
            sat_out[lb]["why"] = reason
        done = r + 1
        if not race or done == repeats:
            continue
        rows = [row(c, measured[c["label"]]) for c in settings if c["policy"] != BASELINE]
        why = settled(rows)
        if why:
            say(f"[tune] confirmation stopped: {why}")
            break
        now = outrun(rows) or {}
        for lb in sorted(set(now) - set(out)):
            say(f"[tune] {lb} sits out the next repeat: {now[lb]}")
        for lb in sorted(set(out) - set(now)):
            say(f"[tune] {lb} runs again: the pick missed an SLO or changed")
        out = now
    if bar is not None and bar.n < bar.total:  # it counted every run of every repeat asked for
        bar.total = bar.n
        bar.refresh()
    raced = {"repeats": done, "of": repeats, "why": why, "sat_out": sat_out} if why or sat_out else None
    return measured, raced


def wants_warm_up(warm_up: Optional[bool] = None, steady: bool = False) -> bool:
    """Whether tune warms its solo runs and confirmation up (:func:`solo_runs`, :func:`warm_runs`): always for a
    ``steady`` tune, else ``warm_up`` where given (True or False), else (None: ``--warm-up auto``) where the default
    device prepares attention per exact shape (:func:`mlxlab.engine.fused.cold_keying`). Until 12-07 tune asked
    ``wants_warm_up(warm_up or steady)``, which turned auto (None) into off: the H100 tune of that day ran its
    confirmation cold, each ``stall_free`` candidate's first repeat 1.3-2.2x its second."""
    from mlxlab.engine.fused import cold_keying

    if steady:
        return True
    return cold_keying()[0] == "shape" if warm_up is None else bool(warm_up)


def solo_runs(metrics: Dict[str, Sequence[str]], *, repeats: int, run_solo: Callable[[str], dict],
              medians: Callable[[Sequence[dict], List[str]], dict], warm: bool,
              say: Callable[[str], None] = print) -> Tuple[Dict[str, dict], Dict[str, dict]]:
    """Each tenant of ``metrics`` (tenant -> the metrics its relative SLOs name) alone on the engine
    ``repeats`` times (``run_solo(tenant)``: one run's summary), after one run not kept where ``warm``: the
    solo figures every relative SLO's bound and the decode calibration rest on, so a process's first uses
    must not land in them. Returns the per-figure ``medians`` of each tenant's runs and, per tenant,
    ``{"warm_up_s": seconds or None, "runs": [{metric: seconds}]}`` (each kept run's figures, in order)."""
    import time

    from mlxlab.studies.tune.slo import figure

    solos: Dict[str, dict] = {}
    record: Dict[str, dict] = {}
    for t, names in metrics.items():
        warm_s = None
        if warm:
            t0 = time.perf_counter()
            run_solo(t)
            warm_s = time.perf_counter() - t0
        runs = [run_solo(t) for _ in range(repeats)]
        solos[t] = medians(runs, ["all", t] if t != "all" else ["all"])
        record[t] = {"warm_up_s": warm_s, "runs": [{m: figure(s, t, m) for m in names} for s in runs]}
        say(f"[tune] {t} alone: " + ", ".join(f"{m} {figure(solos[t], t, m) * 1e3:.1f} ms{_range(record[t]['runs'], m)}"
                                              for m in names)
            + (f" (after a run not kept, {warm_s:.1f} s)" if warm_s is not None else ""))
    return solos, record


def _range(runs: List[dict], metric: str) -> str:
    """`` (median of N runs, a-b ms)``: how far the solo runs behind a bound lay apart, for the log."""
    vals = [r[metric] for r in runs if r.get(metric) is not None]
    if len(vals) < 2:
        return ""
    return f" (median of {len(vals)} runs, {min(vals) * 1e3:.1f}-{max(vals) * 1e3:.1f} ms)"


def warm_runs(settings: Sequence[dict], *, run_one: Callable[[dict], dict],
              order: Callable[[List[dict], int], List[dict]], say: Callable[[str], None] = print) -> dict:
    """Each of ``settings`` run once through ``run_one``, in the order the first repeat runs them
    (``order(settings, 0)``), its result dropped: the process's first uses of each setting's shapes
    happen here, not in a kept run. Returns ``{"runs_s": {label: wall seconds}, "wall_s": total}``."""
    import time

    walls: Dict[str, float] = {}
    for c in order(list(settings), 0):
        t0 = time.perf_counter()
        run_one(c)
        walls[c["label"]] = time.perf_counter() - t0
    total = sum(walls.values())
    say(f"[tune] confirmation: warmed the process up with one run of each of its {len(walls)} settings "
        f"({total:.1f} s, not kept)")
    return {"runs_s": walls, "wall_s": total}


def race_text(raced: Optional[dict]) -> str:
    """One line on what the race did (``tune.json``'s ``race``: :func:`confirm_runs`' second value), or ""
    where it ran every repeat with every candidate."""
    if not raced:
        return ""
    parts = [f"the confirmation ran {raced['repeats']} of {raced['of']} repeats"
             + (f" (stopped: {raced['why']})" if raced.get("why") else "")]
    parts += [f"{label} sat out repeat{'s' if len(s['repeats']) > 1 else ''} {', '.join(map(str, s['repeats']))} "
              f"({s['why']})" for label, s in (raced.get("sat_out") or {}).items()]
    return "; ".join(parts)
