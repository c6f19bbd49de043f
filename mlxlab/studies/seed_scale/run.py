"""Seed 001 at its own scale: the case study's figures reproduced in the simulator (no MLX).

:func:`seed_scale_study` charges the seed-001 published profile
(:func:`mlxlab.sim.published.seed001_profile`) with the case study's scenarios at 60k-token
scale: the prompt's TTFT floor, the TTFT-vs-chunk and chat-ITL-vs-chunk curves over 256-4,096,
the 0.67 tok/s crawl without a gate and the 60-70 tok/s windows with one, and where
``stall_free`` and ``slo`` fall on the same TTFT/ITL plane. The figures the profile is fitted on
come back in a ``calibration`` block (input, value given back, residual) and get no verdict; the
ones it predicts are scored by :mod:`mlxlab.studies.seed_scale.verdict`.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Union

import numpy as np

from mlxlab.core.results import jsonable, save_results
from mlxlab.core.runner import RunResult, run_workload
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload
from mlxlab.sim.fit import coefficients
from mlxlab.sim.published import calibration_inputs, seed001_cost_model, seed001_figures
from mlxlab.sim.simulator import Simulator
from mlxlab.studies.seed_scale.verdict import calibration_block, format_verdicts, seed_scale_verdicts

#: A smaller plane for quick runs: the chunk sizes the verdicts read (512, 1,024, 2,048) and one
#: point per other policy, so a quick run stores the same verdicts as a full one.
QUICK = {"chunk_sizes": (512, 1024, 2048), "stall_free_budgets": (512,), "slo_targets_s": (0.5,)}
GATE = {"big_prompt_tokens": 4096}  # the gates' "big prompt": the batch prompts and the 60k one, not the chat


class SeedScenes:
    """The study's scenarios on one cost model: a chat of ``chat_context_tokens`` beside one or
    more long prompts, simulated at the seed's scale (vocabulary 1,000, contexts up to 256k)."""

    def __init__(self, cm, *, long_prompt_tokens: int, chat_context_tokens: int, seed: int):
        self.cm, self.seed = cm, seed
        self.n_long = int(long_prompt_tokens)
        self.chat_context_tokens = chat_context_tokens
        self.solo_itl = cm.predict(1, chat_context_tokens + 1, [])

    def sim(self, tenants, *, policy="interleave", chunk_size=2048, **opts) -> RunResult:
        vocab, max_context = 1000, 262_144
        wl = Workload(tenants, vocab_size=vocab, seed=self.seed, max_context=max_context)
        return run_workload(Simulator(self.cm, policy=policy, chunk_size=chunk_size, vocab_size=vocab,
                                      max_context=max_context, **opts), wl)

    def chat(self, out_tokens: int) -> ChatTenant:
        return ChatTenant(sessions=1, turns=1, first_prompt_tokens=self.chat_context_tokens,
                          output_tokens=int(out_tokens), think_time_s=0.0, name="chat")

    def long_prompt(self, start_s: float, n_tokens=None, w: int = 1, out: int = 1) -> BatchTenant:
        return BatchTenant(workers=w, requests=w, prompt_tokens=n_tokens or self.n_long, output_tokens=out,
                           start_s=start_s, name="batch")

    def chat_start(self, policy: str, c: int, **opts) -> float:
        """When the chat streams under ``policy`` (its own prompt prefilled first, alone), plus ten
        decode steps: when the long prompts arrive."""
        res = self.sim([self.chat(2)], policy=policy, chunk_size=c, **opts)
        return res.submitted[0].token_times_s[0] + 10 * self.solo_itl

    def chat_tokens_for(self, seconds: float) -> int:
        """Enough chat tokens to keep the chat decoding for ``seconds`` and then some."""
        return int(1.5 * seconds / self.solo_itl) + 64


def contended(res: RunResult):
    """The chat, the batch prompts, the window from their arrival to their last first token, the
    chat's gaps inside it, and the timeline's steps that ran a batch prompt's chunk."""
    reqs = res.submitted
    ch = [r for r in reqs if r.tenant == "chat"][0]
    big = [r for r in reqs if r.tenant == "batch"]
    window = (min(r.arrival_s for r in big), max(r.token_times_s[0] for r in big))
    t = ch.token_times_s
    gaps = [b - a for a, b in zip(t, t[1:]) if b > window[0] and a < window[1]]
    tl = res.timeline
    ids = {r.id for r in big}
    chunk_steps = tl[[bool(ids & set(s)) for s in tl.prefill_seqs]] if len(tl) else tl
    return ch, big, window, gaps, chunk_steps


def gap_stats(gaps: Sequence[float]) -> dict:
    g = np.asarray(gaps, dtype=float)
    if not g.size:
        return {k: float("nan") for k in ("itl_p50_s", "itl_p99_s", "itl_mean_s", "itl_max_s", "tok_s")}
    return {"itl_p50_s": float(np.percentile(g, 50)), "itl_p99_s": float(np.percentile(g, 99)),
            "itl_mean_s": float(g.mean()), "itl_max_s": float(g.max()), "tok_s": float(1.0 / g.mean()),
            "gaps": int(g.size)}


def _chunk_step_stats(steps) -> dict:
    return {"chunk_step_p50_s": float(steps.duration_s.median()) if len(steps) else float("nan"),
            "chunk_step_max_s": float(steps.duration_s.max()) if len(steps) else float("nan")}


def floor_and_alone(sc: SeedScenes, chunk_sizes: Sequence[int]):
    """The 60k prompt alone: in one chunk (the floor, no chunk boundary to pay for) and at each
    chunk size."""
    floor_s = sc.sim([sc.long_prompt(0.0)], chunk_size=sc.n_long).submitted[0].ttft_s
    alone = {c: sc.sim([sc.long_prompt(0.0)], chunk_size=c).submitted[0].ttft_s for c in chunk_sizes}
    return floor_s, alone


def run_point(sc: SeedScenes, policy: str, c: int, label: str, *, floor_s: float, longest_alone_s: float,
              **opts) -> dict:
    """The chat streaming when the 60k prompt arrives, under ``policy`` at chunk ``c``: the
    prompt's TTFT and premium over the floor, the chat's gaps while it is prefilled."""
    start = sc.chat_start(policy, c, **opts)
    res = sc.sim([sc.chat(sc.chat_tokens_for(start + 3 * longest_alone_s)), sc.long_prompt(start)],
                 policy=policy, chunk_size=c, **opts)
    ch, big, window, gaps, steps = contended(res)
    ttft = big[0].ttft_s
    row = {"policy": res.executor.policy.name, "label": label, "chunk_size": c,
           "options": {k: (v if isinstance(v, (int, float, str)) else getattr(v, "source", repr(v)))
                       for k, v in opts.items()}, "long_ttft_s": ttft,
           "premium": ttft / floor_s - 1.0, **gap_stats(gaps), **_chunk_step_stats(steps), "chunks": int(len(steps))}
    chosen = getattr(res.executor.policy, "chosen", None)
    if chosen:
        row["chosen_chunk_median"] = float(np.median(chosen))
    return row


def crawl_case(sc: SeedScenes, policy: str, opts: dict, *, workers: int, batch_prompt_tokens: Sequence[int],
               stall_chunk: int) -> dict:
    """The chat beside ``workers`` fresh batch prompts at ``stall_chunk``: its rate and worst gap,
    against the longest single chunk, and its rate over the decode-only gaps (the windows)."""
    cm = sc.cm
    start = sc.chat_start("interleave", stall_chunk)
    est = workers * cm.predict(0, 0, [(max(batch_prompt_tokens), max(batch_prompt_tokens) / 2)]) * 1.5
    res = sc.sim([sc.chat(sc.chat_tokens_for(start + 4 * est)),
                  sc.long_prompt(start, tuple(batch_prompt_tokens), w=workers, out=227)],
                 policy=policy, chunk_size=stall_chunk, **opts)
    ch, big, window, gaps, steps = contended(res)
    st = gap_stats(gaps)
    fast = [g for g in gaps if g < 0.25 * float(steps.duration_s.min())] if len(steps) else []
    big_ids = {r.id for r in big}
    one_chunk = [cm.predict(0, 0, [(n, c)]) for rec in res.executor.steps for (i, n, c) in rec.prefill
                 if i in big_ids]
    st.update({"one_chunk_max_s": max(one_chunk) if one_chunk else float("nan"),
               "worst_gap_over_one_chunk": (st["itl_max_s"] / max(one_chunk)) if one_chunk else float("nan"),
               "window_gaps": len(fast), "window_tok_s": (1.0 / float(np.mean(fast))) if fast else float("nan"),
               **_chunk_step_stats(steps),
               "batch_ttft_p50_s": float(np.median([r.ttft_s for r in big])),
               "batch_last_first_token_s": window[1] - window[0]})
    return st


def seed_scale_study(cost_model=None, *, chunk_sizes: Sequence[int] = (256, 512, 1024, 2048, 4096),
                     long_prompt_tokens: int = 60_000, chat_context_tokens: int = 23_000,
                     workers: int = 4, batch_prompt_tokens=(10_000, 25_000), stall_chunk: int = 2048,
                     window_s: float = 1.0, stall_free_budgets: Sequence[int] = (256, 512, 1024, 2048),
                     slo_targets_s: Sequence[float] = (0.25, 0.5, 1.0), seed: int = 0, save: bool = False,
                     figure: bool = False, name: str = "seed_scale", folder: Union[None, str, Path] = None,
                     log: Optional[Callable[[str], None]] = None, mapper: Callable = map) -> dict:
    """Seed 001 at its own scale in the simulator, with the published profile.

    Scenarios (all on the seed-001 cost model, no noise):

    * ``floor``: the 60k prompt alone in one chunk (no chunk boundary to pay for), and alone at each
      chunk size;
    * ``tradeoff``: a chat stream whose prompt is ``chat_context_tokens`` decodes while the 60k
      prompt arrives (once the chat streams) and is prefilled under ``interleave`` (one decode
      step per chunk, as mlx-vlm) at each chunk size: the prompt's TTFT and its premium over the
      floor, the chat's gaps while the prompt is being prefilled (p50, p99, mean, tok/s);
    * ``crawl``: the chat beside ``workers`` concurrent fresh batch prompts
      (``batch_prompt_tokens``) under ``interleave`` at ``stall_chunk`` (no gate), beside the same
      under ``admission_gate`` and ``admission_gate_window``
      (:class:`mlxlab.policies.decode_window.DecodeWindowGate`, ``window_s``);
    * ``plane``: the 60k prompt's TTFT against the chat's ITL for ``interleave`` at each chunk
      size, ``stall_free`` at each token budget, ``slo`` at each ITL target (given the seed cost
      model as its prior, so it needs no warm-up), and the two gates.

    Returns a JSON-ready dict with ``verdicts`` (:func:`mlxlab.core.claims.verdict` records for the
    claims the simulator predicts, computed here from the numbers beside them), ``calibration``
    (the figures the profile was fitted on, what the simulator gives back and the residual),
    ``chunk_doc_s``, ``curves``, ``crawl``, ``plane``, ``profile`` and ``config`` (the run's
    parameters). With ``save``, written by :func:`save_study` into ``folder`` (default
    ``data/results/sim-seed001/``).
    """
    say = log or (lambda s: None)
    t_start = time.perf_counter()
    cm = cost_model or seed001_cost_model()
    sc = SeedScenes(cm, long_prompt_tokens=long_prompt_tokens, chat_context_tokens=chat_context_tokens, seed=seed)
    floor_s, alone = floor_and_alone(sc, chunk_sizes)
    say(f"[seed] floor {floor_s:.2f} s; alone " + ", ".join(f"{c}: {t:.1f} s" for c, t in alone.items()))
    curves, plane = _curves_and_plane(sc, floor_s, max(alone.values()), chunk_sizes=chunk_sizes,
                                      stall_free_budgets=stall_free_budgets, slo_targets_s=slo_targets_s,
                                      stall_chunk=stall_chunk, window_s=window_s, say=say, mapper=mapper)
    crawl = {}
    cases = _crawl_policies(window_s)
    crawl_rows = mapper(partial(_crawl_point, sc, dict(workers=workers, batch_prompt_tokens=batch_prompt_tokens,
                                                       stall_chunk=stall_chunk)), cases)
    for (label, _, _), st in zip(cases, crawl_rows):
        crawl[label] = st
        say(f"[seed] crawl {label:28s}: chat {st['tok_s']:.2f} tok/s, worst gap {st['itl_max_s']:.2f} s, "
            f"window {st['window_tok_s']:.1f} tok/s over {st['window_gaps']} gaps")
    doc_lo, doc_hi = seed001_figures()["doc_context_tokens"]["value"]
    chunk_doc = {c: cm.predict(0, 0, [(2048, c)]) for c in (doc_lo, doc_hi)}
    inputs = calibration_inputs()  # what the published profile is fitted on: residuals, not verdicts
    premium_at = {r["chunk_size"]: r["premium"] for r in curves}
    out = {
        "verdicts": seed_scale_verdicts(floor_s=floor_s, solo_itl_s=sc.solo_itl, curves=curves,
                                        chunk_doc_s=chunk_doc, inputs=inputs, stall_chunk=stall_chunk),
        "calibration": calibration_block(inputs, floor_s=floor_s, solo_itl_s=sc.solo_itl, premium_at=premium_at),
        "chunk_doc_s": {str(c): t for c, t in chunk_doc.items()},
        "floor_s": floor_s,
        "alone_ttft_s": {str(c): t for c, t in alone.items()},
        "solo_itl_s": sc.solo_itl,
        "curves": curves,
        "crawl": crawl,
        "plane": plane,
        "profile": {"coefficients": coefficients(cm), "source": getattr(cm, "source", None)},
        "config": {"chunk_sizes": list(chunk_sizes), "long_prompt_tokens": sc.n_long,
                   "chat_context_tokens": chat_context_tokens, "workers": workers,
                   "batch_prompt_tokens": list(batch_prompt_tokens), "stall_chunk": stall_chunk, "window_s": window_s,
                   "stall_free_budgets": list(stall_free_budgets), "slo_targets_s": list(slo_targets_s),
                   "seed": seed, "cost_model": getattr(cm, "source", None)},
        "wall_s": time.perf_counter() - t_start,
    }
    out = jsonable(out)
    if save:
        out["paths"] = save_study(out, name, figure=figure, folder=folder)
    return out


def _plane_point(sc: SeedScenes, floor_s: float, longest_alone_s: float, point: tuple) -> dict:
    """One point of the plane, ``(policy, chunk, label, options)``: :func:`run_point` (a module-level
    function, so a cluster's worker can be sent it)."""
    policy, c, label, opts = point
    return run_point(sc, policy, c, label, floor_s=floor_s, longest_alone_s=longest_alone_s, **opts)


def _crawl_point(sc: SeedScenes, kw: dict, case: tuple) -> dict:
    """One crawl case, ``(label, policy, options)``: :func:`crawl_case`."""
    return crawl_case(sc, case[1], case[2], **kw)


def _curves_and_plane(sc: SeedScenes, floor_s: float, longest_alone_s: float, *, chunk_sizes, stall_free_budgets,
                      slo_targets_s, stall_chunk: int, window_s: float, say, mapper: Callable = map) -> tuple:
    """The interleave trade-off curve over chunk sizes, and every policy's point on the plane."""
    points = [("interleave", c, f"interleave {c}", {}) for c in chunk_sizes]
    points += [("stall_free", 4096, f"stall_free {b}", {"token_budget": int(b)}) for b in stall_free_budgets]
    points += [("slo", 4096, f"slo {tgt:g} s", {"itl_target_s": float(tgt), "min_chunk": 64, "max_chunk": 4096,
                                                "cost_model": sc.cm}) for tgt in slo_targets_s]
    points += [("admission_gate", c, f"admission_gate {c}", dict(GATE)) for c in (512, stall_chunk)]
    points.append(("admission_gate_window", stall_chunk, f"gate+window {window_s:g} s, {stall_chunk}",
                   {"window_s": window_s, **GATE}))
    curves, plane = [], []
    for (policy, c, _, _), row in zip(points, mapper(partial(_plane_point, sc, floor_s, longest_alone_s), points)):
        plane.append(row)
        if policy == "interleave":
            curves.append(row)
            say(f"[seed] interleave {c:5d}: TTFT {row['long_ttft_s']:6.1f} s (+{row['premium']:.0%}), chat gap p50 "
                f"{row['itl_p50_s']:.3f} s p99 {row['itl_p99_s']:.3f} s, {row['tok_s']:.2f} tok/s")
    return curves, plane


def _crawl_policies(window_s: float) -> List[tuple]:
    return [("no gate (interleave)", "interleave", {}),
            ("admission_gate", "admission_gate", dict(GATE)),
            (f"gate + {window_s:g} s decode window", "admission_gate_window", {"window_s": window_s, **GATE})]


def save_study(out: dict, name: str = "seed_scale", *, figure: bool = False,
               folder: Union[None, str, Path] = None) -> dict:
    """Write a :func:`seed_scale_study` result: its verdicts and its ``config`` as the run's
    parameters (checked against data/claims by :func:`mlxlab.core.results.save_results`), into
    ``folder`` (default ``data/results/sim-seed001/``); with ``figure``, the chart into ``folder``
    too, or :data:`mlxlab.studies.sim_validation.charts.FIGURES` by default. Returns the paths written."""
    payload = {k: v for k, v in out.items() if k not in ("verdicts", "paths")}
    paths = {"results": str(save_results(name, payload, platform="sim-seed001", folder=folder,
                                         verdicts=out["verdicts"], parameters=out["config"]))}
    if figure:
        try:
            from mlxlab.notebook.plots import save_figure  # altair: only for the figure
            from mlxlab.studies.sim_validation.charts import (  # altair, as above
                FIGURES,
                seed_scale_chart,
            )

            paths["figures"] = [str(p) for p in save_figure(seed_scale_chart(out), name, folder or FIGURES)]
        except Exception as e:  # a figure must not lose the numbers
            paths["figure_error"] = repr(e)
    return paths


def format_claims(result: dict) -> str:
    """The study's verdicts and calibration residuals, one line each."""
    return format_verdicts(result["verdicts"], result.get("calibration"))
