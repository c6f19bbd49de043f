"""The edges of the rules every verdict shares (mlxlab.studies.rules): a noise band at least as
wide as what the claim must resolve gives "inconclusive", never a pass or a fail."""

import math

from mlxlab.core.claims import verdict
from mlxlab.studies.rules import (bound_check, combine_outcomes, noise_outcome, ratio_band, repeats_to_resolve,
                                  run_ratios, within_noise)


def test_a_band_wider_than_the_margin_is_inconclusive_with_the_repeats_that_would_resolve_it():
    out = noise_outcome(True, margin=5.0, band=19.0, repeats=5)
    assert out["verdict"] == "inconclusive" and out["within_noise"] is True
    assert out["repeats_to_resolve"] == math.ceil(5 * (19 / 5) ** 2)  # the band shrinks as 1/sqrt(n)
    assert noise_outcome(False, margin=-5.0, band=5.1, repeats=3)["verdict"] == "inconclusive"
    assert noise_outcome(False, margin=-5.0, band=5.0, repeats=3)["verdict"] == "not reproduced"  # reaches, no more


def test_a_band_narrower_than_the_margin_lets_the_rule_decide():
    assert noise_outcome(True, margin=5.0, band=2.0, repeats=5) == {"verdict": "reproduced", "within_noise": False}
    assert noise_outcome(False, margin=5.0, band=2.0, repeats=5)["verdict"] == "not reproduced"
    assert noise_outcome(None, margin=5.0, band=2.0, repeats=5)["verdict"] == "not measured"
    assert noise_outcome(True, margin=float("nan"), band=2.0, repeats=5)["verdict"] == "not measured"


def test_repeats_to_resolve_is_more_than_were_run_and_unknown_for_a_tie():
    assert repeats_to_resolve(2.0, 1.0, 5) == 20
    assert repeats_to_resolve(1.0, 2.0, 5) == 6  # already resolved by the band: one more at least
    assert repeats_to_resolve(1.0, 0.0, 5) is None and repeats_to_resolve(1.0, 1.0, None) is None


def test_per_repeat_ratios_pair_by_repeat_and_skip_what_a_repeat_did_not_measure():
    assert run_ratios([2.0, None, 3.0, 4.0], [1.0, 1.0, 0.0, 2.0]) == [2.0, 2.0]  # None and a zero denominator go
    assert run_ratios([2.0, 4.0], 2.0) == [1.0, 2.0]
    assert ratio_band([2.0], 1.0) == (None, 1)  # one repeat: no band
    band, n = ratio_band([1.0, 1.1, 1.3], 1.0)
    assert n == 3 and math.isclose(band, 3 * 0.1 / math.sqrt(3))


def test_a_range_bound_is_decided_on_the_nearer_edge_and_combined_failures_win():
    assert bound_check(1.02, 1.1, 0.05, 5, low=0.9)["verdict"] == "reproduced"  # 0.08 from the top, 0.12 from the bottom
    assert bound_check(0.92, 1.1, 0.05, 5, low=0.9)["verdict"] == "inconclusive"  # 0.02 from the bottom
    assert bound_check(1.5, 1.1, None, 1) == {"verdict": "not reproduced", "within_noise": None}
    fail, unsure = bound_check(2.0, 1.0, 0.1, 3), bound_check(1.0, 1.0, 0.1, 3)
    assert combine_outcomes([unsure, fail])["verdict"] == "not reproduced"
    both = combine_outcomes([unsure, bound_check(0.5, 1.0, 0.1, 3)])
    assert both["verdict"] == "inconclusive" and both["within_noise"] is True
    assert combine_outcomes([bound_check(0.5, 1.0, None, 1)])["within_noise"] is None


def test_within_noise_needs_a_spread():
    assert within_noise(1.1, 1.0, None) is None
    assert within_noise(1.1, 1.0, 0.05) is True and within_noise(1.5, 1.0, 0.05) is False


def test_a_verdict_says_inconclusive_where_it_came_from_and_who_decided_it():
    rec = verdict("s001-own-compute", "inconclusive", measured={"x": 1}, rule="r", fairness="f", source="simulation")
    assert rec["verdict"] == "inconclusive" and rec["source"] == "simulation" and rec["decided_by"]
    assert "source" not in verdict("s001-own-compute", "reproduced", measured=1, rule="r", fairness="f")
    import pytest

    with pytest.raises(ValueError, match="source"):
        verdict("s001-own-compute", "reproduced", measured=1, rule="r", fairness="f", source="guess")
