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

**The wire** (:mod:`mlxlab.engine.disagg_wire`): an int32 header with the metadata (index,
lengths, shapes, dtype, times), the prompt and tenant, then the stacked keys and values, over the
ring backend's point-to-point ``send``/``recv`` (mlx's NCCL backend has neither in mlx 0.32).

``recv`` blocks, so the decode worker reads messages on a :class:`Receiver` thread with its own
mlx stream (a blocked recv then holds only that stream's worker, never the engine's) and the
engine's thread polls its queue between steps; a waiting recv busy-polls a core in mlx's ring
backend, so its threads wait at idle priority (:class:`Comms`). The other direction carries *triggers*: a workload request that
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

import time
from typing import Callable, Dict, List

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxlab.core.request import Request, StepRecord
from mlxlab.core.threads import join_fully
from mlxlab.engine.disagg_wire import (  # noqa: F401 (the wire's names are this module's API too)
    HEADER, KIND_DONE, KIND_PROMPT, KIND_TRIGGER, Comms, Receiver, _send, pack_prompt, recv_message,
    send_prompt, send_signal, unpack_prompt)
from mlxlab.engine.loop import Engine, thread_stream

PREFILL_RANK, DECODE_RANK = 0, 1


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


def run_prefill(engine_factory: Callable[[Callable], PrefillEngine], workload: List[dict], comms: Comms) -> dict:
    """Rank 0: the prefill worker. Sends its start time, then each prefilled prompt as it is done;
    submits timed requests on time and a triggered one when rank 1's trigger is read, which is
    when it has nothing to prefill and no timed arrival is due (a trigger sent during a prefill
    waits in the socket till then: the trigger's time is its arrival, so the wait counts in its
    TTFT; no recv is left pending while it computes, see :class:`Comms`). Ends with a done message
    and waits for rank 1's (the round's barrier). Returns ``sent`` (index -> :func:`send_prompt`'s
    record), ``requests`` (index -> request) and ``engine``."""
    workload = check_workload(workload)
    sent: Dict[int, dict] = {}
    index_of: Dict[int, int] = {}  # request id -> workload index

    def hand_off(seq, token, t, caches):
        req = seq.req
        sent[index_of[req.id]] = send_prompt(comms, DECODE_RANK, index_of[req.id], req, token, caches,
                                             engine._t0, {"arrival": req.arrival_s, "prefill_start":
                                                          req.prefill_start_s, "first": t})

    def submit(i: int, arrival_s: float) -> None:
        index_of[engine._next_request] = i
        reqs[i] = _submit(engine, workload[i], arrival_s)

    engine = engine_factory(hand_off)
    with comms.active():
        _send(mx.array([engine._t0], dtype=mx.float64), DECODE_RANK, comms.group)
    timed, reqs = _timed_arrivals(workload), {}
    triggered = sum(r["after"] is not None for r in workload)
    while timed or triggered or engine.has_work:
        while timed and workload[timed[0]]["arrival_s"] <= engine.now():
            i = timed.pop(0)
            submit(i, workload[i]["arrival_s"])
        if engine.has_work:
            engine.step()
        elif timed:
            time.sleep(max(0.0, workload[timed[0]]["arrival_s"] - engine.now()))
        else:
            msg = recv_message(comms, DECODE_RANK)
            if msg["kind"] != KIND_TRIGGER:
                raise RuntimeError(f"the decode worker ended with {triggered} triggered requests not yet sent")
            submit(msg["index"], msg["arrival_s"])
            triggered -= 1
    send_signal(comms, DECODE_RANK, KIND_DONE)
    if recv_message(comms, DECODE_RANK)["kind"] != KIND_DONE:
        raise RuntimeError("the decode worker sent a message after the last request")
    return {"sent": sent, "requests": reqs, "engine": engine}


def run_decode(engine: DecodeEngine, workload: List[dict], comms: Comms) -> dict:
    """Rank 1: the decode worker. Adopts each prompt rank 0 sends (read on a :class:`Receiver`
    thread), decodes, sends a trigger when a triggered request's condition is met, and a done
    message once rank 0's done came and its own work ended. Returns ``requests`` (index ->
    request), ``received`` (index -> bytes and times) and ``engine``."""
    workload = check_workload(workload)
    with comms.active():
        start = mx.distributed.recv((1,), mx.float64, PREFILL_RANK, group=comms.group)
        mx.eval(start)
    engine.align_clock(float(start.item()))
    receiver = Receiver(comms, PREFILL_RANK)
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
                send_signal(comms, PREFILL_RANK, KIND_TRIGGER, i, engine.now())
            trig.cancel(engine, reqs)
            if engine.has_work:
                engine.step()
            if trig.pending and not engine.has_work and peer_done:
                raise RuntimeError(f"requests {trig.pending} wait on triggers that can no longer fire")
        engine.flush()
    join_fully(receiver)  # its OS thread too: it held an mlx stream (see mlxlab.core.threads)
    send_signal(comms, PREFILL_RANK, KIND_DONE)
    return {"requests": reqs, "received": received, "engine": engine}
