"""The OpenAI-compatible HTTP app (Starlette; server-sent events through ``sse-starlette``).

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(streaming and not), ``GET /health``, ``GET /metrics`` (Prometheus text). Requests go to the
engine's thread (:class:`mlxlab.serve.worker.EngineWorker`); a client that disconnects cancels
its request. Every error is an OpenAI-style body ``{"error": {"message", "type", "param",
"code"}}`` with its 4xx status, and the server goes on serving.

Request fields read: ``model``, ``prompt`` (text or token ids) / ``messages``, ``max_tokens``,
``stream``, ``stop`` (a string or up to 4), ``temperature``, ``top_p``, ``seed``, ``user`` (the
tenant, unless an ``X-Tenant`` header names one) and mlxlab's ``kv_bits`` (keep this request's KV
cache quantized) and ``num_draft_tokens`` (decode speculatively with the server's draft model, that
many drafts a round; 0: not; the server's ``--num-draft-tokens`` when absent). A speculative
request's ``usage`` counts its drafts in ``completion_tokens_details`` (OpenAI's
``accepted_prediction_tokens`` / ``rejected_prediction_tokens``). A response's choices also carry ``token_ids`` (mlxlab's extension: the ids the
text came from, in order).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Dict, List, Optional

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxlab.serve.encode import Encoder
from mlxlab.serve.text import safe_prefix, stop_index
from mlxlab.serve.worker import EngineWorker, Stream

MAX_BODY_BYTES = 4 << 20  # a request body larger than this is refused (413)
DEFAULT_MAX_TOKENS = 256  # chat completions without max_tokens (completions: OpenAI's 16)
MAX_STOPS = 4


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error", headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind, self.headers = status, message, param, code, kind, headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _field(body: dict, name: str, types, default=None, *, required: bool = False):
    if name not in body or body[name] is None:
        if required:
            raise ApiError(400, f"'{name}' is required", name, "missing_field")
        return default
    v = body[name]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ApiError(400, f"'{name}' must be {_names(types)}, got a boolean", name, "invalid_type")
    if not isinstance(v, types):
        raise ApiError(400, f"'{name}' must be {_names(types)}, got {type(v).__name__}", name, "invalid_type")
    return v


def _names(types) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    words = {int: "an integer", float: "a number", str: "a string", list: "a list", bool: "true or false", dict: "an object"}
    return " or ".join(dict.fromkeys(words.get(t, t.__name__) for t in ts))


class Server:
    """The app and its state: the worker (engine thread), the tokenizer, the served model name."""

    def __init__(self, worker: EngineWorker, tokenizer, model_name: str, max_body_bytes: int = MAX_BODY_BYTES,
                 max_in_flight: Optional[int] = None, num_draft_tokens: Optional[int] = None,
                 tokenizer_processes: int = 0):
        self.worker, self.tokenizer, self.model_name = worker, tokenizer, model_name
        # long prompts tokenized in worker processes (the tokenizer holds the GIL: mlxlab.serve.encode)
        self.encoder = Encoder(tokenizer, tokenizer_processes)
        self.max_body_bytes = max_body_bytes
        # with this many requests submitted and not ended, another gets 429 and Retry-After (counted
        # at submit on the event loop, so a burst arriving in one moment cannot pass it)
        self.max_in_flight = max_in_flight
        self.num_draft_tokens = num_draft_tokens  # for requests that name none (needs the engine's draft model)
        self.started = int(time.time())

    # ------------------------------------------------------------------ the app
    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(app):
            if not self.worker.alive:
                self.worker.start()
            await asyncio.get_running_loop().run_in_executor(None, self.encoder.start)
            try:
                yield
            finally:  # shutdown (SIGINT/SIGTERM through uvicorn): in-flight requests are cancelled
                await asyncio.get_running_loop().run_in_executor(None, self.worker.stop)
                await asyncio.get_running_loop().run_in_executor(None, self.encoder.stop)

        routes = [Route("/health", self.health), Route("/metrics", self.metrics),
                  Route("/v1/models", self.models),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat, methods=["POST"])]
        return Starlette(routes=routes, lifespan=lifespan, exception_handlers={ApiError: _error_response})

    async def health(self, request: Request) -> Response:
        if not self.worker.alive:
            return JSONResponse({"status": "error", "error": repr(self.worker.error)}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.model_name})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.worker.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                         "created": self.started, "owned_by": "mlxlab"}]})

    async def completions(self, request: Request) -> Response:
        body = await self._body(request)
        prompt = _field(body, "prompt", (str, list), required=True)
        if isinstance(prompt, str):
            ids = await self.encoder.encode(prompt)
        else:
            ids = prompt
            if ids and all(isinstance(p, str) for p in ids):
                raise ApiError(400, "a list of prompts is not supported: send one prompt per request", "prompt",
                               "unsupported")
        return await self._generate(request, body, ids, chat=False, default_max=16)

    async def chat(self, request: Request) -> Response:
        body = await self._body(request)
        messages = _field(body, "messages", list, required=True)
        if not messages:
            raise ApiError(400, "'messages' is empty: send at least one message", "messages", "empty")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ApiError(400, f"messages[{i}] must be an object with a string 'role' and 'content'",
                               f"messages[{i}]", "invalid_type")
        ids = await self.encoder.chat_prompt([{"role": m["role"], "content": m["content"]} for m in messages])
        return await self._generate(request, body, ids, chat=True, default_max=DEFAULT_MAX_TOKENS)

    # ------------------------------------------------------------------ helpers
    async def _body(self, request: Request) -> dict:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise ApiError(413, f"request body of {length} bytes is over the limit of {self.max_body_bytes}",
                           None, "body_too_large")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.max_body_bytes:
                raise ApiError(413, f"request body is over the limit of {self.max_body_bytes} bytes", None,
                               "body_too_large")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", None, "invalid_json")
        model = _field(body, "model", str, required=True)
        if model != self.model_name:
            raise ApiError(404, f"model '{model}' is not served here; this server serves '{self.model_name}'",
                           "model", "model_not_found")
        return body

    def _options(self, request: Request, body: dict, default_max: int) -> Dict[str, Any]:
        max_tokens = _field(body, "max_tokens", int, default_max)
        if "max_completion_tokens" in body and body.get("max_completion_tokens") is not None:
            max_tokens = _field(body, "max_completion_tokens", int)
        if max_tokens <= 0:
            raise ApiError(400, f"'max_tokens' must be a positive integer, got {max_tokens}", "max_tokens",
                           "invalid_value")
        opts = {"max_tokens": max_tokens,
                "temperature": _field(body, "temperature", (int, float)),
                "top_p": _field(body, "top_p", (int, float)),
                "seed": _field(body, "seed", int),
                "kv_bits": _field(body, "kv_bits", int)}
        if body.get("num_draft_tokens") is not None:
            if self.worker.engine.draft is None:
                raise ApiError(400, "'num_draft_tokens' needs a draft model, and this server has none (mlxlab serve "
                                    "--draft-model)", "num_draft_tokens", "no_draft_model")
            from mlxlab.engine.speculative import MAX_DRAFT_TOKENS  # (mlx is loaded: the engine has a draft)

            k = _field(body, "num_draft_tokens", int)
            if not 0 <= k <= MAX_DRAFT_TOKENS:
                raise ApiError(400, f"'num_draft_tokens' must be from 0 (no speculation) to {MAX_DRAFT_TOKENS}, got {k}",
                               "num_draft_tokens", "invalid_value")
            opts["num_draft_tokens"] = k
        elif self.num_draft_tokens and not opts["kv_bits"]:
            opts["num_draft_tokens"] = self.num_draft_tokens
        stop = _field(body, "stop", (str, list), [])
        stops = [stop] if isinstance(stop, str) else stop
        if len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
            raise ApiError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOPS} of them", "stop",
                           "invalid_value")
        opts["stops"] = stops
        opts["tenant"] = request.headers.get("x-tenant") or _field(body, "user", str, "default")
        return opts

    async def _generate(self, request: Request, body: dict, ids: List[int], chat: bool, default_max: int) -> Response:
        opts = self._options(request, body, default_max)
        stream_mode = _field(body, "stream", bool, False)
        stops, tenant, max_tokens = opts.pop("stops"), opts.pop("tenant"), opts.pop("max_tokens")
        ctx = self.worker.engine.max_context
        if len(ids) >= ctx:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; this model's context is {ctx}: shorten it",
                           "prompt", "context_length_exceeded")
        if len(ids) + max_tokens > ctx:
            raise ApiError(400, f"the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds this model's "
                                f"context of {ctx} tokens: lower max_tokens to at most {ctx - len(ids)}",
                           "max_tokens", "context_length_exceeded")
        engine_opts = {k: v for k, v in opts.items() if v is not None}
        if self.max_in_flight is not None and self.worker.outstanding >= self.max_in_flight:
            raise ApiError(429, f"{self.worker.outstanding} requests are in flight, the most this server takes at "
                                f"once (--max-in-flight); retry in a moment", None, "server_busy",
                           kind="rate_limit_error", headers={"Retry-After": "1"})
        stream = Stream(asyncio.get_running_loop(), tenant)
        self.worker.submit(stream, ids, max_tokens, stop_tokens=self.tokenizer.eos_token_ids, **engine_opts)
        first = await stream.events.get()
        if first[0] == "error":
            raise ApiError(400, first[1], _param_of(first[1]), "invalid_request")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        gen = _Generation(self.tokenizer, stops)
        if stream_mode:
            return EventSourceResponse(self._sse(request, stream, gen, rid, chat, len(ids)), ping=15,
                                       headers={"Cache-Control": "no-cache"})
        # the whole response at once: the client may leave while it decodes, and no send will tell
        # (nothing is sent until the end), so its disconnect is awaited beside the tokens and
        # cancels the request (else it decodes to max_tokens, holding its KV and an in-flight slot)
        tokens = asyncio.ensure_future(self._drain(stream, gen))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({tokens, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not tokens.done():
                self.worker.cancel(stream)
            await tokens
        except asyncio.CancelledError:  # the client went away
            self.worker.cancel(stream)
            tokens.cancel()
            raise
        finally:
            gone.cancel()
        return JSONResponse(self._full(rid, chat, gen, len(ids), stream.request))

    async def _drain(self, stream: Stream, gen: "_Generation") -> None:
        async for _ in self._events(stream, gen):
            pass

    async def _events(self, stream: Stream, gen: "_Generation"):
        """Yield the new text and ids as tokens arrive; cancels the request at a stop string."""
        while True:
            ev = await stream.events.get()
            if ev[0] == "tokens":
                text, ids, stopped = gen.add(ev[1])
                if stopped:
                    self.worker.cancel(stream)
                    gen.finish_reason = "stop"
                    yield text, ids
                    return
                yield text, ids
            elif ev[0] == "done":
                if gen.finish_reason is None:
                    gen.finish_reason = {"cancelled": "stop", "length": "length"}.get(ev[1], "stop")
                tail = gen.close()
                if tail:
                    yield tail, []
                return
            elif ev[0] == "error":
                raise RuntimeError(ev[1])

    async def _sse(self, request: Request, stream: Stream, gen: "_Generation", rid: str, chat: bool, n_prompt: int):
        created = int(time.time())
        try:
            if chat:
                yield {"data": json.dumps(self._chunk(rid, created, chat, {"role": "assistant", "content": ""}, None))}
            async for text, ids in self._events(stream, gen):
                yield {"data": json.dumps(self._chunk(rid, created, chat, text, None, ids))}
            last = self._chunk(rid, created, chat, "" if not chat else {}, gen.finish_reason)
            last["usage"] = _usage(n_prompt, gen.n_tokens, stream.request)
            yield {"data": json.dumps(last)}
            yield {"data": "[DONE]"}
        finally:  # a disconnect ends the generator here too: the engine drops the request
            if gen.finish_reason is None:
                self.worker.cancel(stream)

    def _chunk(self, rid, created, chat, delta, finish, ids=()) -> dict:
        choice = {"index": 0, "finish_reason": finish, "token_ids": list(ids)}
        if chat:
            choice["delta"] = delta if isinstance(delta, dict) else {"content": delta}
        else:
            choice["text"] = delta if isinstance(delta, str) else ""
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.model_name, "choices": [choice]}

    def _full(self, rid: str, chat: bool, gen: "_Generation", n_prompt: int, request=None) -> dict:
        choice = {"index": 0, "finish_reason": gen.finish_reason, "token_ids": gen.ids}
        if chat:
            choice["message"] = {"role": "assistant", "content": gen.text}
        else:
            choice["text"] = gen.text
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice], "usage": _usage(n_prompt, gen.n_tokens, request)}


class _Generation:
    """One response's text so far: the detokenizer, stop strings held back until they cannot match."""

    def __init__(self, tokenizer, stops: List[str]):
        self.detok = tokenizer.detokenizer()
        self.stops = stops
        self.text = ""  # sent so far
        self._held = ""  # decoded, not sent yet (might start a stop string)
        self.ids: List[int] = []
        self.n_tokens = 0
        self.finish_reason: Optional[str] = None

    def add(self, ids: List[int]):
        """New tokens: (text to send, their ids, whether a stop string ended the response)."""
        self.n_tokens += len(ids)
        self.ids.extend(ids)
        self._held += "".join(self.detok.add(t) for t in ids)
        at = stop_index(self._held, self.stops)
        if at is not None:
            out, self._held = self._held[:at], ""
            self.text += out
            return out, ids, True
        k = safe_prefix(self._held, self.stops)
        out, self._held = self._held[:k], self._held[k:]
        self.text += out
        return out, ids, False

    def close(self) -> str:
        out = self._held + self.detok.finish()
        self._held = ""
        at = stop_index(out, self.stops)
        out = out if at is None else out[:at]
        self.text += out
        return out


async def _error_response(request: Request, e: "ApiError") -> Response:
    """An :class:`ApiError`'s response, built on the event loop: Starlette runs a plain function
    handler in anyio's thread pool, which grew by a thread per error answered at once (a burst of
    429s) and kept them, which a soak read as a thread leak."""
    return e.response()


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (its body already read, the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _usage(prompt: int, completion: int, req=None) -> dict:
    """OpenAI's usage; a speculative request's drafts as ``completion_tokens_details``."""
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if req is not None and req.draft_proposed:
        out["completion_tokens_details"] = {"accepted_prediction_tokens": req.draft_accepted,
                                            "rejected_prediction_tokens": req.draft_proposed - req.draft_accepted}
    return out


def _param_of(message: str) -> Optional[str]:
    m = message.lower()
    if "kv budget" in m:
        return "max_tokens"
    for word, param in (("num_draft_tokens", "num_draft_tokens"), ("draft model", "num_draft_tokens"),
                        ("max_tokens", "max_tokens"), ("prompt", "prompt"), ("token id", "prompt"),
                        ("kv", "kv_bits"), ("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed")):
        if word in m:
            return param
    return None
