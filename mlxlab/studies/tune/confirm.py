"""Tune's confirmation on the engine: the simulation's top settings and mlx-lm's ``BatchGenerator``
replayed on the trace, repeats outermost, in an order shuffled per repeat, as a race.

A race (as configuration racing drops a candidate once its runs separate it from the best) stops
after a repeat whose runs already decide the choice (:func:`mlxlab.studies.tune.slo.settled`: from the
second repeat, the pick met every SLO in every repeat and every other setting either missed one or
ran worse in every repeat), so the repeats asked for are a ceiling. Replayed on the 17 tunes stored
with a sweep before it, their sweeps' runs standing in for the confirmation's
(``probes/confirm_race_sim.py``, ``data/results/sim-tune/confirm_race_sim.json``), it chose what all
the repeats chose in every file and stopped early in 4 of them; in the others the candidates' runs
overlapped to the last repeat, none met the SLOs in every repeat, or only two repeats were asked.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

BASELINE = "mlx_lm.BatchGenerator"


def confirm_runs(settings: Sequence[dict], *, repeats: int, run_one: Callable[[dict], dict],
                 order: Callable[[List[dict], int], List[dict]], row: Callable[[dict, List[dict]], dict],
                 race: bool = True, bar=None, say: Callable[[str], None] = print
                 ) -> Tuple[Dict[str, List[dict]], Optional[dict]]:
    """Each of ``settings`` (tune's rows: ``label``, ``policy``, ``chunk_size``, ``options``; the
    baseline's policy :data:`BASELINE`) run up to ``repeats`` times, repeats outermost. ``run_one(setting)``:
    one fresh replay of the trace on the engine, its run summary; ``order(settings, r)``: the order repeat
    ``r`` runs them in (:func:`mlxlab.studies.tune.run.run_order`); ``row(setting, runs)``: the confirmed row
    of a setting's runs so far (what the race reads); ``bar``: a progress bar updated after each run.
    Returns each label's run summaries and, where the race stopped early, ``{"repeats", "of", "why"}``
    (else None)."""
    from mlxlab.studies.tune.slo import settled

    measured: Dict[str, List[dict]] = {c["label"]: [] for c in settings}
    raced = None
    for r in range(repeats):
        for c in order(list(settings), r):
            measured[c["label"]].append(run_one(c))
            if bar is not None:
                bar.update(1)
        why = settled([row(c, measured[c["label"]]) for c in settings if c["policy"] != BASELINE]) \
            if race and r + 1 < repeats else None
        if why:
            raced = {"repeats": r + 1, "of": repeats, "why": why}
            say(f"[tune] confirmation stopped: {why}")
            break
    return measured, raced
