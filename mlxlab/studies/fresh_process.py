"""The child side of the fresh-process studies in :mod:`mlxlab.studies.prefill`.

``python -m mlxlab.studies.fresh_process KIND ARGS_JSON`` runs one measurement in a process where
nothing is compiled yet and prints ``RESULT`` followed by its JSON on stdout. ``KIND`` is
``seed-protocol`` (:func:`seed_protocol_child`) or ``cold-start`` (:func:`cold_start_child`).
"""

from __future__ import annotations

import json
import sys
import time

T_START = time.perf_counter()  # before mlx is imported: a cold start's load_s includes importing it

import mlx.core as mx  # noqa: E402

from mlxlab.engine.loop import Engine  # noqa: E402
from mlxlab.engine.models import load_model  # noqa: E402
from mlxlab.engine.warmup import random_prompt, warmup  # noqa: E402
from mlxlab.studies.prefill import ttft_mlx_lm  # noqa: E402


def seed_protocol_child(a: dict) -> list:
    """The case study's protocol: ``a["n"]`` requests at each step size of ``a["order"]`` in
    turn, timed with mlx-lm's ``generate_step``; one row per request (step, request, ttft_s)."""
    model = load_model(a["model"], dtype=a.get("dtype"), bits=a.get("bits"))
    out = []
    for step in a["order"]:
        for i in range(a["n"]):
            t = ttft_mlx_lm(model, random_prompt(a["prompt_tokens"], model.vocab_size, i), step)
            out.append({"step": step, "request": i, "ttft_s": t})
    return out


def _request(model, events: list, label: str, n: int, chunk: int, batch: int = 1, max_tokens: int = 8) -> None:
    """``batch`` requests of ``n`` prompt tokens on a fresh engine; appends one event: TTFT (the
    slowest), mean ITL and active / cache / peak memory in MiB after it."""
    eng = Engine(model, chunk_size=chunk)
    reqs = [eng.submit(random_prompt(n, model.vocab_size, 100 + len(events) + i), max_tokens) for i in range(batch)]
    eng.run()
    itl = [g for r in reqs for g in r.itl_s]
    events.append({"event": label, "prompt_tokens": n, "chunk": chunk, "batch": batch,
                   "ttft_s": max(r.ttft_s for r in reqs), "itl_s": sum(itl) / len(itl) if itl else None,
                   "active_mb": mx.get_active_memory() / 2**20, "cache_mb": mx.get_cache_memory() / 2**20,
                   "peak_mb": mx.get_peak_memory() / 2**20})


def cold_start_child(a: dict) -> dict:
    """Set mlx's allocator limits, load the model, warm up (``a["warmup"]``), then time the
    first request, warm repeats, and the first and second use of each other chunk and batch
    size. Returns load_s (from process start), warmup_s, warmup_parts and the events."""
    if a.get("cache_limit_mb") is not None:
        mx.set_cache_limit(int(a["cache_limit_mb"]) * 2**20)
    if a.get("memory_limit_mb") is not None:
        mx.set_memory_limit(int(a["memory_limit_mb"]) * 2**20)
    model = load_model(a["model"], dtype=a.get("dtype"), bits=a.get("bits"))
    mx.reset_peak_memory()
    out = {"load_s": time.perf_counter() - T_START}
    t0 = time.perf_counter()
    out["warmup_parts"] = warmup(lambda c: Engine(model, chunk_size=c), model.vocab_size, a["warmup"],
                                 chunk_sizes=a["chunks"][:1], batch_sizes=[1])
    out["warmup_s"] = time.perf_counter() - t0
    events: list = []
    n, c = a["prompt_tokens"], a["chunks"][0]
    _request(model, events, "first request", n, c)
    for _ in range(a["repeats"]):
        _request(model, events, "warm request", n, c)
    for c2 in a["chunks"][1:]:
        _request(model, events, f"first use of chunk {c2}", max(n, c2 + 1), c2)
        _request(model, events, f"again chunk {c2}", max(n, c2 + 1), c2)
    for b in a["batches"]:
        _request(model, events, f"first use of batch {b}", n, c, batch=b)
        _request(model, events, f"again batch {b}", n, c, batch=b)
    out["events"] = events
    return out


CHILDREN = {"seed-protocol": seed_protocol_child, "cold-start": cold_start_child}

if __name__ == "__main__":
    kind, args = sys.argv[1], json.loads(sys.argv[2])
    print("RESULT" + json.dumps(CHILDREN[kind](args)))
