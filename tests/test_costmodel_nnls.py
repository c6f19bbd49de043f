"""The cost model's solver is scipy's NNLS: the fits of the committed profiles and validations are
those of the hand-written active-set solver it replaced, kept here as the oracle."""

import json

import numpy as np
import pytest

import mlxlab.sim.fit as fit
from mlxlab.core.costmodel import solve_nnls
from mlxlab.core.paths import ROOT
from mlxlab.studies.sim_validation.scoring import profile_shares


def _handwritten_nnls(X, y, ridge):
    """The solver of mlxlab.core.costmodel before scipy (Lawson and Hanson's active set with the
    same ridge rows), verbatim, as the reference the scipy fit must match."""
    k = X.shape[1]
    if ridge > 0:
        X = np.vstack([X, np.sqrt(ridge) * np.eye(k)])
        y = np.concatenate([y, np.zeros(k)])
    passive = np.zeros(k, dtype=bool)
    coef = np.zeros(k)
    tol = 1e-12 * max(1.0, float(np.abs(X).max()) * float(np.abs(y).max()) * len(y))
    for _ in range(3 * k):
        grad = X.T @ (y - X @ coef)
        if passive.all() or (grad[~passive] <= tol).all():
            break
        passive[int(np.argmax(np.where(passive, -np.inf, grad)))] = True
        while True:
            trial = np.zeros(k)
            trial[passive] = np.linalg.lstsq(X[:, passive], y, rcond=None)[0]
            if (trial[passive] > 0).all():
                break
            neg = passive & (trial <= 0)
            alpha = float(np.min(coef[neg] / (coef[neg] - trial[neg])))
            coef = coef + alpha * (trial - coef)
            passive &= coef > tol
            if not passive.any():
                trial = np.zeros(k)
                break
        coef = trial
    return np.maximum(coef, 0.0)


def _record_sets():
    """Profile records as the fits see them: the committed CPU profile, and each profile share of
    the committed validations (H200 and CPU)."""
    out = {"profiles/cpu-small": json.loads((ROOT / "data/profiles/cpu-small.json").read_text())["records"]}
    for name in ("h200/sim_validation", "cpu/sim_validation_heldout"):
        doc = json.loads((ROOT / f"data/results/{name}.json").read_text())
        for i, share in enumerate(profile_shares(doc["profile"]["records"])):
            out[f"{name} share {i + 1}"] = share
    return out


RECORD_SETS = _record_sets()


@pytest.mark.parametrize("name", sorted(RECORD_SETS))
def test_scipy_nnls_fits_the_committed_profiles_as_the_handwritten_solver_did(name, monkeypatch):
    cells = fit.cell_medians(RECORD_SETS[name])
    new = fit.fit_cost_model(cells).coef
    monkeypatch.setattr(fit, "solve_nnls", _handwritten_nnls)
    old = fit.fit_cost_model(cells).coef
    assert (old > 0).sum() >= 5, "a fit with something to compare"
    # the same coefficients within solver tolerance (features are scaled to 1 before the solve)
    assert new == pytest.approx(old, rel=1e-6, abs=1e-12)


def test_ridge_rows_keep_a_feature_of_zeros_at_zero_and_the_rest_exact():
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.uniform(1, 2, 30), np.zeros(30), rng.uniform(0, 1, 30)])
    y = X @ np.array([3.0, 0.0, 0.25])
    got = solve_nnls(X, y, 1e-9)
    assert got[1] == 0.0 and got[[0, 2]] == pytest.approx([3.0, 0.25], rel=1e-6)
    assert solve_nnls(X, y, 1.0)[0] < 3.0, "a large ridge pulls the coefficients towards zero"
