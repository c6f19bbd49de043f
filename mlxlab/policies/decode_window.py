"""The admission gate with a decode window held open between a big prompt's chunks."""

from __future__ import annotations

from mlxlab.core.plan import SchedulerState, StepPlan
from mlxlab.policies.admission_gate import AdmissionGate


class DecodeWindowGate(AdmissionGate):
    """``admission_gate`` plus a decode window: after each step that ran a chunk of a big prompt,
    only decoding (and short prompts) run for ``window_s`` seconds, so interactive streams get
    runs of plain decode steps between chunks (seed 001's "decode window held open between
    prefill chunks"). With nobody decoding, big chunks run back to back. Works on the engine and
    the simulator alike (it reads ``state.now_s`` and observed step records)."""

    name = "admission_gate_window"

    def __init__(self, window_s: float = 1.0, big_prompt_tokens: int = 2048, prefill_batch_size: int = 8):
        super().__init__(big_prompt_tokens=big_prompt_tokens, prefill_batch_size=prefill_batch_size)
        if not window_s >= 0:
            raise ValueError(f"window_s must be >= 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._hold_until = float("-inf")
        self._big: set = set()

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan = super().schedule(state)
        self._big |= {s.seq_id for s in state.prefill_queue if self.is_big(s)}
        if state.decoding and state.now_s < self._hold_until:
            plan.prefill = [(i, n) for i, n in plan.prefill if i not in self._big]
        return plan

    def observe(self, record: dict) -> None:
        if any(i in self._big for i in record.get("prefill_seqs", ())):
            self._hold_until = record["end_s"] + self.window_s

    def __repr__(self) -> str:
        return f"DecodeWindowGate(window_s={self.window_s}, big_prompt_tokens={self.big_prompt_tokens})"
