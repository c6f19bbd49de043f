"""Seed 001 at its own scale: the calibration block and the verdicts (no MLX).

The published profile (:func:`mlxlab.sim.published.seed001_profile`) is fitted on some of the case
study's figures (:func:`mlxlab.sim.published.calibration_inputs`): the 44 s floor of the 60k
prompt, 65 tok/s at 23k of context, the 15% TTFT premium at 1,024-token chunks, plus the sizes of
the architecture and of the scenario. The simulator giving those back is a residual of the fit,
shown in :func:`calibration_block` and scored by nobody. Only the figures it was not fitted on
(chunk times at document scale, chat gaps, the crawl rate, the 30% premium at 512) get a verdict
in :func:`seed_scale_verdicts`, each rule naming the inputs the prediction rests on.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence

from mlxlab.core.claims import verdict

#: How far a prediction may sit from a published value or range and still match: the case study
#: gives its figures as "about", "roughly", "one to two": 15% either side of the value or the range.
ABOUT = 0.15
#: every verdict of this study comes from the simulator, never from a run (mlxlab.core.claims.SOURCES)
SIM = "simulation"

FAIRNESS = ("Simulator on the seed-001 published profile, a cost model derived from the case study's own "
            "figures (mlxlab.sim.published), not a measurement: the verdict says whether the seed's figures "
            "are consistent with each other under the simulator's step-cost structure (weights + KV reads per "
            "decode step, per-token and per-query-key-pair prefill cost, a fixed cost per chunk), not how any "
            "machine behaves. Deterministic, so one run and no spread; the 35B MoE, 60k and 23k contexts are "
            "the published ones.")

#: The fitted inputs every prefill-side prediction rests on, and the decode-side ones.
PREFILL_INPUTS = ("the 44 s floor of the 60k prompt (sets the per-token cost), the assumed attention cost per "
                  "query-key pair (20 KB/token architecture) and the per-chunk cost fitted to the 15% premium at "
                  "1,024")
DECODE_INPUTS = "65 tok/s at 23k of context with 3 GB of weights and 20 KB/token of KV (sets the decode step)"


def _band(published, about: float = ABOUT) -> tuple:
    """(low, high) of a published value or [low, high] range, widened by ``about`` either side."""
    lo, hi = (published, published) if not isinstance(published, (list, tuple)) else published
    return lo * (1 - about), hi * (1 + about)


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and x is not None and math.isfinite(x) for x in xs)


def calibration_block(inputs: Mapping[str, dict], *, floor_s: float, solo_itl_s: float,
                      premium_at: Mapping[int, float]) -> Dict[str, object]:
    """The profile's calibration inputs apart from its predictions.

    ``fitted``: each published target the derivation is fitted to, with the value the simulator
    gives back and the residual ((given back - input) / input, in %); ``inputs``: every figure the
    derivation reads (value, unit, kind "published" or "assumed", provenance). ``inputs`` is
    :func:`mlxlab.sim.published.calibration_inputs`; ``premium_at``: chunk size -> the 60k prompt's
    premium over the floor beside the chat."""
    fitted = []

    def add(name, figure, published, unit, value):
        res = 100.0 * (value - published) / published if _finite(value) and published else None
        fitted.append({"input": name, "figure": figure, "published": published, "unit": unit,
                       "fitted": value, "residual_pct": res})

    if "floor_60k_s" in inputs:
        add("60k prompt's prefill floor", "floor_60k_s", inputs["floor_60k_s"]["value"], "s", floor_s)
    if "decode_tok_s" in inputs:
        add("decode at 23k of context", "decode_tok_s", inputs["decode_tok_s"]["value"], "tok/s",
            1.0 / solo_itl_s if _finite(solo_itl_s) and solo_itl_s > 0 else float("nan"))
    if "premium_point" in inputs:
        chunk, prem = inputs["premium_point"]["value"]
        add(f"TTFT premium at {chunk} (the low end of the published 15-30%)", "premium_point", prem, "fraction",
            premium_at.get(int(chunk), float("nan")))
    return {"fitted": fitted,
            "inputs": [{"figure": k, "value": f["value"], "unit": f["unit"], "kind": f["kind"],
                        "provenance": f["provenance"]} for k, f in inputs.items()]}


def seed_scale_verdicts(*, floor_s: float, solo_itl_s: float, curves: Sequence[Mapping[str, float]],
                        chunk_doc_s: Mapping[int, float], inputs: Mapping[str, dict],
                        stall_chunk: int = 2048, band_chunks: Sequence[int] = (512, 1024),
                        about: float = ABOUT) -> List[dict]:
    """One :func:`mlxlab.core.claims.verdict` record per claim the seed-scale study decides.

    ``curves``: interleave rows (chunk_size, premium, itl_p50_s, itl_mean_s, itl_max_s, tok_s) of
    the chat beside the 60k prompt; ``chunk_doc_s``: context tokens -> the predicted time of one
    2,048-token chunk there; ``inputs``: :func:`mlxlab.sim.published.calibration_inputs`.

    ``measured`` keys, per claim:

    * s001-chunk-time: chunk_2048_at_10k_s, chunk_2048_at_25k_s (the two ends of document scale);
    * s001-prefill-floor: floor_s, floor_input_s, residual_pct (an input: "not measured");
    * s001-chunk-2048-gap: gap_p50_s, gap_mean_s, gap_max_s;
    * s001-stall-crawl: chat_tok_s, gap_mean_s, solo_itl_ms (the last a calibration input);
    * s001-sweet-spot: gap_p50_512_s, gap_p50_1024_s, premium_512_pct, premium_1024_pct (the last
      a calibration input).
    """
    by_c = {int(r["chunk_size"]): r for r in curves}
    nan = float("nan")

    def at(c, key):
        x = by_c.get(int(c), {}).get(key)
        return float(x) if x is not None else nan

    out = []
    # s001-chunk-time: a prediction (the chunk figure is no input)
    ctxs = sorted(chunk_doc_s)
    lo_c, hi_c = ctxs[0], ctxs[-1]
    t_lo, t_hi = float(chunk_doc_s[lo_c]), float(chunk_doc_s[hi_c])
    lo, hi = _band([1.0, 2.0], about)
    m = {f"chunk_2048_at_{lo_c // 1000}k_s": t_lo, f"chunk_2048_at_{hi_c // 1000}k_s": t_hi}
    m["consistent_with_published"] = bool(lo <= t_lo <= hi and lo <= t_hi <= hi) if _finite(t_lo, t_hi) else None
    m["calibration_residual"] = True
    out.append(verdict(
        "s001-chunk-time", "not measured", measured=m,
        rule=(f"A calibration residual, not a prediction: the profile's time for one 2,048-token chunk at "
              f"{lo_c:,} and {hi_c:,} tokens of context follows from the fitted 44 s floor (its per-token cost "
              f"times 2,048, plus attention: 44 x 2048 / 60000 = 1.50 s), so agreeing with the published 1-2 s "
              f"tests nothing the fit did not put in. consistent_with_published says whether both lie in 1-2 s "
              f"widened by {about:.0%} ({lo:.2f}-{hi:.2f} s). It rests on {PREFILL_INPUTS}."),
        fairness=FAIRNESS, evidence="seed_scale: cost model prediction of one chunk (chunk_doc_s)", source=SIM))

    # s001-prefill-floor: a calibration input, so no verdict from the simulator
    floor_in = inputs.get("floor_60k_s", {}).get("value")
    m = {"floor_s": floor_s, "floor_input_s": floor_in,
         "residual_pct": (100.0 * (floor_s - floor_in) / floor_in) if floor_in and _finite(floor_s) else None}
    if floor_in is None:  # the profile no longer fits on the floor: then the simulator predicts it
        lo, hi = _band(44.0, about)
        v = "not measured" if not _finite(floor_s) else "reproduced" if lo <= floor_s <= hi else "not reproduced"
        rule = (f"Prediction: the 60k prompt alone in one chunk; reproduced within {about:.0%} of 44 s "
                f"({lo:.1f}-{hi:.1f} s).")
    else:
        v = "not measured"
        rule = ("Not measured: the 44 s floor is a calibration input of the published profile (the per-token "
                "prefill cost is fitted so that the 60k prompt alone takes 44 s), so the simulator giving it back "
                "is a residual of the fit, not a test; its consistency with the 1-2 s chunks is the "
                "s001-chunk-time verdict, and no machine here prefills 60k tokens of a 35B model.")
    out.append(verdict("s001-prefill-floor", v, measured=m, rule=rule, fairness=FAIRNESS,
                       evidence="seed_scale: calibration.fitted", source=SIM))

    # s001-chunk-2048-gap: the chat's typical gap while the 60k prompt is prefilled at 2,048
    p50, mean, mx = at(stall_chunk, "itl_p50_s"), at(stall_chunk, "itl_mean_s"), at(stall_chunk, "itl_max_s")
    lo, hi = _band(1.5, about)
    out.append(verdict(
        "s001-chunk-2048-gap", "not measured",
        measured={"gap_p50_s": p50, "gap_mean_s": mean, "gap_max_s": mx, "calibration_residual": True,
                  "consistent_with_published": bool(lo <= p50 <= hi) if _finite(p50) else None},
        rule=(f"A calibration residual, not a prediction: with one decode step between chunks the gap is one "
              f"chunk's time, which the fitted 44 s floor fixes (s001-chunk-time), so it is reported, not "
              f"scored. The figure: the median gap of a 23k-context chat while the 60k prompt is prefilled at "
              f"{stall_chunk:,}-token chunks, one decode step between chunks (interleave); reproduced within "
              f"{about:.0%} of 1.5 s ({lo:.2f}-{hi:.2f} s). The seed's 1.5 s is 1 / 0.67 tok/s, the gap of the "
              f"worst case (a prefill running), so the median gap is the figure; consistent_with_published: "
              f"within {about:.0%} of 1.5 s ({lo:.2f}-{hi:.2f} s); gap_max_s (the prompt's last chunks, where "
              f"attention costs most) is reported beside it. Rests on {PREFILL_INPUTS} and {DECODE_INPUTS}."),
        fairness=FAIRNESS, evidence=f"seed_scale: curves[chunk_size={stall_chunk}]", source=SIM))

    # s001-stall-crawl: the chat's rate over the same window
    tok_s = at(stall_chunk, "tok_s")
    lo, hi = _band(0.67, about)
    out.append(verdict(
        "s001-stall-crawl", "not measured",
        measured={"chat_tok_s": tok_s, "gap_mean_s": mean,
                  "solo_itl_ms": 1e3 * solo_itl_s if _finite(solo_itl_s) else None, "calibration_residual": True,
                  "consistent_with_published": bool(lo <= tok_s <= hi) if _finite(tok_s) else None},
        rule=(f"A calibration residual, not a prediction: the chat's tokens per second (1 / mean gap) while the "
              f"60k prompt is prefilled at {stall_chunk:,} under interleave is one token per chunk step, which the "
              f"fitted 44 s floor fixes (1 / 1.48 s = 0.675 tok/s), so it is reported, not scored; "
              f"consistent_with_published: within {about:.0%} of 0.67 tok/s ({lo:.2f}-{hi:.2f}). The ~15 ms ITL before the prefill is the 65 tok/s calibration input "
              f"(solo_itl_ms, not scored). Rests on {PREFILL_INPUTS} and {DECODE_INPUTS}."),
        fairness=FAIRNESS, evidence=f"seed_scale: curves[chunk_size={stall_chunk}]", source=SIM))

    # s001-sweet-spot: the gaps at 512-1,024 and the premium at 512 are predictions; the premium at
    # the calibration chunk is an input
    cal_chunk = int(inputs["premium_point"]["value"][0]) if "premium_point" in inputs else None
    small, big = band_chunks[0], band_chunks[-1]
    g_s, g_b = at(small, "itl_p50_s"), at(big, "itl_p50_s")
    pr = {c: at(c, "premium") for c in band_chunks}
    scored_prem = {c: p for c, p in pr.items() if c != cal_chunk}
    glo, ghi = _band([0.4, 0.8], about)
    plo, phi = _band([0.15, 0.30], about)
    vals = [g_s, g_b, *scored_prem.values()]
    ok = glo <= g_s <= ghi and glo <= g_b <= ghi and all(plo <= p <= phi for p in scored_prem.values())
    v = "not measured" if not _finite(*vals) else "reproduced" if ok else "not reproduced"
    m = {f"gap_p50_{small}_s": g_s, f"gap_p50_{big}_s": g_b,
         **{f"premium_{c}_pct": (100.0 * p if _finite(p) else None) for c, p in pr.items()}}
    cal = (f"; the premium at {cal_chunk:,} is the calibration input (premium_{cal_chunk}_pct, not scored)"
           if cal_chunk in pr else "")
    out.append(verdict(
        "s001-sweet-spot", v, measured=m,
        rule=(f"Prediction: the chat's median gap at {small:,} and {big:,}-token chunks beside the 60k prompt "
              f"within 0.4-0.8 s widened by {about:.0%} ({glo:.2f}-{ghi:.2f} s), and the prompt's TTFT premium "
              f"over the floor at " + ", ".join(f"{c:,}" for c in scored_prem) +
              f" within 15-30% widened by {about:.0%} ({100 * plo:.1f}-{100 * phi:.1f}%){cal}. Rests on "
              f"{PREFILL_INPUTS} and {DECODE_INPUTS}; the premium at 512 also on the cost being per chunk."),
        fairness=FAIRNESS, evidence="seed_scale: curves", source=SIM))
    return out


def format_verdicts(verdicts: Sequence[Mapping], calibration: Optional[Mapping] = None) -> str:
    """The verdicts and the calibration residuals as plain text lines."""
    def fmt(x):
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = []
    for r in verdicts:
        m = r["measured"] or {}
        lines.append(f"{r['verdict']:15s} {r['claim']:22s} published {r['published']!s:32s} "
                     + ", ".join(f"{k}={fmt(x)}" for k, x in m.items()))
    for f in (calibration or {}).get("fitted", []):
        res = f["residual_pct"]
        lines.append(f"{'calibration':15s} {f['figure']:22s} input {f['published']!s:10s} fitted {fmt(f['fitted'])} "
                     f"{f['unit']} (residual {'n/a' if res is None else f'{res:+.2f}%'})")
    return "\n".join(lines)


def decide_stored(doc: dict, path=None) -> List[dict]:
    """The verdicts of a saved ``seed_scale.json`` (``mlxlab seed-scale``, notebook 07;
    :class:`~mlxlab.studies.base.Study`'s ``decide``) from its stored floor, solo ITL, curves and
    chunk times, the calibration inputs it stored and its ``config``'s stall chunk; nothing is simulated."""
    missing = [k for k in ("floor_s", "solo_itl_s", "curves", "chunk_doc_s", "calibration", "config") if k not in doc]
    if missing:
        raise ValueError(f"{path or 'this document'} is not a seed-scale result (no {', '.join(missing)}): "
                         "rescore a seed_scale.json")
    inputs = {f["figure"]: f for f in doc["calibration"]["inputs"]}
    return seed_scale_verdicts(floor_s=doc["floor_s"], solo_itl_s=doc["solo_itl_s"], curves=doc["curves"],
                               chunk_doc_s={int(c): t for c, t in doc["chunk_doc_s"].items()}, inputs=inputs,
                               stall_chunk=int(doc["config"].get("stall_chunk", 2048)))
