"""Fitting a step-time cost model (:mod:`mlxlab.sim.fit`): records made from known coefficients
give them back, staged or joint; cell medians and the fit report. No MLX, no timing."""

import numpy as np
import pytest

from mlxlab.core.costmodel import StepCostModel
from mlxlab.sim.fit import cell_medians, coefficients, fit_cost_model, fit_report


def test_fit_recovers_synthetic_coefficients():
    """Records made from known coefficients (decode-only steps lone and batched, steps that change
    the batch, prefill-only and mixed steps, and the two timing kinds) give those coefficients
    back, staged or joint, and the medians of the timing records."""
    true = {"decode_step": 2e-3, "decode_batched": 1e-3, "decode_batch": 5e-4, "decode_context_tokens": 1e-7,
            "join_tokens": 2e-6, "drop_tokens": 1e-6, "prefill_chunks": 3e-3,
            "prefill_tokens": 1e-4, "prefill_attention": 2e-8}
    truth = StepCostModel.from_coefficients(true, n_obs=1)
    recs = []
    for b in (1, 2, 4, 8):
        for c in (100, 1000, 4000):
            recs.append({"kind": "decode", "decode_batch": b, "decode_context_tokens": b * c, "prefill_tokens": 0,
                         "duration_s": truth.predict(b, b * c)})
    for b, c in ((2, 500), (4, 500), (4, 3000), (2, 3000)):
        recs.append({"kind": "rebatch", "decode_batch": b, "decode_context_tokens": b * c, "join_tokens": b * c,
                     "duration_s": truth.predict(b, b * c, join_tokens=b * c)})
        recs.append({"kind": "rebatch", "decode_batch": b // 2, "decode_context_tokens": b // 2 * c,
                     "drop_tokens": b // 2 * c, "duration_s": truth.predict(b // 2, b // 2 * c, drop_tokens=b // 2 * c)})
    for n in (32, 256, 1024):
        for ctx in (0, 1000, 3000):
            for b in (0, 2):
                recs.append({"kind": "mixed" if b else "prefill", "decode_batch": b, "decode_context_tokens": b * 500,
                             "prefill_tokens": n, "prefill_context_tokens": ctx, "prefill_seqs": [9],
                             "duration_s": truth.predict(b, b * 500, [(n, ctx)])})
    timing = [{"kind": "tail", "duration_s": x} for x in (0.002, 0.0025, 0.009)]
    timing += [{"kind": "overhead", "duration_s": x} for x in (1e-4, 2e-4, 5e-4)]
    for staged in (True, False):
        got = fit_cost_model(recs + timing, staged=staged)
        assert max(got.relative_error(recs)) < 1e-6
        for name, value in true.items():
            assert got.coefficients()[name] == pytest.approx(value, rel=1e-3), (staged, name)
        assert got.tail_s == pytest.approx(0.0025) and got.overhead_s == pytest.approx(2e-4)
        assert (got.coef >= 0).all()
    # round trip, and a profile in the six-feature format of earlier versions still loads
    back = StepCostModel.from_dict(got.as_dict())
    assert np.allclose(back.coef, got.coef) and back.tail_s == got.tail_s and back.overhead_s == got.overhead_s
    old = StepCostModel.from_dict({"features": ["decode_step", "decode_batch", "decode_context_tokens", "prefill_chunks",
                                                "prefill_tokens", "prefill_attention"],
                                   "coef": [1e-2, 1e-3, 1e-7, 0.1, 1e-4, 1e-9]})
    assert old.predict(1, 1000) == pytest.approx(1e-2 + 1e-3 + 1e-4)
    assert old.predict(2, 2000) == pytest.approx(1e-2 + 2e-3 + 2e-4)  # no batched intercept
    assert old.tail_s is None and old.overhead_s == 0
    with pytest.raises(ValueError, match="features"):
        StepCostModel.from_dict({"features": ["decode_step", "nope"], "coef": [1.0, 2.0]})


def test_padding_gets_its_own_price_only_from_steps_that_had_padding():
    """Decode records with left padding (a short row beside a long one) give the padding its own
    coefficient; without such records the fit prices padding as context. A profile saved before
    the padding term loads with padding priced as context, as it was charged then."""
    true = {"decode_step": 2e-3, "decode_batched": 1e-3, "decode_batch": 5e-4, "decode_context_tokens": 1e-7,
            "decode_padding_tokens": 2e-8}
    truth = StepCostModel.from_coefficients(true, n_obs=1)
    even = [{"kind": "decode", "decode_batch": b, "decode_context_tokens": b * c, "prefill_tokens": 0,
             "duration_s": truth.predict(b, b * c)} for b in (1, 2, 4) for c in (100, 2000, 8000)]
    uneven = [{"kind": "decode", "decode_batch": 2, "decode_context_tokens": 100 + c, "decode_kv_tokens": 2 * c,
               "prefill_tokens": 0, "duration_s": truth.predict(2, 100 + c, decode_padding_tokens=c - 100)}
              for c in (2000, 8000, 16000)]
    got = fit_cost_model(even + uneven).coefficients()
    for k, v in true.items():
        assert got[k] == pytest.approx(v, rel=1e-4), k
    tied = fit_cost_model(even).coefficients()
    assert tied["decode_padding_tokens"] == tied["decode_context_tokens"] == pytest.approx(1e-7, rel=1e-4)
    old = truth.as_dict()
    i = old["features"].index("decode_padding_tokens")
    del old["features"][i], old["coef"][i]
    assert StepCostModel.from_dict(old).coefficients()["decode_padding_tokens"] == pytest.approx(1e-7)


def test_nnls_keeps_correlated_positive_features_and_clips_negative_ones():
    """Two columns that move together, both truly positive, are both kept with their values; a
    truly negative coefficient ends at 0 and the rest is the least-squares fit without it."""
    from mlxlab.core.costmodel import solve_nnls as _nnls

    rng = np.random.default_rng(0)
    a = rng.uniform(1, 2, 40)
    X = np.stack([a, a * (1 + 0.01 * rng.standard_normal(40)), rng.uniform(0, 1, 40)], axis=1)
    y = X @ np.array([1.0, 2.0, 0.5])
    assert _nnls(X, y, 0.0) == pytest.approx([1.0, 2.0, 0.5], rel=1e-6)
    y2 = X[:, [0, 2]] @ np.array([1.0, -0.5])
    got = _nnls(X[:, [0, 2]], y2, 0.0)
    assert got[1] == 0.0 and got[0] == pytest.approx(np.linalg.lstsq(X[:, [0]], y2, rcond=None)[0][0])


def test_fit_recovers_the_batch_change_and_unaligned_terms():
    true = {"decode_step": 2e-3, "decode_batch": 5e-4, "join_rows": 2e-3, "batch_changes": 5e-3,
            "prefill_chunks": 3e-3, "prefill_tokens": 1e-4, "prefill_attention": 2e-8,
            "prefill_attention_unaligned": 3e-8}
    truth = StepCostModel.from_coefficients(true, n_obs=1)
    recs = [{"kind": "decode", "decode_batch": b, "decode_context_tokens": b * c, "duration_s": truth.predict(b, b * c)}
            for b in (1, 2, 4, 8) for c in (100, 1000, 3000)]
    for b, joined, dropped in ((4, 4, 0), (2, 1, 0), (3, 2, 0), (2, 0, 2), (1, 0, 1)):
        recs.append({"kind": "rebatch", "decode_batch": b, "decode_context_tokens": b * 100, "joined": joined,
                     "dropped": dropped, "duration_s": truth.predict(b, b * 100, join_rows=joined if b >= 2 else 0,
                                                                     batch_change=True)})
    for n in (32, 255, 256, 1023, 1024):
        for ctx in (0, 1000, 3001):
            recs.append({"kind": "prefill", "prefill_tokens": n, "prefill_context_tokens": ctx, "prefill_seqs": [9],
                         "duration_s": truth.predict(0, 0, [(n, ctx)])})
    got = fit_cost_model(recs)
    assert max(got.relative_error(recs)) < 1e-6
    for name, value in true.items():
        assert got.coefficients()[name] == pytest.approx(value, rel=1e-3), name


def test_cell_medians_keep_a_slow_outlier_out_of_the_fit():
    """Each grid cell becomes one record with the median duration and features, its count and
    spread; a fit to the cells recovers the coefficients although one step of a cell ran 10x
    slow, and the report's errors are those of the model on the cells."""
    true = {"decode_step": 2e-3, "decode_batch": 5e-4, "decode_context_tokens": 1e-7, "prefill_chunks": 3e-3,
            "prefill_tokens": 1e-4, "prefill_attention": 2e-8}
    truth = StepCostModel.from_coefficients(true, n_obs=1)
    recs = []
    for b in (1, 2, 4):
        for c in (100, 1000, 4000):
            t = truth.predict(b, b * c)
            recs += [{"kind": "decode", "cell": f"decode b{b} c{c}", "decode_batch": b, "decode_context_tokens": b * c,
                      "prefill_tokens": 0, "duration_s": t * f} for f in (1.0, 1.0, 10.0 if b == 2 else 1.0)]
    for n in (32, 128, 256):  # three sizes: a chunk's own masked block grows as n**2
        for ctx in (0, 1000):
            t = truth.predict(0, 0, [(n, ctx)])
            recs += [{"kind": "prefill", "cell": f"prefill n{n} c{ctx}", "decode_batch": 0, "prefill_tokens": n,
                      "prefill_context_tokens": ctx, "prefill_seqs": [1], "duration_s": t} for _ in range(3)]
    cells = cell_medians(recs)
    assert len(cells) == 9 + 6 and all(c["n"] == 3 for c in cells)
    slow = [c for c in cells if c["decode_batch"] == 2]
    assert all(c["spread"] > 1 for c in slow) and all(c["spread"] < 1e-9 for c in cells if c["decode_batch"] != 2)
    got = fit_cost_model(cells)
    for name, value in true.items():
        assert coefficients(got)[name] == pytest.approx(value, rel=1e-3), name
    rep = fit_report(got, cells)
    assert set(rep) == {"all", "decode", "prefill"} and rep["all"]["n"] == 15
    assert rep["all"]["median"] == pytest.approx(float(np.median(got.relative_error(cells))))
    assert rep["all"]["max"] < 1e-6


def test_fit_separates_the_masked_pairs_of_a_dense_causal_attention():
    """Chunks whose attention pays for the masked half of its own block (a dense masked attention,
    mlx's CPU path) give ``prefill_attention_masked`` its price apart from the kept pairs: large
    chunks at context 0 and small chunks at a long context, as a profile's fill and prefill
    cells are, tell the two apart; the feature counts a chunk's pad."""
    true = {"decode_step": 1e-2, "decode_batch": 7e-4, "decode_context_tokens": 2e-6, "prefill_chunks": 1e-2,
            "prefill_tokens": 4e-4, "prefill_attention": 8e-7, "prefill_attention_masked": 9e-7}
    truth = StepCostModel.from_coefficients(true, n_obs=1)
    recs = [{"kind": "decode", "decode_batch": b, "decode_context_tokens": b * c, "duration_s": truth.predict(b, b * c)}
            for b in (1, 2, 4) for c in (32, 600, 1300)]
    for n, ctx in ((32, 0), (128, 32), (256, 160), (32, 1792), (256, 1952), (768, 0), (1792, 0)):
        recs.append({"kind": "fill" if n > 256 else "prefill", "prefill_tokens": n, "prefill_context_tokens": ctx,
                     "prefill_seqs": [9], "duration_s": truth.predict(0, 0, [(n, ctx)])})
        recs.append({"kind": "mixed", "decode_batch": 2, "decode_context_tokens": 200, "prefill_tokens": n,
                     "prefill_context_tokens": ctx, "prefill_seqs": [9],
                     "duration_s": truth.predict(2, 200, [(n, ctx)])})
    got = fit_cost_model(recs)
    assert max(got.relative_error(recs)) < 1e-6
    for name, value in true.items():
        assert got.coefficients()[name] == pytest.approx(value, rel=1e-3), name
    # without the term the large chunks come out short: the kept pairs alone cannot price them
    kept = {k: v for k, v in true.items() if k != "prefill_attention_masked"}
    short = StepCostModel.from_coefficients(kept, n_obs=1)
    big = [r for r in recs if r["kind"] == "fill"]
    assert all(short.predict_record(r) < 0.8 * r["duration_s"] for r in big)
    f = StepCostModel.from_coefficients({"prefill_attention_masked": 1.0}).predict(0, 0, [(100, 50), (10, 0, 6)])
    assert f == pytest.approx(100 ** 2 / 2 + 16 ** 2 / 2)  # per chunk, its pad counted
