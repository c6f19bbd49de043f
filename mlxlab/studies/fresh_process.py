"""The child side of the fresh-process studies in :mod:`mlxlab.studies.prefill_step.run`.

``python -m mlxlab.studies.fresh_process KIND ARGS_JSON`` runs one measurement in a process where
nothing is compiled yet and prints ``RESULT`` followed by its JSON on stdout. ``KIND`` is
``seed-protocol`` (:func:`seed_protocol_child`), ``cold-start`` (:func:`cold_start_child`) or
``alloc-cache`` (:func:`alloc_cache_child`).
"""

from __future__ import annotations

import json
import resource
import sys
import time

T_START = time.perf_counter()  # before mlx is imported: a cold start's load_s includes importing it

import mlx.core as mx  # noqa: E402

from mlxlab.engine.loop import Engine  # noqa: E402
from mlxlab.engine.models import load_model  # noqa: E402
from mlxlab.engine.warmup import random_prompt, warmup  # noqa: E402
from mlxlab.studies.prefill_step.run import ttft_mlx_lm  # noqa: E402


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


def _timed_request(model, prompt: list, chunk: int, max_tokens: int) -> dict:
    """One request on a fresh engine, stepped by hand so the allocator's cache can be read after
    every step: TTFT, end-to-end latency, cache / active / peak memory (MiB) before, at its
    lowest during, and after the request (its engine and KV released); ``held_mb``: what the
    request holds across steps (its KV cache: active memory at a step's end over the start);
    ``cache_before_mb - cache_low_mb``: how much of that came out of the allocator's cache; and
    ``faulted_mb``: memory the OS had to map fresh for it (minor page faults x page size: a buffer
    kept by an allocator is already mapped, one allocated anew may not be; a CPU-side count, so
    GPU memory does not show in it)."""
    mib = 2**20
    eng = Engine(model, chunk_size=chunk)
    before, active = mx.get_cache_memory(), mx.get_active_memory()
    mx.reset_peak_memory()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    req = eng.submit(prompt, max_tokens)
    low, held = before, active
    while eng.has_work:
        eng.step()
        low, held = min(low, mx.get_cache_memory()), max(held, mx.get_active_memory())
    e2e = time.perf_counter() - t0
    peak = mx.get_peak_memory()
    del eng
    faulted = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) * resource.getpagesize()
    itl = req.itl_s
    return {"ttft_s": req.ttft_s, "e2e_s": e2e, "itl_s": sum(itl) / len(itl) if itl else None, "faulted_mb": faulted / mib, "active_before_mb": active / mib,
            "held_mb": (held - active) / mib, "cache_before_mb": before / mib, "cache_low_mb": low / mib,
            "cache_after_mb": mx.get_cache_memory() / mib, "active_after_mb": mx.get_active_memory() / mib,
            "peak_mb": peak / mib}


def alloc_cache_child(a: dict) -> dict:
    """Request after request under each allocator setting. Loads the model, warms the request's
    shapes up, then measures the request's buffers: what the cache holds after one request with
    no limit (``request_buffers_mb``). Each setting of ``a["settings"]`` ([label, cache limit
    MiB or None for mlx's default, memory limit MiB or None]) and each factor of ``a["scaled"]``
    (a cache limit of that many times the request's buffers) is then run ``a["rounds"]`` times,
    round-robin with the order alternating: clear the cache, set the limits, one priming
    request, then ``a["requests"]`` timed requests of the same size."""
    model = load_model(a["model"], dtype=a.get("dtype"), bits=a.get("bits"))
    n, chunk, mt = a["prompt_tokens"], a["chunk"], a["max_tokens"]
    prompt = random_prompt(n, model.vocab_size, 7)
    default = mx.set_cache_limit(0)
    mx.set_cache_limit(default)
    default_mem = mx.set_memory_limit(1 << 40)
    mx.set_memory_limit(default_mem)
    _timed_request(model, prompt, chunk, mt)  # compile every kernel this request uses
    mx.set_cache_limit(1 << 40)
    mx.clear_cache()
    calib = _timed_request(model, prompt, chunk, mt)
    buffers = calib["cache_after_mb"]
    mib = 2**20
    settings = [(label, default if c is None else int(c * mib), default_mem if m is None else int(m * mib))
                for label, c, m in a["settings"]]
    settings += [(f"{f:g}x buffers", int(f * buffers * mib), default_mem) for f in a["scaled"]]
    rows = []
    for r in range(a["rounds"]):
        for label, cache, mem in (settings if r % 2 == 0 else settings[::-1]):
            mx.set_cache_limit(cache)
            mx.set_memory_limit(mem)
            mx.clear_cache()
            _timed_request(model, prompt, chunk, mt)  # priming: its buffers enter the cache, up to the limit
            for i in range(a["requests"]):
                rows.append({"limit": label, "limit_mb": cache / mib, "memory_limit_mb": mem / mib, "round": r,
                             "request": i, **_timed_request(model, prompt, chunk, mt)})
    mx.set_cache_limit(default)
    mx.set_memory_limit(default_mem)
    return {"request_buffers_mb": buffers, "default_limit_mb": default / mib, "default_memory_limit_mb": default_mem / mib,
            "calibration": calib, "prompt_tokens": n, "chunk": chunk, "max_tokens": mt, "rows": rows}


CHILDREN = {"seed-protocol": seed_protocol_child, "cold-start": cold_start_child, "alloc-cache": alloc_cache_child}

if __name__ == "__main__":
    kind, args = sys.argv[1], json.loads(sys.argv[2])
    print("RESULT" + json.dumps(CHILDREN[kind](args)))
