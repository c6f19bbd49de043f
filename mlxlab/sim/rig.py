"""The measuring rig of a device profile: the real engine driven by a scripted policy, and the
clock around its steps (MLX).

Every group of grid cells (:mod:`mlxlab.sim.cells`) runs on a fresh :class:`Rig`, an engine
whose next plan is dictated, and times its steps through a shared :class:`Bench`, which also
holds the grid, the random prompt tokens and the records measured so far.
"""

from __future__ import annotations

import random
import time
from typing import List, Optional, Sequence, Tuple

from mlxlab.core.costmodel import WarmShapes
from mlxlab.core.plan import SchedulerState, StepPlan
from mlxlab.core.presets import model_limits
from mlxlab.core.request import Request, StepRecord
from mlxlab.engine.fused import can_fuse, cold_keying
from mlxlab.engine.loop import Engine
from mlxlab.policies.base import Policy


class ScriptedPolicy(Policy):
    """Runs exactly the plan it is given for the next step (then nothing)."""

    name = "profile_script"

    def __init__(self):
        self.next = StepPlan()

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan, self.next = self.next, StepPlan()
        return plan


class Rig:
    """An engine on ``model`` whose every step runs the plan given to :meth:`step`."""

    def __init__(self, model, chunk_size: int):
        self.script = ScriptedPolicy()
        self.eng = Engine(model, policy=self.script, chunk_size=chunk_size)

    def submit(self, tokens: List[int], max_tokens: int) -> Request:
        return self.eng.submit(tokens, max_tokens)

    def step(self, plan: StepPlan) -> Optional[StepRecord]:
        """One engine step running ``plan``, untimed (a decode-only step stays in flight)."""
        self.script.next = plan
        return self.eng.step()

    def flush(self) -> None:
        self.eng.flush()

    def decode_rows(self) -> int:
        """How many rows the decode batch holds."""
        return len(self.eng._decoding)

    def decode_width(self) -> int:
        """The key length of the decode batch: its longest row (prompt and tokens issued)."""
        return self.eng.decode_width


class Bench:
    """What every group of cells shares: the model and grid, the prompt tokens (seeded), the
    records and the skipped cells. ``recording`` False (the warm-up) measures without keeping."""

    def __init__(self, model, *, prefill_tokens: Sequence[int], decode_contexts: Sequence[int], repeats: int,
                 fill_chunk: int, mixed: bool, seed: int):
        self.model = model
        self.prefill_tokens = sorted({int(n) for n in prefill_tokens})
        self.decode_contexts = sorted({int(c) for c in decode_contexts})
        self.repeats = repeats
        self.fill_chunk = fill_chunk
        self.mixed = mixed
        self.packed = bool(mixed and can_fuse(getattr(model, "module", model))[0])
        self.vocab, self.max_ctx = model_limits(model)
        self.rng = random.Random(seed)
        self.records: List[dict] = []
        self.skipped: List[str] = []
        self.recording = True
        self.sizes_run: set = set()  # chunk token counts (pad included) this profile has run, warm-up included
        key, capacity, _ = cold_keying()  # what counts as a chunk's first use on this device
        self.warm = WarmShapes(key, capacity)
        self.pass_index = 0  # which pass over the grid a record was measured in (its "pass" field)

    @property
    def decode_steps(self) -> int:
        """Decode steps per phase: decode steps are cheap, so more of them and a median per cell."""
        return max(10, 2 * self.repeats + 4)

    def tokens(self, n: int) -> List[int]:
        return [self.rng.randrange(1, self.vocab) for _ in range(n)]

    def rig(self) -> Rig:
        return Rig(self.model, chunk_size=max(self.fill_chunk, max(self.prefill_tokens)))

    def keep(self, record: dict) -> None:
        if self.recording:
            record.setdefault("pass", self.pass_index)
            self.records.append(record)

    def timed(self, rig: Rig, plan: StepPlan, kind: str, cell: str = "") -> Tuple[dict, float]:
        """Run ``plan`` with the wall time of ``Engine.step()`` as the record's ``duration_s`` (a
        decode still in flight is read first, untimed; the engine's own time is kept as
        ``engine_duration_s``); returns the record and the clock at the step's start."""
        rig.flush()
        rig.script.next = plan
        t0 = time.perf_counter()
        rec = rig.eng.step()
        dt = time.perf_counter() - t0
        if rec is None:
            raise RuntimeError(f"profile step {plan} did not run")
        d = rec.as_dict()
        d.update(kind=kind, engine_duration_s=d["duration_s"], duration_s=dt,
                 cell=cell or f"{kind} n{d['prefill_tokens']} c{d['prefill_context_tokens']}",
                 cold_chunks=self._cold(d["prefill_chunks"]), cold_key=self.warm.key,
                 cold_capacity=self.warm.capacity)
        return d, t0

    def _cold(self, chunks) -> int:
        """How many of a step's chunks ([tokens, context(, pad)]) this profile had not run before
        (``cold_chunks``: :mod:`mlxlab.core.costmodel`; by token count, or on a device that keys
        attention by shape by token count and key length, :attr:`warm`); they are warm from now on."""
        for c in chunks:
            self.sizes_run.add(int(c[0]) + (int(c[2]) if len(c) > 2 else 0))
        return sum(self.warm.cold(chunks))

    def timed_alone(self, rig: Rig, plan: StepPlan, kind: str, cell: str) -> dict:
        """As :meth:`timed`, its tokens read at once: what the step costs with nothing in flight
        before or after it (a batch change, a row's first decode)."""
        d, t0 = self.timed(rig, plan, kind, cell)
        rig.flush()
        d["duration_s"] = time.perf_counter() - t0
        return d

    def fill(self, rig: Rig, req: Request, upto: int, record: bool = True) -> None:
        """Prefill ``upto`` tokens of ``req`` in chunks of ``fill_chunk`` (kind "fill")."""
        done = 0
        while done < upto:
            n = min(self.fill_chunk, upto - done)
            d, _ = self.timed(rig, StepPlan(prefill=[(req.id, n)]), "fill")
            if record:
                self.keep(d)
            done += n
