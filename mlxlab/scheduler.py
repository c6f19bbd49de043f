"""Scheduling policies: what runs in the next step.

Pure Python with no MLX import, so the same policy objects drive the real engine and the
simulator, and tests exercise them on synthetic state without a model.

A policy sees a :class:`SchedulerState` (who is waiting, who is part-way through prefill, who is
decoding) and returns a :class:`StepPlan`: whether every decoding sequence advances by one token in
this step, and which prompts get a prefill chunk of how many tokens. The engine checks the plan
and executes it; each chunk is a scheduling point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple


@dataclass
class SeqView:
    """What a policy may know about one sequence (all counts in tokens)."""

    seq_id: int
    tenant: str
    arrival_s: float
    prefill_tokens: int  # tokens that go through prefill (the prompt less its last token)
    prefilled_tokens: int  # of those, already in the KV cache
    generated: int = 0
    max_tokens: int = 1

    @property
    def remaining_prefill(self) -> int:
        return self.prefill_tokens - self.prefilled_tokens

    @property
    def context_tokens(self) -> int:
        return self.prefilled_tokens + self.generated


@dataclass
class SchedulerState:
    """A snapshot of the engine's queues at a decision point."""

    now_s: float
    chunk_size: int
    prefill_queue: List[SeqView]  # arrival order; started prefills keep their place
    decoding: List[SeqView]

    @property
    def in_flight_prefills(self) -> List[SeqView]:
        return [s for s in self.prefill_queue if s.prefilled_tokens > 0]


@dataclass
class StepPlan:
    """One step: ``decode`` advances every decoding sequence by one token in one batched
    forward pass; ``prefill`` lists ``(seq_id, num_tokens)`` chunks run after it."""

    decode: bool = False
    prefill: List[Tuple[int, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill

    def num_prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)


KEY_ALIGN = 8  # the engine's default key_align (mlxlab.engine.DEFAULT_KEY_ALIGN); no MLX import here


def align_chunk(n: int, s: SeqView, key_align: int, up: bool = False) -> int:
    """``n`` tokens of ``s``'s prompt, cut so the chunk ends at a key length that is a multiple
    of ``key_align`` (at most ``key_align - 1`` tokens fewer; 0 when the cut takes them all). A
    chunk that finishes the prompt is left alone (the engine pads it instead:
    ``Engine(key_align=...)``). On mlx's CUDA backend a chunk ending off a multiple of 8 ran up to 1.65x the
    time of one ending on it (``scripts/chunk_probe.py``), so a token budget less one decode
    (511) would pay that at every step of a long prompt. ``up``: grow the chunk to the next
    aligned end instead (for a lower bound on the chunk), unless that passes the prompt's end."""
    if key_align <= 1 or n >= s.remaining_prefill:
        return n
    if up:
        grown = n + (-(s.prefilled_tokens + n)) % key_align
        return grown if grown < s.remaining_prefill else n
    return n - (s.prefilled_tokens + n) % key_align


class Policy:
    """Base class: subclasses implement :meth:`schedule`. ``observe`` receives each finished
    step record (a dict) for policies that learn from measured step times."""

    name = "policy"
    # Whether an executor that can (see mlxlab.fused) should run this policy's decode and
    # prefill chunks of one step in one packed forward pass.
    fuse = False

    def schedule(self, state: SchedulerState) -> StepPlan:  # pragma: no cover - abstract
        raise NotImplementedError

    def observe(self, record: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PrefillFirst(Policy):
    """Prompts before tokens: while any prompt is unfinished, run a chunk of the oldest one and
    let decoding wait (the phases never mix, as in nano-vllm and vLLM's old scheduler)."""

    name = "prefill_first"

    def schedule(self, state: SchedulerState) -> StepPlan:
        if state.prefill_queue:
            s = state.prefill_queue[0]
            return StepPlan(decode=False, prefill=[(s.seq_id, min(state.chunk_size, s.remaining_prefill))])
        return StepPlan(decode=bool(state.decoding))


class Interleave(Policy):
    """mlx-lm's ``BatchGenerator``: one decode step for all decoding sequences, then one chunk
    for each of up to ``prefill_batch_size`` prompts, unless ``completion_batch_size``
    sequences are already decoding."""

    name = "interleave"

    def __init__(self, prefill_batch_size: int = 8, completion_batch_size: int = 32):
        if prefill_batch_size < 1 or completion_batch_size < 1:
            raise ValueError("prefill_batch_size and completion_batch_size must be >= 1")
        self.prefill_batch_size = prefill_batch_size
        self.completion_batch_size = max(completion_batch_size, prefill_batch_size)

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan = StepPlan(decode=bool(state.decoding))
        room = min(self.prefill_batch_size, self.completion_batch_size - len(state.decoding))
        for s in state.prefill_queue[: max(room, 0)]:
            plan.prefill.append((s.seq_id, min(state.chunk_size, s.remaining_prefill)))
        return plan


class AdmissionGate(Policy):
    """At most one big prefill (at least ``big_prompt_tokens`` tokens) in flight at a time,
    one chunk of it per step, with every decoding sequence advancing in that same step however
    deep the queue. Short prompts (a chat turn) are not held behind the big one."""

    name = "admission_gate"

    def __init__(self, big_prompt_tokens: int = 2048, prefill_batch_size: int = 8):
        if big_prompt_tokens < 1 or prefill_batch_size < 1:
            raise ValueError("big_prompt_tokens and prefill_batch_size must be >= 1")
        self.big_prompt_tokens = big_prompt_tokens
        self.prefill_batch_size = prefill_batch_size

    def is_big(self, s: SeqView) -> bool:
        return s.prefill_tokens >= self.big_prompt_tokens

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan = StepPlan(decode=bool(state.decoding))
        admitted = next((s for s in state.prefill_queue if self.is_big(s) and s.prefilled_tokens > 0), None)
        for s in state.prefill_queue:
            if len(plan.prefill) >= self.prefill_batch_size:
                break
            if self.is_big(s):
                if admitted is None:
                    admitted = s
                elif s is not admitted:
                    continue  # held at the gate until the admitted one finishes
            plan.prefill.append((s.seq_id, min(state.chunk_size, s.remaining_prefill)))
        return plan

    def __repr__(self) -> str:
        return f"AdmissionGate(big_prompt_tokens={self.big_prompt_tokens})"


class StallFree(Policy):
    """Sarathi-Serve's stall-free batching: a token budget per step, filled with every
    decoding sequence first (one token each), then the in-flight prefills' chunks, then new
    prefills chunked to fit. Decoding never waits for a whole prompt; a step never carries
    more than ``token_budget`` tokens unless the decoding sequences alone exceed it.

    ``key_align``: each chunk that does not finish its prompt ends at a key length that is a
    multiple of it (:func:`align_chunk`), so a 512 budget with one decode runs 504-token chunks
    rather than 511s; 1 fills the budget exactly, as Sarathi-Serve does."""

    name = "stall_free"
    fuse = True  # Sarathi-Serve packs a step's decodes and chunk into one forward

    def __init__(self, token_budget: int = 512, key_align: int = KEY_ALIGN):
        if token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")
        if key_align < 1:
            raise ValueError(f"key_align must be >= 1 (1: chunks as the budget gives them), got {key_align}")
        self.token_budget = token_budget
        self.key_align = key_align

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan = StepPlan(decode=bool(state.decoding))
        budget = self.token_budget - len(state.decoding)
        ordered = sorted(state.prefill_queue, key=lambda s: s.prefilled_tokens == 0)  # in-flight first
        for s in ordered:
            if budget <= 0:
                break
            n = min(budget, state.chunk_size, s.remaining_prefill)
            aligned = align_chunk(n, s, self.key_align)
            if aligned <= 0 and plan.prefill:  # the budget left cannot end a chunk aligned: leave it
                continue
            n = aligned if aligned > 0 else n  # (a step's only chunk is never dropped: prompts must progress)
            plan.prefill.append((s.seq_id, n))
            budget -= n
        return plan

    def __repr__(self) -> str:
        return f"StallFree(token_budget={self.token_budget}, key_align={self.key_align})"


class SLOChunking(Policy):
    """Chunk size chosen per step from a cost model of step time: while interactive streams
    decode, the largest chunk whose predicted step (decode + chunk) keeps their inter-token
    latency under ``itl_target_s``; with nobody decoding, ``max_chunk``.

    The cost model (:class:`mlxlab.costmodel.StepCostModel`) is refitted from the executor's own
    step records every ``refit_every`` observations; until it has ``min_observations`` it plays
    safe with ``min_chunk``. A pre-fitted model (from ``mlxlab profile``) can be passed in.
    ``interactive_tenants`` limits whose decoding counts (default: every decoding stream).

    When even a ``min_chunk`` step is predicted over the target, no chunk size can meet it, and
    the choice is a trade-off. Where a prefill forward has a large fixed cost (on the H200 a
    32-token chunk beside a decode cost ~26 ms against a 6 ms decode), crawling at ``min_chunk``
    multiplies the prompt's TTFT by its chunk count (38x alone, measured) and still misses the
    target. Where it has almost none (a CPU: ~1.5 ms per token whatever the chunk), ``min_chunk``
    loses little throughput and keeps the ITL lowest. So the policy takes the smallest chunk
    whose predicted prefill cost per token is within ``1 / infeasible_efficiency`` of the
    cheapest per-token cost over the chunk range (:meth:`StepCostModel.efficient_chunk`): past
    the knee where the fixed cost stops dominating, and no further.

    A model learned online only knows the chunk sizes the policy has chosen: fitted on steps that
    all carried 4 tokens, its per-token slope is a guess, and a whole 2,048-token prompt chosen as
    one chunk on its say-so once stalled the chat for 4 s (CPU, ``min_chunk=4``). While learning, the policy therefore
    chooses at most twice the largest chunk its fitting window has seen, growing as it observes.

    ``chunk_multiple`` rounds each chosen chunk down to a multiple of it (never below
    ``min_chunk``). A backend that prepares work per query length (mlx's CUDA attention and
    matmuls) pays that again for every new size; a grid keeps the sizes few. ``key_align`` then
    cuts the chunk so it ends on a key length that is a multiple of it (:func:`align_chunk`)."""

    name = "slo"

    def __init__(self, itl_target_s: float = 0.05, min_chunk: int = 32, max_chunk: int = 2048,
                 cost_model=None, interactive_tenants: Optional[Sequence[str]] = None,
                 refit_every: int = 16, min_observations: int = 8, history: int = 512,
                 infeasible_efficiency: float = 0.5, chunk_multiple: int = 1, key_align: int = KEY_ALIGN):
        if key_align < 1:
            raise ValueError(f"key_align must be >= 1 (1: chunks as chosen), got {key_align}")
        if itl_target_s <= 0:
            raise ValueError(f"itl_target_s must be positive, got {itl_target_s}")
        if chunk_multiple < 1:
            raise ValueError(f"chunk_multiple must be >= 1, got {chunk_multiple}")
        if not 0 < infeasible_efficiency <= 1:
            raise ValueError(f"infeasible_efficiency must be in (0, 1] (the share of the best prefill throughput "
                             f"to keep when the ITL target cannot be met), got {infeasible_efficiency}")
        if not 1 <= min_chunk <= max_chunk:
            raise ValueError(f"need 1 <= min_chunk <= max_chunk, got {min_chunk}, {max_chunk}")
        from .costmodel import StepCostModel  # numpy only: policies stay free of MLX

        self.itl_target_s = itl_target_s
        self.min_chunk, self.max_chunk = min_chunk, max_chunk
        self.cost_model = cost_model or StepCostModel()
        self._learn = cost_model is None
        self.interactive_tenants = set(interactive_tenants) if interactive_tenants else None
        self.refit_every, self.min_observations, self.history = refit_every, min_observations, history
        self.infeasible_efficiency = float(infeasible_efficiency)
        self._largest_seen = 0  # largest chunk in the fitting window (the learned model's trust region)
        self.chunk_multiple = int(chunk_multiple)
        self.key_align = int(key_align)
        self._records: List[dict] = []
        self.chosen: List[int] = []  # chunk sizes chosen while streams decoded (for plots)
        self.infeasible_steps = 0  # of those, how many had no chunk size meeting the target

    def observe(self, record: dict) -> None:
        if not self._learn:
            return
        self._records.append(record)
        del self._records[:-self.history]
        if len(self._records) >= self.min_observations and len(self._records) % self.refit_every == 0:
            from .costmodel import StepCostModel

            self.cost_model = StepCostModel.fit(self._records, source="online")
            self._largest_seen = max(int(r.get("prefill_tokens", 0) or 0) for r in self._records)

    def _interactive(self, state: SchedulerState) -> bool:
        if self.interactive_tenants is None:
            return bool(state.decoding)
        return any(s.tenant in self.interactive_tenants for s in state.decoding)

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan = StepPlan(decode=bool(state.decoding))
        if not state.prefill_queue:
            return plan
        s = state.prefill_queue[0]
        if not self._interactive(state):
            n = self.max_chunk
        elif not self.cost_model.fitted:
            n = self.min_chunk
        else:
            batch, ctx, at = len(state.decoding), sum(d.context_tokens for d in state.decoding), s.prefilled_tokens
            hi = self.max_chunk
            if self._learn:  # no extrapolation far past what the model has seen (class docstring)
                hi = min(hi, max(self.min_chunk, 2 * self._largest_seen))
            feasible = self.cost_model.predict(batch, ctx, [(self.min_chunk, at)]) <= self.itl_target_s
            if feasible:
                n = self.cost_model.largest_chunk(self.itl_target_s, batch, ctx, at, self.min_chunk, hi)
            else:  # the target cannot be met: see the class docstring
                self.infeasible_steps += 1
                n = self.cost_model.efficient_chunk(batch, ctx, at, self.min_chunk, hi, self.infeasible_efficiency)
            if self.chunk_multiple > 1:
                n = max(self.min_chunk, n - n % self.chunk_multiple)
            n = min(n, s.remaining_prefill)
            # a budget is an upper bound (align down); the knee a lower one (align up)
            n = align_chunk(n, s, self.key_align, up=not feasible) or n
            self.chosen.append(n)
        n = min(n, s.remaining_prefill)
        plan.prefill.append((s.seq_id, align_chunk(n, s, self.key_align) or n))  # (idempotent when aligned above)
        return plan

    def __repr__(self) -> str:
        return (f"SLOChunking(itl_target_s={self.itl_target_s}, min_chunk={self.min_chunk}, "
                f"max_chunk={self.max_chunk}, infeasible_efficiency={self.infeasible_efficiency}, "
                f"chunk_multiple={self.chunk_multiple}, key_align={self.key_align})")


POLICIES: Dict[str, Callable[..., Policy]] = {
    PrefillFirst.name: PrefillFirst,
    Interleave.name: Interleave,
    AdmissionGate.name: AdmissionGate,
    StallFree.name: StallFree,
    SLOChunking.name: SLOChunking,
}


def make_policy(policy: "str | Policy", **kwargs) -> Policy:
    """A policy object from a name in :data:`POLICIES` (with its keyword options) or as given."""
    if isinstance(policy, Policy):
        if kwargs:
            raise ValueError("policy options are only accepted with a policy name")
        return policy
    try:
        factory = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(POLICIES)}") from None
    return factory(**kwargs)


def with_key_align(policy: "str | Policy", key_align: int, options: dict) -> dict:
    """``options`` for a policy named ``policy``, with the executor's ``key_align`` added when the
    policy takes one and the caller did not set it: one knob turns both the executor's padding and
    the policy's chunk alignment off (``key_align=1``)."""
    import inspect

    factory = POLICIES.get(policy) if isinstance(policy, str) else None
    if factory is None or "key_align" in options or "key_align" not in inspect.signature(factory).parameters:
        return options
    return {**options, "key_align": key_align}


def next_plan(policy: Policy, state: SchedulerState) -> StepPlan:
    """The policy's plan for ``state`` (an empty plan when nothing waits or decodes), checked
    with :func:`check_plan`: what every executor asks before a step."""
    plan = policy.schedule(state) if (state.prefill_queue or state.decoding) else StepPlan()
    check_plan(plan, state)
    return plan


def check_plan(plan: StepPlan, state: SchedulerState) -> None:
    """Raise ``ValueError`` if a plan asks for something the state cannot give: an unknown or
    repeated sequence, a chunk of no tokens or past the end of its prompt."""
    queued = {s.seq_id: s for s in state.prefill_queue}
    seen = set()
    for seq_id, n in plan.prefill:
        s = queued.get(seq_id)
        if s is None:
            raise ValueError(f"plan prefills sequence {seq_id}, which is not waiting for prefill")
        if seq_id in seen:
            raise ValueError(f"plan prefills sequence {seq_id} twice in one step")
        if not 0 < n <= s.remaining_prefill:
            raise ValueError(f"plan gives sequence {seq_id} a chunk of {n} tokens; {s.remaining_prefill} remain")
        seen.add(seq_id)
    if plan.decode and not state.decoding:
        raise ValueError("plan decodes but no sequence is decoding")
