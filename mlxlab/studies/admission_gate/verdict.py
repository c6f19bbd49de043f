"""The admission-gate experiment's verdicts on seed 001's claims (no MLX, no device).

:func:`verdicts` reads a result of :func:`mlxlab.studies.admission_gate.run.gate_study` (or the saved
``admission_gate.json``): its table rows by (policy, chunk size, workers), its references and
config. It decides ``s001-stall-crawl``, ``s001-gate-worst-gap``, ``s001-gate-window-rate``,
``s001-sweet-spot`` and ``s001-gate-vs-stall-free``.

The seed's absolute figures belong to its machine, so each rule compares ratios (see
:mod:`mlxlab.studies.admission_gate.run`): a chat rate over the chat's solo rate (the seed's 65 tok/s), a gap
over the gap at the chunk that stands for the seed's 2,048 (its 1.5 s), a TTFT over the floor.
Each deciding figure carries a noise band from its own repeats (the table's ``*_runs``, in repeat order, so
two rows pair by repeat: 3 x MAD / sqrt(repeats), :mod:`mlxlab.studies.rules`): a figure nearer its
bound than its band makes the verdict inconclusive (``within_noise`` true, ``repeats_to_resolve``), a
failure beyond its band anywhere outweighs an inconclusive elsewhere. Results from before 2026-12-07
(#26) keep no per-repeat values: they are decided on the figures alone (``within_noise`` null), and
``spread_pct`` ((max - min) / median) stays a report.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

from mlxlab.core.claims import claim
from mlxlab.studies.rules import (NOISE_RULE, all_finite, as_float, bound_check, decided, finite_or_none, noted,
                                  paired_band, ratio_band, to_ms, values_band)
from mlxlab.studies.scheduling.verdict import GATE_ITL_X, GATE_TTFT_X
from mlxlab.studies.scheduling.metrics import ratio

# the seed's figures (data/claims/seed-001.yaml)
SEED_SOLO_TOK_S = 65.0  # the chat alone (60-70)
SEED_STALL_TOK_S = 0.67  # the chat during a 60k prefill at 2,048-token chunks
SEED_ITL_S = 0.015  # the chat's solo ITL
SEED_REF_GAP_S = 1.5  # the chat's gap at 2,048-token chunks
SEED_SWEET_GAP_S = (0.4, 0.8)  # the gaps at 512 and 1,024
SEED_PREMIUM_PCT = (15.0, 30.0)  # the long prompt's TTFT premium over its floor at 512-1,024
SEED_STEP_ITL = (1.0 / SEED_ITL_S, 2.0 / SEED_ITL_S)  # a 2,048 step in decode steps: 1-2 s / 15 ms

# thresholds
CRAWL_MIN_X = 10.0  # a crawl: the chat at least 10x slower than alone during the prefill
MECHANISM_BAND = (0.5, 2.0)  # measured collapse / one-token-per-chunk-step prediction
GAP_STEP_MAX_X = 1.25  # the gate's worst gap at most 1.25x its longest one-chunk step
GAP_GROWTH_MAX_X = 1.5  # ... and at most 1.5x deeper-queue over one-worker
WINDOW_BAND = (0.8, 1.25)  # the chat's rate in decode windows over its solo rate (seed 60-70 of 65)
SWEET_GAP_FACTOR = 1.5  # the relative sweet-spot gaps within 1.5x of the seed's (0.27, 0.53)
PREMIUM_FACTOR = 2.0  # the TTFT premium within 2x of the seed's 15-30%

GATE, WINDOW = "admission_gate", "admission_gate_window"


def _spread(row: dict, field: str) -> Optional[float]:
    """(max - min) / median over repeats of ``field``; None with one repeat or none measured."""
    m, lo, hi = as_float(row.get(field)), as_float(row.get(f"{field}_lo")), as_float(row.get(f"{field}_hi"))
    if row.get("repeats", 0) < 2 or not all_finite(m, lo, hi) or m == 0:
        return None
    return (hi - lo) / abs(m)


def _runs(row: dict, field: str) -> list:
    """A row's per-repeat values of ``field`` (repeat order; empty for files that kept none)."""
    return list(row.get(f"{field}_runs") or [])


def _product_band(a: list, b: list) -> tuple:
    """(band, repeats) of a figure that is a per-repeat product ``a[i] * b[i]``."""
    v = [as_float(x) * as_float(y) for x, y in zip(a, b)]
    v = [x for x in v if math.isfinite(x)]
    return (paired_band(v, 0.0)[1] if len(v) >= 2 else None), len(v)


class _Result:
    """The parts of a gate result the verdicts read."""

    def __init__(self, result: dict):
        self.config: dict = result.get("config", {})
        self.refs: dict = result.get("references", {})
        prompt = self.config.get("prompt_tokens")
        table = result.get("table", [])
        self.rows: Dict[Tuple[str, int, int], dict] = {(r["policy"], int(r["chunk_size"]), int(r["workers"])): r
                                                       for r in table if r.get("prompt_tokens") == prompt}
        #: the stall at the seed's condition (one prompt of many chunks), else the plan's prompt
        self.stall = next((r for r in table if r.get("prompt_tokens") != prompt and r["policy"] == "interleave"),
                          self.rows.get(("interleave", int(self.config.get("ref_chunk", 0)), 1), {}))
        self.ref = int(self.config.get("ref_chunk", 0))
        self.window_s = as_float(result.get("calibration", {}).get("window_s"))

    def row(self, policy: str, chunk: int, workers: int) -> dict:
        return self.rows.get((policy, int(chunk), int(workers)), {})

    def get(self, policy: str, chunk: int, workers: int, field: str) -> float:
        return as_float(self.row(policy, chunk, workers).get(field))

    def of(self, policy: str) -> Dict[Tuple[int, int], dict]:
        return {(c, w): r for (p, c, w), r in self.rows.items() if p == policy}

    @property
    def workers(self) -> List[int]:
        return sorted({w for (_, _, w) in self.rows})

    @property
    def solo_tok_s(self) -> float:
        return as_float(self.refs.get("solo_tok_s"))

    def fairness(self, what: str, prompt_tokens: Optional[int] = None) -> str:
        """The conditions in words, from the result's own config (``prompt_tokens``: the long
        prompt of the row the claim reads, where it is not the plan's)."""
        c = self.config
        reps, L, ref = c.get("repeats"), prompt_tokens or c.get("prompt_tokens"), self.ref
        step = finite_or_none(self.refs.get("ref_step_over_solo_itl_x"))
        return (f"{what}; one model object ({c.get('model_name', '?')}) in one process, {reps} repeat(s) per "
                f"configuration, the repeats outermost and the configurations in a seeded shuffled order within "
                f"each" + (" (one repeat: no spread measured)" if reps == 1 else "") +
                f"; long prompt(s) of {L} tokens where the seed prefilled ~60k on a 35B MoE, and a "
                f"{c.get('chat_prompt_tokens')}-token chat where the seed's had a ~23k-token context; chunk {ref} "
                f"stands for the seed's 2,048 (its step lasted "
                + (f"{step:.0f}" if step is not None else "?") + f" solo decode steps here, the seed's "
                f"{SEED_STEP_ITL[0]:.0f}-{SEED_STEP_ITL[1]:.0f})" + ("; quick mode" if c.get("quick") else ""))


# ---------------------------------------------------------------------------------- the claims
def stall_crawl(r: _Result) -> dict:
    """``s001-stall-crawl``. measured: ``chunk_tokens``, ``prompt_tokens``, ``chat_prefill_tok_s`` (with ``_lo`` /
    ``_hi`` over repeats), ``solo_tok_s``, ``collapse_x`` (solo / prefill-window rate),
    ``predicted_collapse_x`` (one chat token per chunk step: solo rate x the chunk step),
    ``mechanism_ratio_x`` (their ratio), ``step_over_solo_itl_x``, ``seed_equivalent_tok_s`` (65 tok/s
    / collapse), ``collapse_w{W}_x`` (interleave with W workers), ``spread_pct``, ``within_noise``."""
    ref, row = r.ref, r.stall
    solo, rate = r.solo_tok_s, as_float(row.get("chat_prefill_tok_s"))
    step = as_float(row.get("chunk_time_s"))
    collapse, predicted = ratio(solo, rate), solo * step
    mech = ratio(collapse, predicted)
    s = _spread(row, "chat_prefill_tok_s")
    measured = {"chunk_tokens": ref, "prompt_tokens": row.get("prompt_tokens"), "chat_prefill_tok_s": finite_or_none(rate),
                "chat_prefill_tok_s_lo": finite_or_none(row.get("chat_prefill_tok_s_lo")),
                "chat_prefill_tok_s_hi": finite_or_none(row.get("chat_prefill_tok_s_hi")),
                "solo_tok_s": finite_or_none(solo), "collapse_x": finite_or_none(collapse), "predicted_collapse_x": finite_or_none(predicted),
                "mechanism_ratio_x": finite_or_none(mech),
                "step_over_solo_itl_x": finite_or_none(ratio(step, as_float(r.refs.get("solo_itl_s")))),
                "seed_equivalent_tok_s": finite_or_none(ratio(SEED_SOLO_TOK_S, collapse)),
                **{f"collapse_w{w}_x": finite_or_none(ratio(solo, r.get("interleave", ref, w, "chat_prefill_tok_s")))
                   for w in r.workers if w > 1 and r.row("interleave", ref, w)},
                "spread_pct": None if s is None else 100 * s}
    solo_runs, pos = r.refs.get("solo_tok_s_runs") or [], _runs(row, "prefill_over_solo_x")
    b_c, n_c = ratio_band([1.0] * len(pos), pos)  # each repeat's collapse: 1 / (its rate over its solo rate)
    predicted = [as_float(a) * as_float(t) for a, t in zip(solo_runs, _runs(row, "chunk_time_s"))]
    b_m, n_m = ratio_band([1.0 / x if as_float(x) > 0 else None for x in pos], predicted)
    out = noted(measured, [bound_check(collapse, math.inf, b_c, n_c, low=CRAWL_MIN_X),
                           bound_check(mech, MECHANISM_BAND[1], b_m, n_m, low=MECHANISM_BAND[0])],
                {"collapse": b_c, "mechanism_ratio": b_m})
    ok = None
    if all_finite(collapse, mech):
        ok = collapse >= CRAWL_MIN_X and MECHANISM_BAND[0] <= mech <= MECHANISM_BAND[1]
    return decided("s001-stall-crawl", ok, measured,
              f"Scaled rule: the seed's chat fell from {SEED_SOLO_TOK_S:g} to {SEED_STALL_TOK_S:g} tok/s (a "
              f"{SEED_SOLO_TOK_S / SEED_STALL_TOK_S:.0f}x collapse), one token per 2,048-token chunk step of ~100 "
              f"decode steps. Here, under interleave at chunk {ref} with one long prompt of "
              f"{row.get('prompt_tokens')} tokens, collapse_x = the chat's solo rate / its rate over the prefill "
              f"window (tokens between the prompt's arrival and its first "
              f"token, over that time); reproduced when collapse_x >= {CRAWL_MIN_X:g} (a crawl) and within "
              f"{MECHANISM_BAND[0]:g}-{MECHANISM_BAND[1]:g}x of predicted_collapse_x, the collapse one token per "
              f"measured chunk step gives; not reproduced otherwise. The scale: the seed's ~100x is one token per "
              f"chunk step of ~100 decode steps, so here the collapse to expect is the step's length in decode "
              f"steps (predicted_collapse_x), not 100x; what would falsify it: a chat that keeps decoding between "
              f"chunks (collapse under {CRAWL_MIN_X:g}x) or a collapse the one-token-per-step mechanism does not "
              f"explain (outside the band)." + NOISE_RULE,
              r.fairness("the stall and the solo chat measured on the same workload seed in every repeat",
                         prompt_tokens=row.get("prompt_tokens")),
              f"admission_gate table row {row.get('config')}, references.solo_tok_s", outcome=out)


def gate_worst_gap(r: _Result) -> dict:
    """``s001-gate-worst-gap``. measured: ``worst_gap_over_step_x`` (the largest, over every chunk
    size and worker count the gate ran, of its median worst chat gap / longest one-chunk step),
    ``worst_gap_over_alone_chunk_x`` (the same over the chunk's step alone), per W at the largest
    chunk every W ran: ``gate_worst_gap_w{W}_ms``, ``interleave_worst_gap_w{W}_ms``,
    ``gap_over_step_w{W}_x``; ``gate_growth_x`` and ``interleave_growth_x`` (worst gap with the
    most workers / with one), ``chunk_tokens``, ``spread_pct``, ``within_noise``."""
    cells = r.of(GATE)
    ratios = {k: as_float(row.get("gap_over_step_x")) for k, row in cells.items()}
    alone = r.refs.get("alone_chunk_time_s", {})
    over_alone = [ratio(as_float(row.get("chat_worst_gap_s")), as_float(alone.get(str(c), alone.get(c))))
                  for (c, _), row in cells.items()]
    ws = sorted({w for _, w in cells})
    common = [c for c in sorted({c for c, _ in cells}) if all((c, w) in cells for w in ws)]
    top = common[-1] if common else r.ref
    measured = {"worst_gap_over_step_x": finite_or_none(max((x for x in ratios.values() if math.isfinite(x)), default=None)),
                "worst_gap_over_alone_chunk_x": finite_or_none(max((x for x in over_alone if math.isfinite(x)), default=None)),
                "chunk_tokens": top}
    for w in ws:
        measured[f"gate_worst_gap_w{w}_ms"] = to_ms(r.get(GATE, top, w, "chat_worst_gap_s"))
        measured[f"interleave_worst_gap_w{w}_ms"] = to_ms(r.get("interleave", top, w, "chat_worst_gap_s"))
        measured[f"gap_over_step_w{w}_x"] = finite_or_none(r.get(GATE, top, w, "gap_over_step_x"))
    lo_w, hi_w = (ws[0], ws[-1]) if ws else (1, 1)
    growth = ratio(r.get(GATE, top, hi_w, "chat_worst_gap_s"), r.get(GATE, top, lo_w, "chat_worst_gap_s"))
    measured["gate_growth_x"] = finite_or_none(growth)
    measured["interleave_growth_x"] = finite_or_none(ratio(r.get("interleave", top, hi_w, "chat_worst_gap_s"),
                                                 r.get("interleave", top, lo_w, "chat_worst_gap_s")))
    worst_key = max(ratios, key=lambda k: ratios[k] if math.isfinite(ratios[k]) else -1, default=None)
    s = _spread(cells[worst_key], "gap_over_step_x") if worst_key else None
    measured["spread_pct"] = None if s is None else 100 * s
    outs, bands = [], {}
    for (c, w), row in cells.items():
        bands[f"gap_over_step_c{c}_w{w}"], n = values_band(_runs(row, "gap_over_step_x"))
        outs.append(bound_check(ratios[(c, w)], GAP_STEP_MAX_X, bands[f"gap_over_step_c{c}_w{w}"], n))
    bands["gate_growth"], n = ratio_band(_runs(r.row(GATE, top, hi_w), "chat_worst_gap_s"),
                                         _runs(r.row(GATE, top, lo_w), "chat_worst_gap_s"))
    outs.append(bound_check(growth, GAP_GROWTH_MAX_X, bands["gate_growth"], n))
    out = noted(measured, outs, bands)
    ok = None
    if cells and all(math.isfinite(x) for x in ratios.values()) and all_finite(growth):
        ok = max(ratios.values()) <= GAP_STEP_MAX_X and growth <= GAP_GROWTH_MAX_X
    return decided("s001-gate-worst-gap", ok, measured,
              f"For every chunk size and worker count ({ws}) the admission gate ran, the chat's worst gap (median "
              f"over repeats) over the longest step that ran one long-prompt chunk in that run; reproduced when it "
              f"is at most {GAP_STEP_MAX_X:g} everywhere (one chunk step) and the gate's worst gap with {hi_w} "
              f"workers is at most {GAP_GROWTH_MAX_X:g}x the one with {lo_w} at chunk {top} (however deep the "
              f"queue); interleave at the same chunks is the contrast." + NOISE_RULE,
              r.fairness("the gate and interleave at equal chunk sizes and worker counts on the same workloads"),
              "admission_gate table rows admission_gate/* and interleave/*", outcome=out)


def gate_window_rate(r: _Result) -> dict:
    """``s001-gate-window-rate``. measured: ``window_tok_s`` (the chat's rate over decode-only
    gaps in the prefill window, one worker), ``solo_tok_s``, ``window_over_solo_min_x`` and
    ``window_over_solo_max_x`` (over every worker count), ``window_time_fraction``,
    ``window_gaps`` (per run, one worker), ``window_ms``, ``chunk_tokens``,
    ``window_ttft_premium_pct``, ``gate_window_gaps_max`` (the plain gate's decode-only gaps: one
    decode per chunk leaves none), ``seed_equivalent_tok_s`` (65 tok/s x the lowest ratio),
    ``spread_pct``, ``within_noise``."""
    cells = r.of(WINDOW)
    xs = [as_float(row.get("window_over_solo_x")) for row in cells.values()]
    one = min(cells.items(), key=lambda kv: kv[0][1])[1] if cells else {}
    plain = [as_float(row.get("window_gaps_hi")) for row in r.of(GATE).values()]
    lo_x = min(xs) if xs and all(math.isfinite(x) for x in xs) else float("nan")
    hi_x = max(xs) if xs and all(math.isfinite(x) for x in xs) else float("nan")
    s = _spread(one, "window_over_solo_x") if one else None
    measured = {"window_tok_s": finite_or_none(one.get("chat_window_tok_s")), "solo_tok_s": finite_or_none(r.solo_tok_s),
                "window_over_solo_min_x": finite_or_none(lo_x), "window_over_solo_max_x": finite_or_none(hi_x),
                "window_time_fraction": finite_or_none(one.get("window_time_fraction")),
                "window_gaps": finite_or_none(one.get("window_gaps")), "window_ms": to_ms(r.window_s),
                "chunk_tokens": int(one["chunk_size"]) if one else None,
                "window_ttft_premium_pct": finite_or_none(one.get("ttft_premium_pct")),
                "gate_window_gaps_max": finite_or_none(max((x for x in plain if math.isfinite(x)), default=None)),
                "seed_equivalent_tok_s": finite_or_none(SEED_SOLO_TOK_S * lo_x) if all_finite(lo_x) else None,
                "spread_pct": None if s is None else 100 * s}
    outs, bands = [], {}
    for (c, w), row in cells.items():
        bands[f"window_over_solo_c{c}_w{w}"], n = values_band(_runs(row, "window_over_solo_x"))
        outs.append(bound_check(row.get("window_over_solo_x"), WINDOW_BAND[1], bands[f"window_over_solo_c{c}_w{w}"], n,
                                low=WINDOW_BAND[0]))
    out = noted(measured, outs, bands)
    ok = None if not all_finite(lo_x, hi_x) else (WINDOW_BAND[0] <= lo_x and hi_x <= WINDOW_BAND[1])
    return decided("s001-gate-window-rate", ok, measured,
              f"Scaled rule: the seed's 60-70 tok/s between chunks is its solo 65 tok/s (0.92-1.08x). Under "
              f"admission_gate_window (the gate with a decode window of {to_ms(r.window_s) or 0:.0f} ms held open after "
              f"each chunk), the chat's rate over its gaps in the prefill window that no long-prompt chunk ran in, "
              f"over its solo rate, for every worker count; reproduced when it lies in "
              f"{WINDOW_BAND[0]:g}-{WINDOW_BAND[1]:g}x. The plain gate runs one decode per chunk, so it has no "
              f"such window (gate_window_gaps_max)." + NOISE_RULE,
              r.fairness("the window gate, the plain gate and the solo chat in the same repeats"),
              "admission_gate table rows admission_gate_window/*, references.solo_tok_s",
              why_not="admission_gate_window did not run, or its chat had no decode-only gap", outcome=out)


def sweet_spot(r: _Result) -> dict:
    """``s001-sweet-spot`` (the gate, one long prompt). measured: ``chunk_lo_tokens``,
    ``chunk_hi_tokens``, ``chunk_ref_tokens`` (the seed's 512, 1,024 and 2,048 here),
    ``gap_p50_lo_ms``, ``gap_p50_hi_ms``, ``gap_p50_ref_ms`` (the chat's median gap that held a
    chunk, median over repeats),
    ``gap_lo_over_ref_x``, ``gap_hi_over_ref_x``, ``gap_lo_seed_scale_s`` and
    ``gap_hi_seed_scale_s`` (the gaps in solo ITLs x the seed's 15 ms), ``worst_gap_lo_ms``,
    ``worst_gap_hi_ms``, ``premium_lo_pct``, ``premium_hi_pct``, ``premium_ref_pct`` (TTFT over the
    floor), ``floor_s``, ``floor_chunk_tokens``, ``spread_pct``, ``within_noise``."""
    lo, hi = r.config.get("sweet_chunks") or (r.ref // 4, r.ref // 2)
    ref, itl = r.ref, as_float(r.refs.get("solo_itl_s"))
    gap = {c: r.get(GATE, c, 1, "chat_chunk_gap_p50_s") for c in (lo, hi, ref)}
    prem = {c: r.get(GATE, c, 1, "ttft_over_floor_pct") for c in (lo, hi, ref)}
    rel = {c: ratio(gap[c], gap[ref]) for c in (lo, hi)}
    seed_rel = {lo: SEED_SWEET_GAP_S[0] / SEED_REF_GAP_S, hi: SEED_SWEET_GAP_S[1] / SEED_REF_GAP_S}
    p_lo, p_hi = SEED_PREMIUM_PCT[0] / PREMIUM_FACTOR, SEED_PREMIUM_PCT[1] * PREMIUM_FACTOR
    s = max([x for x in (_spread(r.row(GATE, c, 1), "long_ttft_s") for c in (lo, hi)) if x is not None], default=None)
    measured = {"chunk_lo_tokens": lo, "chunk_hi_tokens": hi, "chunk_ref_tokens": ref,
                "gap_p50_lo_ms": to_ms(gap[lo]), "gap_p50_hi_ms": to_ms(gap[hi]), "gap_p50_ref_ms": to_ms(gap[ref]),
                "gap_lo_over_ref_x": finite_or_none(rel[lo]), "gap_hi_over_ref_x": finite_or_none(rel[hi]),
                "gap_lo_seed_scale_s": finite_or_none(ratio(gap[lo], itl) * SEED_ITL_S),
                "gap_hi_seed_scale_s": finite_or_none(ratio(gap[hi], itl) * SEED_ITL_S),
                "worst_gap_lo_ms": to_ms(r.get(GATE, lo, 1, "chat_worst_gap_s")),
                "worst_gap_hi_ms": to_ms(r.get(GATE, hi, 1, "chat_worst_gap_s")),
                "premium_lo_pct": finite_or_none(prem[lo]), "premium_hi_pct": finite_or_none(prem[hi]), "premium_ref_pct": finite_or_none(prem[ref]),
                "floor_s": finite_or_none(r.refs.get("floor_s")), "floor_chunk_tokens": r.refs.get("floor_chunk"),
                "spread_pct": None if s is None else 100 * s}
    outs, bands = [], {}
    for c in (lo, hi):
        bands[f"gap_c{c}_over_ref"], n = ratio_band(_runs(r.row(GATE, c, 1), "chat_chunk_gap_p50_s"),
                                                    _runs(r.row(GATE, ref, 1), "chat_chunk_gap_p50_s"))
        outs.append(bound_check(rel[c], seed_rel[c] * SWEET_GAP_FACTOR, bands[f"gap_c{c}_over_ref"], n,
                                low=seed_rel[c] / SWEET_GAP_FACTOR))
        bands[f"premium_c{c}_pct"], n = values_band(_runs(r.row(GATE, c, 1), "ttft_over_floor_pct"))
        outs.append(bound_check(prem[c], p_hi, bands[f"premium_c{c}_pct"], n, low=p_lo))
    out = noted(measured, outs, bands)
    ok = None
    if all_finite(rel[lo], rel[hi], prem[lo], prem[hi]):
        gaps_ok = all(seed_rel[c] / SWEET_GAP_FACTOR <= rel[c] <= seed_rel[c] * SWEET_GAP_FACTOR for c in (lo, hi))
        ok = gaps_ok and all(p_lo <= prem[c] <= p_hi for c in (lo, hi))
    return decided("s001-sweet-spot", ok, measured,
              f"Scaled rule: chunks {lo} and {hi} stand for the seed's 512 and 1,024 (1/4 and 1/2 of chunk {ref}, "
              f"its 2,048), so the seed's gaps of 0.4 and 0.8 s become 0.27x and 0.53x of the gap at chunk {ref} "
              f"(the seed's 1.5 s) and its TTFT premium stays a percentage over the floor (the lowest alone TTFT "
              f"over the chunk sizes). Under the admission gate with one long prompt: reproduced when each median "
              f"gap ratio lies within {SWEET_GAP_FACTOR:g}x of the seed's and each premium within "
              f"{p_lo:g}-{p_hi:g}% (15-30% within {PREMIUM_FACTOR:g}x); not reproduced otherwise. What would "
              f"falsify it: gaps that do not shrink in proportion to the chunk (a ratio outside the band), or a "
              f"premium outside the band, which is wide ({p_lo:g}-{p_hi:g}%) because the seed gave a range, not a "
              f"figure, for a different model and prompt." + NOISE_RULE,
              r.fairness("every chunk size and its alone reference on the same prompt in every repeat"),
              f"admission_gate table rows admission_gate/c{{{lo},{hi},{ref}}}/w1, references.floor_s", outcome=out)


def gate_vs_stall_free(r: _Result) -> dict:
    """``s001-gate-vs-stall-free``. measured: ``itl_p99_ratio_x`` and ``ttft_ratio_x`` (gate /
    stall_free at an equal chunk = token budget: the largest over every compared cell),
    ``itl_p99_ratio_min_x``, ``ttft_ratio_min_x``, ``ttft_mean_ratio_x``, ``cells_compared``, and at
    the seed's 512 with one worker: ``gate_itl_p99_ms``, ``stall_free_itl_p99_ms``,
    ``gate_long_ttft_s``, ``stall_free_long_ttft_s``, ``chunk_tokens``; ``spread_pct``, ``within_noise``."""
    gate, sf = r.of(GATE), r.of("stall_free")
    pairs = sorted(set(gate) & set(sf))
    itl = {k: ratio(as_float(gate[k].get("chat_itl_p99_pooled_s")), as_float(sf[k].get("chat_itl_p99_pooled_s"))) for k in pairs}
    ttft = {k: ratio(as_float(gate[k].get("long_ttft_s")), as_float(sf[k].get("long_ttft_s"))) for k in pairs}
    mean = {k: ratio(as_float(gate[k].get("long_ttft_mean_s")), as_float(sf[k].get("long_ttft_mean_s"))) for k in pairs}
    fin = all(all_finite(itl[k], ttft[k]) for k in pairs)
    lo = (r.config.get("sweet_chunks") or (r.ref // 4,))[0]
    head = (lo, 1) if (lo, 1) in pairs else (pairs[0] if pairs else (lo, 1))
    worst = max(pairs, key=lambda k: itl[k] if math.isfinite(itl[k]) else -1) if pairs else None
    s_i = _spread(gate[worst], "chat_itl_p99_s") if worst else None
    s_t = _spread(gate[worst], "long_ttft_s") if worst else None
    def top(d):  # the largest ratio (None unless every cell measured one)
        return finite_or_none(max(d.values())) if d and all(map(all_finite, d.values())) else None

    i_max, t_max = top(itl), top(ttft)
    spreads = [x for x in (s_i, s_t) if x is not None]
    measured = {"itl_p99_ratio_x": i_max, "ttft_ratio_x": t_max,
                "itl_p99_ratio_min_x": finite_or_none(min(itl.values())) if i_max is not None else None,
                "ttft_ratio_min_x": finite_or_none(min(ttft.values())) if t_max is not None else None,
                "ttft_mean_ratio_x": top(mean), "cells_compared": len(pairs), "chunk_tokens": head[0],
                "gate_itl_p99_ms": to_ms(r.get(GATE, *head, "chat_itl_p99_pooled_s")),
                "stall_free_itl_p99_ms": to_ms(r.get("stall_free", *head, "chat_itl_p99_pooled_s")),
                "gate_long_ttft_s": finite_or_none(r.get(GATE, *head, "long_ttft_s")),
                "stall_free_long_ttft_s": finite_or_none(r.get("stall_free", *head, "long_ttft_s")),
                "spread_pct": 100 * max(spreads) if spreads else None}
    limit = float(claim("mlx-stall-free-itl").published["value"])
    base_x = max((as_float(sf[k].get("chat_itl_p99_pooled_s")) for k in pairs), default=float("nan")) * r.solo_tok_s
    measured.update(stall_free_itl_p99_over_solo_x=finite_or_none(base_x),
                    baseline_meets_own_bound=bool(base_x <= limit) if math.isfinite(base_x) else None)
    outs, bands = [], {}
    for k in pairs:
        c, w = k
        bands[f"itl_p99_ratio_c{c}_w{w}"], n = ratio_band(_runs(gate[k], "chat_itl_p99_s"), _runs(sf[k], "chat_itl_p99_s"))
        outs.append(bound_check(itl[k], GATE_ITL_X, bands[f"itl_p99_ratio_c{c}_w{w}"], n))
        bands[f"ttft_ratio_c{c}_w{w}"], n = ratio_band(_runs(gate[k], "long_ttft_s"), _runs(sf[k], "long_ttft_s"))
        outs.append(bound_check(ttft[k], GATE_TTFT_X, bands[f"ttft_ratio_c{c}_w{w}"], n))
    if pairs:  # the baseline in its worst cell: its p99 x the solo rate, repeat by repeat
        k = max(pairs, key=lambda k: as_float(sf[k].get("chat_itl_p99_pooled_s")))
        bands["stall_free_itl_p99_over_solo"], n = _product_band(_runs(sf[k], "chat_itl_p99_s"),
                                                                 r.refs.get("solo_tok_s_runs") or [])
        outs.append(bound_check(base_x, limit, bands["stall_free_itl_p99_over_solo"], n))
    out = noted(measured, outs, bands)
    ok = None if not (pairs and fin and math.isfinite(base_x)) else (
        max(itl.values()) <= GATE_ITL_X and max(ttft.values()) <= GATE_TTFT_X and base_x <= limit)
    return decided("s001-gate-vs-stall-free", ok, measured,
              f"The admission gate against stall_free at an equal chunk size = token budget, for every chunk size "
              f"and worker count both ran ({len(pairs)} cells), the same chat beside the same long prompts: "
              f"reproduced (the gate approximates stall-free batching) when everywhere the gate's chat ITL p99 "
              f"(pooled over repeats) is at most {GATE_ITL_X:g}x stall_free's and its last long-prompt TTFT at most "
              f"{GATE_TTFT_X:g}x stall_free's (the scheduling study's bounds); not reproduced otherwise. " + f"A comparison with a baseline holds the baseline to its own bound: when stall_free's chat ITL p99 is "
              f"over {limit:g}x the chat's solo ITL, in its worst cell (mlx-stall-free-itl's bound), stall_free is not stall-free here and "
              f"the claim is not reproduced, however close the gate comes to it." + NOISE_RULE,
              r.fairness("both policies on the same seeded workloads, model object and repeats; stall_free packs its "
                         "decode and chunk into one forward where the model fuses and leaves one budget token to "
                         "each decode, the gate runs the decode and the chunk back to back"),
              "admission_gate table rows admission_gate/* and stall_free/*", outcome=out)


CLAIM_IDS = ("s001-stall-crawl", "s001-gate-worst-gap", "s001-gate-window-rate", "s001-sweet-spot",
             "s001-gate-vs-stall-free")


def verdicts(result: dict) -> List[dict]:
    """The five verdicts of :data:`CLAIM_IDS` from a gate result ("not measured" where a
    configuration a claim needs did not run)."""
    r = _Result(result)
    return [stall_crawl(r), gate_worst_gap(r), gate_window_rate(r), sweet_spot(r), gate_vs_stall_free(r)]


def decide_stored(doc: dict, path=None) -> List[dict]:
    """The verdicts of a saved ``admission_gate.json`` (:class:`~mlxlab.studies.base.Study`'s
    ``decide``): its table, references and config are what :func:`verdicts` reads."""
    if "table" not in doc or "config" not in doc:
        raise ValueError(f"{path or 'this document'} is not an admission-gate result (no table / config)")
    return verdicts(doc)
