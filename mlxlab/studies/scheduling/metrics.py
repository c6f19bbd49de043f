"""One run's numbers for the scheduling study, and their medians over repeats.

A run is a :class:`mlxlab.core.runner.RunResult` of a chat stream (tenant ``chat``) beside long
prompts (tenant ``batch``). The chat's gaps that overlap the long prompts' prefill window (first
batch arrival to last batch first token) are the *contended* gaps.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np


def q(v: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of ``v`` (NaN when empty)."""
    return float(np.percentile(np.asarray(v, dtype=float), p)) if len(v) else float("nan")


def med(v: Sequence[float]) -> float:
    """The median of the finite values of ``v`` (NaN when none)."""
    v = [x for x in v if x is not None and math.isfinite(x)]
    return float(np.median(v)) if v else float("nan")


def nanmax(v) -> float:
    """The largest finite value of ``v`` (NaN when none)."""
    v = [x for x in v if x is not None and math.isfinite(x)]
    return max(v) if v else float("nan")


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either is not finite or ``b`` is 0."""
    return a / b if (b and math.isfinite(a) and math.isfinite(b)) else float("nan")


def spread(v) -> Optional[float]:
    """The repeat-to-repeat spread of ``v``: (max - min) / median of its finite values; None with
    fewer than two (one repeat measures no spread) or a median of 0."""
    v = [float(x) for x in (v or []) if x is not None and math.isfinite(x)]
    if len(v) < 2:
        return None
    m = float(np.median(v))
    return (max(v) - min(v)) / m if m > 0 else None


def _contended(chat, batch):
    """(the chat's gaps inside the batch's prefill window, whether every chat stream covered the
    whole window); all gaps and None when there is no window."""
    gaps = [g for r in chat for g in r.itl_s]
    if not (batch and all(r.token_times_s for r in batch)) or not chat:
        return gaps, None
    start, end = min(r.arrival_s for r in batch), max(r.token_times_s[0] for r in batch)
    contended = [b - a for r in chat for a, b in zip(r.token_times_s, r.token_times_s[1:]) if b > start and a < end]
    covered = all(r.token_times_s and r.token_times_s[0] <= start and r.token_times_s[-1] >= end for r in chat)
    return contended, covered


def _chunk_times(tl, batch, chunk_size: Optional[int]):
    """(median, max) duration of the steps that ran a chunk of exactly one long prompt (the chat's
    own short prompt is no chunk); the median over (nearly) full chunks when there are any."""
    if not (len(tl) and "prefill_seqs" in tl and batch):
        return float("nan"), float("nan")
    ids = {r.id for r in batch}
    one = tl[[len(ids & set(s)) == 1 for s in tl.prefill_seqs]]
    full = one[one.prefill_tokens >= 0.9 * chunk_size] if chunk_size else one
    use = full if len(full) else one
    if not len(use):
        return float("nan"), float("nan")
    return float(use.duration_s.median()), float(one.duration_s.max())


def run_metrics(res, chunk_size: Optional[int] = None) -> dict:
    """One run's numbers from a :class:`mlxlab.core.runner.RunResult`: the chat's gaps (all and
    contended), the long prompts' TTFTs and the median full-chunk step time."""
    reqs = list(res.submitted)
    chat = [r for r in reqs if r.tenant == "chat"]
    batch = [r for r in reqs if r.tenant == "batch"]
    gaps = [g for r in chat for g in r.itl_s]
    contended, covered = _contended(chat, batch)
    tl = res.timeline
    chunk_time, chunk_max = _chunk_times(tl, batch, chunk_size)
    mixed = tl[tl.phase == "mixed"] if len(tl) and "phase" in tl else []
    ttfts = [r.ttft_s for r in batch if r.ttft_s is not None]
    pol = getattr(res.executor, "policy", None)
    chosen = list(getattr(pol, "chosen", []) or [])
    return {
        "chat_gaps_s": gaps,
        "contended_gaps_s": contended,
        "chat_ttft_s": chat[0].ttft_s if chat else float("nan"),
        "chat_itl_p50_s": q(contended, 50),
        "chat_itl_p99_s": q(contended, 99),
        "chat_worst_gap_s": max(gaps) if gaps else float("nan"),
        "chat_tokens": sum(len(r.output_tokens) for r in chat),
        "chat_covered": covered,
        "long_ttft_s": max(ttfts) if ttfts else float("nan"),
        "long_ttfts_s": ttfts,
        "chunk_time_s": chunk_time,
        "chunk_time_max_s": chunk_max,
        # median step that ran a decode and a chunk together
        "mixed_step_s": float(mixed.duration_s.median()) if len(mixed) else float("nan"),
        "chosen_chunk_median": float(np.median(chosen)) if chosen else None,
        # slo: the share of its decisions where no chunk size could meet the ITL target
        "infeasible_fraction": getattr(pol, "infeasible_steps", 0) / len(chosen) if chosen else None,
        "steps": int(len(tl)),
        "wall_s": res.wall_s,
        "complete": res.complete,
    }


def aggregate(runs: List[dict]) -> dict:
    """Medians over repeats of each run's scalars; p50/p99/max over the pooled contended gaps."""
    pooled = [g for r in runs for g in r["contended_gaps_s"]]
    out = {"repeats": len(runs)}
    for k in ("chat_ttft_s", "chat_itl_p50_s", "chat_itl_p99_s", "chat_worst_gap_s", "long_ttft_s",
              "chunk_time_s", "chunk_time_max_s", "mixed_step_s", "wall_s"):
        out[k] = med([r.get(k, float("nan")) for r in runs])
    out["chat_worst_gap_runs_s"] = [r["chat_worst_gap_s"] for r in runs]
    out["long_ttft_runs_s"] = [r["long_ttft_s"] for r in runs]
    out["chat_itl_p99_runs_s"] = [r["chat_itl_p99_s"] for r in runs]  # each repeat's own p99: its spread
    out["pooled_itl_p50_s"] = q(pooled, 50)
    out["pooled_itl_p99_s"] = q(pooled, 99)
    out["pooled_itl_max_s"] = max(pooled) if pooled else float("nan")
    out["pooled_gaps"] = len(pooled)
    cov = [r["chat_covered"] for r in runs if r["chat_covered"] is not None]
    out["chat_covered_fraction"] = (sum(cov) / len(cov)) if cov else None
    ch = [r["chosen_chunk_median"] for r in runs if r["chosen_chunk_median"] is not None]
    out["chosen_chunk_median"] = med(ch) if ch else None
    inf = [r["infeasible_fraction"] for r in runs if r.get("infeasible_fraction") is not None]
    out["infeasible_fraction"] = med(inf) if inf else None
    out["complete"] = all(r["complete"] for r in runs)
    return out
