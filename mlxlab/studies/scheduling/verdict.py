"""The scheduling study's verdicts on the claims of ``data/claims`` (no MLX, no device).

:func:`verdicts` reads a scheduling result (as :func:`mlxlab.studies.scheduling.run.scheduling_study`
returns it, or as saved in ``data/results/<platform>/scheduling*.json``): its table rows by
configuration, its references and its config. It decides, for the policies that ran:

* ``mlx-interleave-matches`` (interleave and mlx_lm): engine / BatchGenerator worst chat gap per
  worker count within the claim's band;
* ``mlx-slo-chat-itl``, ``mlx-slo-alone-ttft``, ``mlx-slo-not-dominated`` (slo);
* ``mlx-stall-free-itl`` (stall_free);
* ``mlx-overlap`` (overlap): TTFT and chat ITL at its best chunk size, in one verdict;
* ``s001-gate-vs-stall-free`` (admission_gate and stall_free): the gate against stall_free at the
  same chunk / token budget on the same single long prompt.

The thresholds are the published figures of the claims files. Each deciding figure carries a noise
band from its own repeats (3 x the median absolute deviation of its per-repeat values, as ratios
paired by repeat, over sqrt(repeats): :func:`mlxlab.studies.rules.ratio_band`, the band
engine_bench and the serve benchmark use): a figure nearer its bound than its band makes the verdict
**inconclusive** (``within_noise`` true, with ``repeats_to_resolve``), and a failure beyond its band
anywhere outweighs an inconclusive elsewhere. One repeat has no band (``within_noise`` null): the
figure alone decides. ``*_spread_pct`` ((max - min) / median of the repeats) stays as a report.
Results decided before 2026-12-07 (#26) stored ``within_noise`` as "3x that spread reaches across
the bound" and did not let it decide.

The stall itself (``stall_interleave``, ``stall_mlx_lm`` in the result's ``claims`` list) is
evidence for ``s001-stall-crawl``, which the admission-gate and seed-scale experiments decide; it
stays in the payload only.

:func:`decide_stored` decides them for a saved result (``mlxlab rescore``: nothing is run, and
``rescored_by`` records this code's commit).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

from mlxlab.core.claims import claim
from mlxlab.studies.rules import (NOISE_RULE, all_finite, as_float, bound_check, decided, finite_or_none,
                                  noise_outcome, noted, ratio_band, to_ms, worst)
from mlxlab.studies.scheduling.metrics import ratio, spread

#: the claims this study decides (each only where the policies it needs ran)
CLAIM_IDS = ("mlx-interleave-matches", "mlx-slo-chat-itl", "mlx-slo-alone-ttft", "mlx-slo-not-dominated",
             "mlx-stall-free-itl", "mlx-overlap", "s001-gate-vs-stall-free")

#: s001-gate-vs-stall-free ("approximates"): the gate at most this much worse than stall_free
GATE_ITL_X = 1.5  # chat ITL p99, gate / stall_free
GATE_TTFT_X = 1.25  # long-prompt TTFT, gate / stall_free
REFERENCE_CHUNK = 2048  # the alone-TTFT reference (mlxlab.studies.scheduling.plan.REFERENCE_CHUNK)


def _pct(s: Optional[float]) -> Optional[float]:
    return None if s is None else 100.0 * s


class _Result:
    """The parts of a scheduling result the verdicts read."""

    def __init__(self, result: dict):
        self.rows: Dict[str, dict] = {r["config"]: r for r in result.get("table", [])}
        self.refs: dict = result.get("references", {})
        self.config: dict = result.get("config", {})
        self.run = set(self.config.get("policies_run") or self.config.get("policies") or [])

    def has(self, *keys: str) -> bool:
        return all(k in self.rows for k in keys)

    def get(self, key: str, field: str) -> float:
        return as_float(self.rows.get(key, {}).get(field))

    def runs(self, key: str, field: str) -> list:
        return [as_float(x) for x in (self.rows.get(key, {}).get(field) or [])]

    @property
    def solo_itl_s(self) -> float:
        return as_float(self.refs.get("solo_itl_s"))

    def fairness(self, what: str, seed: bool = False) -> str:
        """``what`` makes the comparison fair, then what every row shares; ``seed``: a case-study
        claim, whose published condition differs in scale."""
        c = self.config
        lo, hi = (c.get("long_prompt_tokens") or ["?", "?"])[:2]
        reps, scale = c.get("repeats"), c.get("platform_scale")
        scale = f"{scale:.4g}" if isinstance(scale, (int, float)) else "?"
        return (f"{what}; model {c.get('model', '?')}, {reps} repeat(s) per configuration with the repeats "
                f"outermost" + (" (one repeat: no spread measured)" if reps == 1 else "")
                + f"; long prompts of {lo}-{hi} tokens (platform_scale {scale})"
                + (" where the case study prefilled ~60k-token prompts on a 35B MoE" if seed else "")
                + ("; quick mode" if c.get("quick") else ""))


# ---------------------------------------------------------------------------------- the claims
def interleave_matches(r: _Result) -> dict:
    """``mlx-interleave-matches``. measured: ``worst_gap_ratio_w{W}_x`` (engine interleave / mlx-lm
    BatchGenerator worst chat gap, per worker count W), ``worst_gap_ratio_min_x``,
    ``worst_gap_ratio_max_x``, ``engine_worst_gap_ms`` and ``mlx_lm_worst_gap_ms`` (most workers),
    ``worst_gap_spread_pct``, ``within_noise``."""
    pub = claim("mlx-interleave-matches").published
    lo, hi = float(pub["low"]), float(pub["high"])
    workers = list(r.config.get("workers") or [])
    ratios = {w: ratio(r.get(f"stall/interleave/w{w}", "chat_worst_gap_s"), r.get(f"stall/mlx_lm/w{w}", "chat_worst_gap_s"))
              for w in workers}
    s = worst(*(spread(r.runs(f"stall/{e}/w{w}", "chat_worst_gap_runs_s")) for w in workers
                 for e in ("interleave", "mlx_lm")))
    top = max(workers) if workers else None
    fin = [x for x in ratios.values() if math.isfinite(x)]
    outs, bands = [], {}
    for w in workers:
        bands[f"w{w}"], n = ratio_band(r.runs(f"stall/interleave/w{w}", "chat_worst_gap_runs_s"),
                                       r.runs(f"stall/mlx_lm/w{w}", "chat_worst_gap_runs_s"))
        outs.append(bound_check(ratios[w], hi, bands[f"w{w}"], n, low=lo))
    measured = {**{f"worst_gap_ratio_w{w}_x": finite_or_none(x) for w, x in ratios.items()},
                "worst_gap_ratio_min_x": min(fin) if fin else None, "worst_gap_ratio_max_x": max(fin) if fin else None,
                "engine_worst_gap_ms": to_ms(r.get(f"stall/interleave/w{top}", "chat_worst_gap_s")),
                "mlx_lm_worst_gap_ms": to_ms(r.get(f"stall/mlx_lm/w{top}", "chat_worst_gap_s")),
                "worst_gap_spread_pct": _pct(s)}
    out = noted(measured, outs, bands)
    ok = None if not workers or len(fin) < len(workers) else all(lo <= x <= hi for x in fin)
    return decided("mlx-interleave-matches", ok, measured,
              f"reproduced when the engine's interleave / mlx-lm BatchGenerator worst chat gap lies in "
              f"[{lo:g}, {hi:g}] for every worker count {workers} (chunk = prefill_step_size "
              f"{r.config.get('stall_chunk')}); not reproduced otherwise." + NOISE_RULE,
              r.fairness("both executors on the same seeded workload (one chat beside W long prompts) and the same "
                         "model object in the same run; each ratio uses each side's own worst gap"),
              "scheduling table rows stall/interleave/w* and stall/mlx_lm/w*",
              why_not="a worst gap is missing (a run produced no chat gaps)", outcome=out)


def slo_chat_itl(r: _Result) -> dict:
    """``mlx-slo-chat-itl``. measured: ``itl_p99_over_solo_x``, ``itl_p99_ms``, ``solo_itl_ms``,
    ``itl_target_ms`` (the target slo ran with: 2x repeat 0's solo ITL), ``packed_itl_p99_over_solo_x``
    (slo with packed steps; null where the model does not fuse), ``chosen_chunk_median``,
    ``infeasible_fraction``, ``itl_p99_spread_pct``, ``within_noise``."""
    limit = float(claim("mlx-slo-chat-itl").published["value"])
    p99, solo = r.get("contended/slo", "pooled_itl_p99_s"), r.solo_itl_s
    x = ratio(p99, solo)
    s = spread(r.runs("contended/slo", "chat_itl_p99_runs_s"))
    measured = {"itl_p99_over_solo_x": finite_or_none(x), "itl_p99_ms": to_ms(p99), "solo_itl_ms": to_ms(solo),
                "itl_target_ms": to_ms(r.refs.get("slo_itl_target_s")),
                "packed_itl_p99_over_solo_x": finite_or_none(ratio(r.get("contended/slo_packed", "pooled_itl_p99_s"), solo)),
                "chosen_chunk_median": finite_or_none(r.rows.get("contended/slo", {}).get("chosen_chunk_median")),
                "infeasible_fraction": finite_or_none(r.rows.get("contended/slo", {}).get("infeasible_fraction")),
                "itl_p99_spread_pct": _pct(s)}
    b, n = ratio_band(r.runs("contended/slo", "chat_itl_p99_runs_s"), solo)
    out = noted(measured, [bound_check(x, limit, b, n)], {"itl_p99_over_solo": b})
    return decided("mlx-slo-chat-itl", None if not math.isfinite(x) else x <= limit, measured,
              f"reproduced when slo's chat ITL p99 (pooled over the repeats' contended gaps) is at most {limit:g}x "
              f"the chat's solo ITL p50 while one long prompt prefills; not reproduced otherwise (the packed "
              f"variant is reported, not decided)." + NOISE_RULE,
              r.fairness("slo and the solo reference on the same model object in the same run; the contended gaps "
                         "are those inside the long prompt's prefill window"),
              "scheduling table row contended/slo, references.solo_itl_s",
              why_not="slo's contended run or the solo reference has no ITL", outcome=out)


def slo_alone_ttft(r: _Result) -> dict:
    """``mlx-slo-alone-ttft``. measured: ``ttft_ratio_x`` (slo alone / interleave alone at chunk
    2048), ``slo_alone_ttft_s``, ``alone_ttft_2048_s``, ``ttft_over_best_alone_x`` (against the
    fastest fixed chunk alone), ``ttft_spread_pct``, ``within_noise``."""
    limit = float(claim("mlx-slo-alone-ttft").published["value"])
    ref_key = f"alone/interleave/c{REFERENCE_CHUNK}"
    t, ref = r.get("alone/slo", "long_ttft_s"), as_float(r.refs.get("alone_ttft_2048_s"))
    x = ratio(t, ref)
    s = worst(spread(r.runs("alone/slo", "long_ttft_runs_s")), spread(r.runs(ref_key, "long_ttft_runs_s")))
    measured = {"ttft_ratio_x": finite_or_none(x), "slo_alone_ttft_s": finite_or_none(t), "alone_ttft_2048_s": finite_or_none(ref),
                "ttft_over_best_alone_x": finite_or_none(ratio(t, as_float(r.refs.get("alone_ttft_best_s")))),
                "ttft_spread_pct": _pct(s)}
    b, n = ratio_band(r.runs("alone/slo", "long_ttft_runs_s"), r.runs(ref_key, "long_ttft_runs_s"))
    out = noted(measured, [bound_check(x, limit, b, n)], {"ttft_ratio": b})
    return decided("mlx-slo-alone-ttft", None if not math.isfinite(x) else x <= limit, measured,
              f"reproduced when slo's long-prompt TTFT with nobody decoding is at most {limit:g}x the same prompt's "
              f"TTFT alone at chunk {REFERENCE_CHUNK} (interleave); not reproduced otherwise." + NOISE_RULE,
              r.fairness("the same prompt alone under both policies, same model object, same run"),
              f"scheduling table rows alone/slo and {ref_key}",
              why_not="a TTFT alone is missing", outcome=out)


def slo_not_dominated(r: _Result) -> dict:
    """``mlx-slo-not-dominated``. measured: ``dominating_chunks_n``, ``dominating_chunks`` (the
    fixed chunk sizes with both a chat ITL p99 and a long-prompt TTFT at most slo's, comma
    separated), ``fixed_chunks_n``, ``slo_itl_p99_ms``, ``slo_long_ttft_s``, ``within_noise`` (a
    fixed chunk's dominance would flip within 3x the spread of either figure)."""
    chunks = sorted(int(c) for c in r.config.get("chunk_sizes") or [])
    keys = {c: f"tradeoff/interleave/c{c}" for c in chunks if f"tradeoff/interleave/c{c}" in r.rows}
    itl, ttft = r.get("contended/slo", "pooled_itl_p99_s"), r.get("contended/slo", "long_ttft_s")
    dom, outs, bands = [], [], {}
    for c, k in keys.items():
        figs = [(r.get(k, "pooled_itl_p99_s"), itl, "chat_itl_p99_runs_s"), (r.get(k, "long_ttft_s"), ttft, "long_ttft_runs_s")]
        if all(t <= base for t, base, _ in figs):
            dom.append(c)
        # the chunk dominates when the larger of its two ratios to slo's figures is at most 1
        ratios = [(t / base, field) for t, base, field in figs if all_finite(t, base) and base > 0]
        if len(ratios) == len(figs):
            d, field = max(ratios)
            b, n = ratio_band(r.runs(k, field), r.runs("contended/slo", field))
            bands[f"c{c}"] = b
            outs.append({"verdict": "reproduced" if d > 1 else "not reproduced", "within_noise": None} if b is None
                        else noise_outcome(d > 1, margin=d - 1, band=b, repeats=n))
    measured = {"dominating_chunks_n": len(dom), "dominating_chunks": ", ".join(map(str, dom)),
                "fixed_chunks_n": len(keys), "slo_itl_p99_ms": to_ms(itl), "slo_long_ttft_s": finite_or_none(ttft)}
    out = noted(measured, outs, bands)
    ok = None if not (keys and all_finite(itl, ttft)) else not dom
    return decided("mlx-slo-not-dominated", ok, measured,
              "reproduced when no fixed chunk size (interleave, one long prompt beside the chat) has both a chat ITL "
              "p99 and a long-prompt TTFT at most slo's; not reproduced when one does (ties count as dominating). A "
              "chunk's deciding figure is the larger of its two ratios to slo's (dominating at most 1)." + NOISE_RULE,
              r.fairness("slo and every fixed chunk size on the same workload (one chat, one long prompt), same run; "
                         "the fixed sizes are the study's chunk_sizes only"),
              "scheduling table rows contended/slo and tradeoff/interleave/c*",
              why_not="slo's run or the fixed-chunk sweep is missing", outcome=out)


def stall_free_itl(r: _Result) -> dict:
    """``mlx-stall-free-itl``. measured: ``itl_p99_over_solo_x``, ``itl_p99_ms``, ``solo_itl_ms``,
    ``token_budget``, ``unfused_itl_p99_over_solo_x`` (decode and chunk back to back),
    ``mixed_step_ms`` and ``unfused_mixed_step_ms``, ``itl_p99_spread_pct``, ``within_noise``."""
    limit = float(claim("mlx-stall-free-itl").published["value"])
    b = r.config.get("stall_free_budget")
    key, unf = f"contended/stall_free/b{b}", f"contended/stall_free_unfused/b{b}"
    p99, solo = r.get(key, "pooled_itl_p99_s"), r.solo_itl_s
    x = ratio(p99, solo)
    s = spread(r.runs(key, "chat_itl_p99_runs_s"))
    measured = {"itl_p99_over_solo_x": finite_or_none(x), "itl_p99_ms": to_ms(p99), "solo_itl_ms": to_ms(solo), "token_budget": b,
                "unfused_itl_p99_over_solo_x": finite_or_none(ratio(r.get(unf, "pooled_itl_p99_s"), solo)),
                "mixed_step_ms": to_ms(r.get(key, "mixed_step_s")), "unfused_mixed_step_ms": to_ms(r.get(unf, "mixed_step_s")),
                "itl_p99_spread_pct": _pct(s)}
    b, n = ratio_band(r.runs(key, "chat_itl_p99_runs_s"), solo)
    out = noted(measured, [bound_check(x, limit, b, n)], {"itl_p99_over_solo": b})
    return decided("mlx-stall-free-itl", None if not math.isfinite(x) else x <= limit, measured,
              f"reproduced when stall_free's chat ITL p99 (token_budget {b}, its decode and chunk in one packed forward "
              f"where the model fuses) is at most {limit:g}x the chat's solo ITL p50 while one long prompt prefills; "
              f"not reproduced otherwise." + NOISE_RULE,
              r.fairness("stall_free and the solo reference on the same model object in the same run"),
              f"scheduling table row {key}, references.solo_itl_s",
              why_not="stall_free's contended run or the solo reference has no ITL", outcome=out)


def overlap(r: _Result) -> dict:
    """``mlx-overlap`` (TTFT and chat ITL in one verdict). measured: ``ttft_over_alone_x`` (against
    alone at chunk 2048), ``itl_p99_over_solo_x``, ``best_chunk``, ``long_ttft_s``,
    ``alone_ttft_2048_s``, ``itl_p99_ms``, ``solo_itl_ms``, ``ttft_spread_pct``, ``within_noise``."""
    pub = claim("mlx-overlap").published
    ttft_lim, itl_lim = float(pub["ttft_x"]["high"]), float(pub["itl_x"]["high"])
    pol = r.config.get("overlap_policy", "interleave")
    chunks = [int(c) for c in r.config.get("chunk_sizes") or [] if f"overlap/{pol}/c{c}" in r.rows]
    solo, alone = r.solo_itl_s, as_float(r.refs.get("alone_ttft_2048_s"))
    measured = {"ttft_over_alone_x": None, "itl_p99_over_solo_x": None, "best_chunk": None, "long_ttft_s": None,
                "alone_ttft_2048_s": finite_or_none(alone), "itl_p99_ms": None, "solo_itl_ms": to_ms(solo),
                "ttft_spread_pct": None, "within_noise": None}
    ok, out = None, None
    if chunks and all_finite(solo, alone):
        p99 = {c: r.get(f"overlap/{pol}/c{c}", "pooled_itl_p99_s") for c in chunks}
        meets = [c for c in chunks if p99[c] <= itl_lim * solo]
        best = (min(meets, key=lambda c: r.get(f"overlap/{pol}/c{c}", "long_ttft_s")) if meets
                else min(chunks, key=lambda c: p99[c]))
        key = f"overlap/{pol}/c{best}"
        tx, ix = ratio(r.get(key, "long_ttft_s"), alone), ratio(p99[best], solo)
        s = worst(spread(r.runs(key, "long_ttft_runs_s")), spread(r.runs(f"alone/interleave/c{REFERENCE_CHUNK}",
                                                                            "long_ttft_runs_s")))
        bt, nt = ratio_band(r.runs(key, "long_ttft_runs_s"), r.runs(f"alone/interleave/c{REFERENCE_CHUNK}",
                                                                   "long_ttft_runs_s"))
        bi, ni = ratio_band(r.runs(key, "chat_itl_p99_runs_s"), solo)
        measured.update(ttft_over_alone_x=finite_or_none(tx), itl_p99_over_solo_x=finite_or_none(ix), best_chunk=best,
                        long_ttft_s=finite_or_none(r.get(key, "long_ttft_s")), itl_p99_ms=to_ms(p99[best]),
                        ttft_spread_pct=_pct(s))
        out = noted(measured, [bound_check(tx, ttft_lim, bt, nt), bound_check(ix, itl_lim, bi, ni)],
                     {"ttft_over_alone": bt, "itl_p99_over_solo": bi})
        ok = None if not all_finite(tx, ix) else (tx <= ttft_lim and ix <= itl_lim)
    return decided("mlx-overlap", ok, measured,
              f"at overlap's best chunk size (the lowest TTFT among sizes whose chat ITL p99 is at most {itl_lim:g}x "
              f"solo, else the lowest ITL p99): reproduced when the long prompt's TTFT is at most {ttft_lim:g}x its "
              f"TTFT alone at chunk {REFERENCE_CHUNK} and the chat's ITL p99 at most {itl_lim:g}x its solo ITL; "
              f"not reproduced otherwise." + NOISE_RULE,
              r.fairness(f"overlap=True ({pol}) and the references on the same model object in the same run; the best "
                         f"of {len(chunks)} chunk sizes is chosen after the fact, which favours overlap"),
              f"scheduling table rows overlap/{pol}/c*",
              why_not="no overlap run, or a reference is missing", outcome=out)


def gate_vs_stall_free(r: _Result) -> dict:
    """``s001-gate-vs-stall-free``. measured: ``itl_p99_ratio_x`` and ``ttft_ratio_x`` (gate /
    stall_free), ``gate_itl_p99_ms``, ``stall_free_itl_p99_ms``, ``gate_long_ttft_s``,
    ``stall_free_long_ttft_s``, ``chunk_tokens`` (the gate's chunk = stall_free's token budget),
    ``equal_prompt`` (both runs prefilled the same single prompt), ``spread_pct``, ``within_noise``."""
    b = r.config.get("stall_free_budget")
    sf, gate = f"contended/stall_free/b{b}", f"contended/admission_gate/c{b}"
    equal = r.has(gate)
    if not equal and r.config.get("gate_chunk") == b:
        gate = "gate/admission_gate/w1"  # files before the equal-prompt run: the chat comparison only
    gi, si = r.get(gate, "pooled_itl_p99_s"), r.get(sf, "pooled_itl_p99_s")
    gt, st = r.get(gate, "long_ttft_s"), r.get(sf, "long_ttft_s")
    ix, tx = ratio(gi, si), ratio(gt, st)
    s_i = worst(spread(r.runs(gate, "chat_itl_p99_runs_s")), spread(r.runs(sf, "chat_itl_p99_runs_s")))
    s_t = worst(spread(r.runs(gate, "long_ttft_runs_s")), spread(r.runs(sf, "long_ttft_runs_s")))
    measured = {"itl_p99_ratio_x": finite_or_none(ix), "ttft_ratio_x": finite_or_none(tx) if equal else None,
                "gate_itl_p99_ms": to_ms(gi), "stall_free_itl_p99_ms": to_ms(si),
                "gate_long_ttft_s": finite_or_none(gt), "stall_free_long_ttft_s": finite_or_none(st), "chunk_tokens": b,
                "equal_prompt": equal, "spread_pct": _pct(worst(s_i, s_t))}
    limit = float(claim("mlx-stall-free-itl").published["value"])
    base_x = ratio(si, r.solo_itl_s)  # the baseline against its own bound
    measured.update(stall_free_itl_p99_over_solo_x=finite_or_none(base_x),
                    baseline_meets_own_bound=bool(base_x <= limit) if math.isfinite(base_x) else None)
    bi, ni = ratio_band(r.runs(gate, "chat_itl_p99_runs_s"), r.runs(sf, "chat_itl_p99_runs_s"))
    bt, nt = ratio_band(r.runs(gate, "long_ttft_runs_s"), r.runs(sf, "long_ttft_runs_s"))
    bb, nb = ratio_band(r.runs(sf, "chat_itl_p99_runs_s"), r.solo_itl_s)
    checks = [bound_check(ix, GATE_ITL_X, bi, ni), bound_check(base_x, limit, bb, nb)]
    out = noted(measured, checks + ([bound_check(tx, GATE_TTFT_X, bt, nt)] if equal else []),
                 {"itl_p99_ratio": bi, "stall_free_itl_p99_over_solo": bb, **({"ttft_ratio": bt} if equal else {})})
    ok = None
    why = "the admission gate or stall_free did not run at an equal chunk / budget"
    if equal and all_finite(ix, tx, base_x):
        ok = ix <= GATE_ITL_X and tx <= GATE_TTFT_X and base_x <= limit
    elif r.has(gate, sf):
        why = ("this file predates the equal-prompt gate run (contended/admission_gate/c*): its gate runs drew "
               "their prompt from the long-prompt range while stall_free prefilled the longest, so their TTFTs do "
               "not compare; itl_p99_ratio_x compares the chats only")
    return decided("s001-gate-vs-stall-free", ok, measured,
              f"the admission gate at chunk {b} against stall_free at token budget {b}, each with one chat beside the "
              f"same long prompt: reproduced (the gate approximates stall-free batching) when the gate's chat ITL p99 "
              f"is at most {GATE_ITL_X:g}x stall_free's and its long-prompt TTFT at most {GATE_TTFT_X:g}x "
              f"stall_free's; not reproduced otherwise. " + f"A comparison with a baseline holds the baseline to its own bound: when stall_free's chat ITL p99 is "
              f"over {limit:g}x the chat's solo ITL (mlx-stall-free-itl's bound), stall_free is not stall-free here and "
              f"the claim is not reproduced, however close the gate comes to it." + NOISE_RULE,
              r.fairness("both policies on the same seeded workload, model object and run, the gate's chunk equal "
                         "to stall_free's token budget; stall_free packs its decode and chunk into one forward where "
                         "the model fuses, the gate runs them as separate steps", seed=True),
              f"scheduling table rows {gate} and {sf}", why_not=why, outcome=out)


_DECIDE = {"mlx-interleave-matches": interleave_matches, "mlx-slo-chat-itl": slo_chat_itl,
           "mlx-slo-alone-ttft": slo_alone_ttft, "mlx-slo-not-dominated": slo_not_dominated,
           "mlx-stall-free-itl": stall_free_itl, "mlx-overlap": overlap, "s001-gate-vs-stall-free": gate_vs_stall_free}


def decide(claim_id: str, result: dict) -> dict:
    """One claim's verdict (of :data:`CLAIM_IDS`) from a scheduling result, whatever ran: a claim
    whose runs are missing comes back "not measured"."""
    return _DECIDE[claim_id](_Result(result))


def verdicts(result: dict) -> List[dict]:
    """The verdicts a scheduling result decides: one per claim of :data:`CLAIM_IDS` whose
    policies ran (a run of a subset of policies decides only theirs)."""
    r = _Result(result)
    out = []
    if {"interleave", "mlx_lm"} <= r.run:
        out.append(interleave_matches(r))
    if "slo" in r.run:
        out += [slo_chat_itl(r), slo_alone_ttft(r), slo_not_dominated(r)]
    if "stall_free" in r.run:
        out.append(stall_free_itl(r))
    if "overlap" in r.run:
        out.append(overlap(r))
    if {"admission_gate", "stall_free"} <= r.run:
        out.append(gate_vs_stall_free(r))
    return out


PARAMETER_KEYS = ("model", "platform_scale", "long_prompt_tokens", "chat_prompt_tokens", "policies", "chunk_sizes",
                  "workers", "repeats", "stall_chunk", "gate_chunk", "stall_free_budget", "slo_min_chunk",
                  "slo_max_chunk", "slo_chunk_multiple", "overlap_policy", "seed", "warmup", "quick")


def parameters(result: dict, **extra) -> dict:
    """The run's parameters, from its config (and ``extra``: e.g. the model's bits and dtype)."""
    c = result.get("config", {})
    return {**{k: c[k] for k in PARAMETER_KEYS if k in c}, **extra}


def decide_stored(doc: dict, path=None) -> List[dict]:
    """The verdicts of a stored scheduling result (:class:`~mlxlab.studies.base.Study`'s ``decide``),
    adding its ``parameters`` from the config where the file has none."""
    if "table" not in doc or "config" not in doc:
        raise ValueError(f"{path or 'this document'} is not a scheduling result (no table / config)")
    if not doc.get("parameters"):
        model = doc.get("model")
        doc["parameters"] = parameters(doc, **({"bits": model.get("bits"), "dtype": model.get("dtype")}
                                               if isinstance(model, dict) else {}))
    return verdicts(doc)
