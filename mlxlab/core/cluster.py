"""Sweeps beyond one process: a study's points mapped over a Dask cluster (no MLX at import).

A *sweep* is a list of points (a simulator grid's policy and chunk size, a benchmark's setting)
and one function that turns a point into a result. :class:`Sweep` runs them on
`Dask distributed <https://distributed.dask.org>`_: ``Sweep()`` starts a local cluster of worker
processes on this machine (loopback only), ``Sweep("tcp://host:8786")`` connects to a running
scheduler. :meth:`Sweep.run` gives the results back in input order, each with its point, the
worker and host that ran it, when it started and ended (``time.time()`` on the worker) and the
worker's provenance (:func:`mlxlab.core.results.environment_block` for a timed point); a study
takes :meth:`Sweep.mapper` where it would call ``map`` and stores :meth:`Sweep.provenance` beside
its results.

**One timed study per accelerator.** A point that times the device (a benchmark) is submitted
with the resource ``accelerator: 1``; a worker that may time its machine's device advertises
``accelerator=1`` (one worker per GPU, the GPU pinned by ``CUDA_VISIBLE_DEVICES``), so the
scheduler never runs two timed points at once on one accelerator, while simulator points (pure
Python, no device) need no resource and run on every worker at once. Workers run one thread
each, so two points never share a worker's core. The local cluster gives the resource to as
many workers as the machine has accelerators (its GPUs, or one for a CPU or an Apple GPU: the
machine's one device), the other workers run simulator points only.

**Why Dask and not Ray.** Dask distributed is pure Python: it installs from the same registry
as everything else on the CPU CI, and the wheels the GPU image lacks (dask, distributed, tornado
and six small ones) are about 3 MiB, little beside the 64 MiB a device call carries to a machine
that has no registry (``scripts/device_wheels.sh``); Ray's wheel for one platform is tens of MiB
of compiled binaries (its raylet and GCS server), more than a call has room for beside the tree
and the mlx CUDA bundle. Both have per-worker custom resources; Dask's
``SpecCluster`` starts in-process for tests, and a cluster is one ``dask scheduler`` and a
``dask worker ADDRESS --nthreads 1 [--resources accelerator=1]`` per machine (or per GPU).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

#: the worker resource a timed point needs one of (one unit per accelerator)
ACCELERATOR = "accelerator"

#: how long a Sweep waits, by default, for a scheduler at an address to answer and show a worker
#: (a local cluster gets LOCAL_START_S to start its processes)
CONNECT_TIMEOUT_S = 10.0
LOCAL_START_S = 60.0

#: what to run on each machine of a cluster (``ADDRESS``: the scheduler's)
WORKER_COMMAND = "dask worker ADDRESS --nthreads 1 --resources accelerator=1"


@dataclass(frozen=True)
class PointResult:
    """One point of a sweep, as it came back.

    index (int): the point's position in the input; params: the point as given; value: what the
    sweep's function returned for it; host (str): the host name of the machine that ran it;
    worker (str): the Dask worker's address (``"in-process"`` when run without a cluster);
    pid (int): the worker process; started_at / ended_at (float): ``time.time()`` on the worker
    around the call, seconds since the epoch; environment (dict): the worker's provenance.
    """
    index: int
    params: Any
    value: Any
    host: str
    worker: str
    pid: int
    started_at: float
    ended_at: float
    environment: dict

    def record(self) -> dict:
        """The point's bookkeeping without its value (a results file keeps the value in its study's
        own place): index, params (JSON-ready), host, worker, pid, started_at, ended_at, seconds."""
        return {"index": self.index, "params": describe(self.params), "host": self.host, "worker": self.worker,
                "pid": self.pid, "started_at": self.started_at, "ended_at": self.ended_at,
                "seconds": self.ended_at - self.started_at}


def describe(params: Any) -> Any:
    """``params`` as JSON-ready data: numbers, strings, lists and dicts as they are, an object by
    its ``source`` (a cost model's) or its type name, so a point that carries a model or a cost
    model can still be stored."""
    if params is None or isinstance(params, (bool, int, float, str)):
        return params
    if isinstance(params, dict):
        return {str(k): describe(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return [describe(v) for v in params]
    if hasattr(params, "item") and callable(params.item):  # numpy scalars
        return params.item()
    return getattr(params, "source", None) or type(params).__name__


@functools.lru_cache(maxsize=4)
def _worker_environment(timed: bool, platform: Optional[str]) -> dict:
    """The provenance of the process running a point, once per process: the whole
    :func:`~mlxlab.core.results.environment_block` (device, BLAS, versions, commit) for a timed
    point; for a simulator point only the code (commit, dirty flag, Python), so a simulator worker
    never imports MLX."""
    from mlxlab.core.results import _git_commit, _git_dirty, environment_block

    if timed:
        return {**environment_block(platform), "host": socket.gethostname()}
    block = {"host": socket.gethostname(), "python": sys.version.split()[0], "git_commit": _git_commit(),
             "git_dirty": _git_dirty()}
    if os.environ.get("MLXLAB_SOURCE_COMMIT"):
        block["source_commit"] = os.environ["MLXLAB_SOURCE_COMMIT"]
    return block


def run_point(fn: Callable[[Any], Any], index: int, point: Any, timed: bool = False,
              platform: Optional[str] = None) -> PointResult:
    """``fn(point)`` in this process, with its bookkeeping (:class:`PointResult`): what a Dask
    worker runs for each point, and what an in-process sweep runs."""
    try:
        from distributed import get_worker

        worker = get_worker().address
    except (ImportError, ValueError):  # no Dask, or not on a worker
        worker = "in-process"
    env = _worker_environment(timed, platform)
    started = time.time()
    value = fn(point)
    ended = time.time()
    return PointResult(index, point, value, socket.gethostname(), worker, os.getpid(), started, ended, env)


def _dask():
    try:
        import distributed
    except ImportError:
        raise ValueError("a sweep over a cluster needs Dask distributed: pip install -e '.[cluster]' "
                         "(or pip install distributed)") from None
    return distributed


def local_accelerators() -> int:
    """How many timed points this machine can run at once: its GPUs on CUDA (through
    ``mx.device_count``, respecting ``CUDA_VISIBLE_DEVICES``), else 1 (a CPU or an Apple GPU is one
    device). MLX is imported only here."""
    if sys.platform == "darwin":
        return 1
    import mlx.core as mx  # mlx: only to count the GPUs a local cluster pins its workers to

    return max(1, int(mx.device_count(mx.gpu)))


def _pinned_env(i: int, accelerators: int) -> dict:
    """Worker ``i``'s ``CUDA_VISIBLE_DEVICES`` when a local cluster has several GPUs: the ``i``-th
    visible one, so each accelerator worker times its own GPU; nothing with one accelerator."""
    if accelerators < 2 or i >= accelerators:
        return {}
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return {"CUDA_VISIBLE_DEVICES": visible[i] if i < len(visible) else str(i)}


def start_local_cluster(n_workers: Optional[int] = None, accelerators: Optional[int] = None,
                        timeout_s: float = LOCAL_START_S):
    """A Dask cluster of ``n_workers`` worker processes on this machine (default: one per CPU
    core), one thread each, listening on loopback only, no dashboard. The first ``accelerators``
    workers (default :func:`local_accelerators`, at most ``n_workers``) get ``accelerator=1``,
    each pinned to its own GPU when there are several. No memory limit: a worker's nanny must not
    pause or restart a study in the middle of a measurement (the studies are sized by their
    options). Returns the ``distributed.SpecCluster``."""
    distributed = _dask()
    import logging

    import dask

    n = int(os.cpu_count() or 1) if n_workers is None else int(n_workers)
    if n < 1:
        raise ValueError(f"a local cluster needs at least 1 worker, got {n_workers}")
    acc = min(n, local_accelerators() if accelerators is None else int(accelerators))
    if acc < 0:
        raise ValueError(f"accelerators must be 0 or more, got {accelerators}")

    def worker(i: int) -> dict:
        return {"cls": distributed.Nanny,
                "options": {"host": "127.0.0.1", "nthreads": 1, "memory_limit": 0, "dashboard": False,
                            "silence_logs": logging.ERROR, "death_timeout": timeout_s,
                            "resources": {ACCELERATOR: 1} if i < acc else {}, "env": _pinned_env(i, acc)}}

    scheduler = {"cls": distributed.Scheduler,
                 # its HTTP server (health checks, metrics) on a free loopback port, never on 8787 of every interface
                 "options": {"host": "127.0.0.1", "dashboard": False, "dashboard_address": "127.0.0.1:0"}}
    with dask.config.set({"distributed.comm.timeouts.connect": f"{timeout_s}s"}):
        return distributed.SpecCluster(scheduler=scheduler, workers={i: worker(i) for i in range(n)},
                                       silence_logs=logging.ERROR)


def _scheduler_workers(dask_scheduler) -> Dict[str, dict]:
    """Run on the scheduler: its workers, address -> host, threads and resources (read from the
    scheduler's own worker states, which every version of distributed keeps)."""
    return {a: {"host": ws.host, "nthreads": ws.nthreads, "resources": dict(ws.resources or {})}
            for a, ws in dask_scheduler.workers.items()}


def _probe(address: str, timeout_s: float) -> None:
    """Raise a one-line ValueError unless a Dask scheduler answers at ``address`` within
    ``timeout_s``: opened as a bare connection first, so a wrong address never leaves a
    half-started client behind (its clean-up would print a traceback at exit). Runs on its own
    thread, so it also works inside a notebook's running event loop."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from distributed.comm import connect

    async def knock() -> None:
        comm = await connect(address, timeout=timeout_s)
        await comm.close()

    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, knock()).result()
    except (ValueError, TypeError) as e:
        raise ValueError(f"{address!r} is not a scheduler address ({e}): give tcp://HOST:PORT, as `dask scheduler` "
                         f"prints it, or local") from None
    except (OSError, TimeoutError) as e:
        raise ValueError(f"no Dask scheduler answered at {address} within {timeout_s:g} s ({type(e).__name__}): "
                         f"start one there (`dask scheduler`, then `{WORKER_COMMAND.replace('ADDRESS', address)}` "
                         f"on each machine) or use --cluster local") from None


class Sweep:
    """Runs a sweep's points on a Dask cluster: a local one (``address`` None or ``"local"``) or
    the scheduler at ``address`` (``tcp://host:port``, or ``host:port``).

    n_workers, accelerators: the local cluster's (:func:`start_local_cluster`); timeout_s: how long
    to wait for the scheduler to answer and for a first worker (default :data:`CONNECT_TIMEOUT_S`,
    a local cluster :data:`LOCAL_START_S`); progress: a progress bar over the
    points as they finish (tqdm, on stderr); platform: the results platform named in a timed
    point's provenance (default: the worker's own). Use as a context manager, or :meth:`close`.
    """

    def __init__(self, address: Optional[str] = None, *, n_workers: Optional[int] = None,
                 accelerators: Optional[int] = None, timeout_s: Optional[float] = None, progress: bool = True,
                 platform: Optional[str] = None):
        distributed = _dask()
        self.local = address in (None, "", "local")
        timeout_s = float(timeout_s or (LOCAL_START_S if self.local else CONNECT_TIMEOUT_S))
        self.progress, self.platform = progress, platform
        self.results: List[PointResult] = []  # every point run, over all calls, in the order they were asked
        self._calls: List[str] = []  # per result: "<desc> #<call>", the run() call it came from
        self._cluster = start_local_cluster(n_workers, accelerators, timeout_s) if self.local else None
        if not self.local:
            _probe(str(address), timeout_s)
        try:
            self.client = distributed.Client(address if self._cluster is None else self._cluster,
                                             timeout=f"{timeout_s}s", set_as_default=False)
            self.client.wait_for_workers(1, timeout=timeout_s)
        except (OSError, TimeoutError, distributed.TimeoutError) as e:
            if self._cluster is not None:
                self._cluster.close()
            raise ValueError(f"the Dask scheduler at {address or 'local'} has no worker after {timeout_s:g} s "
                             f"({type(e).__name__}): start one on each machine as "
                             f"`{WORKER_COMMAND.replace('ADDRESS', str(address))}`") from None
        self.address = self.client.scheduler.address

    # ------------------------------------------------------------------ the workers
    def workers(self) -> Dict[str, dict]:
        """The cluster's workers now: address -> host, threads and resources."""
        return self.client.run_on_scheduler(_scheduler_workers)

    def _check_accelerators(self) -> None:
        if not any(w["resources"].get(ACCELERATOR, 0) >= 1 for w in self.workers().values()):
            raise ValueError(f"no worker of the cluster at {self.address} offers the {ACCELERATOR!r} resource, so "
                             f"a timed point would wait forever: start each machine's worker as "
                             f"`{WORKER_COMMAND.replace('ADDRESS', self.address)}`")

    def accelerator_platform(self) -> str:
        """The results platform (:func:`~mlxlab.core.environment.platform_name`, e.g. ``h200``,
        ``cpu``) of the workers that hold an accelerator, asked of them before anything runs;
        ValueError if there are none or they name different platforms (one results folder
        must not mix machines)."""
        from mlxlab.core.environment import platform_name

        self._check_accelerators()
        timed = [a for a, w in self.workers().items() if w["resources"].get(ACCELERATOR, 0) >= 1]
        names = self.client.run(platform_name, workers=timed)
        distinct = sorted(set(names.values()))
        if len(distinct) > 1:
            raise ValueError(f"the accelerator workers of {self.address} are on different platforms {distinct}: run "
                             f"one kind of machine per sweep, or name the results folder with --platform")
        return distinct[0]

    # ------------------------------------------------------------------ running points
    def run(self, fn: Callable[[Any], Any], points: Sequence[Any], *, timed: bool, desc: str = "sweep",
            timeout_s: Optional[float] = None,
            on_result: Optional[Callable[[PointResult], None]] = None) -> List[PointResult]:
        """``fn(point)`` for every point, on the cluster: timed points (that time the device) one at
        a time per accelerator (resource ``accelerator: 1``), the others anywhere. ``fn`` and the
        points must pickle (a module-level function, ``functools.partial`` of one). Returns a
        :class:`PointResult` per point in input order; ``timeout_s`` bounds the whole sweep;
        ``on_result`` is called with each point as it finishes (e.g. to append it to a file, so a
        sweep cut short keeps what it measured). A point that raises cancels the rest and raises
        its error here."""
        distributed = _dask()
        points = list(points)
        if timed:
            self._check_accelerators()
        resources = {ACCELERATOR: 1} if timed else None
        futures = [self.client.submit(run_point, fn, i, p, timed, self.platform, resources=resources, pure=False,
                                      key=f"{desc}-{i}-{os.urandom(4).hex()}")
                   for i, p in enumerate(points)]
        index = {f.key: i for i, f in enumerate(futures)}
        out: List[Optional[PointResult]] = [None] * len(points)
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), desc=desc, disable=not self.progress, leave=False)
        try:
            for fut in distributed.as_completed(futures, loop=self.client.loop, timeout=timeout_s):
                r = out[index[fut.key]] = fut.result()
                if on_result is not None:
                    on_result(r)
                bar.set_postfix_str(r.host, refresh=False)
                bar.update(1)
        except BaseException:
            self.client.cancel(futures)
            raise
        finally:
            bar.close()
        self._calls.extend([f"{desc} #{len(set(self._calls)) + 1}"] * len(out))
        self.results.extend(out)
        return out

    def mapper(self, *, timed: bool, desc: str = "sweep",
               timeout_s: Optional[float] = None) -> Callable[[Callable, Sequence], List[Any]]:
        """A ``map``-like callable, ``(fn, points) -> values in input order``, that runs through
        :meth:`run`: what a study takes where it would call ``map`` in-process."""
        def map_on_cluster(fn, points):
            return [r.value for r in self.run(fn, points, timed=timed, desc=desc, timeout_s=timeout_s)]

        return map_on_cluster

    def provenance(self) -> dict:
        """What to store beside a sweep's results: the scheduler (``local`` or its address), the
        workers, every point's :meth:`PointResult.record` with the call it came from (``sweep``:
        ``"<desc> #<n>"``, its ``index`` counts within that call), and each worker's provenance
        once (``environments``: worker address -> block)."""
        envs: Dict[str, dict] = {}
        for r in self.results:
            envs.setdefault(r.worker, r.environment)
        return {"scheduler": "local" if self.local else self.address, "workers": self.workers(),
                "points": [{**r.record(), "sweep": c} for r, c in zip(self.results, self._calls)],
                "environments": envs}

    def close(self) -> None:
        """Disconnect, and stop the local cluster if this sweep started it."""
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self) -> "Sweep":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
