"""An :class:`~mlxlab.core.executor.Executor` that sends its requests to a running ``mlxlab serve``
(or any server that streams ``token_ids`` the same way), so :func:`mlxlab.run_workload` and the
notebooks drive the engine over HTTP exactly as real tenants do, and their tables come out in the
same form as an in-process run's.

Each submitted request streams on a thread of its own (``/v1/completions`` with the prompt's token
ids, ``user`` = the tenant); its :class:`~mlxlab.core.request.Request` fills in as chunks arrive,
on this client's clock: the arrival is the one the runner gives (else the moment it is sent), each
token is stamped when its chunk is read. A request the server refuses ends with ``finish_reason`` ``"error"`` and its message in
:attr:`HttpExecutor.errors`. There are no step records: the server's steps are its own.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Dict, List, Optional, Sequence

from mlxlab.core.executor import Executor
from mlxlab.core.request import DONE, Request, StepRecord

POLL_S = 0.002  # how long a step waits for news from the streams


class HttpExecutor(Executor):
    """Requests to ``base_url`` (e.g. ``http://127.0.0.1:8000``) for ``model`` (the served name)."""

    def __init__(self, base_url: str, model: str, *, timeout_s: float = 600.0, vocab_size: Optional[int] = None):
        import httpx  # the client: only when used

        self.base_url, self.model, self.timeout_s = base_url.rstrip("/"), model, timeout_s
        self.vocab_size = vocab_size
        self.requests: List[Request] = []
        self.steps: List[StepRecord] = []
        self.errors: Dict[int, str] = {}
        self._client = httpx.Client(timeout=timeout_s)
        self._news = threading.Condition()
        self._threads: List[threading.Thread] = []
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    @property
    def has_work(self) -> bool:
        return any(not r.done for r in self.requests)

    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = ()) -> Request:
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ValueError("empty prompt: a request needs at least one prompt token")
        req = Request(id=len(self.requests), prompt=prompt, max_tokens=int(max_tokens), tenant=str(tenant),
                      arrival_s=self.now() if arrival_s is None else float(arrival_s))
        self.requests.append(req)
        t = threading.Thread(target=self._stream, args=(req,), name=f"mlxlab-http-{req.id}", daemon=True)
        self._threads.append(t)
        t.start()
        return req

    def step(self) -> Optional[StepRecord]:
        """Wait a moment for news from the streams. While requests are in flight the server is
        working on them, so this returns a record of the wait (phase "http", not kept in
        ``steps``): a runner that saw None would take the executor for idle and sleep until its
        next scheduled arrival, past the finishes (and closed-loop follow-ups) of the streams."""
        t = self.now()
        with self._news:
            self._news.wait(POLL_S)
        if not self.has_work:
            return None
        return StepRecord(-1, t, self.now(), "http", [], [])

    def close(self) -> None:
        for t in self._threads:
            t.join(self.timeout_s)
        self._threads = [t for t in self._threads if t.is_alive()]

    # ------------------------------------------------------------------ a request's thread
    def _stream(self, req: Request) -> None:
        body = {"model": self.model, "prompt": req.prompt, "max_tokens": req.max_tokens, "stream": True,
                "user": req.tenant}
        reason = "error"
        try:
            with self._client.stream("POST", self.base_url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    self.errors[req.id] = r.json().get("error", {}).get("message", r.text)
                else:
                    for line in r.iter_lines():
                        if not line.startswith("data:") or line.strip() == "data: [DONE]":
                            continue
                        choice = json.loads(line[5:])["choices"][0]
                        ids = choice.get("token_ids") or []
                        if ids:
                            t = self.now()
                            if req.prefill_start_s is None:
                                req.prefill_start_s = req.arrival_s
                            req.output_tokens.extend(ids)
                            req.token_times_s.extend([t] * len(ids))
                            self._notify()
                        if choice.get("finish_reason"):
                            reason = choice["finish_reason"]
        except Exception as e:  # noqa: BLE001 - the request ends, the reason is kept
            self.errors[req.id] = repr(e)
        req.finish_reason = reason
        req.finish_s = self.now()
        req.state = DONE
        self._notify()

    def _notify(self) -> None:
        with self._news:
            self._news.notify_all()
