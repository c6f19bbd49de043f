"""The wire of disaggregated serving (:mod:`mlxlab.engine.disagg`) on ``mx.distributed``: the
message header, a prompt's arrays packed and unpacked, blocking sends and receives, a receiving
thread, and the scheduling of mlx's ring threads while they wait (:class:`Comms`).

Per prompt, a ``HEADER``-long int32 header (kind, workload index, prompt length, ``max_tokens``,
first token, layers, positions, KV heads, key and value head dims, dtype code, tenant bytes, times
in microseconds), then the prompt's tokens and tenant name (int32), then all layers' keys stacked
into one array and the values into another (two large sends instead of two per layer). mlx's ring
backend has point-to-point ``send``/``recv`` (each direction of a two-rank ring is its own socket,
served by its own thread), so the KV moves once, from rank 0 to rank 1. mlx's NCCL backend raises
"Send not supported" for both in mlx 0.32, so on two GPUs the KV would have to move by
``all_gather`` (both ranks in lock step, the receiver contributing a buffer of equal size): not
built here.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, List, Optional

import mlx.core as mx

from mlxlab.core.request import Request
from mlxlab.engine.batch import all_plain

HEADER = 16  # int32 fields of a message header
KIND_PROMPT, KIND_TRIGGER, KIND_DONE = 1, 2, 3
(F_KIND, F_INDEX, F_PROMPT, F_MAX, F_FIRST, F_LAYERS, F_POS, F_HEADS, F_KDIM, F_VDIM, F_DTYPE, F_TENANT,
 F_ARRIVAL_US, F_PREFILL_START_US, F_FIRST_US, F_SEND_US) = range(HEADER)
DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def _us(t: float) -> int:
    return int(round(t * 1e6))


def header_array(**fields) -> mx.array:
    """A header with ``fields`` (names of the ``F_*`` constants, lower case, without ``F_``) set."""
    h = [0] * HEADER
    for k, v in fields.items():
        h[globals()["F_" + k.upper()]] = int(v)
    return mx.array(h, dtype=mx.int32)


def _send(x: mx.array, dst: int, group) -> None:
    mx.eval(mx.distributed.send(x, dst, group=group))


def _tasks() -> set:
    return {int(t) for t in os.listdir("/proc/self/task")} if os.path.isdir("/proc/self/task") else set()


class Comms:
    """The ring group and the scheduling of its threads.

    mlx's ring backend serves each socket with a thread that **busy-polls** a non-blocking socket
    while a send or recv is pending (``SocketThread::worker`` in ``mlx/distributed/ring/ring.cpp``:
    ``recv`` in a loop on ``EAGAIN``), so a rank that waits for a message it does not know the time
    of holds a CPU core the whole wait: on a 2-core machine the waiting ranks took the computing
    ones' cores. So the threads that ``mx.distributed.init`` starts (its socket threads and its
    pool; found as the process's new threads, Linux) run on a duty cycle while they wait: at
    ``SCHED_OTHER`` for ``awake_s`` out of every ``period_s`` and at ``SCHED_IDLE`` the rest
    (SCHED_IDLE alone let a waiting recv starve for 0.8-1.3 s on the loaded machine), and at
    ``SCHED_OTHER`` throughout while a message's bytes are known to be on the way (:meth:`active`:
    a prompt's body once its header is in, every send). A wait then costs about
    ``awake_s / period_s`` of a core and notices a message within about ``period_s``. An
    unprivileged thread may switch back from ``SCHED_IDLE`` at nice 0 (sched(7)).
    ``idle_wait=False`` leaves the threads as mlx made them (the busy-poll at full priority)."""

    def __init__(self, backend: str = "ring", idle_wait: bool = True, period_s: float = 0.01, awake_s: float = 0.001):
        mx.eval(mx.zeros(1))  # the default stream's thread exists before init, so it is not taken for mlx's
        before = _tasks()
        self.group = mx.distributed.init(backend=backend, strict=True)
        self.threads = sorted(_tasks() - before) if idle_wait and hasattr(os, "SCHED_IDLE") else []
        self.idle_wait = bool(self.threads)
        self.period_s, self.awake_s = float(period_s), float(awake_s)
        self._lock, self._active, self._awake = threading.Lock(), 0, False
        if self.idle_wait:
            self._policy(os.SCHED_IDLE)
            threading.Thread(target=self._duty_cycle, daemon=True, name="mlxlab-ring-duty").start()

    def _policy(self, policy) -> None:
        for tid in self.threads:
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except OSError:  # the thread ended, or the platform refuses: it keeps its scheduling
                pass

    def _duty_cycle(self) -> None:
        while True:
            with self._lock:
                self._awake = True
                if not self._active:
                    self._policy(os.SCHED_OTHER)
            time.sleep(self.awake_s)
            with self._lock:
                self._awake = False
                if not self._active:
                    self._policy(os.SCHED_IDLE)
            time.sleep(self.period_s - self.awake_s)

    @contextmanager
    def active(self):
        """While the block runs, the ring's threads run at normal priority (nestable, any thread)."""
        if not self.idle_wait:
            yield
            return
        with self._lock:
            self._active += 1
            if self._active == 1 and not self._awake:
                self._policy(os.SCHED_OTHER)
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0 and not self._awake:
                    self._policy(os.SCHED_IDLE)


# ----------------------------------------------------------------------------- the wire


def pack_prompt(index: int, req: Request, first_token: int, caches: Optional[list], t0: float,
                times: Dict[str, float]) -> list:
    """One prefilled prompt as the arrays that travel, in order: header, prompt + tenant, and with
    ``caches`` (the prompt's per-layer plain ``KVCache``; None: the request is already done, no KV
    travels) all layers' keys, then values, each ``(layers, 1, heads, positions, dim)``.
    ``times``: ``arrival``, ``prefill_start``, ``first`` (engine seconds); the header's send time
    is now, on the clock ``t0`` starts."""
    keys = values = None
    if caches is not None:
        if not all_plain(caches):
            raise ValueError("disaggregation sends plain KVCache layers only (no quantized, rotating or SSM caches)")
        pos = caches[0].offset
        keys = mx.stack([c.keys[..., :pos, :] for c in caches])
        values = mx.stack([c.values[..., :pos, :] for c in caches])
        mx.eval(keys, values)
    tenant = list(req.tenant.encode())
    kv = {} if keys is None else dict(layers=keys.shape[0], pos=keys.shape[3], heads=keys.shape[2],
                                      kdim=keys.shape[4], vdim=values.shape[4], dtype=DTYPES.index(keys.dtype))
    head = header_array(kind=KIND_PROMPT, index=index, prompt=len(req.prompt), max=req.max_tokens, first=first_token,
                        tenant=len(tenant), arrival_us=_us(times["arrival"]),
                        prefill_start_us=_us(times["prefill_start"]), first_us=_us(times["first"]),
                        send_us=_us(time.perf_counter() - t0), **kv)
    return [head, mx.array(req.prompt + tenant, dtype=mx.int32)] + ([] if keys is None else [keys, values])


def unpack_prompt(h: List[int], text: List[int], keys: Optional[mx.array], values: Optional[mx.array]) -> dict:
    """A received prompt message as a dict (see :func:`recv_message`)."""
    return {"kind": h[F_KIND], "index": h[F_INDEX], "arrival_s": h[F_ARRIVAL_US] / 1e6, "prompt": text[:h[F_PROMPT]],
            "tenant": bytes(text[h[F_PROMPT]:]).decode(), "max_tokens": h[F_MAX], "first_token": h[F_FIRST],
            "positions": h[F_POS], "prefill_start_s": h[F_PREFILL_START_US] / 1e6, "first_s": h[F_FIRST_US] / 1e6,
            "send_start_s": h[F_SEND_US] / 1e6, "keys": keys, "values": values,
            "bytes": 4 * (HEADER + len(text)) + (0 if keys is None else keys.nbytes + values.nbytes)}


def send_prompt(comms: Comms, dst: int, index: int, req: Request, first_token: int, caches: Optional[list],
                t0: float, times: Dict[str, float]) -> dict:
    """Send one prefilled prompt (:func:`pack_prompt`'s arrays, one ``send`` each). Returns what was
    sent: ``bytes`` (all of it), ``kv_bytes``, ``positions``, ``pack_s`` (stacking the layers),
    ``send_s`` and the send's start and end (seconds on ``t0``'s clock)."""
    t_pack = time.perf_counter()
    arrays = pack_prompt(index, req, first_token, caches, t0, times)
    t_send = time.perf_counter()
    with comms.active():
        for x in arrays:
            _send(x, dst, comms.group)
    t_end = time.perf_counter()
    return {"bytes": int(sum(x.nbytes for x in arrays)), "kv_bytes": int(sum(x.nbytes for x in arrays[2:])),
            "positions": int(arrays[0][F_POS].item()), "pack_s": t_send - t_pack, "send_s": t_end - t_send,
            "send_start_s": t_send - t0, "send_end_s": t_end - t0}


def send_signal(comms: Comms, dst: int, kind: int, index: int = 0, t_s: float = 0.0) -> None:
    """A header-only message: a trigger (``index`` arrives at ``t_s``) or done."""
    with comms.active():
        _send(header_array(kind=kind, index=index, arrival_us=_us(t_s)), dst, comms.group)


def recv_message(comms: Comms, src: int) -> dict:
    """Receive one message (blocking): ``kind``, ``index``, and for a prompt its ``prompt``,
    ``tenant``, ``max_tokens``, ``first_token``, ``keys``/``values`` (None without KV) and times.
    The header is awaited with the ring's threads idle (:class:`Comms`), the body received active."""
    group = comms.group
    head = mx.distributed.recv((HEADER,), mx.int32, src, group=group)
    mx.eval(head)
    h = head.tolist()
    msg = {"kind": h[F_KIND], "index": h[F_INDEX], "arrival_s": h[F_ARRIVAL_US] / 1e6}
    if h[F_KIND] != KIND_PROMPT:
        return msg
    with comms.active():
        return _recv_body(group, src, h)


def _recv_body(group, src: int, h: List[int]) -> dict:
    text = mx.distributed.recv((h[F_PROMPT] + h[F_TENANT],), mx.int32, src, group=group)
    mx.eval(text)
    keys = values = None
    if h[F_POS]:
        dtype = DTYPES[h[F_DTYPE]]
        keys = mx.distributed.recv((h[F_LAYERS], 1, h[F_HEADS], h[F_POS], h[F_KDIM]), dtype, src, group=group)
        mx.eval(keys)
        values = mx.distributed.recv((h[F_LAYERS], 1, h[F_HEADS], h[F_POS], h[F_VDIM]), dtype, src, group=group)
        mx.eval(values)
    return unpack_prompt(h, text.tolist(), keys, values)


class Receiver(threading.Thread):
    """Receives messages from ``src`` on its own thread and mlx stream until a done message; each
    lands in ``messages`` with ``received_at`` (the clock's reading as its last byte came)."""

    def __init__(self, comms: Comms, src: int, clock: Callable[[], float] = time.perf_counter):
        super().__init__(daemon=True, name=f"mlxlab-recv-{src}")
        self.comms, self.src, self.clock = comms, src, clock
        self.messages: "queue.Queue[dict]" = queue.Queue()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            with mx.stream(mx.new_stream(mx.cpu)):
                while True:
                    msg = recv_message(self.comms, self.src)
                    msg["received_at"] = self.clock()
                    self.messages.put(msg)
                    if msg["kind"] == KIND_DONE:
                        return
        except BaseException as e:  # handed to the engine's thread, which raises it
            self.error = e
            self.messages.put({"kind": KIND_DONE, "error": True})

    def get(self, timeout: Optional[float]) -> Optional[dict]:
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            return None
        if self.error is not None:
            raise RuntimeError(f"the receiver of rank {self.src}'s messages failed: {self.error!r}") from self.error
        return msg
