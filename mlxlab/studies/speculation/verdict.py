"""The speculative-decoding study's verdicts on seed 000's claims (s000-spec-gain,
s000-spec-overhead, s000-spec-large-target), from a :func:`~mlxlab.studies.speculation.run.
speculation_study` result or a stored file (:func:`decide_stored`)."""

from __future__ import annotations

import statistics
from typing import List

from mlxlab.core.claims import claim, verdict
from mlxlab.engine.speculative import analytic_speedup, best_k, breakeven_cost_ratio
from mlxlab.studies.rules import repeats_to_resolve


# --------------------------------------------------------------------------- verdicts

#: Noise band where only one repeat ran (no spread to scale), and the least error the analytic
#: model is allowed before it is said not to predict the measured speedup.
NOISE_FALLBACK_PCT = 5.0
PREDICTION_TOLERANCE_PCT = 10.0
#: How close the pair's draft work k*c must come to the published 1.33 for the measured speedup
#: to stand for the claim's own condition (relative).
OVERHEAD_MATCH = 0.25
#: Draft/target step cost of a 1B draft for a 7B target if a decode step costs its weight bytes.
LARGE_PAIR_C = 1 / 7
#: A no-effect claim cannot be confirmed by repeats that disagree this much (noise band, %).
MAX_NOISE_BAND_PCT = 25.0
#: "No effect" and "barely paid back" resolved to this (%): a wider noise band could hide such a change
RESOLUTION_PCT = 5.0


def _spread_pct(xs) -> float:
    xs = [x for x in xs if x == x]
    return 100 * statistics.stdev(xs) / statistics.median(xs) if len(xs) > 1 else float("nan")


def _band(spread_pct: float) -> float:
    return 3.0 * spread_pct if spread_pct == spread_pct else NOISE_FALLBACK_PCT


def _r(x, n=3):
    return None if x is None or x != x else round(float(x), n)


def _speedup(row) -> float:
    """The decode speedup the verdicts use: the median over repeats of each repeat's decode
    speedup against that repeat's baseline."""
    return row.get("speedup_decode_paired", row["speedup_decode"])


def verdicts(study: dict, k: int = 4) -> List[dict]:
    """The verdicts on s000-spec-gain, s000-spec-overhead and s000-spec-large-target from a
    :func:`speculation_study` result, at ``k`` draft tokens. Speedups are decode-only (the
    claim is about decode tok/s): per repeat, the target alone's decode time over all prompts
    / speculation's (interleaved by prompt), then the median over repeats; the noise band is 3x
    the spread of the per-repeat speedups. A band over
    :data:`MAX_NOISE_BAND_PCT` is too wide to confirm a no-effect claim: "not measured".

    ``measured`` keys: gain: k, speedup_x, gain_pct, gain_end_to_end_pct, spread_pct,
    noise_band_pct, repeats, acceptance_a, acceptance_rate, tokens_per_pass, cost_ratio_c,
    identical_outputs. overhead: k, cost_ratio_c, draft_work_x, draft_work_published_x,
    acceptance_a, verify_cost_v, speedup_measured_x, speedup_predicted_x (v = 1),
    speedup_predicted_v_x (measured v), prediction_error_pct, prediction_v_error_pct,
    model_predicts, speedup_at_published_c_x. large target: k, acceptance_a, breakeven_c,
    breakeven_c_v, large_pair_c, speedup_large_pair_x, speedup_large_pair_v_x, best_k_large_pair.
    Without a ``k`` row, all three are "not measured"."""
    ids = ("s000-spec-gain", "s000-spec-overhead", "s000-spec-large-target")
    row = next((r for r in study["rows"] if r["k"] == k), None)
    models = study.get("models", {})
    same = "identical to" if all(r["identical"] for r in study["rows"]) else "NOT all identical to"
    pair = (f"byte-level target/draft trained here ({models['target_params'] / 1e6:.1f}M / "
            f"{models['draft_params'] / 1e6:.1f}M parameters)" if "target_params" in models
            else "byte-level target/draft pair trained here")
    fairness = (f"The {pair} on {study['config']['num_prompts']} held-out code prompts, against the same target "
                f"alone (mlx-lm generate_step), interleaved by prompt within each of {study['config']['repeats']} "
                f"repeat(s); greedy outputs {same} the target's. Not the case study's 0.5B/1.5B Qwen pair on Metal.")
    if row is None:
        return [verdict(i, "not measured", measured=None, fairness=fairness,
                        rule=f"The study ran no k={k} (ks {study['config']['ks']}), the draft length the claim names.")
                for i in ids]
    return [_gain(row, study, fairness), _overhead(row, study, fairness), _large(row, study, fairness)]


def _gain(row, study, fairness) -> dict:
    sp, spread = _speedup(row), _spread_pct(row.get("speedup_decode_repeats", []))
    gain, band = 100 * (sp - 1), _band(spread)
    measured = {"k": row["k"], "speedup_x": _r(sp), "gain_pct": _r(gain, 1),
                "gain_end_to_end_pct": _r(100 * (row["speedup"] - 1), 1), "spread_pct": _r(spread, 2),
                "noise_band_pct": _r(band, 2), "repeats": len(row.get("speedup_decode_repeats", [])),
                "acceptance_a": _r(row["a_hat"]), "acceptance_rate": _r(row["acceptance_rate"]),
                "tokens_per_pass": _r(row["tokens_per_pass"]), "cost_ratio_c": _r(study["cost"]["c"]),
                "identical_outputs": bool(row["identical"])}
    v = "not reproduced" if abs(gain) > band else "reproduced" if band <= RESOLUTION_PCT else "inconclusive"
    measured["within_noise"] = v == "inconclusive"
    if v == "inconclusive":
        measured["repeats_to_resolve"] = repeats_to_resolve(band, RESOLUTION_PCT, measured["repeats"])
    rule = ("The published +1% is a no-effect claim: not reproduced if speculation is faster or slower than the "
            f"target alone beyond the noise band (3x the repeat spread, {NOISE_FALLBACK_PCT:g}% with one repeat); "
            f"reproduced if the speedup is within a band of at most {RESOLUTION_PCT:g}% (the run could have seen a "
            f"change that size); inconclusive if it is within a wider band, where such a change would hide.")
    return verdict("s000-spec-gain", v, measured=measured, rule=rule, fairness=fairness)


def _barely(gain_pct: float, band: float) -> str:
    """"Barely paid back": the speedup breaks even, the draft's work eating what it saves. Two-sided
    (a slowdown beyond the band is not paid back, a gain beyond it is more than barely): reproduced
    when the gain is within a band of at most RESOLUTION_PCT (``band`` 0, as for the analytic
    speedup: within RESOLUTION_PCT itself), inconclusive when within a wider band."""
    if gain_pct != gain_pct:
        return "not measured"
    tol = max(band, RESOLUTION_PCT) if band == 0 else band
    if abs(gain_pct) > tol:
        return "not reproduced"
    return "reproduced" if tol <= RESOLUTION_PCT else "inconclusive"


def _overhead(row, study, fairness) -> dict:
    c_claim = claim("s000-spec-overhead")
    k, a, c = row["k"], row["a_hat"], study["cost"]["c"]
    v_meas = row["v"] if row["v"] == row["v"] else 1.0
    sp = _speedup(row)
    band = _band(_spread_pct(row.get("speedup_decode_repeats", [])))
    pred, pred_v = row["speedup_analytic"], row["speedup_analytic_v"]
    err, err_v = 100 * (pred / sp - 1), 100 * (pred_v / sp - 1)
    tol = max(min(band, MAX_NOISE_BAND_PCT), PREDICTION_TOLERANCE_PCT)
    predicts = abs(err) <= tol
    c_pub, work_pub = float(c_claim.condition["cost_ratio"]), float(c_claim.published["value"])
    at_pub = analytic_speedup(a, k, c_pub, v_meas) if a == a else float("nan")
    comparable = abs(k * c / work_pub - 1) <= OVERHEAD_MATCH
    measured = {"k": k, "cost_ratio_c": _r(c), "draft_work_x": _r(k * c), "draft_work_published_x": work_pub,
                "acceptance_a": _r(a), "verify_cost_v": _r(v_meas), "speedup_measured_x": _r(sp),
                "speedup_predicted_x": _r(pred), "speedup_predicted_v_x": _r(pred_v),
                "prediction_error_pct": _r(err, 1), "prediction_v_error_pct": _r(err_v, 1),
                "model_predicts": bool(predicts), "speedup_at_published_c_x": _r(at_pub)}
    if comparable:
        v = _barely(100 * (sp - 1), band)
    elif predicts and band <= MAX_NOISE_BAND_PCT:
        v = _barely(100 * (at_pub - 1), 0.0)  # the analytic speedup has no repeat noise of its own
    else:
        v = "not measured"
    measured["within_noise"] = v == "inconclusive"
    rule = (f"The claim holds if a draft doing ~{work_pub:g} target passes of work per verification is barely paid "
            f"back, a speedup that breaks even: two-sided, so a slowdown never counts as paid back. Where the "
            f"measured k*c is within {OVERHEAD_MATCH:.0%} of {work_pub:g}, on the measured speedup: not reproduced "
            f"if it is slower or faster than 1 beyond the noise band; reproduced if within a band of at most "
            f"{RESOLUTION_PCT:g}%; inconclusive if within a wider band. Where k*c differs, the same test (within "
            f"{RESOLUTION_PCT:g}%) on the analytic speedup at c={c_pub:g} with the measured a and v, used only if the textbook formula "
            f"(1-a^(k+1))/((1-a)(k c+1)) predicts the measured speedup within {PREDICTION_TOLERANCE_PCT:g}% "
            f"(or the noise band, up to {MAX_NOISE_BAND_PCT:g}%), else not measured.")
    return verdict(c_claim.id, v, measured=measured, rule=rule,
                   fairness=fairness + " c and v are medians of interleaved single-step timings at a 128-token context.")


def _large(row, study, fairness) -> dict:
    k, a = row["k"], row["a_hat"]
    v_meas = row["v"] if row["v"] == row["v"] else 1.0
    ok = a == a
    measured = {"k": k, "acceptance_a": _r(a),
                "breakeven_c": _r(breakeven_cost_ratio(a, k)) if ok else None,
                "breakeven_c_v": _r(breakeven_cost_ratio(a, k, v_meas)) if ok else None,
                "large_pair_c": _r(LARGE_PAIR_C), "speedup_large_pair_x": _r(analytic_speedup(a, k, LARGE_PAIR_C)) if ok else None,
                "speedup_large_pair_v_x": _r(analytic_speedup(a, k, LARGE_PAIR_C, v_meas)) if ok else None,
                "best_k_large_pair": best_k(a, LARGE_PAIR_C)[0] if ok else None}
    m = measured
    rule = (f"No 7B target runs on this machine, so nothing was measured. With this pair's acceptance "
            f"(a = {m['acceptance_a']}), the analytic model says k={k} pays (speedup > 1) for draft/target cost "
            f"ratios c below {m['breakeven_c']} ({m['breakeven_c_v']} with the measured verification cost "
            f"v = {_r(v_meas, 2)}); a 1B draft for a 7B target costs about c = 1/7 if a step costs its weight bytes, "
            f"for a predicted {m['speedup_large_pair_x']}x ({m['speedup_large_pair_v_x']}x with v), but such a "
            f"pair's acceptance is not measured here.")
    return verdict("s000-spec-large-target", "not measured", measured=measured, rule=rule,
                   fairness=fairness + " An extrapolation by the analytic model, not a measurement.")


def decide_stored(doc: dict, path=None) -> List[dict]:
    """The verdicts of a saved speculation result (:class:`~mlxlab.studies.base.Study`'s ``decide``)
    at k=4, as both writers call :func:`verdicts`: notebook 03 stores the :func:`speculation_study`
    result under ``study``, ``mlxlab bench speculation`` at the top level."""
    study = doc.get("study", doc)
    missing = [k for k in ("rows", "config", "cost") if k not in study]
    if missing:
        raise ValueError(f"{path or 'this document'} is not a speculation result (no {', '.join(missing)}): "
                         "rescore a speculation.json or a bench speculation file")
    return verdicts(study, k=4)
