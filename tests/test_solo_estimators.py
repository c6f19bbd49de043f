"""probes/solo_estimators.py: the median of k runs' figures against the figure of their requests pooled,
over random sets of k runs."""

import pytest

from probes.solo_estimators import estimates


def test_each_estimator_is_scored_by_its_spread_over_random_sets_of_k_runs():
    per_run = [1.0, 1.0, 1.0, 3.0]  # one run's tail far out
    # pooled: as if the pooled tail ignored the outlier unless two of the set were it (never here)
    out = estimates(per_run, lambda idx: 1.0, k=3, draws=200, seed=1)
    assert out["k"] == 3 and out["pooled"] == {"median": 1.0, "spread": 0.0, "range_x": 1.0}
    # the median of 3 of these runs is 1.0 whichever 3 are drawn: no spread either
    assert out["median"]["range_x"] == 1.0
    two = estimates(per_run, lambda idx: 1.0, k=2, draws=200, seed=1)
    # the median of 2 runs is their mean: 2.0 whenever the outlier is drawn (half the draws), else 1.0
    assert two["median"]["range_x"] == pytest.approx(2.0) and two["median"]["spread"] > 0
    with pytest.raises(ValueError, match="more than the 4 runs"):
        estimates(per_run, lambda idx: 1.0, k=5, draws=10)
