"""The policy base class and the two policies that need no options of their own."""

from __future__ import annotations

from mlxlab.core.plan import SchedulerState, StepPlan


class Policy:
    """Base class: subclasses implement :meth:`schedule`. ``observe`` receives each finished
    step record (a dict) for policies that learn from measured step times."""

    name = "policy"
    # Whether an executor that can (see mlxlab.engine.fused) should run this policy's decode and
    # prefill chunks of one step in one packed forward pass.
    fuse = False
    # Engine options (overlap_sync, overlap_job_chunks) with which this policy wants its prefill
    # run beside decode, on the engine's prefill thread and stream, where the engine is left to
    # choose (``Engine(overlap=None)``, the default) and the device runs the two streams at once
    # (a GPU). None: the policy plans serial steps only.
    side_prefill = None

    def schedule(self, state: SchedulerState) -> StepPlan:  # pragma: no cover - abstract
        raise NotImplementedError

    # Whether the policy reads step records: set for every subclass by __init_subclass__, so an
    # executor builds a step's record dict only for a policy that overrides observe.
    observes = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.observes = cls.observe is not Policy.observe

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
