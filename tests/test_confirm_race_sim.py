"""probes/confirm_race_sim.py: the race replayed on a stored sweep, a candidate that missed an SLO
sitting out the later repeats (and their run time counted as saved) only where dropping is on."""

from mlxlab.studies.tune.confirm import BASELINE
from probes.confirm_race_sim import race
from tests.test_tune import _full_summary

OK, MISS = 0.01, 0.05  # the chat's ITL p99 against chat.itl_p99<=3x of a 10 ms solo figure


def _doc():
    plan = {"a": [(OK, 0.5), (OK, 0.7), (OK, 0.5), (OK, 0.6)], "b": [(OK, 0.6)] * 4,
            "c": [(MISS, 0.4), (OK, 0.4), (OK, 0.4), (OK, 0.4)]}
    return {"slos": ["chat.itl_p99<=3x"], "tenants": ["batch", "chat"], "objective": "batch.ttft_p50",
            "solo": {"chat": _full_summary(OK, 0.5)}, "parameters": {"repeats": 4}, "grid": [],
            "confirmed": [{"label": k, "policy": "interleave"} for k in plan] + [{"label": BASELINE,
                                                                                   "policy": BASELINE}],
            "sweep": {"repeats": 4, "rows": [], "runs": {k: [_full_summary(*r) for r in v] for k, v in plan.items()},
                      "run_wall_s": {k: [10.0] * 4 for k in plan}}}


def test_a_candidate_that_missed_sits_out_the_later_repeats_only_when_dropping():
    kept = race(_doc(), 2, drop=False)
    # a and b overlap to the end: the race never stops, and without dropping nothing is saved
    assert kept["stopped_at"] == 4 and kept["sat_out"] == [] and kept["saved_wall_s"] == 0
    dropped = race(_doc(), 2, drop=True)
    assert dropped["sat_out"] == ["c@3", "c@4"] and dropped["saved_wall_s"] == 20.0
    assert dropped["candidates_wall_s"] == 120.0
    assert dropped["choice"] == kept["choice"] == dropped["choice_all_repeats"] == "a"
