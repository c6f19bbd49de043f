"""Overlap mode (``Engine(..., overlap=True)``): decode steps and prefill chunks run concurrently on
two mlx streams from two threads, so decoding does not wait for a chunk to finish.

* The **main thread** (whichever thread calls :meth:`Engine.step` / :meth:`Engine.run`) asks the
  policy for a plan each step as usual and runs the decode inline on its own stream. The plan's
  prefill chunks are handed to the prefill worker only if the worker is idle; otherwise they are
  skipped this step (the worker is still busy with the previous plan's chunks).
* The **prefill worker** (:class:`PrefillWorker`) is a daemon thread with its own stream
  (``mx.new_stream`` created inside the thread: mlx streams belong to the thread that made them).
  It runs the chunks of one handed-over plan, evaluates the caches, fills in that plan's
  :class:`~mlxlab.core.request.StepRecord` (phase "prefill", ``thread`` "prefill", its own start
  and end) and publishes the sequences whose prefill finished; the main thread collects them at
  its next step, and they join the decode batch at the next decode. When nothing else can run,
  the main thread waits on the worker (a condition variable) instead of spinning.
* **Cache ownership.** A sequence's own KV cache belongs to the worker from hand-over until the
  main thread collects the worker's result; the main thread does not touch it (nor the
  sequence's prefill progress) in between. The batch cache, the decode inputs and every queue
  belong to the main thread only. While the worker holds a sequence, the policy does not see it
  in ``prefill_queue`` (it is neither idle nor schedulable), so plans stay valid for
  :func:`mlxlab.core.plan.check_plan` (which :func:`mlxlab.policies.next_plan` applies).
* **Records.** ``engine.steps`` holds the records of both threads in the order they started
  (a prefill record is appended at hand-over; its ``start_s`` is when the worker began it);
  ``thread`` says which thread ran it. ``policy.observe`` is only ever called on the main
  thread: worker records are delivered when their results are collected.
* **Lifetime.** The worker starts at the first hand-over and stops at the end of :meth:`Engine.run`
  or on :meth:`Engine.close` (a later step starts a new one). It holds only a weak reference to
  its engine, so an engine dropped without ``close()`` does not keep it alive for long. (Each
  worker makes a new mlx stream; on the CPU every mlx stream keeps an idle thread for the life
  of the process.)
* **mlx back-pressure.** ``eval``/``async_eval`` on any thread block while more than 10 scheduler
  tasks are in flight in the whole process (``MAX_ACTIVE_TASKS``, one global count; on the CPU a
  task is 10 dispatched ops). A chunk's whole graph queued at once keeps that count at 10, and
  the decode thread can then only enqueue as fast as the chunk's tasks finish: decode waits for
  the chunk after all. So by default (``overlap_sync="layer"``) the worker evaluates each layer
  as its keys and values reach the cache, which keeps at most about one layer of prefill in
  flight; ``"pipelined"`` queues each layer and then waits for the one before it (about two
  layers in flight, no idle device between layers); ``"chunk"`` queues the whole chunk at once
  (:func:`mlxlab.engine.batch.evaluating_layers`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, List, Optional, Set, Tuple

import mlx.core as mx

from mlxlab.core.request import SequenceState, StepRecord

OVERLAP_SYNCS = ("layer", "pipelined", "chunk")
WORKER_POLL_S = 1.0  # an idle prefill worker checks this often whether its engine still exists

Chunks = List[Tuple[SequenceState, int]]


class PrefillWorker:
    """The prefill thread of one engine and its hand-over protocol (see the module docstring).

    ``run_job(rec, chunks)`` is the engine's (bound) method that runs a job's chunks and returns
    the sequences whose prefill finished; the worker holds it weakly. Main-thread state:
    ``thread``, ``busy`` (a job is out and its result not yet collected), ``held`` (ids of the
    sequences the worker holds). Guarded by the condition: the job, the result, the stop flag."""

    def __init__(self, run_job: Callable[[StepRecord, Chunks], List[SequenceState]]):
        self._run_job = weakref.WeakMethod(run_job)
        self._cv = threading.Condition()
        self._job: Optional[Tuple[StepRecord, Chunks]] = None  # handed over, not yet taken
        self._result = None  # (record, finished sequences, error) published by the worker
        self._stopping = False
        self.thread: Optional[threading.Thread] = None
        self.busy = False
        self.held: Set[int] = set()

    # ------------------------------------------------------------------ main thread
    def hand_over(self, rec: StepRecord, chunks: Chunks) -> None:
        """Give the worker ``chunks`` (and those sequences' caches), recorded in ``rec``."""
        if self.thread is None or not self.thread.is_alive():
            with self._cv:
                self._stopping = False
            self.thread = threading.Thread(target=self._loop, name="mlxlab-prefill", daemon=True)
            self.thread.start()
        self.held = {seq.req.id for seq, _ in chunks}
        self.busy = True
        with self._cv:
            self._job = (rec, chunks)
            self._cv.notify_all()

    def collect(self, wait: bool = False) -> Optional[Tuple[StepRecord, List[SequenceState]]]:
        """Take back the finished job (waiting for it if ``wait``): its record and the sequences
        whose prefill finished, or None if no job finished. Raises the worker's error."""
        if not self.busy:
            return None
        with self._cv:
            while wait and self._result is None:
                if self.thread is None or not self.thread.is_alive():
                    raise RuntimeError("the prefill worker stopped without finishing its chunks")
                self._cv.wait(WORKER_POLL_S)
            result, self._result = self._result, None
        if result is None:
            return None
        rec, finished, error = result
        self.busy = False
        self.held = set()
        if error is not None:
            raise RuntimeError(f"prefill worker failed: {error!r}; the caches of sequences it held may "
                               f"be partly written: build a new Engine") from error
        return rec, finished

    def stop(self) -> bool:
        """Stop the thread once its current job is done; False if none was running."""
        thread = self.thread
        if thread is None:
            return False
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        thread.join()
        self.thread = None
        return True

    # ------------------------------------------------------------------ worker thread
    def _next_job(self) -> Optional[Tuple[StepRecord, Chunks]]:
        """Wait for a job; None once the engine is gone, or stopped the worker with none queued."""
        with self._cv:
            while True:
                if self._run_job() is None or (self._job is None and self._stopping):
                    return None
                if self._job is not None:
                    job, self._job = self._job, None
                    return job
                self._cv.wait(WORKER_POLL_S)

    def _loop(self) -> None:
        """Run one job at a time on this thread's stream. The engine is held only while a job
        runs, so a dropped engine lets the thread exit."""
        stream = mx.new_stream(mx.default_device())  # streams are per thread: make it here
        while (job := self._next_job()) is not None:
            rec, chunks = job
            finished, error = [], None
            run = self._run_job()
            try:
                if run is None:
                    raise RuntimeError("the engine was dropped while its prefill job was queued")
                with mx.stream(stream):
                    finished = run(rec, chunks)
            except BaseException as e:  # handed to the main thread, raised there
                error = e
            with self._cv:
                self._result = (rec, finished, error)
                self._cv.notify_all()
            run = job = rec = chunks = finished = error = None
