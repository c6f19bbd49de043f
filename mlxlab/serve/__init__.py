"""``mlxlab serve``: an OpenAI-compatible server on the engine (:mod:`mlxlab.serve.app`), the
engine on its own thread (:mod:`mlxlab.serve.worker`), tokenizers (:mod:`mlxlab.serve.text`)
and Prometheus metrics (:mod:`mlxlab.serve.metrics`).

:func:`build` makes the server for a loaded model and engine options; :func:`run` serves it with
uvicorn until SIGINT/SIGTERM; :func:`start_background` serves it on a thread (tests, notebooks)
and returns the base URL and a function that stops it.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Callable, Optional, Tuple

from mlxlab.core.threads import join_fully
from mlxlab.serve.app import Server
from mlxlab.serve.text import tokenizer_for
from mlxlab.serve.worker import EngineWorker

HISTORY_LIMIT = 1024  # step records and finished requests a server's engine keeps (Engine history_limit)
SHUTDOWN_DRAIN_S = 3.0  # at SIGINT/SIGTERM, how long cancelled streams get to send their last events


def build(model, *, model_name: Optional[str] = None, tokenizer=None, max_in_flight: Optional[int] = None,
          num_draft_tokens: Optional[int] = None, record: Optional[str] = None, tokenizer_processes: int = 0,
          **engine_options) -> Server:
    """A :class:`Server` for ``model`` (a :class:`mlxlab.engine.models.LoadedModel`): an
    :class:`mlxlab.Engine` with ``engine_options`` on its own thread (started with the app);
    ``max_in_flight``: more requests at once get 429 with Retry-After. With ``draft_model`` (an
    engine option), ``num_draft_tokens`` is the drafts per round of a request that names none
    (None: such requests decode in the batch). The engine keeps only
    the newest :data:`HISTORY_LIMIT` step records and finished requests unless
    ``history_limit`` says otherwise (None: all, memory growing with every request). ``record``:
    append one trace line per finished request to this file (:class:`mlxlab.core.traces.TraceRecorder`,
    what ``mlxlab tune --trace`` reads). ``tokenizer_processes``: long prompts are tokenized in this
    many worker processes (a model directory's tokenizer holds the GIL: :mod:`mlxlab.serve.encode`)."""
    from mlxlab.engine.loop import Engine

    name = model_name or getattr(model, "name", "model")
    engine_options.setdefault("history_limit", HISTORY_LIMIT)
    engine = Engine(model, **engine_options)
    if num_draft_tokens is not None and engine.draft is None:
        raise ValueError("num_draft_tokens needs a draft model: pass draft_model= (mlxlab serve --draft-model)")
    recorder = None
    if record is not None:
        from mlxlab.core.traces import TraceRecorder

        recorder = TraceRecorder(record, offset_s=time.time() - engine.now())
    return Server(EngineWorker(engine, recorder=recorder), tokenizer or tokenizer_for(name), name,
                  max_in_flight=max_in_flight, num_draft_tokens=num_draft_tokens,
                  tokenizer_processes=tokenizer_processes)


def run(server: Server, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers: in-flight requests are cancelled, then the
    process exits 0)."""
    import uvicorn

    uv = uvicorn.Server(uvicorn.Config(server.app(), host=host, port=port, log_level=log_level,
                                       timeout_graceful_shutdown=5))
    exit_handler = uv.handle_exit

    def handle_exit(sig, frame) -> None:
        # cancel in-flight requests first and let their streams end with a finish reason and
        # [DONE] (a moment, off the signal handler: the event loop must run to send them); only
        # then tell uvicorn (and sse-starlette, which cuts open streams when it hears of the exit)
        server.worker.cancel_all()

        def later() -> None:
            server.worker.wait_idle(SHUTDOWN_DRAIN_S)
            exit_handler(sig, frame)

        threading.Thread(target=later, name="mlxlab-shutdown", daemon=True).start()

    uv.handle_exit = handle_exit
    # uvicorn raises the signal it caught again once it has shut down, with the handlers it found
    # installed: these make that a no-op, so a stopped server's process exits 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    uv.run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_background(server: Server, host: str = "127.0.0.1", port: Optional[int] = None,
                     timeout_s: float = 30.0) -> Tuple[str, Callable[[], None]]:
    """Serve on a daemon thread; returns (base URL, stop). ``stop()`` shuts the server down (its
    lifespan stops the engine thread) and waits."""
    import uvicorn

    port = port or free_port(host)
    config = uvicorn.Config(server.app(), host=host, port=port, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, name="mlxlab-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)

    def stop() -> None:
        uv.should_exit = True
        join_fully(thread, timeout_s)

    return f"http://{host}:{port}", stop
