"""The scheduling study's verdict: references, one table row per configuration, and one claim per
goal (name, goal, measured, passed, status, evidence), from the runs' medians over repeats.

The ``claims`` list is the study's own goals, kept in the payload (the stall ones are evidence for
``s001-stall-crawl``); the verdict records on the claims of ``data/claims`` are decided from the
same result by :mod:`mlxlab.studies.scheduling.verdict`."""

from __future__ import annotations

from typing import Dict, List

from mlxlab.studies.scheduling.metrics import aggregate, nanmax, ratio
from mlxlab.studies.scheduling.plan import (
    REFERENCE_CHUNK,
    SLO_ITL_FACTOR,
    Calibration,
    StudyPlan,
)

# goals
STALL_MIN_RATIO = 10.0  # the stall must stretch the chat's worst gap >= 10x its solo ITL
GATE_MAX_RATIO = 1.25  # admission gate: worst gap <= 1.25x the longest one-chunk step, for every N
SLO_ALONE_MAX = 1.05  # slo with nobody decoding: TTFT within 1.05x of alone at 2048
OVERLAP_TTFT_MAX = 1.2  # overlap: long-prompt TTFT within 1.2x of alone at 2048
MATCH_RANGE = (0.5, 2.0)  # engine interleave vs BatchGenerator worst gap


def study_result(plan: StudyPlan, calib: Calibration, runs: Dict[str, List[dict]], meta: Dict[str, dict],
                 warmup_s: Dict[str, float]) -> dict:
    """The study's JSON-ready result (NaN where nothing could be measured): ``config``,
    ``references``, ``claims``, ``table`` (one row per configuration) and ``warmup_s``."""
    agg = {k: aggregate(v) for k, v in runs.items()}
    refs = references(agg, plan, calib)
    return {"config": _config(plan, calib), "references": refs, "claims": claims(agg, plan, refs),
            "table": table_rows(agg, meta, refs), "warmup_s": warmup_s}


def _config(plan: StudyPlan, calib: Calibration) -> dict:
    return {"platform_scale": plan.scale, "long_prompt_tokens": [plan.lo, plan.hi],
            "chat_prompt_tokens": plan.chat_prompt, "policies": list(plan.policies),
            "policies_run": sorted(plan.run), "chunk_sizes": list(plan.chunk_sizes), "workers": list(plan.workers),
            "repeats": plan.repeats, "stall_chunk": plan.stall_chunk, "gate_chunk": plan.gate_chunk,
            "stall_free_budget": plan.stall_free_budget, "slo_min_chunk": plan.slo_min_chunk,
            "slo_max_chunk": plan.slo_max_chunk, "slo_chunk_multiple": plan.slo_chunk_multiple,
            "overlap_policy": plan.overlap_policy, "batch_output_tokens": plan.batch_output_tokens,
            "batch_arrival_s": calib.batch_arrival_s, "seed": plan.seed, "warmup": plan.warmup,
            "model": plan.model_name}


def references(agg: Dict[str, dict], plan: StudyPlan, calib: Calibration) -> dict:
    """The chat's solo ITL (engine, mlx-lm), the long prompt's TTFT alone per chunk size (at
    :data:`REFERENCE_CHUNK` and at its best), the slo target, and repeat 0's calibration."""
    alone = {c: agg[f"alone/interleave/c{c}"]["long_ttft_s"] for c in plan.alone_chunks}
    return {"solo_itl_s": agg["solo/engine"]["pooled_itl_p50_s"],
            "solo_itl_mlx_lm_s": agg["solo/mlx_lm"]["pooled_itl_p50_s"] if "mlx_lm" in plan.run else float("nan"),
            "solo_chat_ttft_s": agg["solo/engine"]["chat_ttft_s"],
            "alone_ttft_s": alone,
            "alone_chunk_time_s": {c: agg[f"alone/interleave/c{c}"]["chunk_time_s"] for c in plan.alone_chunks},
            "alone_ttft_2048_s": alone[REFERENCE_CHUNK],
            "alone_ttft_best_s": min(alone.values()),  # on a CPU a smaller chunk is often faster than 2048
            "alone_best_chunk": min(alone, key=alone.get), "slo_itl_target_s": calib.itl_target_s,
            "calibration": {"note": "repeat 0's references; they set the batch arrival time, the slo "
                                    "target and the chat's output length",
                            "solo_itl_s": calib.solo_itl_s, "solo_chat_ttft_s": calib.solo_chat_ttft_s,
                            "alone_ttft_s": calib.alone_ttft_s}}


def table_rows(agg: Dict[str, dict], meta: Dict[str, dict], refs: dict) -> List[dict]:
    """One row per configuration: its options, its medians and its ratios to the references."""
    table = []
    for key, a in agg.items():
        info = meta[key]
        solo = refs["solo_itl_mlx_lm_s"] if info.get("executor") == "mlx_lm" else refs["solo_itl_s"]
        row = {"config": key, **info, **a}
        row["worst_gap_over_solo_itl"] = ratio(a["chat_worst_gap_s"], solo)
        row["itl_p99_over_solo_itl"] = ratio(a["pooled_itl_p99_s"], solo)
        row["worst_gap_over_chunk_time"] = ratio(a["chat_worst_gap_s"], a["chunk_time_s"])
        row["long_ttft_over_alone_2048"] = ratio(a["long_ttft_s"], refs["alone_ttft_2048_s"])
        row["long_ttft_over_alone_best"] = ratio(a["long_ttft_s"], refs["alone_ttft_best_s"])
        table.append(row)
    return table


def claim(name, goal, measured, passed, evidence, status="measured") -> dict:
    return {"name": name, "goal": goal, "measured": measured,
            "passed": None if passed is None else bool(passed), "status": status, "evidence": evidence}


def claims(agg: Dict[str, dict], plan: StudyPlan, refs: dict) -> List[dict]:
    """One claim per goal of every policy that ran."""
    out = _stall_claims(agg, plan, refs)
    if "admission_gate" in plan.run:
        out.append(_gate_claim(agg, plan))
    if "slo" in plan.run:
        out += _slo_claims(agg, plan, refs)
    if "stall_free" in plan.run:
        out += _stall_free_claims(agg, plan, refs)
    if "overlap" in plan.run:
        out += _overlap_claims(agg, plan, refs)
    return out


def _by_workers(agg, prefix: str, workers, field: str) -> dict:
    return {w: agg[f"{prefix}/w{w}"][field] for w in workers}


def _stall_claims(agg, plan: StudyPlan, refs: dict) -> List[dict]:
    """The stall under interleave (and under mlx-lm, and how closely the two agree)."""
    workers, solo_itl, solo_mlx = plan.workers, refs["solo_itl_s"], refs["solo_itl_mlx_lm_s"]
    w_top = max([w for w in workers if w >= 2] or workers)
    worst = _by_workers(agg, "stall/interleave", workers, "chat_worst_gap_s")
    ratios = {w: ratio(worst[w], solo_itl) for w in workers}
    out = [claim("stall_interleave",
                 f"chat worst gap >= {STALL_MIN_RATIO:g}x solo ITL under interleave with {w_top} workers "
                 f"(chunk {plan.stall_chunk}, prompts {plan.lo}-{plan.hi} tokens)",
                 ratios[w_top], ratios[w_top] >= STALL_MIN_RATIO,
                 {"solo_itl_s": solo_itl, "worst_gap_s": worst, "worst_gap_over_solo_itl": ratios,
                  "pooled_itl_p99_s": _by_workers(agg, "stall/interleave", workers, "pooled_itl_p99_s"),
                  "worst_gap_runs_s": _by_workers(agg, "stall/interleave", workers, "chat_worst_gap_runs_s"),
                  "chat_covered_fraction": _by_workers(agg, "stall/interleave", workers, "chat_covered_fraction")})]
    if "mlx_lm" not in plan.run:
        return out
    worst_m = _by_workers(agg, "stall/mlx_lm", workers, "chat_worst_gap_s")
    mr = {w: ratio(worst_m[w], solo_mlx) for w in workers}
    out.append(claim("stall_mlx_lm",
                     f"mlx-lm BatchGenerator shows the stall too: chat worst gap >= {STALL_MIN_RATIO:g}x its solo "
                     f"ITL with {w_top} workers (prefill_step_size {plan.stall_chunk})",
                     mr[w_top], mr[w_top] >= STALL_MIN_RATIO,
                     {"solo_itl_s": solo_mlx, "worst_gap_s": worst_m, "worst_gap_over_solo_itl": mr,
                      "chat_covered_fraction": _by_workers(agg, "stall/mlx_lm", workers, "chat_covered_fraction")}))
    match = {w: ratio(worst[w], worst_m[w]) for w in workers}
    out.append(claim("interleave_matches_mlx_lm",
                     f"the engine's interleave reproduces BatchGenerator's stall: worst-gap ratio engine / mlx-lm "
                     f"within {MATCH_RANGE[0]:g}-{MATCH_RANGE[1]:g} for every worker count",
                     match, all(MATCH_RANGE[0] <= r <= MATCH_RANGE[1] for r in match.values()),
                     {"engine_worst_gap_s": worst, "mlx_lm_worst_gap_s": worst_m,
                      "engine_long_ttft_s": _by_workers(agg, "stall/interleave", workers, "long_ttft_s"),
                      "mlx_lm_long_ttft_s": _by_workers(agg, "stall/mlx_lm", workers, "long_ttft_s"),
                      "solo_itl_engine_s": solo_itl, "solo_itl_mlx_lm_s": solo_mlx}))
    return out


def _gate_claim(agg, plan: StudyPlan) -> dict:
    """The admission gate holds the chat's worst gap to one chunk step, for every worker count."""
    workers = plan.workers
    g = {w: agg[f"gate/admission_gate/w{w}"] for w in workers}
    gr = {w: ratio(g[w]["chat_worst_gap_s"], g[w]["chunk_time_s"]) for w in workers}
    gm = {w: ratio(g[w]["chat_worst_gap_s"], g[w]["chunk_time_max_s"]) for w in workers}
    worst = [g[w]["chat_worst_gap_s"] for w in workers]
    return claim("admission_gate_bounded",
                 f"admission_gate at chunk {plan.gate_chunk}: for every worker count {list(workers)} the chat's "
                 f"worst gap is one chunk step: <= {GATE_MAX_RATIO:g}x the longest step that ran one long-prompt "
                 f"chunk (measured also: worst gap / median full-chunk step)",
                 {"worst_gap_over_longest_chunk_step": nanmax(gm.values()),
                  "worst_gap_over_median_chunk": nanmax(gr.values())},
                 all(r <= GATE_MAX_RATIO for r in gm.values()),
                 {"worst_gap_s": {w: g[w]["chat_worst_gap_s"] for w in workers},
                  "chunk_time_s": {w: g[w]["chunk_time_s"] for w in workers},
                  "chunk_time_max_s": {w: g[w]["chunk_time_max_s"] for w in workers},
                  "worst_gap_over_chunk_time": gr, "worst_gap_over_longest_chunk_step": gm,
                  "worst_gap_spread_across_workers": ratio(max(worst), min(worst)),
                  "pooled_itl_p99_s": {w: g[w]["pooled_itl_p99_s"] for w in workers},
                  "interleave_worst_gap_s": _by_workers(agg, "stall/interleave", workers, "chat_worst_gap_s"),
                  "chat_covered_fraction": {w: g[w]["chat_covered_fraction"] for w in workers},
                  "long_ttft_max_s": {w: g[w]["long_ttft_s"] for w in workers}})


def _contended_evidence(a: dict, refs: dict) -> dict:
    solo_itl, alone_ref, alone_best = refs["solo_itl_s"], refs["alone_ttft_2048_s"], refs["alone_ttft_best_s"]
    return {"chat_itl_p50_s": a["pooled_itl_p50_s"], "chat_itl_p99_s": a["pooled_itl_p99_s"],
            "chat_itl_max_s": a["pooled_itl_max_s"], "solo_itl_s": solo_itl,
            "itl_p99_over_solo": ratio(a["pooled_itl_p99_s"], solo_itl),
            "long_ttft_s": a["long_ttft_s"], "alone_ttft_2048_s": alone_ref,
            "long_ttft_over_alone_2048": ratio(a["long_ttft_s"], alone_ref),
            "alone_ttft_best_s": alone_best,
            "long_ttft_over_alone_best": ratio(a["long_ttft_s"], alone_best),
            "chat_covered_fraction": a["chat_covered_fraction"], "chosen_chunk_median": a["chosen_chunk_median"],
            "infeasible_fraction": a["infeasible_fraction"], "mixed_step_s": a["mixed_step_s"]}


def _slo_claims(agg, plan: StudyPlan, refs: dict) -> List[dict]:
    """slo meets its ITL target (packed too), keeps its TTFT alone, and no fixed chunk beats it."""
    a, target, hi = agg["contended/slo"], refs["slo_itl_target_s"], plan.hi
    ev = {**_contended_evidence(a, refs), "itl_target_s": target}
    out = [claim("slo_chat_itl", f"slo (itl_target_s = {SLO_ITL_FACTOR:g}x solo ITL = {target * 1e3:.2f} ms): chat "
                 f"ITL p99 <= target while one {hi}-token prompt prefills", ev["itl_p99_over_solo"],
                 a["pooled_itl_p99_s"] <= target, ev)]
    if "contended/slo_packed" in agg:
        pk = agg["contended/slo_packed"]
        pev = {**_contended_evidence(pk, refs), "itl_target_s": target,
               "unpacked_itl_p99_s": a["pooled_itl_p99_s"], "unpacked_long_ttft_s": a["long_ttft_s"]}
        out.append(claim("slo_packed_chat_itl", f"slo with packed steps: chat ITL p99 <= {target * 1e3:.2f} ms "
                         f"while one {hi}-token prompt prefills", pev["itl_p99_over_solo"],
                         pk["pooled_itl_p99_s"] <= target, pev))
    b = agg["alone/slo"]
    r = ratio(b["long_ttft_s"], refs["alone_ttft_2048_s"])
    out.append(claim("slo_alone_ttft", f"slo with nobody decoding: long-prompt TTFT <= {SLO_ALONE_MAX:g}x alone at "
                     f"chunk {REFERENCE_CHUNK}", r, r <= SLO_ALONE_MAX,
                     {"slo_alone_ttft_s": b["long_ttft_s"], "alone_ttft_2048_s": refs["alone_ttft_2048_s"],
                      "prompt_tokens": hi}))
    tradeoff = {c: agg[f"tradeoff/interleave/c{c}"] for c in plan.chunk_sizes}
    dominated_by = [c for c, t in tradeoff.items()
                    if t["pooled_itl_p99_s"] <= a["pooled_itl_p99_s"] and t["long_ttft_s"] <= a["long_ttft_s"]]
    out.append(claim("slo_not_dominated", "no fixed chunk size (interleave) gives both a lower chat ITL p99 and a "
                     "lower long-prompt TTFT than slo", dominated_by, not dominated_by,
                     {"slo": {"itl_p99_s": a["pooled_itl_p99_s"], "long_ttft_s": a["long_ttft_s"]},
                      "fixed": {c: {"itl_p99_s": t["pooled_itl_p99_s"], "long_ttft_s": t["long_ttft_s"]}
                                for c, t in tradeoff.items()}}))
    return out


def _stall_free_claims(agg, plan: StudyPlan, refs: dict) -> List[dict]:
    """stall_free meets 2x solo ITL, and what fusing its steps saves."""
    b = plan.stall_free_budget
    a, u = agg[f"contended/stall_free/b{b}"], agg[f"contended/stall_free_unfused/b{b}"]
    ev = {**_contended_evidence(a, refs), "token_budget": b}
    fev = {"fusable_model": plan.fusable,
           "mixed_step_s": {"fused": a["mixed_step_s"], "unfused": u["mixed_step_s"]},
           "chat_itl_p99_s": {"fused": a["pooled_itl_p99_s"], "unfused": u["pooled_itl_p99_s"]},
           "long_ttft_s": {"fused": a["long_ttft_s"], "unfused": u["long_ttft_s"]}}
    saving = ratio(u["mixed_step_s"], a["mixed_step_s"])
    return [claim("stall_free_chat_itl", f"stall_free (token_budget {b}): chat ITL p99 <= {SLO_ITL_FACTOR:g}x "
                  f"solo ITL while one {plan.hi}-token prompt prefills", ev["itl_p99_over_solo"],
                  ev["itl_p99_over_solo"] <= SLO_ITL_FACTOR, ev),
            claim("stall_free_fusion", "the cost of not fusing: median mixed (decode + chunk) step, back to back "
                  "over packed in one forward (> 1: fusing saves time)", saving,
                  saving > 1.0 if plan.fusable else None, fev,
                  status="measured" if plan.fusable else "not fusable: both runs back to back")]


def _overlap_claims(agg, plan: StudyPlan, refs: dict) -> List[dict]:
    """overlap=True at its best chunk size keeps the long prompt's TTFT and the chat's ITL."""
    chunks, solo_itl = plan.chunk_sizes, refs["solo_itl_s"]
    ov = {c: agg[f"overlap/{plan.overlap_policy}/c{c}"] for c in chunks}
    # best: the lowest TTFT among sizes whose chat p99 meets 2x solo; else the lowest chat p99
    ok = [c for c in chunks if ov[c]["pooled_itl_p99_s"] <= SLO_ITL_FACTOR * solo_itl]
    best = min(ok, key=lambda c: ov[c]["long_ttft_s"]) if ok else min(chunks, key=lambda c: ov[c]["pooled_itl_p99_s"])
    ev = {**_contended_evidence(ov[best], refs), "best_chunk": best,
          "per_chunk": {c: {"itl_p99_over_solo": ratio(ov[c]["pooled_itl_p99_s"], solo_itl),
                            "long_ttft_over_alone_2048": ratio(ov[c]["long_ttft_s"], refs["alone_ttft_2048_s"])}
                        for c in chunks}}
    goal = (f"overlap=True at its best chunk size: long-prompt TTFT <= {OVERLAP_TTFT_MAX:g}x alone at "
            f"{REFERENCE_CHUNK}, chat ITL p99 <= {SLO_ITL_FACTOR:g}x solo")
    return [claim("overlap_ttft", goal, ev["long_ttft_over_alone_2048"],
                  ev["long_ttft_over_alone_2048"] <= OVERLAP_TTFT_MAX, ev),
            claim("overlap_chat_itl", goal, ev["itl_p99_over_solo"], ev["itl_p99_over_solo"] <= SLO_ITL_FACTOR,
                  {"best_chunk": best, "chat_itl_p99_s": ov[best]["pooled_itl_p99_s"], "solo_itl_s": solo_itl})]
