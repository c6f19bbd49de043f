"""The engine's own thread: it owns the model and the :class:`mlxlab.Engine`, takes requests and
cancellations from a queue, steps the engine, and hands each request's new tokens to its HTTP
handler's asyncio queue (thread-safely, never waiting on a reader: a slow reader's tokens pile up
in its own queue, and no other stream waits for it).

Events a :class:`Stream` receives, in order: ``("started", request)``, then ``("tokens",
[ids])`` as they are read, then ``("done", finish_reason)``; or ``("error", message, param)`` if
the engine refused the request at submit.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Dict, Optional

from mlxlab.core.threads import join_fully
from mlxlab.serve.metrics import ServerMetrics

IDLE_WAIT_S = 0.05  # how long an idle engine thread waits for a request before it looks again


class Stream:
    """One request's channel from the engine thread to its handler (made on the handler's loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tenant: str = "default"):
        self.loop = loop
        self.tenant = tenant
        self.events: asyncio.Queue = asyncio.Queue()
        self.request = None  # the engine's Request, once submitted
        self.sent = 0  # output tokens handed over so far

    def put(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's loop is closed: nobody is listening any more
            pass


class EngineWorker:
    """Runs ``engine`` on its own thread (see the module docstring)."""

    def __init__(self, engine, metrics: Optional[ServerMetrics] = None, recorder=None):
        self.engine = engine
        self.metrics = metrics or ServerMetrics(engine)
        self.recorder = recorder  # a TraceRecorder: one trace line per finished request (serve --record)
        self._inbox: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self._live: Dict[int, Stream] = {}  # request id -> stream
        # submitted (event loop) and ended (engine thread): each counter has one writer
        self._submitted = self._ended = 0
        self._stopping = threading.Event()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="mlxlab-engine", daemon=True)
        if hasattr(engine, "before_wait"):  # tokens read before the engine blocks go out at once
            engine.before_wait = self._publish

    # ------------------------------------------------------------------ any thread
    def start(self) -> "EngineWorker":
        self.thread.start()
        return self

    def submit(self, stream: Stream, prompt, max_tokens: int, **options) -> None:
        self._submitted += 1  # the handlers' thread only (the event loop): one writer
        self._inbox.put(("submit", stream, prompt, max_tokens, options))

    def cancel(self, stream: Stream) -> None:
        self._inbox.put(("cancel", stream))

    def cancel_all(self) -> None:
        """Cancel every request in flight (shutting down)."""
        self._inbox.put(("cancel_all",))

    def wait_idle(self, timeout_s: float, settle_s: float = 0.2) -> bool:
        """Wait (up to ``timeout_s``) until no request is in flight, then ``settle_s`` more for
        the handlers to send what they were handed; False on the timeout."""
        deadline = time.monotonic() + timeout_s
        while self._live and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(settle_s)
        return not self._live

    def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel every request still in flight (each stream gets ``done: cancelled``) and stop
        the thread; waits for it."""
        self._stopping.set()
        self._inbox.put(("wake",))
        join_fully(self.thread, timeout_s)  # its OS thread too: it held an mlx stream

    @property
    def in_flight(self) -> int:
        """Requests submitted to the engine and not finished."""
        return len(self._live)

    @property
    def outstanding(self) -> int:
        """Requests handed to :meth:`submit` and not yet ended, counting those still queued for the
        engine thread: what ``--max-in-flight`` limits (:attr:`in_flight` lags a burst, whose
        handlers all check before the engine thread has taken any of them)."""
        return self._submitted - self._ended

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stopping.is_set():
                self._take(block=not eng.has_work)
                if eng.has_work:
                    eng.step()
                    if not eng.has_work:
                        eng.flush()
                    self._publish()
            for stream in list(self._live.values()):
                eng.cancel(stream.request)
            eng.flush()
            self._publish()
        except BaseException as e:  # noqa: BLE001 - every stream hears of it, then the server reports it
            self.error = e
            failed = list(self._live.values())
            self._ended += len(failed)  # ended before their streams say so, as in _publish
            self._live.clear()
            for stream in failed:
                stream.put("error", f"the engine failed: {e!r}", None)
        finally:
            close = getattr(eng, "close", None)
            if close is not None:
                close()
            if self.recorder is not None:
                self.recorder.close()

    def _take(self, block: bool) -> None:
        """Apply the queued submissions and cancellations (waiting a moment for one if ``block``)."""
        try:
            item = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, item: tuple) -> None:
        kind = item[0]
        if kind == "submit":
            _, stream, prompt, max_tokens, options = item
            try:
                req = self.engine.submit(prompt, max_tokens, tenant=stream.tenant, **options)
            except ValueError as e:
                self._ended += 1
                stream.put("error", str(e), None)
                return
            stream.request = req
            self._live[req.id] = stream
            self.metrics.started(req)
            stream.put("started", req)
        elif kind == "cancel_all":
            for stream in list(self._live.values()):
                self.engine.cancel(stream.request)
            self._publish()
        elif kind == "cancel":
            stream = item[1]
            if stream.request is not None and self.engine.cancel(stream.request):
                self._publish()

    def _publish(self) -> None:
        """Hand each live request's new tokens to its stream; finished ones get ``done``."""
        for rid, stream in list(self._live.items()):
            req = stream.request
            new = req.output_tokens[stream.sent:]
            if new:
                self.metrics.tokens(req, stream.sent)
                stream.sent += len(new)
                stream.put("tokens", list(new))
            if req.done:
                self.metrics.finished(req)
                if self.recorder is not None and req.output_tokens:  # a request refused or cancelled before
                    self.recorder.write(req)  # its first token cost no decode: nothing to replay
                # counted as ended before the stream says so: a client that sends its next request the moment
                # this one ends must find the slot free under --max-in-flight (CI saw outstanding 1 after the answer)
                del self._live[rid]
                self._ended += 1
                stream.put("done", req.finish_reason)
        self.metrics.queues(len(self._live))
