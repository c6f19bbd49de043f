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
from typing import Callable, Dict, List, Optional, Tuple


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


class Policy:
    """Base class: subclasses implement :meth:`schedule`. ``observe`` receives each finished
    step record (a dict) for policies that learn from measured step times."""

    name = "policy"

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


POLICIES: Dict[str, Callable[..., Policy]] = {
    PrefillFirst.name: PrefillFirst,
    Interleave.name: Interleave,
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
