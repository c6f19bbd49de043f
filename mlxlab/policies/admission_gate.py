"""The admission gate of the second case study: big prompts wait while interactive work runs."""

from __future__ import annotations

from mlxlab.core.plan import SchedulerState, SeqView, StepPlan
from mlxlab.policies.base import Policy


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
