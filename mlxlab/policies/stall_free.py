"""Stall-free batching (Sarathi-Serve): a token budget per step, decodes first."""

from __future__ import annotations

from mlxlab.core.plan import KEY_ALIGN, SchedulerState, StepPlan, align_chunk
from mlxlab.policies.base import Policy


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
