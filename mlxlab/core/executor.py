"""The executor interface: what takes requests, runs steps and leaves request and step records.

:class:`mlxlab.engine.Engine` (an mlx-lm model, wall clock), :class:`mlxlab.sim.Simulator` (a cost
model, virtual clock) and :class:`mlxlab.engine.baseline.MlxLmExecutor` (mlx-lm's own
``BatchGenerator``) are executors; :func:`mlxlab.core.runner.run_workload` drives any of them.

Pure Python, no MLX.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import List, Optional, Sequence

from mlxlab.core.request import Request, StepRecord


class Executor(ABC):
    """Submit requests, step until they are done, read the records.

    A subclass fills ``requests`` (every submitted :class:`Request`, by id) and ``steps`` (one
    :class:`StepRecord` per executed step) and implements :meth:`submit`, :meth:`step`,
    :meth:`now` and :attr:`has_work`. ``virtual_clock`` is True for an executor whose
    :meth:`advance_to` jumps its clock instead of waiting for it."""

    requests: List[Request]
    steps: List[StepRecord]
    virtual_clock: bool = False

    @abstractmethod
    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = ()) -> Request:
        """Queue a request and return it; its fields fill in as the executor runs. Raises
        ``ValueError`` (changing nothing) for input the executor cannot run."""

    @abstractmethod
    def step(self) -> Optional[StepRecord]:
        """Run one step; its record, or None if there was nothing to do."""

    @abstractmethod
    def now(self) -> float:
        """Seconds on the executor's clock (0 = its start)."""

    @property
    @abstractmethod
    def has_work(self) -> bool:
        """Whether any submitted request is not done yet."""

    def run(self, progress: bool = False) -> List[Request]:
        """Step until every submitted request is done, then :meth:`flush` and :meth:`close`;
        returns all requests. ``progress``: show a tqdm bar of finished requests."""
        bar = progress_bar(len(self.requests)) if progress else None
        try:
            while self.has_work:
                if self.step() is None and not self.has_work:
                    break
                if bar is not None:
                    bar.n = sum(r.done for r in self.requests)
                    bar.refresh()
        finally:
            self.flush()
            self.close()
            if bar is not None:
                bar.close()
        return self.requests

    def flush(self) -> None:
        """Read any tokens still in flight (:meth:`run` does this when it ends)."""

    def close(self) -> None:
        """Release what the executor holds (threads, the device); it stays usable."""

    def advance_to(self, t: float) -> None:
        """Let the clock reach ``t``: a wall-clock executor sleeps until then."""
        dt = t - self.now()
        if dt > 0:
            time.sleep(dt)

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.flush()
        self.close()


def progress_bar(total: Optional[int]):
    """A tqdm bar counting finished requests."""
    from tqdm.auto import tqdm  # progress bars are optional plumbing; not needed to run

    return tqdm(total=total, desc="requests", leave=False)
