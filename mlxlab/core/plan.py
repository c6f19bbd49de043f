"""What a policy sees and what it returns: the queue snapshot (:class:`SchedulerState` of
:class:`SeqView`) and the step it plans (:class:`StepPlan`), checked by :func:`check_plan`.

Pure Python, no MLX: the engine, the simulator and every policy share these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Tuple

if TYPE_CHECKING:  # typing only: policies import this module
    pass


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
    # the executor runs prefill chunks beside decode steps (the engine's overlap mode): a chunk
    # does not lengthen the decode step it is planned with
    side_prefill: bool = False

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


KEY_ALIGN = 8  # the default key_align of the engine, the simulator and the policies
#: ``slo``'s chunk alignment where the device prepares attention per exact shape (tune's grid, serve's hint)
SLO_KEY_ALIGN_SHAPES = 512


def align_chunk(n: int, s: SeqView, key_align: int, up: bool = False) -> int:
    """``n`` tokens of ``s``'s prompt, cut so the chunk ends at a key length that is a multiple
    of ``key_align`` (at most ``key_align - 1`` tokens fewer; 0 when the cut takes them all). A
    chunk that finishes the prompt is left alone (the engine pads it instead:
    ``Engine(key_align=...)``). On mlx's CUDA backend a chunk ending off a multiple of 8 runs a
    slower attention path (``probes/chunk_probe.py``), so a token budget less one decode (511)
    would pay that at every step of a long prompt. ``up``: grow the chunk to the next
    aligned end instead (for a lower bound on the chunk), unless that passes the prompt's end."""
    if key_align <= 1 or n >= s.remaining_prefill:
        return n
    if up:
        grown = n + (-(s.prefilled_tokens + n)) % key_align
        return grown if grown < s.remaining_prefill else n
    # at least 0: a prompt already off the alignment (a prefix restored at an odd length, an earlier
    # chunk that ended its step unaligned) with fewer than its overshoot left in the chunk has no
    # aligned cut (``slo`` then keeps ``n``; ``stall_free`` leaves it for another step)
    return max(0, n - (s.prefilled_tokens + n) % key_align)



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
