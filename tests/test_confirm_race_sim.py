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


def test_later_misses_counts_the_settings_that_met_the_first_k_repeats_and_missed_after():
    from probes.confirm_race_sim import later_misses

    doc = _doc()  # c missed its first run; now b misses its last
    doc["sweep"]["runs"]["b"][3] = _full_summary(MISS, 0.6)
    rows = {r["k"]: r for r in later_misses({"t.json": doc}, 4)}
    # c missed its first run, so it never counts as having met its first k; b did and missed the 4th
    assert [rows[k]["met"] for k in (1, 2, 3)] == [2, 2, 2]
    assert all(rows[k]["missed"] == 1 and rows[k]["which"] == ["t.json:b"] for k in (1, 2, 3))
    assert [(rows[k]["later_runs"], rows[k]["later_run_misses"]) for k in (1, 2, 3)] == [(6, 1), (4, 1), (2, 1)]
    assert later_misses({"t.json": doc}, 5) == [{"k": k, "late": 5, "met": 0, "missed": 0, "which": [],
                                                 "later_runs": 0, "later_run_misses": 0} for k in range(1, 5)]
