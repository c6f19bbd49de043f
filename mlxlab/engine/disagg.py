"""Prefill/decode disaggregation over ``mx.distributed`` (issue 21): a prefill worker and a decode
worker in two processes, as DistServe and Splitwise split them across machines.

Rank 0, the **prefill worker** (:class:`PrefillEngine`), is an :class:`mlxlab.engine.loop.Engine`
whose policy plans only chunks (it never holds a decode row). When a prompt's prefill completes it
runs the prompt's last token through the model on the prompt's own cache (the first decode
forward, batch 1, what overlap mode's hand-back runs: ``OverlapSteps._first_token``), and sends the
first token and the KV cache of every prompt position, trimmed to the prompt's length, to rank 1.
Rank 1, the **decode worker** (:class:`DecodeEngine`), adopts each prompt as a sequence whose
prefill is done and whose first token is issued (overlap mode's protocol: the next decode input is
that token), so it joins the decode batch at the next decode like any prefilled sequence, and
streams the rest. A request that the first token ends (``max_tokens`` 1, a stop token) travels
without KV: nobody would read it.

**The wire** (:func:`send_prompt` / :func:`recv_message`): per prompt, a ``HEADER``-long int32
header (kind, workload index, prompt length, ``max_tokens``, first token, layers, positions, KV
heads, key and value head dims, dtype code, tenant bytes, times in microseconds), then the prompt's
tokens and tenant name (int32), then all layers' keys stacked into one array and the values into
another (two large sends instead of two per layer). mlx's ring backend has point-to-point
``send``/``recv`` (each direction of a two-rank ring is its own socket, served by its own thread), so
the KV moves only once and only from rank 0 to rank 1. mlx's NCCL backend raises "Send not
supported" for both in mlx 0.32, so on two GPUs the KV would have to move by ``all_gather``
(both ranks in lock step, the receiver contributing a buffer of equal size): not built here.

``recv`` blocks, so each rank reads messages on a :class:`Receiver` thread with its own mlx stream
(a blocked recv then holds only that stream's worker, never the engine's) and the engine's thread
polls its queue between steps. The other direction carries *triggers*: a workload request that
arrives "after request j has n tokens" (the contention workload's document, arriving once the
chat streams) is noticed on the decode worker, which sends the trigger's index and time to rank 0.

**Clocks.** Times are seconds since a start that rank 0 sends rank 1 (``time.perf_counter``, the
host's CLOCK_MONOTONIC): both processes read one clock on one host. Across hosts the start would
need an offset estimate; not needed on loopback.

**Workloads** (:func:`check_workload`): a list of requests, each ``{"prompt", "max_tokens",
"tenant", "arrival_s" | "after": [j, n], "until": [j, n]}`` (``until``: cancel this request once
request j is done and this one has n more tokens since j's first). :func:`run_local` runs one on
a single engine (the baseline, the same triggers checked in process), :func:`run_prefill` and
:func:`run_decode` on the two ranks.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Dict, List, Optional

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxlab.core.request import Request, StepRecord
from mlxlab.engine.batch import all_plain
from mlxlab.engine.loop import Engine, thread_stream

HEADER = 16  # int32 fields of a message header
KIND_PROMPT, KIND_TRIGGER, KIND_DONE, KIND_START = 1, 2, 3, 4
(F_KIND, F_INDEX, F_PROMPT, F_MAX, F_FIRST, F_LAYERS, F_POS, F_HEADS, F_KDIM, F_VDIM, F_DTYPE, F_TENANT,
 F_ARRIVAL_US, F_PREFILL_START_US, F_FIRST_US, F_SEND_US) = range(HEADER)
DTYPES = (mx.float32, mx.float16, mx.bfloat16)
PREFILL_RANK, DECODE_RANK = 0, 1


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


def send_prompt(group, dst: int, index: int, req: Request, first_token: int, caches: Optional[list],
                t0: float, times: Dict[str, float]) -> dict:
    """Send one prefilled prompt (:func:`pack_prompt`'s arrays, one ``send`` each). Returns what was
    sent: ``bytes`` (all of it), ``kv_bytes``, ``positions``, ``pack_s`` (stacking the layers),
    ``send_s`` and the send's start and end (seconds on ``t0``'s clock)."""
    t_pack = time.perf_counter()
    arrays = pack_prompt(index, req, first_token, caches, t0, times)
    t_send = time.perf_counter()
    for x in arrays:
        _send(x, dst, group)
    t_end = time.perf_counter()
    return {"bytes": int(sum(x.nbytes for x in arrays)), "kv_bytes": int(sum(x.nbytes for x in arrays[2:])),
            "positions": int(arrays[0][F_POS].item()), "pack_s": t_send - t_pack, "send_s": t_end - t_send,
            "send_start_s": t_send - t0, "send_end_s": t_end - t0}


def send_signal(group, dst: int, kind: int, index: int = 0, t_s: float = 0.0) -> None:
    """A header-only message: a trigger (``index`` arrives at ``t_s``), done, or the start."""
    _send(header_array(kind=kind, index=index, arrival_us=_us(t_s)), dst, group)


def recv_message(group, src: int) -> dict:
    """Receive one message (blocking): ``kind``, ``index``, and for a prompt its ``prompt``,
    ``tenant``, ``max_tokens``, ``first_token``, ``keys``/``values`` (None without KV) and times."""
    head = mx.distributed.recv((HEADER,), mx.int32, src, group=group)
    mx.eval(head)
    h = head.tolist()
    msg = {"kind": h[F_KIND], "index": h[F_INDEX], "arrival_s": h[F_ARRIVAL_US] / 1e6}
    if h[F_KIND] != KIND_PROMPT:
        return msg
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
    lands in ``messages`` with ``received_s`` (seconds since ``start``, set once known)."""

    def __init__(self, group, src: int, clock: Callable[[], float] = time.perf_counter):
        super().__init__(daemon=True, name=f"mlxlab-recv-{src}")
        self.group, self.src, self.clock = group, src, clock
        self.messages: "queue.Queue[dict]" = queue.Queue()
        self.start_time: Optional[float] = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            with mx.stream(mx.new_stream(mx.cpu)):
                while True:
                    msg = recv_message(self.group, self.src)
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


# ----------------------------------------------------------------------------- the two engines


def _check_disaggregable(kwargs: dict) -> None:
    for k in ("overlap", "prefix_cache", "draft_model"):
        if kwargs.get(k):
            raise ValueError(f"a disaggregated engine does not take {k}={kwargs[k]!r}: leave it out")


class PrefillEngine(Engine):
    """Rank 0's engine: chunks only; each finished prompt is handed to ``hand_off(seq, first_token,
    t)`` with its KV in ``seq.cache`` and ends here (finish reason "handed_off", its first token
    read). Engine options as :class:`Engine`, without overlap, prefix cache or draft model."""

    def __init__(self, model, hand_off: Callable, **kwargs):
        _check_disaggregable(kwargs)
        super().__init__(model, overlap=False, **kwargs)
        self._hand_off_to = hand_off

    def submit(self, prompt_tokens, max_tokens: int = 256, **kwargs) -> Request:
        for k in ("kv_bits", "num_draft_tokens"):
            if kwargs.get(k):
                raise ValueError(f"a disaggregated request does not take {k}: its KV travels as plain arrays")
        req = super().submit(prompt_tokens, max_tokens, **kwargs)
        seq = self._seqs[req.id]
        if seq in self._ready:  # a one-token prompt: nothing to prefill, its first forward runs now
            self._ready.remove(seq)
            seq.cache = make_prompt_cache(self.module)
            with mx.stream(thread_stream()):
                self._hand_off(seq)
        return req

    def _prefill_done(self, seq) -> None:
        super()._prefill_done(seq)
        self._ready.remove(seq)
        self._hand_off(seq)

    def _hand_off(self, seq) -> None:
        if seq.req.prefill_start_s is None:
            seq.req.prefill_start_s = self.now()
        token = self._first_token(seq)
        t = self.now()
        seq.issued += 1
        self._deliver(_READ, [seq], [token], t)
        done = seq.req.done
        if not done:
            self._finish(seq, "handed_off", t)
        self._hand_off_to(seq, token, t, None if done else seq.cache)
        seq.cache = None


_READ = StepRecord(-1, 1.0, 1.0, "", [], [])  # a token read outside any step (ended: no policy sees it)


class DecodeEngine(Engine):
    """Rank 1's engine: :meth:`adopt` takes a prompt prefilled on rank 0 (its KV and first token)
    into the decode batch. Engine options as :class:`Engine`, without overlap, prefix cache or
    draft model."""

    def __init__(self, model, **kwargs):
        _check_disaggregable(kwargs)
        super().__init__(model, overlap=False, **kwargs)

    def align_clock(self, start: float) -> None:
        """Read seconds from ``start`` (the prefill worker's start, same host clock)."""
        self._t0 = start

    def adopt(self, msg: dict, t: float) -> Request:
        """A received prompt (:func:`recv_message`) becomes a sequence whose prefill is done and
        whose first token (read at ``t``) is issued: it joins the batch at the next decode."""
        prompt = self._validate(msg["prompt"], msg["max_tokens"])
        req = self._enqueue(prompt, msg["max_tokens"], tenant=msg["tenant"], arrival_s=msg["arrival_s"],
                            stop_tokens=())
        seq = self._seqs[req.id]
        if msg["keys"] is not None:
            if msg["positions"] != len(prompt) or msg["keys"].shape[0] != len(make_prompt_cache(self.module)):
                raise ValueError(f"received KV of {msg['positions']} positions x {msg['keys'].shape[0]} layers "
                                 f"for a {len(prompt)}-token prompt on a model of another shape: same model on both ranks")
            seq.cache = []
            for k, v in zip(msg["keys"], msg["values"]):
                c = KVCache()
                c.keys, c.values, c.offset = k, v, msg["positions"]
                seq.cache.append(c)
        seq.prefilled = seq.prefill_tokens
        req.prefill_start_s = msg["prefill_start_s"]
        if seq in self._queue:
            self._queue.remove(seq)
            self._ready.append(seq)
        seq.issued = 1
        self._deliver(_READ, [seq], [msg["first_token"]], t)
        if req.done:  # the first token ended it: it never joins the batch
            self._ready.remove(seq)
            seq.cache = None
        return req


# ----------------------------------------------------------------------------- workloads and drivers


def check_workload(workload: List[dict]) -> List[dict]:
    """The workload's requests with defaults filled (see the module docstring); ``ValueError``
    naming the request for a missing prompt, a bad ``max_tokens`` or a trigger on a later request."""
    if not workload:
        raise ValueError("empty workload: give at least one request")
    out = []
    for i, r in enumerate(workload):
        if not r.get("prompt"):
            raise ValueError(f"request {i} has no prompt: give token ids")
        if not isinstance(r.get("max_tokens"), int) or r["max_tokens"] < 1:
            raise ValueError(f"request {i}: max_tokens must be a positive integer, got {r.get('max_tokens')!r}")
        for key in ("after", "until"):
            if r.get(key) is not None and not (0 <= int(r[key][0]) < i if key == "after" else 0 <= int(r[key][0])
                                               < len(workload)):
                raise ValueError(f"request {i}: {key} names request {r[key][0]}, which is not an earlier request")
        out.append({"prompt": [int(t) for t in r["prompt"]], "max_tokens": int(r["max_tokens"]),
                    "tenant": str(r.get("tenant", "default")), "arrival_s": float(r.get("arrival_s", 0.0)),
                    "after": None if r.get("after") is None else [int(x) for x in r["after"]],
                    "until": None if r.get("until") is None else [int(x) for x in r["until"]]})
    return out


class Triggers:
    """The workload's ``after`` and ``until`` conditions over the requests seen so far (by
    workload index): :meth:`fired` returns the triggers that are due (once each), :meth:`cancel`
    cancels the requests whose ``until`` is met."""

    def __init__(self, workload: List[dict]):
        self.workload = workload
        self.pending = [i for i, r in enumerate(workload) if r["after"] is not None]

    def fired(self, reqs: Dict[int, Request]) -> List[int]:
        due = [i for i in self.pending if self.workload[i]["after"][0] in reqs
               and len(reqs[self.workload[i]["after"][0]].output_tokens) >= self.workload[i]["after"][1]]
        self.pending = [i for i in self.pending if i not in due]
        return due

    def cancel(self, engine: Engine, reqs: Dict[int, Request]) -> None:
        for i, req in reqs.items():
            until = self.workload[i]["until"]
            other = reqs.get(until[0]) if until else None
            if other is not None and other.done and other.token_times_s and not req.done and \
                    sum(t > other.token_times_s[0] for t in req.token_times_s) >= until[1]:
                engine.cancel(req)


def _timed_arrivals(workload: List[dict]) -> List[int]:
    return sorted((i for i, r in enumerate(workload) if r["after"] is None), key=lambda i: workload[i]["arrival_s"])


def _submit(engine: Engine, r: dict, arrival_s: float) -> Request:
    return engine.submit(r["prompt"], r["max_tokens"], tenant=r["tenant"], arrival_s=arrival_s)


def run_local(engine: Engine, workload: List[dict]) -> Dict[int, Request]:
    """The workload on one engine, triggers checked between steps; returns index -> request."""
    workload = check_workload(workload)
    timed, trig, reqs = _timed_arrivals(workload), Triggers(workload), {}
    with engine:
        while timed or trig.pending or engine.has_work:
            while timed and workload[timed[0]]["arrival_s"] <= engine.now():
                i = timed.pop(0)
                reqs[i] = _submit(engine, workload[i], workload[i]["arrival_s"])
            for i in trig.fired(reqs):
                reqs[i] = _submit(engine, workload[i], engine.now())
            trig.cancel(engine, reqs)
            if engine.has_work:
                engine.step()
            elif timed:
                time.sleep(max(0.0, workload[timed[0]]["arrival_s"] - engine.now()))
            elif trig.pending:
                raise RuntimeError(f"requests {trig.pending} wait on triggers that can no longer fire")
        engine.flush()
    return reqs


def run_prefill(engine_factory: Callable[[Callable], PrefillEngine], workload: List[dict], group) -> dict:
    """Rank 0: the prefill worker. Sends the start, then each prefilled prompt; submits timed
    requests on time and triggered ones when rank 1's trigger comes; ends with a done message and
    waits for rank 1's. Returns ``sent`` (index -> :func:`send_prompt`'s record), ``requests``
    (index -> request) and ``engine``."""
    workload = check_workload(workload)
    sent: Dict[int, dict] = {}
    index_of: Dict[int, int] = {}  # request id -> workload index

    def hand_off(seq, token, t, caches):
        req = seq.req
        sent[index_of[req.id]] = send_prompt(group, DECODE_RANK, index_of[req.id], req, token, caches,
                                             engine._t0, {"arrival": req.arrival_s, "prefill_start":
                                                          req.prefill_start_s, "first": t})

    engine = engine_factory(hand_off)
    receiver = Receiver(group, DECODE_RANK)
    receiver.start()
    mx.eval(mx.distributed.send(mx.array([engine._t0], dtype=mx.float64), DECODE_RANK, group=group))
    timed, reqs, waiting, peer_done = _timed_arrivals(workload), {}, len(workload), False

    while waiting or engine.has_work:
        while timed and workload[timed[0]]["arrival_s"] <= engine.now():
            i = timed.pop(0)
            index_of[engine._next_request] = i
            reqs[i] = _submit(engine, workload[i], workload[i]["arrival_s"])
            waiting -= 1
        if engine.has_work:
            engine.step()
            msg = receiver.get(timeout=0) if not receiver.messages.empty() else None
        else:
            wait = workload[timed[0]]["arrival_s"] - engine.now() if timed else None
            msg = receiver.get(timeout=max(0.0, wait) if wait is not None else None)
        if msg is not None and msg["kind"] == KIND_TRIGGER:
            i = msg["index"]
            index_of[engine._next_request] = i
            reqs[i] = _submit(engine, workload[i], msg["arrival_s"])
            waiting -= 1
        elif msg is not None and msg["kind"] == KIND_DONE:
            peer_done = True
            if waiting:
                raise RuntimeError(f"the decode worker ended with {waiting} requests not yet submitted")
    send_signal(group, DECODE_RANK, KIND_DONE)
    if not peer_done:
        while receiver.get(timeout=None)["kind"] != KIND_DONE:
            pass
    receiver.join()
    return {"sent": sent, "requests": reqs, "engine": engine}


def run_decode(engine: DecodeEngine, workload: List[dict], group) -> dict:
    """Rank 1: the decode worker. Adopts each prompt rank 0 sends, decodes, sends a trigger when a
    triggered request's condition is met, and a done message once rank 0's done came and its own
    work ended. Returns ``requests`` (index -> request), ``received`` (index -> bytes and times)
    and ``engine``."""
    workload = check_workload(workload)
    start = mx.distributed.recv((1,), mx.float64, PREFILL_RANK, group=group)
    mx.eval(start)
    engine.align_clock(float(start.item()))
    receiver = Receiver(group, PREFILL_RANK)
    receiver.start()
    trig, reqs, received, peer_done = Triggers(workload), {}, {}, False
    with mx.stream(thread_stream()):
        while not peer_done or engine.has_work:
            # idle: wait for the next message (a step's tokens are what fire triggers); busy: only take what came
            msg = receiver.get(timeout=None) if not engine.has_work else \
                (receiver.get(timeout=0) if not receiver.messages.empty() else None)
            while msg is not None:
                if msg["kind"] == KIND_DONE:
                    peer_done = True
                elif msg["kind"] == KIND_PROMPT:
                    t = msg["received_at"] - engine._t0
                    reqs[msg["index"]] = engine.adopt(msg, t)
                    received[msg["index"]] = {"bytes": msg["bytes"], "positions": msg["positions"],
                                              "send_start_s": msg["send_start_s"], "received_s": t,
                                              "transfer_s": t - msg["send_start_s"], "first_s": msg["first_s"]}
                msg = receiver.get(timeout=0) if not receiver.messages.empty() else None
            for i in trig.fired(reqs):
                send_signal(group, PREFILL_RANK, KIND_TRIGGER, i, engine.now())
            trig.cancel(engine, reqs)
            if engine.has_work:
                engine.step()
            if trig.pending and not engine.has_work and peer_done:
                raise RuntimeError(f"requests {trig.pending} wait on triggers that can no longer fire")
        engine.flush()
    send_signal(group, PREFILL_RANK, KIND_DONE)
    receiver.join()
    return {"requests": reqs, "received": received, "engine": engine}
