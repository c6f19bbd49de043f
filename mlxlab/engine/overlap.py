"""Overlap mode (``Engine(..., overlap=True)``): decode steps and prefill chunks run concurrently on
two mlx streams from two threads, so decoding does not wait for a chunk to finish.

* The **main thread** (whichever thread calls :meth:`Engine.step` / :meth:`Engine.run`) asks the
  policy for a plan each step as usual and runs the decode inline on its own stream. The plan's
  prefill chunks are handed to the prefill worker only if the worker is idle; otherwise they are
  skipped this step (the worker is still busy with the previous plan's chunks).
* The **prefill worker** (:class:`PrefillWorker`, the engine's side) hands each job to the
  process's prefill thread (:class:`PrefillThread`, a daemon thread with its own stream, made
  inside the thread: mlx streams belong to the thread that made them). That thread runs the chunks of one handed-over plan, evaluates the caches, fills in that plan's
  :class:`~mlxlab.core.request.StepRecord` (phase "prefill", ``thread`` "prefill", its own start
  and end) and publishes the sequences whose prefill finished; the main thread collects them at
  its next step, samples each one's first token on its own cache
  (:meth:`mlxlab.engine.overlap_steps.OverlapSteps._first_token`), and those with more to
  produce join the decode batch at the next decode. When nothing else can run,
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
* **Lifetime.** Every overlap engine of a process shares **one** prefill thread per device, with
  one mlx stream made inside it (:class:`PrefillThread`); an engine's :class:`PrefillWorker` hands
  its jobs to that thread and waits for their results. The thread starts at the first hand-over in
  the process and is stopped and joined at interpreter exit (``atexit``). One thread and one
  stream, however many engines: on mlx's CUDA backend a process whose second overlap engine made
  a second prefill thread and stream (each closed and joined before the next) aborted at exit
  ("terminate called without an active exception", exit 134); one made by one engine exited 0.
  :meth:`Engine.close` and the end of :meth:`Engine.run` wait for the engine's job and collect it;
  the thread holds no reference to an engine between jobs, so a dropped engine is freed.
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

import atexit
import collections
import threading
import weakref
from typing import Callable, Deque, Dict, List, Optional, Set, Tuple

import mlx.core as mx

from mlxlab.core.request import SequenceState, StepRecord
from mlxlab.core.threads import join_fully

OVERLAP_SYNCS = ("layer", "pipelined", "chunk")
PACE_GAPS = 16  # decode-only gaps the pacer's reference is the median of
WORKER_POLL_S = 1.0  # a main thread waiting on the prefill thread checks this often that it still runs

Chunks = List[Tuple[SequenceState, int]]



def side_by_side_device() -> bool:
    """Whether the default device runs a second stream's work beside the first's (a GPU). On a
    CPU both streams share the same cores, and overlap mode only adds a thread."""
    return mx.default_device().type == mx.DeviceType.gpu


def resolve_overlap(policy, overlap, overlap_sync, overlap_job_chunks):
    """``(overlap, overlap_sync, overlap_job_chunks)`` for an engine: ``overlap`` None leaves the
    choice to the policy, whose ``side_prefill`` options (e.g. ``slo``'s) turn overlap mode on
    where the device runs both streams at once (:func:`side_by_side_device`); an option given
    explicitly always wins over the policy's; the rest default to "layer" and 1."""
    wanted = getattr(policy, "side_prefill", None)
    if overlap is None:
        overlap = bool(wanted) and side_by_side_device()
    prefs = dict(wanted or {}) if overlap else {}
    sync = overlap_sync if overlap_sync is not None else prefs.get("overlap_sync", "layer")
    jobs = overlap_job_chunks if overlap_job_chunks is not None else prefs.get("overlap_job_chunks", 1)
    return overlap, sync, jobs


class PrefillThread:
    """The process's prefill thread for one device and its stream, shared by every engine's
    :class:`PrefillWorker` (see "Lifetime" in the module docstring). Jobs run one at a time in the
    order handed over."""

    def __init__(self, device_name: str):
        self.device_name = device_name
        self._cv = threading.Condition()
        self._jobs: Deque[tuple] = collections.deque()  # (weak ref to a PrefillWorker, job)
        self._stopping = False
        self.thread: Optional[threading.Thread] = None

    def submit(self, worker: "PrefillWorker", job) -> threading.Thread:
        """Queue ``worker``'s job, starting the thread if it is not running; returns the thread."""
        with self._cv:
            if self.thread is None or not self.thread.is_alive():
                self._stopping = False
                self.thread = threading.Thread(target=self._loop, name="mlxlab-prefill", daemon=True)
                self.thread.start()
            self._jobs.append((weakref.ref(worker), job))
            self._cv.notify_all()
            return self.thread

    def shutdown(self) -> None:
        """Let the queued jobs finish, then stop the thread and wait until it has exited (at
        interpreter exit: see :mod:`mlxlab.core.threads`)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            join_fully(thread)

    def _loop(self) -> None:
        stream = mx.new_stream(mx.default_device())  # streams are per thread: make it here, once
        while True:
            with self._cv:
                while not self._jobs and not self._stopping:
                    self._cv.wait()
                if not self._jobs:
                    return
                ref, job = self._jobs.popleft()
            worker = ref()
            if worker is not None:
                worker._run(job, stream)
            worker = job = None  # hold nothing of an engine between jobs


_THREADS: Dict[str, PrefillThread] = {}
_THREADS_LOCK = threading.Lock()


def prefill_thread() -> PrefillThread:
    """The shared prefill thread of the default device (made on first use)."""
    name = str(mx.default_device())
    with _THREADS_LOCK:
        if name not in _THREADS:
            _THREADS[name] = PrefillThread(name)
        return _THREADS[name]


@atexit.register
def _shutdown_prefill_threads() -> None:
    for t in list(_THREADS.values()):
        t.shutdown()


class DecodePacer:
    """Spends part of the decode stream's latency budget on the prefill beside it: while the
    prefill thread holds a job, decode steps start no sooner than ``x`` times the median of the
    last :data:`PACE_GAPS` gaps between decode steps that ran with the prefill thread idle (the
    stream's own pace, measured by the engine as it runs). The prefill thread then gets the GIL
    and the device for the rest. ``x`` None turns pacing off."""

    def __init__(self, x: Optional[float]):
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 1):
            raise ValueError(f"overlap_pace_x must be None or a number >= 1 (a multiple of the decode-only gap), "
                             f"got {x!r}")
        self.x = x
        self._gaps: Deque[float] = collections.deque(maxlen=PACE_GAPS)
        self._last: Optional[Tuple[float, bool]] = None  # the last decode step: start, prefill busy then

    def delay_s(self, now: float, busy: bool) -> float:
        """Seconds to wait before a decode step that would start at ``now``."""
        if self.x is None or not busy or not self._gaps or self._last is None:
            return 0.0
        ref = sorted(self._gaps)[len(self._gaps) // 2]
        return max(0.0, self._last[0] + self.x * ref - now)

    def started(self, t: float, busy: bool) -> None:
        """Note a decode step starting at ``t`` (``busy``: the prefill thread held a job)."""
        if self._last is not None and not busy and not self._last[1]:
            self._gaps.append(t - self._last[0])
        self._last = (t, busy)


class PrefillWorker:
    """One engine's side of the prefill thread and its hand-over protocol (see the module
    docstring).

    ``run_job(rec, chunks)`` is the engine's (bound) method that runs a job's chunks and returns
    the sequences whose prefill finished; the worker holds it weakly. Main-thread state:
    ``thread`` (the shared prefill thread while this engine uses it, None after :meth:`stop`),
    ``busy`` (a job is out and its result not yet collected), ``held`` (ids of the sequences the
    worker holds). Guarded by the condition: the result."""

    def __init__(self, run_job: Callable[[StepRecord, Chunks], List[SequenceState]]):
        self._run_job = weakref.WeakMethod(run_job)
        self._cv = threading.Condition()
        self._result = None  # (record, finished sequences, error) published by the prefill thread
        self.thread: Optional[threading.Thread] = None
        self.busy = False
        self.held: Set[int] = set()

    # ------------------------------------------------------------------ main thread
    def hand_over(self, rec: StepRecord, chunks: Chunks) -> None:
        """Give the prefill thread ``chunks`` (and those sequences' caches), recorded in ``rec``."""
        self.held = {seq.req.id for seq, _ in chunks}
        self.busy = True
        self.thread = prefill_thread().submit(self, (rec, chunks))

    def collect(self, wait: bool = False) -> Optional[Tuple[StepRecord, List[SequenceState]]]:
        """Take back the finished job (waiting for it if ``wait``): its record and the sequences
        whose prefill finished, or None if no job finished. Raises the job's error."""
        if not self.busy:
            return None
        with self._cv:
            while wait and self._result is None:
                if self.thread is None or not self.thread.is_alive():
                    raise RuntimeError("the prefill thread stopped without finishing its chunks")
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
        """Wait until this engine's job (if any) is done, and let go of the prefill thread; False
        if the engine never used it since the last stop."""
        if self.thread is None:
            return False
        with self._cv:
            while self.busy and self._result is None and self.thread.is_alive():
                self._cv.wait(WORKER_POLL_S)
        self.thread = None
        return True

    # ------------------------------------------------------------------ prefill thread
    def _run(self, job: Tuple[StepRecord, Chunks], stream) -> None:
        """Run one job on the prefill thread's stream and publish its result."""
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
        run = None
        with self._cv:
            self._result = (rec, finished, error)
            self._cv.notify_all()
