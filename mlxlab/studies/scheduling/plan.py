"""What the scheduling study runs: its sizes (from the model, the device and the options) and its
list of configurations, the references first, then the contention runs they calibrate."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

import mlx.core as mx

from mlxlab.core.presets import model_limits, module_of
from mlxlab.core.workload import BatchTenant, ChatTenant
from mlxlab.engine.fused import can_fuse
from mlxlab.studies.scheduling.metrics import aggregate

SEED_LONG_PROMPT_TOKENS = (16_384, 32_768)  # the long-prompt range at platform_scale 1 (H200, 1.5B)
SEED_CHAT_PROMPT_TOKENS = 512  # a chat turn's prompt at platform_scale 1 (short: it is the output that is long)
ALL_POLICIES = ("interleave", "mlx_lm", "admission_gate", "stall_free", "slo", "overlap")
REFERENCE_CHUNK = 2048  # the long prompt's TTFT reference: prefilled alone at chunk 2048
SLO_ITL_FACTOR = 2.0  # slo target and the ITL goal of stall_free / overlap: 2x solo ITL


def default_scale(model) -> float:
    """The prompt scale for ``model`` on this device: 1.0 on a GPU (16k-32k-token prompts), 1/16
    on a CPU (1k-2k tokens), lowered where the model's context is shorter than the longest
    long prompt."""
    device = 1.0 if mx.default_device().type == mx.DeviceType.gpu else 1.0 / 16
    return min(device, model_limits(model)[1] / SEED_LONG_PROMPT_TOKENS[1])


def chat_tenant(prompt_tokens: int, output_tokens: int) -> ChatTenant:
    """One chat session of one turn, from time 0 (tenant ``chat``)."""
    return ChatTenant(sessions=1, turns=1, first_prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                      think_time_s=0.0, name="chat")


def batch_tenant(workers: int, prompt_tokens, output_tokens: int, start_s: float) -> BatchTenant:
    """``workers`` long prompts, one per worker, arriving at ``start_s`` (tenant ``batch``)."""
    return BatchTenant(workers=workers, requests=workers, prompt_tokens=prompt_tokens,
                       output_tokens=output_tokens, start_s=start_s, name="batch")


@dataclass(frozen=True)
class StudyPlan:
    """The study's checked options and the sizes they give (see :func:`plan_study`)."""
    scale: float
    lo: int  # long prompts are lo..hi tokens
    hi: int
    chat_prompt: int
    policies: Tuple[str, ...]  # as asked
    run: FrozenSet[str]  # what runs: the asked policies and interleave (it gives the references)
    chunk_sizes: Tuple[int, ...]
    workers: Tuple[int, ...]
    repeats: int
    stall_chunk: int
    gate_chunk: int
    stall_free_budget: int
    slo_min_chunk: int
    slo_max_chunk: int
    slo_chunk_multiple: int
    overlap_policy: str
    batch_output_tokens: int
    max_chat_tokens: int
    seed: int
    warmup: bool
    vocab: int
    max_context: int
    fusable: bool  # the model runs decode and chunks in one packed forward
    model_name: str

    @property
    def alone_chunks(self) -> Tuple[int, ...]:
        """Chunk sizes of the long prompt alone (the TTFT references)."""
        return tuple(sorted(set(self.chunk_sizes) | {REFERENCE_CHUNK}))

    @property
    def solo_chat_tokens(self) -> int:
        """Output tokens of the chat streaming alone (the ITL reference)."""
        return max(32, min(256, self.max_chat_tokens))


def plan_study(model, *, platform_scale: Optional[float] = None,
               policies: Sequence[str] = ALL_POLICIES,
               chunk_sizes: Sequence[int] = (256, 512, 1024, 2048),
               workers: Sequence[int] = (1, 2, 4), repeats: int = 3,
               stall_chunk: int = 2048, gate_chunk: int = 512,
               stall_free_budget: Optional[int] = None,
               slo_min_chunk: int = 32, slo_max_chunk: int = 2048, slo_chunk_multiple: int = 1,
               overlap_policy: str = "interleave",
               chat_prompt_tokens: Optional[int] = None, batch_output_tokens: int = 4,
               max_chat_tokens: int = 4096, seed: int = 0, warmup: bool = True) -> StudyPlan:
    """Check the options of :func:`mlxlab.studies.scheduling.run.scheduling_study` and size the study.

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel` (or an mlx-lm module).
        platform_scale: long prompts are ``(16384, 32768) * platform_scale`` tokens (the longest
            capped by the model's context), the chat's prompt ``512 * platform_scale`` (at least
            16); default :func:`default_scale`.
        policies: which of :data:`ALL_POLICIES` to measure (``interleave`` always runs: it gives
            the references).
        chunk_sizes: chunk sizes of the alone / tradeoff / overlap sweeps (2048 is always
            added to the alone sweep: it is the TTFT reference).
        workers: batch worker counts of the stall and gate runs.
        repeats: runs per configuration.
        stall_chunk, gate_chunk: chunk sizes of the stall and gate runs.
        stall_free_budget: ``stall_free``'s token budget (default ``gate_chunk``).
        slo_min_chunk, slo_max_chunk: ``slo``'s chunk range; its ITL target is 2x solo ITL.
        slo_chunk_multiple: ``slo`` rounds its chunks down to multiples of this (1: any size).
        overlap_policy: the policy the ``overlap=True`` engine runs.
        chat_prompt_tokens: the chat's prompt (default: scaled, see ``platform_scale``).
        batch_output_tokens: tokens each long prompt generates (few: nobody watches them).
        max_chat_tokens: cap on the chat's output (it is sized to outlast the contention).
        seed: the workloads' seed.
        warmup: run every executor kind once, unrecorded, before measuring.
    """
    scale = default_scale(model) if platform_scale is None else float(platform_scale)
    if not scale > 0:
        raise ValueError(f"platform_scale must be positive, got {platform_scale!r}")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    workers = sorted({int(w) for w in workers})
    if not workers or workers[0] < 1:
        raise ValueError("workers must be positive integers")
    unknown = set(policies) - set(ALL_POLICIES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; choose from {list(ALL_POLICIES)}")
    vocab, max_ctx = model_limits(model)
    lo, hi = (max(2, round(n * scale)) for n in SEED_LONG_PROMPT_TOKENS)
    hi = min(hi, max_ctx - batch_output_tokens - 1)
    return StudyPlan(
        scale=scale, lo=min(lo, hi), hi=hi,
        chat_prompt=chat_prompt_tokens or max(16, round(SEED_CHAT_PROMPT_TOKENS * scale)),
        policies=tuple(policies), run=frozenset(policies) | {"interleave"},
        chunk_sizes=tuple(sorted({int(c) for c in chunk_sizes})), workers=tuple(workers), repeats=repeats,
        stall_chunk=stall_chunk, gate_chunk=gate_chunk, stall_free_budget=stall_free_budget or gate_chunk,
        slo_min_chunk=slo_min_chunk, slo_max_chunk=slo_max_chunk, slo_chunk_multiple=slo_chunk_multiple,
        overlap_policy=overlap_policy, batch_output_tokens=batch_output_tokens, max_chat_tokens=max_chat_tokens,
        seed=seed, warmup=warmup, vocab=vocab, max_context=max_ctx, fusable=can_fuse(module_of(model))[0],
        model_name=getattr(model, "name", type(model).__name__))


@dataclass(frozen=True)
class Job:
    """One configuration of the study: ``kind`` names the executor (a policy, ``mlx_lm`` for
    mlx-lm's BatchGenerator, ``overlap`` for the engine's overlap mode)."""
    key: str
    kind: str
    chunk: int
    chat_tokens: Optional[int]  # the chat's output tokens; None: no chat
    workers: int  # long prompts, one per batch worker
    prompt_tokens: Union[int, Tuple[int, int]]  # each long prompt's length (a range: drawn from it)
    info: dict  # recorded with every run of it
    opts: dict = field(default_factory=dict)  # executor options
    start_s: float = 0.0  # when the long prompts arrive


def reference_jobs(plan: StudyPlan) -> List[Job]:
    """The chat streaming alone (engine, and mlx-lm if it runs) and the long prompt alone at
    each of :attr:`StudyPlan.alone_chunks`."""
    def info(scenario, executor, policy, chunk, workers):
        return dict(scenario=scenario, executor=executor, policy=policy, chunk_size=chunk, workers=workers)

    jobs = [Job("solo/engine", "interleave", REFERENCE_CHUNK, plan.solo_chat_tokens, 0, 0,
                info("solo", "engine", "interleave", REFERENCE_CHUNK, 0))]
    if "mlx_lm" in plan.run:
        jobs.append(Job("solo/mlx_lm", "mlx_lm", REFERENCE_CHUNK, plan.solo_chat_tokens, 0, 0,
                        info("solo", "mlx_lm", "BatchGenerator", REFERENCE_CHUNK, 0)))
    jobs += [Job(f"alone/interleave/c{c}", "interleave", c, None, 1, plan.hi, info("alone", "engine", "interleave", c, 1))
             for c in plan.alone_chunks]
    return jobs


@dataclass(frozen=True)
class Calibration:
    """Repeat 0's references. They fix what the contention runs need: when the long prompts
    arrive, the slo target and how long the chat streams; every repeat then measures its own
    references next to its contention runs, so drift in the machine moves both."""
    solo_itl_s: float
    solo_chat_ttft_s: float
    alone_ttft_s: Dict[int, float]

    @classmethod
    def from_runs(cls, runs: Dict[str, List[dict]], plan: StudyPlan) -> "Calibration":
        solo = aggregate(runs["solo/engine"])
        return cls(solo["pooled_itl_p50_s"], solo["chat_ttft_s"],
                   {c: aggregate(runs[f"alone/interleave/c{c}"])["long_ttft_s"] for c in plan.alone_chunks})

    @property
    def batch_arrival_s(self) -> float:
        """The long prompts arrive once the chat streams."""
        return 2 * self.solo_chat_ttft_s + 16 * self.solo_itl_s

    @property
    def itl_target_s(self) -> float:
        return SLO_ITL_FACTOR * self.solo_itl_s

    @property
    def lead_in(self) -> int:
        """Chat tokens before the long prompts arrive, with room to spare: 4x the tokens the
        calibration needed to reach the arrival, so the chat still streams then even if this run
        decodes several times faster."""
        return 32 + math.ceil(4 * self.batch_arrival_s / max(self.solo_itl_s, 1e-6))


def contention_jobs(plan: StudyPlan, calib: Calibration) -> List[Job]:
    """The stall (interleave, mlx-lm) and gate runs per worker count, the chunk trade-off, and
    stall_free (with the gate on its terms where both run), slo and overlap against one long
    prompt; the chat sized to outlast them."""
    hi, jobs = plan.hi, []

    def add(key, kind, chunk, chat_tokens, workers, prompts, scenario, *, executor="engine", policy=None, opts=None):
        info = dict(chat_output_tokens=chat_tokens, scenario=scenario, executor=executor, policy=policy or kind,
                    chunk_size=chunk, workers=workers, **({"options": opts} if opts else {}))
        jobs.append(Job(key, kind, chunk, chat_tokens, workers, prompts, info, opts or {},
                        calib.batch_arrival_s if chat_tokens else 0.0))

    def outlast(n_prompts: int, chunk: int) -> int:  # chat tokens to outlast n prompts chunked
        return calib.lead_in + n_prompts * (math.ceil(hi / chunk) + plan.batch_output_tokens)

    def outlast_s(seconds: float) -> int:  # chat tokens to outlast `seconds` at solo pace
        return calib.lead_in + math.ceil(1.5 * seconds / max(calib.solo_itl_s, 1e-6))

    for w in plan.workers:
        add(f"stall/interleave/w{w}", "interleave", plan.stall_chunk, outlast(1, plan.stall_chunk), w,
            (plan.lo, hi), "stall")
        if "mlx_lm" in plan.run:
            add(f"stall/mlx_lm/w{w}", "mlx_lm", plan.stall_chunk, outlast(1, plan.stall_chunk), w, (plan.lo, hi),
                "stall", executor="mlx_lm", policy="BatchGenerator")
        if "admission_gate" in plan.run:
            add(f"gate/admission_gate/w{w}", "admission_gate", plan.gate_chunk, outlast(w, plan.gate_chunk), w,
                (plan.lo, hi), "gate", opts={"big_prompt_tokens": max(1, plan.lo // 2)})
    for c in plan.chunk_sizes:
        add(f"tradeoff/interleave/c{c}", "interleave", c, outlast(1, c), 1, hi, "tradeoff")
    if "stall_free" in plan.run:
        b = plan.stall_free_budget
        add(f"contended/stall_free/b{b}", "stall_free", b, outlast(1, max(1, b - 1)), 1, hi, "contended",
            opts={"token_budget": b})
        # the same policy with its decode and chunk run back to back: the cost of not fusing
        add(f"contended/stall_free_unfused/b{b}", "stall_free", b, outlast(1, max(1, b - 1)), 1, hi, "contended",
            policy="stall_free (unfused)", opts={"token_budget": b, "fuse": False})
        if "admission_gate" in plan.run:
            # the gate on stall_free's terms (one hi-token prompt, chunk = the token budget, the same
            # chat): the two decide s001-gate-vs-stall-free side by side
            add(f"contended/admission_gate/c{b}", "admission_gate", b, outlast(1, max(1, b - 1)), 1, hi, "contended",
                opts={"big_prompt_tokens": max(1, plan.lo // 2)})
    if "slo" in plan.run:
        _add_slo_jobs(add, plan, calib, outlast(1, plan.slo_min_chunk))
    if "overlap" in plan.run:
        for c in plan.chunk_sizes:
            alone = calib.alone_ttft_s.get(c, calib.alone_ttft_s[REFERENCE_CHUNK])
            add(f"overlap/{plan.overlap_policy}/c{c}", "overlap", c, outlast_s(1.2 * alone), 1, hi, "overlap",
                executor="engine(overlap)", policy=plan.overlap_policy)
    return jobs


def _add_slo_jobs(add, plan: StudyPlan, calib: Calibration, chat_tokens: int) -> None:
    """slo beside the chat, packed too where the model fuses, and with nobody decoding."""
    opts = {"itl_target_s": calib.itl_target_s, "min_chunk": plan.slo_min_chunk, "max_chunk": plan.slo_max_chunk}
    if plan.slo_chunk_multiple > 1:
        opts["chunk_multiple"] = int(plan.slo_chunk_multiple)
    add("contended/slo", "slo", plan.slo_max_chunk, chat_tokens, 1, plan.hi, "contended", opts=opts)
    if plan.fusable:
        # slo with its chunk packed into the decode's forward: the chunk rides on the decode's
        # weight read, so a small chunk adds less to the step than on its own
        add("contended/slo_packed", "slo", plan.slo_max_chunk, chat_tokens, 1, plan.hi, "contended",
            policy="slo (packed)", opts={**opts, "fuse": True})
    add("alone/slo", "slo", plan.slo_max_chunk, None, 1, plan.hi, "alone", opts=opts)
