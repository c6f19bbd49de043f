"""Seed-001 scheduling experiments on the real engine, beside mlx-lm's ``BatchGenerator``.

:func:`scheduling_study` runs, in one process and on one model object:

* ``solo``: one chat stream alone (engine and mlx-lm): the reference inter-token latency (ITL);
* ``alone``: one long prompt alone at each chunk size: the reference TTFT (at chunk 2048 above all);
* ``stall``: a chat streaming while ``W`` batch workers each send one long prompt, under the
  engine's ``interleave`` policy and under mlx-lm, at ``stall_chunk``;
* ``gate``: the same under ``admission_gate`` at ``gate_chunk``, for every ``W`` in ``workers``;
* ``tradeoff``: a chat plus one long prompt under ``interleave`` at each chunk size (the
  ITL-vs-chunk and TTFT-vs-chunk curves);
* ``stall_free`` and ``slo``: a chat plus one long prompt; ``slo`` also with nobody decoding;
* ``overlap``: the engine's ``overlap=True`` mode (if the engine has it) at each chunk size.

Every configuration runs ``repeats`` times; the repeats loop is outermost so slow drift in the
machine hits every configuration alike. Per run the chat's gaps are taken from its token times;
gaps that overlap the long prompts' prefill window (first batch arrival to last batch first
token) are the *contended* gaps. Results are medians over repeats, with p50/p99 over the pooled
contended gaps of all repeats, and one verdict per claim (name, goal, measured, passed, evidence).

Prompt lengths follow ``platform_scale``: batch prompts are ``(16384, 32768) * platform_scale``
tokens (1.0 on an H200 with a 1.5B model; 1/16 on a CPU with ``small``: 1,024-2,048 tokens).
"""

from __future__ import annotations

import inspect
import math
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mlxlab.core.presets import model_limits
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload
from mlxlab.engine.baseline import MlxLmExecutor
from mlxlab.engine.fused import can_fuse
from mlxlab.engine.loop import Engine
from mlxlab.policies import POLICIES

SEED_LONG_PROMPT_TOKENS = (16_384, 32_768)  # the long-prompt range at platform_scale 1 (H200, 1.5B)
SEED_CHAT_PROMPT_TOKENS = 512  # a chat turn's prompt at platform_scale 1 (short: it is the output that is long)
ALL_POLICIES = ("interleave", "mlx_lm", "admission_gate", "stall_free", "slo", "overlap")
REFERENCE_CHUNK = 2048  # the long prompt's TTFT reference: prefilled alone at chunk 2048

# goals
STALL_MIN_RATIO = 10.0  # the stall must stretch the chat's worst gap >= 10x its solo ITL
GATE_MAX_RATIO = 1.25  # admission gate: worst gap <= 1.25x the longest one-chunk step, for every N
SLO_ITL_FACTOR = 2.0  # slo target and the ITL goal of stall_free / overlap: 2x solo ITL
SLO_ALONE_MAX = 1.05  # slo with nobody decoding: TTFT within 1.05x of alone at 2048
OVERLAP_TTFT_MAX = 1.2  # overlap: long-prompt TTFT within 1.2x of alone at 2048
MATCH_RANGE = (0.5, 2.0)  # engine interleave vs BatchGenerator worst gap


def default_scale(model=None) -> float:
    """1.0 on a GPU (16k-32k-token prompts), 1/16 on a CPU (1k-2k tokens)."""
    import mlx.core as mx

    return 1.0 if mx.default_device().type == mx.DeviceType.gpu else 1.0 / 16


def engine_has_overlap() -> bool:
    """Whether :class:`mlxlab.Engine` takes an ``overlap`` argument."""
    return "overlap" in inspect.signature(Engine.__init__).parameters


# ---------------------------------------------------------------------------------- metrics
def _q(v: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(v, dtype=float), p)) if len(v) else float("nan")


def _med(v: Sequence[float]) -> float:
    v = [x for x in v if x is not None and math.isfinite(x)]
    return float(np.median(v)) if v else float("nan")


def _nanmax(v) -> float:
    v = [x for x in v if x is not None and math.isfinite(x)]
    return max(v) if v else float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if (b and math.isfinite(a) and math.isfinite(b)) else float("nan")


def run_metrics(res, chunk_size: Optional[int] = None) -> dict:
    """One run's numbers from a :class:`mlxlab.core.runner.RunResult`: the chat's gaps (all and
    contended), the long prompts' TTFTs and the median full-chunk step time."""
    reqs = list(res.submitted)
    chat = [r for r in reqs if r.tenant == "chat"]
    batch = [r for r in reqs if r.tenant == "batch"]
    gaps = [g for r in chat for g in r.itl_s]
    window = None
    if batch and all(r.token_times_s for r in batch):
        window = (min(r.arrival_s for r in batch), max(r.token_times_s[0] for r in batch))
    contended = gaps
    covered = None
    if window is not None and chat:
        contended = [b - a for r in chat for a, b in zip(r.token_times_s, r.token_times_s[1:])
                     if b > window[0] and a < window[1]]
        covered = all(r.token_times_s and r.token_times_s[0] <= window[0] and r.token_times_s[-1] >= window[1]
                      for r in chat)
    tl = res.timeline
    chunk_time = chunk_max = float("nan")
    if len(tl) and "prefill_seqs" in tl and batch:
        ids = {r.id for r in batch}
        # chunk steps: steps that ran a chunk of exactly one long prompt (the chat's own short
        # prompt is no chunk); their median over (nearly) full chunks is "one chunk time"
        one = tl[[len(ids & set(s)) == 1 for s in tl.prefill_seqs]]
        full = one[one.prefill_tokens >= 0.9 * chunk_size] if chunk_size else one
        use = full if len(full) else one
        if len(use):
            chunk_time, chunk_max = float(use.duration_s.median()), float(one.duration_s.max())
    mixed_step = float("nan")
    if len(tl) and "phase" in tl:
        m = tl[tl.phase == "mixed"]
        if len(m):
            mixed_step = float(m.duration_s.median())
    ttfts = [r.ttft_s for r in batch if r.ttft_s is not None]
    pol = getattr(getattr(res, "executor", None), "policy", None)
    chosen = list(getattr(pol, "chosen", []) or [])
    return {
        "chat_gaps_s": gaps,
        "contended_gaps_s": contended,
        "chat_ttft_s": chat[0].ttft_s if chat else float("nan"),
        "chat_itl_p50_s": _q(contended, 50),
        "chat_itl_p99_s": _q(contended, 99),
        "chat_worst_gap_s": max(gaps) if gaps else float("nan"),
        "chat_tokens": sum(len(r.output_tokens) for r in chat),
        "chat_covered": covered,
        "long_ttft_s": max(ttfts) if ttfts else float("nan"),
        "long_ttfts_s": ttfts,
        "chunk_time_s": chunk_time,
        "chunk_time_max_s": chunk_max,
        "mixed_step_s": mixed_step,  # median step that ran a decode and a chunk together
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
        out[k] = _med([r.get(k, float("nan")) for r in runs])
    out["chat_worst_gap_runs_s"] = [r["chat_worst_gap_s"] for r in runs]
    out["long_ttft_runs_s"] = [r["long_ttft_s"] for r in runs]
    out["pooled_itl_p50_s"] = _q(pooled, 50)
    out["pooled_itl_p99_s"] = _q(pooled, 99)
    out["pooled_itl_max_s"] = max(pooled) if pooled else float("nan")
    out["pooled_gaps"] = len(pooled)
    cov = [r["chat_covered"] for r in runs if r["chat_covered"] is not None]
    out["chat_covered_fraction"] = (sum(cov) / len(cov)) if cov else None
    ch = [r["chosen_chunk_median"] for r in runs if r["chosen_chunk_median"] is not None]
    out["chosen_chunk_median"] = _med(ch) if ch else None
    inf = [r["infeasible_fraction"] for r in runs if r.get("infeasible_fraction") is not None]
    out["infeasible_fraction"] = _med(inf) if inf else None
    out["complete"] = all(r["complete"] for r in runs)
    return out


# ---------------------------------------------------------------------------------- workloads
def _chat(prompt_tokens: int, output_tokens: int) -> ChatTenant:
    return ChatTenant(sessions=1, turns=1, first_prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                      think_time_s=0.0, name="chat")


def _batch(workers: int, prompt_tokens, output_tokens: int, start_s: float) -> BatchTenant:
    return BatchTenant(workers=workers, requests=workers, prompt_tokens=prompt_tokens,
                       output_tokens=output_tokens, start_s=start_s, name="batch")


# ---------------------------------------------------------------------------------- the study
def scheduling_study(model, *, platform_scale: Optional[float] = None,
                     policies: Sequence[str] = ALL_POLICIES,
                     chunk_sizes: Sequence[int] = (256, 512, 1024, 2048),
                     workers: Sequence[int] = (1, 2, 4), repeats: int = 3,
                     stall_chunk: int = 2048, gate_chunk: int = 512,
                     stall_free_budget: Optional[int] = None,
                     slo_min_chunk: int = 32, slo_max_chunk: int = 2048, slo_chunk_multiple: int = 1,
                     overlap_policy: str = "interleave",
                     chat_prompt_tokens: Optional[int] = None, batch_output_tokens: int = 4,
                     max_chat_tokens: int = 4096, seed: int = 0, warmup: bool = True,
                     log: Optional[Callable[[str], None]] = None,
                     on_run: Optional[Callable[[dict], None]] = None) -> dict:
    """Measure the stall and its fixes on the real engine, beside mlx-lm, on the same workloads.

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel` (or an mlx-lm module).
        platform_scale: long prompts are ``(16384, 32768) * platform_scale`` tokens, the chat's
            prompt ``512 * platform_scale`` (at least 16); default :func:`default_scale`.
        policies: which of :data:`ALL_POLICIES` to measure (``interleave`` always runs: it gives
            the references); a policy the scheduler lacks is skipped with a note.
        chunk_sizes: chunk sizes of the alone / tradeoff / overlap sweeps (2048 is always
            added to the alone sweep: it is the TTFT reference).
        workers: batch worker counts of the stall and gate runs.
        repeats: runs per configuration.
        stall_chunk, gate_chunk: chunk sizes of the stall and gate runs.
        stall_free_budget: ``stall_free``'s token budget (default ``gate_chunk``).
        slo_min_chunk, slo_max_chunk: ``slo``'s chunk range; its ITL target is 2x solo ITL.
        slo_chunk_multiple: ``slo`` rounds its chunks down to multiples of this (1: any size).
        overlap_policy: the policy the ``overlap=True`` engine runs.
        batch_output_tokens: tokens each long prompt generates (few: nobody watches them).
        max_chat_tokens: cap on the chat's output (it is sized to outlast the contention).
        warmup: run every executor kind once, unrecorded, before measuring.
        log: called with one line per run (e.g. ``print``).
        on_run: called with each run's scalar metrics and configuration as it finishes (the
            CLI appends them to a JSONL file, so a run cut short by a time limit keeps them).

    Returns a JSON-ready dict (NaN where nothing could be measured): ``config``, ``references``,
    ``claims`` (list of dicts: name, goal, measured, passed, evidence, status), ``table`` (one row
    per configuration) and ``notes``.
    """
    t_start = time.perf_counter()
    say = log or (lambda s: None)
    scale = default_scale(model) if platform_scale is None else float(platform_scale)
    if not scale > 0:
        raise ValueError(f"platform_scale must be positive, got {platform_scale!r}")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    workers = sorted({int(w) for w in workers})
    if not workers or workers[0] < 1:
        raise ValueError("workers must be positive integers")
    chunk_sizes = sorted({int(c) for c in chunk_sizes})
    unknown = set(policies) - set(ALL_POLICIES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; choose from {list(ALL_POLICIES)}")
    vocab, max_ctx = model_limits(model)
    lo, hi = (max(2, round(n * scale)) for n in SEED_LONG_PROMPT_TOKENS)
    hi = min(hi, max_ctx - batch_output_tokens - 1)
    lo = min(lo, hi)
    chat_prompt = chat_prompt_tokens or max(16, round(SEED_CHAT_PROMPT_TOKENS * scale))
    sf_budget = stall_free_budget or gate_chunk
    notes: List[str] = []

    wanted = set(policies) | {"interleave"}
    missing = [p for p in ("admission_gate", "stall_free", "slo") if p in wanted and p not in POLICIES]
    for p in missing:
        notes.append(f"policy {p!r} is not in mlxlab.policies.POLICIES yet: its runs and claims are skipped")
        wanted.discard(p)
    if "overlap" in wanted and not engine_has_overlap():
        notes.append("Engine.__init__ has no 'overlap' argument yet: the overlap runs and claims are skipped")
        wanted.discard("overlap")

    def executor(kind: str, chunk: int, **opts):
        if kind == "mlx_lm":
            return MlxLmExecutor(model, prefill_step_size=chunk)
        if kind == "overlap":
            return Engine(model, policy=overlap_policy, chunk_size=chunk, overlap=True)
        return Engine(model, policy=kind, chunk_size=chunk, **opts)

    def workload(chat_out: Optional[int], n_workers: int, prompt_tokens, start_s: float) -> Workload:
        tenants = []
        if chat_out:
            tenants.append(_chat(chat_prompt, max(2, min(int(chat_out), max_chat_tokens,
                                                         max_ctx - chat_prompt - 1))))
        if n_workers:
            tenants.append(_batch(n_workers, prompt_tokens, batch_output_tokens, start_s))
        return Workload(tenants, vocab_size=vocab, seed=seed, max_context=max_ctx)

    runs: Dict[str, List[dict]] = {}
    meta: Dict[str, dict] = {}

    def run(ex, wl):
        try:
            return run_workload(ex, wl)
        finally:  # run_workload steps by hand: stop an overlap engine's prefill worker thread
            close = getattr(ex, "close", None)
            if close is not None:
                close()

    def measure(key: str, ex, wl, chunk: Optional[int], **info) -> dict:
        res = run(ex, wl)
        m = run_metrics(res, chunk)
        runs.setdefault(key, []).append(m)
        meta.setdefault(key, info)
        if on_run is not None:
            on_run({"config": key, **info, **{k: v for k, v in m.items() if not isinstance(v, list)}})
        say(f"[scheduling] {key:34s} worst gap {m['chat_worst_gap_s'] * 1e3:9.1f} ms  "
            f"itl p99 {m['chat_itl_p99_s'] * 1e3:8.1f} ms  long TTFT {m['long_ttft_s']:8.3f} s  "
            f"chunk {m['chunk_time_s'] * 1e3:8.1f} ms  ({res.wall_s:.1f} s)")
        return m

    # ---------------------------------------------------------------- warm-up (unrecorded)
    warmup_s: Dict[str, float] = {}  # how long each warm-up took: first-use costs of the backend
    if warmup:
        kinds = ["interleave", "mlx_lm"] + (["overlap"] if "overlap" in wanted else [])
        for kind in kinds:
            for c in sorted(set(chunk_sizes) | {REFERENCE_CHUNK, stall_chunk, gate_chunk}):
                n = min(hi, c + 16)  # one full chunk and a partial one
                run(executor(kind, c), workload(8, 1, n, 0.0))
        warmup_s["executors"] = time.perf_counter() - t_start
        say(f"[scheduling] warm-up done ({warmup_s['executors']:.1f} s)")

    # ---------------------------------------------------------------- references
    solo_out = max(32, min(256, max_chat_tokens))
    alone_chunks = sorted(set(chunk_sizes) | {REFERENCE_CHUNK})

    def references() -> None:
        measure("solo/engine", executor("interleave", REFERENCE_CHUNK), workload(solo_out, 0, 0, 0.0), None,
                scenario="solo", executor="engine", policy="interleave", chunk_size=REFERENCE_CHUNK, workers=0)
        if "mlx_lm" in wanted:
            measure("solo/mlx_lm", executor("mlx_lm", REFERENCE_CHUNK), workload(solo_out, 0, 0, 0.0), None,
                    scenario="solo", executor="mlx_lm", policy="BatchGenerator", chunk_size=REFERENCE_CHUNK, workers=0)
        for c in alone_chunks:
            measure(f"alone/interleave/c{c}", executor("interleave", c), workload(None, 1, hi, 0.0), c,
                    scenario="alone", executor="engine", policy="interleave", chunk_size=c, workers=1)

    # Repeat 0's references fix what the contention runs need (when the batch arrives, the slo
    # target, how long the chat streams); every repeat then measures its references next to its
    # contention runs, so drift in the machine moves both.
    references()
    calib = aggregate(runs["solo/engine"])
    calib_itl, calib_ttft = calib["pooled_itl_p50_s"], calib["chat_ttft_s"]
    calib_alone = {c: aggregate(runs[f"alone/interleave/c{c}"])["long_ttft_s"] for c in alone_chunks}
    delay = 2 * calib_ttft + 16 * calib_itl  # the batch arrives once the chat streams
    itl_target = SLO_ITL_FACTOR * calib_itl
    say(f"[scheduling] solo ITL {calib_itl * 1e3:.2f} ms, alone TTFT at {REFERENCE_CHUNK}: "
        f"{calib_alone[REFERENCE_CHUNK]:.3f} s; batch arrives at {delay:.3f} s; slo target {itl_target * 1e3:.2f} ms")

    # The chat must still stream when the batch arrives, even if this run decodes several times
    # faster than the calibration did: 4x the tokens the calibration needed to reach the arrival.
    lead_in = 32 + math.ceil(4 * delay / max(calib_itl, 1e-6))

    def steps_out(n_prompts: int, chunk: int) -> int:  # chat tokens to outlast n prompts chunked
        return lead_in + n_prompts * (math.ceil(hi / chunk) + batch_output_tokens)

    def time_out(seconds: float) -> int:  # chat tokens to outlast `seconds` at solo pace
        return lead_in + math.ceil(1.5 * seconds / max(calib_itl, 1e-6))

    # ---------------------------------------------------------------- contention runs
    jobs = []  # (key, kind, chunk, opts, chat_out, workers, prompt_tokens, info)
    for w in workers:
        jobs.append((f"stall/interleave/w{w}", "interleave", stall_chunk, {}, steps_out(1, stall_chunk), w, (lo, hi),
                     dict(scenario="stall", executor="engine", policy="interleave", chunk_size=stall_chunk, workers=w)))
        if "mlx_lm" in wanted:
            jobs.append((f"stall/mlx_lm/w{w}", "mlx_lm", stall_chunk, {}, steps_out(1, stall_chunk), w, (lo, hi),
                         dict(scenario="stall", executor="mlx_lm", policy="BatchGenerator", chunk_size=stall_chunk,
                              workers=w)))
        if "admission_gate" in wanted:
            opts = {"big_prompt_tokens": max(1, lo // 2)}
            jobs.append((f"gate/admission_gate/w{w}", "admission_gate", gate_chunk, opts, steps_out(w, gate_chunk), w,
                         (lo, hi), dict(scenario="gate", executor="engine", policy="admission_gate",
                                        chunk_size=gate_chunk, workers=w, options=opts)))
    for c in chunk_sizes:
        jobs.append((f"tradeoff/interleave/c{c}", "interleave", c, {}, steps_out(1, c), 1, hi,
                     dict(scenario="tradeoff", executor="engine", policy="interleave", chunk_size=c, workers=1)))
    if "stall_free" in wanted:
        opts = {"token_budget": sf_budget}
        jobs.append((f"contended/stall_free/b{sf_budget}", "stall_free", sf_budget, opts,
                     steps_out(1, max(1, sf_budget - 1)), 1, hi,
                     dict(scenario="contended", executor="engine", policy="stall_free",
                          chunk_size=sf_budget, workers=1, options=opts)))
        # the same policy with its decode and chunk run back to back: the cost of not fusing
        uopts = {"token_budget": sf_budget, "fuse": False}
        jobs.append((f"contended/stall_free_unfused/b{sf_budget}", "stall_free", sf_budget, uopts,
                     steps_out(1, max(1, sf_budget - 1)), 1, hi,
                     dict(scenario="contended", executor="engine", policy="stall_free (unfused)",
                          chunk_size=sf_budget, workers=1, options=uopts)))
    if "slo" in wanted:
        opts = {"itl_target_s": itl_target, "min_chunk": slo_min_chunk, "max_chunk": slo_max_chunk}
        if slo_chunk_multiple > 1:
            opts["chunk_multiple"] = int(slo_chunk_multiple)
        jobs.append(("contended/slo", "slo", slo_max_chunk, opts, steps_out(1, slo_min_chunk), 1, hi,
                     dict(scenario="contended", executor="engine", policy="slo", chunk_size=slo_max_chunk,
                          workers=1, options=opts)))
        if can_fuse(getattr(model, "module", model))[0]:
            # slo with its chunk packed into the decode's forward: the chunk rides on the
            # decode's weight read, so a small chunk adds less to the step than on its own
            popts = {**opts, "fuse": True}
            jobs.append(("contended/slo_packed", "slo", slo_max_chunk, popts, steps_out(1, slo_min_chunk), 1, hi,
                         dict(scenario="contended", executor="engine", policy="slo (packed)",
                              chunk_size=slo_max_chunk, workers=1, options=popts)))
        jobs.append(("alone/slo", "slo", slo_max_chunk, opts, None, 1, hi,
                     dict(scenario="alone", executor="engine", policy="slo", chunk_size=slo_max_chunk,
                          workers=1, options=opts)))
    if "overlap" in wanted:
        for c in chunk_sizes:
            jobs.append((f"overlap/{overlap_policy}/c{c}", "overlap", c, {},
                         time_out(1.2 * calib_alone.get(c, calib_alone[REFERENCE_CHUNK])), 1, hi,
                         dict(scenario="overlap", executor="engine(overlap)", policy=overlap_policy,
                              chunk_size=c, workers=1)))
    if warmup:
        # Every contention job's executor once, short and unrecorded. On the H200 the first slo
        # run (32-token chunks, which no earlier run had used) held one step for 40 s while mlx
        # compiled for the new shapes, in both cuDNN settings; the packed slo run after it had
        # no such step.
        t0, seen = time.perf_counter(), set()
        for key, kind, chunk, opts, chat_out, w, ptoks, info in jobs:
            sig = (kind, chunk, tuple(sorted(opts.items())))
            if sig in seen:
                continue
            seen.add(sig)
            n = min(hi, 2 * chunk + 16)
            run(executor(kind, chunk, **opts), workload(8 + math.ceil(n / opts.get("min_chunk", chunk)), 1, n, 0.0))
        warmup_s["contention"] = time.perf_counter() - t0
        say(f"[scheduling] warm-up of {len(seen)} contention executors done ({warmup_s['contention']:.1f} s)")

    for rep in range(repeats):
        if rep:
            references()
        for key, kind, chunk, opts, chat_out, w, ptoks, info in jobs:
            start = delay if chat_out else 0.0
            measure(key, executor(kind, chunk, **opts), workload(chat_out, w, ptoks, start), chunk,
                    chat_output_tokens=chat_out, **info)

    solo = aggregate(runs["solo/engine"])
    solo_itl, solo_ttft = solo["pooled_itl_p50_s"], solo["chat_ttft_s"]
    solo_mlx = aggregate(runs["solo/mlx_lm"])["pooled_itl_p50_s"] if "mlx_lm" in wanted else float("nan")
    alone = {c: aggregate(runs[f"alone/interleave/c{c}"])["long_ttft_s"] for c in alone_chunks}
    alone_ref = alone[REFERENCE_CHUNK]
    alone_best = min(alone.values())  # on a CPU a smaller chunk is often faster than 2048
    chunk_alone = {c: aggregate(runs[f"alone/interleave/c{c}"])["chunk_time_s"] for c in alone_chunks}

    # ---------------------------------------------------------------- table
    agg = {k: aggregate(v) for k, v in runs.items()}
    table = []
    for key, a in agg.items():
        info = meta[key]
        solo_ref = solo_mlx if info.get("executor") == "mlx_lm" else solo_itl
        row = {"config": key, **{k: v for k, v in info.items()}, **{k: v for k, v in a.items()}}
        row["worst_gap_over_solo_itl"] = _ratio(a["chat_worst_gap_s"], solo_ref)
        row["itl_p99_over_solo_itl"] = _ratio(a["pooled_itl_p99_s"], solo_ref)
        row["worst_gap_over_chunk_time"] = _ratio(a["chat_worst_gap_s"], a["chunk_time_s"])
        row["long_ttft_over_alone_2048"] = _ratio(a["long_ttft_s"], alone_ref)
        row["long_ttft_over_alone_best"] = _ratio(a["long_ttft_s"], alone_best)
        table.append(row)

    # ---------------------------------------------------------------- claims
    claims = []

    def claim(name, goal, measured, passed, evidence, status="measured"):
        claims.append({"name": name, "goal": goal, "measured": measured,
                       "passed": None if passed is None else bool(passed), "status": status, "evidence": evidence})

    def skipped(name, goal, why):
        claim(name, goal, None, None, {"note": why}, status="skipped")

    several = [w for w in workers if w >= 2] or workers
    w_top = max(several)
    per_w = {w: agg[f"stall/interleave/w{w}"] for w in workers}
    ratios = {w: _ratio(per_w[w]["chat_worst_gap_s"], solo_itl) for w in workers}
    claim("stall_interleave",
          f"chat worst gap >= {STALL_MIN_RATIO:g}x solo ITL under interleave with {w_top} workers "
          f"(chunk {stall_chunk}, prompts {lo}-{hi} tokens)",
          ratios[w_top], ratios[w_top] >= STALL_MIN_RATIO,
          {"solo_itl_s": solo_itl, "worst_gap_s": {w: per_w[w]["chat_worst_gap_s"] for w in workers},
           "worst_gap_over_solo_itl": ratios, "pooled_itl_p99_s": {w: per_w[w]["pooled_itl_p99_s"] for w in workers},
           "worst_gap_runs_s": {w: per_w[w]["chat_worst_gap_runs_s"] for w in workers},
           "chat_covered_fraction": {w: per_w[w]["chat_covered_fraction"] for w in workers}})
    if "mlx_lm" in wanted:
        per_m = {w: agg[f"stall/mlx_lm/w{w}"] for w in workers}
        mr = {w: _ratio(per_m[w]["chat_worst_gap_s"], solo_mlx) for w in workers}
        claim("stall_mlx_lm",
              f"mlx-lm BatchGenerator shows the stall too: chat worst gap >= {STALL_MIN_RATIO:g}x its solo ITL "
              f"with {w_top} workers (prefill_step_size {stall_chunk})",
              mr[w_top], mr[w_top] >= STALL_MIN_RATIO,
              {"solo_itl_s": solo_mlx, "worst_gap_s": {w: per_m[w]["chat_worst_gap_s"] for w in workers},
               "worst_gap_over_solo_itl": mr,
               "chat_covered_fraction": {w: per_m[w]["chat_covered_fraction"] for w in workers}})
        match = {w: _ratio(per_w[w]["chat_worst_gap_s"], per_m[w]["chat_worst_gap_s"]) for w in workers}
        claim("interleave_matches_mlx_lm",
              f"the engine's interleave reproduces BatchGenerator's stall: worst-gap ratio engine / mlx-lm within "
              f"{MATCH_RANGE[0]:g}-{MATCH_RANGE[1]:g} for every worker count",
              match, all(MATCH_RANGE[0] <= r <= MATCH_RANGE[1] for r in match.values()),
              {"engine_worst_gap_s": {w: per_w[w]["chat_worst_gap_s"] for w in workers},
               "mlx_lm_worst_gap_s": {w: per_m[w]["chat_worst_gap_s"] for w in workers},
               "engine_long_ttft_s": {w: per_w[w]["long_ttft_s"] for w in workers},
               "mlx_lm_long_ttft_s": {w: per_m[w]["long_ttft_s"] for w in workers},
               "solo_itl_engine_s": solo_itl, "solo_itl_mlx_lm_s": solo_mlx})
    elif "mlx_lm" in policies:
        skipped("stall_mlx_lm", "mlx-lm shows the stall", "mlx_lm not run")

    gate_goal = (f"admission_gate at chunk {gate_chunk}: for every worker count {workers} the chat's worst gap "
                 f"is one chunk step: <= {GATE_MAX_RATIO:g}x the longest step that ran one long-prompt chunk "
                 f"(measured also: worst gap / median full-chunk step)")
    if "admission_gate" in wanted:
        g = {w: agg[f"gate/admission_gate/w{w}"] for w in workers}
        gr = {w: _ratio(g[w]["chat_worst_gap_s"], g[w]["chunk_time_s"]) for w in workers}
        gm = {w: _ratio(g[w]["chat_worst_gap_s"], g[w]["chunk_time_max_s"]) for w in workers}
        worst = [g[w]["chat_worst_gap_s"] for w in workers]
        claim("admission_gate_bounded", gate_goal,
              {"worst_gap_over_longest_chunk_step": _nanmax(gm.values()),
               "worst_gap_over_median_chunk": _nanmax(gr.values())},
              all(r <= GATE_MAX_RATIO for r in gm.values()),
              {"worst_gap_s": {w: g[w]["chat_worst_gap_s"] for w in workers},
               "chunk_time_s": {w: g[w]["chunk_time_s"] for w in workers},
               "chunk_time_max_s": {w: g[w]["chunk_time_max_s"] for w in workers},
               "worst_gap_over_chunk_time": gr, "worst_gap_over_longest_chunk_step": gm,
               "worst_gap_spread_across_workers": _ratio(max(worst), min(worst)),
               "pooled_itl_p99_s": {w: g[w]["pooled_itl_p99_s"] for w in workers},
               "interleave_worst_gap_s": {w: per_w[w]["chat_worst_gap_s"] for w in workers},
               "chat_covered_fraction": {w: g[w]["chat_covered_fraction"] for w in workers},
               "long_ttft_max_s": {w: g[w]["long_ttft_s"] for w in workers}})
    elif "admission_gate" in policies:
        skipped("admission_gate_bounded", gate_goal, "policy admission_gate missing")

    def contended_evidence(a: dict) -> dict:
        return {"chat_itl_p50_s": a["pooled_itl_p50_s"], "chat_itl_p99_s": a["pooled_itl_p99_s"],
                "chat_itl_max_s": a["pooled_itl_max_s"], "solo_itl_s": solo_itl,
                "itl_p99_over_solo": _ratio(a["pooled_itl_p99_s"], solo_itl),
                "long_ttft_s": a["long_ttft_s"], "alone_ttft_2048_s": alone_ref,
                "long_ttft_over_alone_2048": _ratio(a["long_ttft_s"], alone_ref),
                "alone_ttft_best_s": alone_best,
                "long_ttft_over_alone_best": _ratio(a["long_ttft_s"], alone_best),
                "chat_covered_fraction": a["chat_covered_fraction"], "chosen_chunk_median": a["chosen_chunk_median"],
                "infeasible_fraction": a["infeasible_fraction"], "mixed_step_s": a["mixed_step_s"]}

    tradeoff = {c: agg[f"tradeoff/interleave/c{c}"] for c in chunk_sizes}
    if "slo" in wanted:
        a = agg["contended/slo"]
        ev = contended_evidence(a)
        ev["itl_target_s"] = itl_target
        claim("slo_chat_itl", f"slo (itl_target_s = {SLO_ITL_FACTOR:g}x solo ITL = {itl_target * 1e3:.2f} ms): chat "
              f"ITL p99 <= target while one {hi}-token prompt prefills", ev["itl_p99_over_solo"],
              a["pooled_itl_p99_s"] <= itl_target, ev)
        if "contended/slo_packed" in agg:
            pk = agg["contended/slo_packed"]
            pev = contended_evidence(pk)
            pev.update(itl_target_s=itl_target, unpacked_itl_p99_s=a["pooled_itl_p99_s"],
                       unpacked_long_ttft_s=a["long_ttft_s"])
            claim("slo_packed_chat_itl", f"slo with packed steps: chat ITL p99 <= {itl_target * 1e3:.2f} ms "
                  f"while one {hi}-token prompt prefills", pev["itl_p99_over_solo"],
                  pk["pooled_itl_p99_s"] <= itl_target, pev)
        b = agg["alone/slo"]
        r = _ratio(b["long_ttft_s"], alone_ref)
        claim("slo_alone_ttft", f"slo with nobody decoding: long-prompt TTFT <= {SLO_ALONE_MAX:g}x alone at chunk "
              f"{REFERENCE_CHUNK}", r, r <= SLO_ALONE_MAX,
              {"slo_alone_ttft_s": b["long_ttft_s"], "alone_ttft_2048_s": alone_ref, "prompt_tokens": hi})
        dominated_by = [c for c, t in tradeoff.items()
                        if t["pooled_itl_p99_s"] <= a["pooled_itl_p99_s"] and t["long_ttft_s"] <= a["long_ttft_s"]]
        claim("slo_not_dominated", "no fixed chunk size (interleave) gives both a lower chat ITL p99 and a lower "
              "long-prompt TTFT than slo", dominated_by, not dominated_by,
              {"slo": {"itl_p99_s": a["pooled_itl_p99_s"], "long_ttft_s": a["long_ttft_s"]},
               "fixed": {c: {"itl_p99_s": t["pooled_itl_p99_s"], "long_ttft_s": t["long_ttft_s"]}
                         for c, t in tradeoff.items()}})
    elif "slo" in policies:
        for n in ("slo_chat_itl", "slo_alone_ttft", "slo_not_dominated"):
            skipped(n, "see the slo policy", "policy slo missing")
    if "stall_free" in wanted:
        a = agg[f"contended/stall_free/b{sf_budget}"]
        ev = contended_evidence(a)
        ev["token_budget"] = sf_budget
        claim("stall_free_chat_itl", f"stall_free (token_budget {sf_budget}): chat ITL p99 <= {SLO_ITL_FACTOR:g}x "
              f"solo ITL while one {hi}-token prompt prefills", ev["itl_p99_over_solo"],
              ev["itl_p99_over_solo"] <= SLO_ITL_FACTOR, ev)
        u = agg[f"contended/stall_free_unfused/b{sf_budget}"]
        fused_ok = can_fuse(getattr(model, "module", model))[0]
        fev = {"fusable_model": fused_ok,
               "mixed_step_s": {"fused": a["mixed_step_s"], "unfused": u["mixed_step_s"]},
               "chat_itl_p99_s": {"fused": a["pooled_itl_p99_s"], "unfused": u["pooled_itl_p99_s"]},
               "long_ttft_s": {"fused": a["long_ttft_s"], "unfused": u["long_ttft_s"]}}
        saving = _ratio(u["mixed_step_s"], a["mixed_step_s"])
        claim("stall_free_fusion", "the cost of not fusing: median mixed (decode + chunk) step, back to back over "
              "packed in one forward (> 1: fusing saves time)", saving,
              None if not fused_ok else saving > 1.0, fev,
              status="measured" if fused_ok else "not fusable: both runs back to back")
    elif "stall_free" in policies:
        skipped("stall_free_chat_itl", "chat ITL under stall_free", "policy stall_free missing")

    ov_goal = (f"overlap=True at its best chunk size: long-prompt TTFT <= {OVERLAP_TTFT_MAX:g}x alone at "
               f"{REFERENCE_CHUNK}, chat ITL p99 <= {SLO_ITL_FACTOR:g}x solo")
    if "overlap" in wanted:
        ov = {c: agg[f"overlap/{overlap_policy}/c{c}"] for c in chunk_sizes}
        # best: the lowest TTFT among sizes whose chat p99 meets 2x solo; else the lowest chat p99
        ok = [c for c in chunk_sizes if ov[c]["pooled_itl_p99_s"] <= SLO_ITL_FACTOR * solo_itl]
        best = (min(ok, key=lambda c: ov[c]["long_ttft_s"]) if ok
                else min(chunk_sizes, key=lambda c: ov[c]["pooled_itl_p99_s"]))
        ev = contended_evidence(ov[best])
        ev["best_chunk"] = best
        ev["per_chunk"] = {c: {"itl_p99_over_solo": _ratio(ov[c]["pooled_itl_p99_s"], solo_itl),
                               "long_ttft_over_alone_2048": _ratio(ov[c]["long_ttft_s"], alone_ref)}
                           for c in chunk_sizes}
        claim("overlap_ttft", ov_goal, ev["long_ttft_over_alone_2048"],
              ev["long_ttft_over_alone_2048"] <= OVERLAP_TTFT_MAX, ev)
        claim("overlap_chat_itl", ov_goal, ev["itl_p99_over_solo"], ev["itl_p99_over_solo"] <= SLO_ITL_FACTOR,
              {"best_chunk": best, "chat_itl_p99_s": ov[best]["pooled_itl_p99_s"], "solo_itl_s": solo_itl})
    elif "overlap" in policies:
        skipped("overlap_ttft", ov_goal, "Engine has no overlap argument")

    return {
        "config": {"platform_scale": scale, "long_prompt_tokens": [lo, hi], "chat_prompt_tokens": chat_prompt,
                   "policies": list(policies), "policies_run": sorted(wanted), "chunk_sizes": chunk_sizes,
                   "workers": workers, "repeats": repeats, "stall_chunk": stall_chunk, "gate_chunk": gate_chunk,
                   "stall_free_budget": sf_budget, "slo_min_chunk": slo_min_chunk, "slo_max_chunk": slo_max_chunk,
                   "slo_chunk_multiple": slo_chunk_multiple,
                   "overlap_policy": overlap_policy, "batch_output_tokens": batch_output_tokens,
                   "batch_arrival_s": delay, "seed": seed, "warmup": warmup,
                   "model": getattr(model, "name", type(model).__name__)},
        "references": {"solo_itl_s": solo_itl, "solo_itl_mlx_lm_s": solo_mlx, "solo_chat_ttft_s": solo_ttft,
                       "alone_ttft_s": alone, "alone_chunk_time_s": chunk_alone,
                       "alone_ttft_2048_s": alone_ref, "alone_ttft_best_s": alone_best,
                       "alone_best_chunk": min(alone, key=alone.get), "slo_itl_target_s": itl_target,
                       "calibration": {"note": "repeat 0's references; they set the batch arrival time, the slo "
                                               "target and the chat's output length",
                                       "solo_itl_s": calib_itl, "solo_chat_ttft_s": calib_ttft,
                                       "alone_ttft_s": calib_alone}},
        "claims": claims,
        "table": table,
        "notes": notes,
        "warmup_s": warmup_s,
        "wall_s": time.perf_counter() - t_start,
    }


def format_table(study: dict) -> str:
    """The per-configuration table and the claims as readable text."""
    rows = [("config", "worst gap ms", "gap/solo", "p50 ms", "p99 ms", "chunk ms", "gap/chunk", "TTFT s",
             "TTFT/2048")]
    for r in study["table"]:
        def f(x, k=1, scale=1.0):
            return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x * scale:.{k}f}"
        rows.append((r["config"], f(r["chat_worst_gap_s"], 1, 1e3), f(r["worst_gap_over_solo_itl"], 1),
                     f(r["pooled_itl_p50_s"], 2, 1e3), f(r["pooled_itl_p99_s"], 1, 1e3),
                     f(r["chunk_time_s"], 1, 1e3), f(r["worst_gap_over_chunk_time"], 2),
                     f(r["long_ttft_s"], 3), f(r["long_ttft_over_alone_2048"], 2)))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.append("")
    for c in study["claims"]:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[c["passed"]]
        m = c["measured"]
        if isinstance(m, float):
            m = f"{m:.3g}"
        elif isinstance(m, dict):
            m = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items())
        lines.append(f"[{verdict}] {c['name']}: measured {m}  (goal: {c['goal']})")
    for n in study.get("notes", []):
        lines.append(f"note: {n}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- chunk trade-off
def chunk_tradeoff(model, chunk_sizes: Sequence[int], *, policies: Sequence[str] = ("interleave", "admission_gate"),
                   long_tokens: int = 1024, chat_prompt_tokens: int = 32, chat_output_tokens: int = 64,
                   batch_start_s: Optional[float] = None, repeats: int = 1, executor: str = "engine",
                   cost_model=None, seed: int = 0, progress: bool = True):
    """The chunk-size trade-off: one chat stream decoding while one long prompt arrives, for each
    policy and chunk size. Returns ``(table, timelines)``: per (policy, chunk) medians over repeats
    of the chat's contended ITL p50/p99 and worst gap and the long prompt's TTFT; and per
    (policy, chunk) the chat's token times of the first repeat (for timeline plots).
    ``executor="sim"`` runs the same workload on the simulator with ``cost_model``."""
    import pandas as pd

    from mlxlab.core.runner import run_workload
    from mlxlab.core.workload import Workload
    from mlxlab.engine.loop import Engine

    if executor not in ("engine", "sim"):
        raise ValueError(f"executor must be 'engine' or 'sim', got {executor!r}")
    vocab = getattr(model, "vocab_size", None) or model.module.args.vocab_size
    if batch_start_s is None:
        # let the chat get going first: its prompt plus a few tokens at the model's solo pace
        probe = Engine(model)
        r = probe.submit(list(range(1, chat_prompt_tokens + 1)), 6)
        probe.run()
        batch_start_s = r.token_times_s[-1] - r.arrival_s
    rows, timelines = [], {}
    combos = [(p, c, k) for k in range(repeats) for p in policies for c in chunk_sizes]
    if progress:
        from tqdm.auto import tqdm
        combos = tqdm(combos, desc="chunk trade-off", leave=False)
    for policy, chunk, k in combos:
        wl = Workload([_chat(chat_prompt_tokens, chat_output_tokens),
                       _batch(1, long_tokens, 4, batch_start_s)], vocab_size=vocab, seed=seed + k)
        opts = {"big_prompt_tokens": max(1, long_tokens // 2)} if policy == "admission_gate" else {}
        if executor == "sim":
            from mlxlab.sim.simulator import Simulator
            ex = Simulator.for_model(model, cost_model, policy=policy, chunk_size=chunk, **opts)
        else:
            ex = Engine(model, policy=policy, chunk_size=chunk, **opts)
        res = run_workload(ex, wl)
        m = run_metrics(res, chunk)
        rows.append({"policy": policy, "chunk_size": chunk, "repeat": k, "chat_itl_p50_s": m["chat_itl_p50_s"],
                     "chat_itl_p99_s": m["chat_itl_p99_s"], "chat_worst_gap_s": m["chat_worst_gap_s"],
                     "long_ttft_s": m["long_ttft_s"], "chunk_time_s": m["chunk_time_s"]})
        if k == 0:
            chat = [r for r in res.submitted if r.tenant == "chat"]
            batch = [r for r in res.submitted if r.tenant == "batch"]
            t0 = min(r.arrival_s for r in res.submitted)
            tt = [{"stream": "chat", "t_s": t - t0} for r in chat for t in r.token_times_s]
            tt += [{"stream": "long prompt (first token)", "t_s": r.token_times_s[0] - t0} for r in batch if r.token_times_s]
            tt += [{"stream": "long prompt (arrival)", "t_s": r.arrival_s - t0} for r in batch]
            timelines[(policy, chunk)] = pd.DataFrame(tt)
    table = pd.DataFrame(rows).groupby(["policy", "chunk_size"], as_index=False).median(numeric_only=True).drop(columns="repeat")
    return table, timelines
