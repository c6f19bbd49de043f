"""The faults of ``mlxlab bench soak`` (:mod:`mlxlab.studies.serving.soak`): what each one sends,
drawn from a seeded generator, and what the client saw.

:class:`FaultGenerator` draws the faults in rounds: each round is a seeded shuffle of every kind
in :data:`FAULTS`, so any ``len(FAULTS)`` draws in a row hold each kind once, however short the
run; each draw also fixes its parameters (when a client cuts, how long a slow reader stalls, how
large a burst is). The same seed draws the same faults in the same order.

:func:`run_fault` sends one fault to a server and returns one outcome record per request it made
(a burst makes several): ``kind``, ``sent`` (``time.perf_counter()``), the HTTP ``status``, the
error body's ``error_code``, ``outcome`` (see :data:`OUTCOMES`) and, for the streams, the token
ids received. Bodies that are not JSON, and clients that vanish or stall, go over a raw socket
(what a broken client does, which an HTTP library would not let it do). Importing this module
loads no MLX.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from typing import Dict, List, Optional
from urllib.parse import urlsplit

#: every fault kind, in the order the results list them
FAULTS = ("disconnect_prefill", "disconnect_decode", "malformed_json", "wrong_type", "over_context",
          "max_tokens_zero", "max_tokens_huge", "burst", "bad_kv_bits", "unknown_model", "slow_reader")
#: what became of a request: ``finished`` (its response or stream ended with a finish reason),
#: ``refused`` (a 4xx with an error body), ``cancelled`` (the client cut it, on purpose),
#: ``server_error`` (a 5xx), ``stream_error`` (a 200 stream that ended without its finish, or any
#: other failure the client did not cause)
OUTCOMES = ("finished", "refused", "cancelled", "server_error", "stream_error")
#: the kv_bits values no backend runs (mlxlab takes 4 and 8, on backends whose quantized attention works)
BAD_KV_BITS = (2, 3, 5, 16)
IO_TIMEOUT_S = 600.0


class FaultGenerator:
    """Seeded faults (see the module docstring): ``next()`` gives ``{"kind", ...parameters}``."""

    def __init__(self, seed: int, *, prompt_chars: int = 1024, max_in_flight: int = 8):
        self.rng = random.Random(f"soak faults {seed}")
        self.prompt_chars, self.max_in_flight = prompt_chars, max_in_flight
        self._round: List[str] = []

    def next(self) -> Dict:
        if not self._round:
            self._round = list(FAULTS)
            self.rng.shuffle(self._round)
        kind, r = self._round.pop(), self.rng
        f = {"kind": kind, "text_seed": r.randrange(2 ** 31)}
        if kind == "disconnect_prefill":  # a long prompt, the socket closed before its first token
            f.update(prompt_chars=self.prompt_chars, cut_after_s=r.uniform(0.02, 0.5))
        elif kind == "disconnect_decode":  # cut after a few streamed tokens; or, not streaming, while it decodes
            f.update(prompt_chars=r.randint(16, 256), max_tokens=r.randint(32, 128), cut_after_tokens=r.randint(1, 8),
                     stream=r.random() < 0.7, cut_after_s=r.uniform(0.2, 1.0))
        elif kind == "slow_reader":  # reads a chunk or two, then stops reading for a while, then leaves
            f.update(prompt_chars=r.randint(16, 256), max_tokens=r.randint(64, 256), read_chunks=r.randint(1, 3),
                     stall_s=r.uniform(1.0, 8.0))
        elif kind == "burst":  # more concurrent streams than --max-in-flight admits
            f.update(streams=self.max_in_flight + r.randint(2, 8), prompt_chars=r.randint(8, 64),
                     max_tokens=r.randint(2, 16))
        elif kind == "wrong_type":
            f.update(field=r.choice(["max_tokens", "prompt", "temperature", "stream", "stop", "model"]))
        elif kind == "malformed_json":
            f.update(body=r.choice(['{"model": ', "not json at all", '{"model": "m", "prompt": "x",}', "[1, 2",
                                    '\xff\xfe{"a"']))
        elif kind == "bad_kv_bits":
            f.update(kv_bits=r.choice(BAD_KV_BITS))
        elif kind == "max_tokens_huge":
            f.update(max_tokens=r.choice([10 ** 6, 2 ** 31 - 1, 10 ** 12]))
        return f


# ----------------------------------------------------------------------------- raw HTTP
def _connect(url: str) -> socket.socket:
    u = urlsplit(url)
    s = socket.create_connection((u.hostname, u.port), timeout=IO_TIMEOUT_S)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a stalled reader's window fills soon
    return s


def _post(url: str, path: str, body: bytes) -> socket.socket:
    s = _connect(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    s.sendall(head + body)
    return s


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk


def _status(raw: bytes) -> Optional[int]:
    try:
        return int(raw.split(b"\r\n", 1)[0].split()[1])
    except (IndexError, ValueError):
        return None


def _record(kind: str, sent: float, status: Optional[int], raw_body: bytes = b"", **extra) -> Dict:
    from mlxlab.studies.serving.against import error_code

    outcome = ("server_error" if status and status >= 500 else "refused" if status and 400 <= status < 500
               else "finished" if status == 200 else "stream_error")
    return {"kind": kind, "sent": sent, "status": status, "error_code": error_code(raw_body) if status != 200 else None,
            "outcome": outcome, **extra}


def post_raw(url: str, kind: str, body: bytes, path: str = "/v1/completions") -> Dict:
    """One non-streaming request with ``body`` as its bytes; its status and error code."""
    sent = time.perf_counter()
    try:
        with _post(url, path, body) as s:
            raw = _read_all(s)
    except OSError as e:
        return {**_record(kind, sent, None), "error": f"{type(e).__name__}: {e}"}
    head, _, payload = raw.partition(b"\r\n\r\n")
    return _record(kind, sent, _status(head), payload)


def _sse_body(model: str, prompt: str, max_tokens: int) -> bytes:
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0.0, "user": "faults"}).encode()


def _tokens_in(raw: bytes) -> int:
    """Token ids in the SSE events received so far (complete lines only)."""
    n = 0
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                n += len(json.loads(line[6:])["choices"][0].get("token_ids") or [])
            except (ValueError, KeyError, IndexError):
                pass
    return n


def cut_stream(url: str, kind: str, body: bytes, *, after_s: Optional[float] = None, after_tokens: Optional[int] = None,
               read_chunks: int = 0, stall_s: float = 0.0) -> Dict:
    """A streaming request whose client leaves: after ``after_s`` seconds (reading nothing), or
    once ``after_tokens`` tokens came, or after ``read_chunks`` reads and ``stall_s`` seconds of
    not reading (a slow reader). ``outcome``: ``cancelled``, or what the response said if it
    ended first (a 4xx or 5xx, or a stream that finished); ``got_tokens``: tokens seen before."""
    sent = time.perf_counter()
    raw = b""
    try:
        with _post(url, "/v1/completions", body) as s:
            if after_s is not None:
                time.sleep(after_s)
                s.setblocking(False)
                try:
                    raw = s.recv(65536)
                except BlockingIOError:
                    pass
            else:
                reads = 0
                while b"data: [DONE]" not in raw:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    raw, reads = raw + chunk, reads + 1
                    if after_tokens is not None and _tokens_in(raw) >= after_tokens:
                        break
                    if read_chunks and reads >= read_chunks and b"\r\n\r\n" in raw:
                        time.sleep(stall_s)  # the window fills; the server must not wait on this reader
                        break
            s.shutdown(socket.SHUT_RDWR)
    except OSError as e:
        return {**_record(kind, sent, _status(raw)), "error": f"{type(e).__name__}: {e}"}
    status = _status(raw)
    head, _, payload = raw.partition(b"\r\n\r\n")
    rec = _record(kind, sent, status, payload, got_tokens=_tokens_in(raw))
    if status in (None, 200) and b"data: [DONE]" not in raw and not (status == 200 and b'"finish_reason"' in payload
                                                                       and b"data:" not in payload):
        rec["outcome"] = "cancelled"
    return rec


# ----------------------------------------------------------------------------- one fault
def run_fault(fault: Dict, url: str, model: str, max_context: int) -> List[Dict]:
    """Send ``fault`` (from :class:`FaultGenerator`) to the server at ``url`` serving ``model``
    (``max_context`` tokens); one outcome record per request made."""
    from mlxlab.studies.serving.against import text

    kind, rng = fault["kind"], random.Random(fault["text_seed"])
    ok = {"model": model, "prompt": "a well-formed prompt", "max_tokens": 4, "temperature": 0.0}
    if kind == "disconnect_prefill":
        return [cut_stream(url, kind, _sse_body(model, text(fault["prompt_chars"], rng), 64), after_s=fault["cut_after_s"])]
    if kind == "disconnect_decode":
        body = _sse_body(model, text(fault["prompt_chars"], rng), fault["max_tokens"] * (1 if fault["stream"] else 8))
        if fault["stream"]:
            return [cut_stream(url, kind, body, after_tokens=fault["cut_after_tokens"])]
        return [cut_stream(url, kind, body.replace(b'"stream": true', b'"stream": false'), after_s=fault["cut_after_s"])]
    if kind == "slow_reader":
        return [cut_stream(url, kind, _sse_body(model, text(fault["prompt_chars"], rng), fault["max_tokens"]),
                           read_chunks=fault["read_chunks"], stall_s=fault["stall_s"])]
    if kind == "burst":
        return _burst(url, model, fault, rng)
    if kind == "malformed_json":
        return [post_raw(url, kind, fault["body"].encode("latin-1"))]
    if kind == "wrong_type":
        bad = {"max_tokens": "ten", "prompt": 3.5, "temperature": "hot", "stream": "yes", "stop": 7, "model": ["m"]}
        return [post_raw(url, kind, json.dumps({**ok, fault["field"]: bad[fault["field"]]}).encode())]
    if kind == "over_context":
        return [post_raw(url, kind, json.dumps({**ok, "prompt": text(max_context + 8, rng)}).encode())]
    if kind == "max_tokens_zero":
        return [post_raw(url, kind, json.dumps({**ok, "max_tokens": 0}).encode())]
    if kind == "max_tokens_huge":
        return [post_raw(url, kind, json.dumps({**ok, "max_tokens": fault["max_tokens"]}).encode())]
    if kind == "bad_kv_bits":
        return [post_raw(url, kind, json.dumps({**ok, "kv_bits": fault["kv_bits"]}).encode())]
    if kind == "unknown_model":
        return [post_raw(url, kind, json.dumps({**ok, "model": f"no-such-model-{rng.randrange(1000)}"}).encode())]
    raise ValueError(f"unknown fault {kind!r}: choose from {FAULTS}")


def _burst(url: str, model: str, fault: Dict, rng: random.Random) -> List[Dict]:
    """``streams`` well-formed streams at once (threads released together): those over the
    server's --max-in-flight get 429; the rest must finish."""
    import httpx

    from mlxlab.studies.serving.against import stream, text

    prompts = [text(fault["prompt_chars"], rng) for _ in range(fault["streams"])]
    out: List[Dict] = []
    gate = threading.Barrier(len(prompts))

    def one(p: str) -> None:
        with httpx.Client(timeout=IO_TIMEOUT_S) as c:
            gate.wait()
            r = stream(c, url, model, p, fault["max_tokens"], user="burst")
        out.append(stream_record("burst", r, fault["max_tokens"]))

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(IO_TIMEOUT_S)
    return out


def stream_record(kind: str, r: Dict, max_tokens: int) -> Dict:
    """The outcome of a well-formed stream (:func:`mlxlab.studies.serving.against.stream`)."""
    status = r.get("status")
    if status == 200:
        outcome = "finished" if r.get("done_seen") and r.get("finish_reason") and not r.get("error") else "stream_error"
    elif status is not None and status >= 500:
        outcome = "server_error"
    elif status is not None and status >= 400:
        outcome = "refused"
    else:
        outcome = "stream_error"
    return {"kind": kind, "sent": r["sent"], "status": status, "error_code": r.get("error_code"), "outcome": outcome,
            "well_formed": True, "arrivals": r.get("arrivals", []), "tokens": r.get("tokens", []),
            "ids": r.get("ids", []), "prompt": r.get("prompt"), "max_tokens": max_tokens, "error": r.get("error")}
