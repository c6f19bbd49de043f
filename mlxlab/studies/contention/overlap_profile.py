"""Where the time goes when a chat decodes beside a document prefilled on overlap mode's second
thread (issue 16: the contention frontier, and why it stops where it does).

The contention benchmark (:mod:`mlxlab.studies.contention.run`) says *how much* the chat's gaps and
the document's TTFT grow; this profile says *which shared resource* they grow on. It times, on
both threads of an ``overlap=True`` engine, every call of the model (Python building the lazy
graph; on the prefill thread the per-layer evaluations run inside that call), every ``mx.eval`` /
``mx.async_eval`` (mlx releases the GIL inside them: the thread waits for, or hands work to, the
device) and the main thread's token reads (``_flush``: waiting for the step's tokens, then handing
them out). Three runs per configuration on engines built the same way:

* ``solo``: the chat alone (its steady-state steps);
* ``alone``: the document alone (its prefill thread's chunks);
* ``together``: the chat, then the document arriving beside it; only the events inside the
  window [document arrival, document's first token] count.

From those, per thread, ``host`` seconds (a model call less the evaluations inside it: Python,
holding the GIL or waiting for it) and ``device`` seconds (inside ``eval``: waiting for the
device). Growth of the prefill thread's *host* time under contention is time it spent waiting
for the GIL the decode thread held (the machine has idle cores); growth of its *device* time is
the device being shared with the decode kernels. Likewise for the chat's step: a longer graph
build is the GIL, a longer token wait is the device. ``switch_interval_s`` sets
``sys.setswitchinterval`` for the run (Python's default 5 ms is how long a thread that wants the
GIL waits before it asks the holder to let go).

Importing this module loads no MLX.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from mlxlab.studies.contention.run import SETTINGS, WARM_TOKENS, alone, make_executor, pct, together

SOLO_STEPS = 64  # the solo chat's measured tokens


class _Events:
    """(thread name, kind, start, end) rows on ``time.perf_counter``, appended from both threads."""

    def __init__(self):
        self.rows: List[tuple] = []

    def timed(self, kind: str, fn):
        rows = self.rows

        def wrapped(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                rows.append((threading.current_thread().name, kind, t0, time.perf_counter()))
        return wrapped


class _TimedMx:
    """``mx`` as the engine modules see it, with ``eval`` and ``async_eval`` timed."""

    def __init__(self, mx, events: _Events):
        self._mx = mx
        self.eval = events.timed("eval", mx.eval)
        self.async_eval = events.timed("async_eval", mx.async_eval)

    def __getattr__(self, name):
        return getattr(self._mx, name)


class _TimedModel:
    def __init__(self, module, events: _Events):
        self._module, self._call = module, events.timed("model", module.__call__)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


@contextlib.contextmanager
def instrumented(eng, events: _Events):
    """Time ``eng``'s model calls, its token reads and every ``eval`` / ``async_eval`` of the
    engine modules (both threads) into ``events`` while the block runs."""
    from mlxlab.engine import batch, loop

    saved = (loop.mx, batch.mx)
    loop.mx = batch.mx = _TimedMx(saved[0], events)
    eng.module = _TimedModel(eng.module, events)
    eng._flush = events.timed("flush", eng._flush)
    try:
        yield
    finally:
        loop.mx, batch.mx = saved
        eng.module = eng.module._module
        del eng._flush


def _overlap_s(a0: float, a1: float, w0: float, w1: float) -> float:
    return max(0.0, min(a1, w1) - max(a0, w0))


def thread_totals(rows: Sequence[tuple], thread: str, w0: float, w1: float) -> Dict[str, float]:
    """Seconds of ``thread``'s events inside [w0, w1]: ``model`` (graph building, and on the
    prefill thread the evaluations inside it), ``eval`` and ``async_eval``, ``flush``, and
    ``host`` = model less the evaluations that ran inside a model call; ``calls`` per kind."""
    mine = [r for r in rows if r[0] == thread]
    out = {k: 0.0 for k in ("model", "eval", "async_eval", "flush")}
    calls = {k: 0 for k in out}
    models = [(a, b) for _, k, a, b in mine if k == "model"]
    inside = 0.0
    for _, kind, a, b in mine:
        s = _overlap_s(a, b, w0, w1)
        if s <= 0:
            continue
        out[kind] = out.get(kind, 0.0) + s
        calls[kind] = calls.get(kind, 0) + 1
        if kind in ("eval", "async_eval") and any(m0 <= a and b <= m1 for m0, m1 in models):
            inside += s
    out["host"] = out["model"] - inside
    out["device_wait"] = out["eval"] + out["flush"]
    return {**out, "calls": calls, "window_s": w1 - w0}


def slowest_steps(rows: Sequence[tuple], w0: float, w1: float, n: int = 3) -> List[dict]:
    """The ``n`` longest main-thread steps inside [w0, w1]: their milliseconds and, inside each,
    the main thread's parts (model call, async_eval, token read, and the rest: planning and
    hand-over) and what the prefill thread spent in the same span (host: model calls less their
    evaluations; eval: waiting for the device) -- which of the two threads, and which resource,
    a long gap in the chat comes from."""
    steps = sorted((r for r in rows if r[0] == "MainThread" and r[1] == "step" and w0 <= r[2] < w1),
                   key=lambda r: r[3] - r[2], reverse=True)[:n]
    out = []
    for _, _, a, b in steps:
        main = thread_totals(rows, "MainThread", a, b)
        pre = thread_totals(rows, "mlxlab-prefill", a, b)
        parts = {k: 1e3 * main[k] for k in ("model", "async_eval", "flush")}
        parts["rest"] = 1e3 * (b - a) - sum(parts.values())
        out.append({"step_ms": 1e3 * (b - a), "main_ms": parts,
                    "prefill_ms": {"host": 1e3 * pre["host"], "eval": 1e3 * pre["eval"]}})
    return out


def _run_solo(model, spec, chat_prompt) -> dict:
    eng = make_executor(model, spec, "off")
    ev = _Events()
    with eng, instrumented(eng, ev):
        chat = eng.submit(chat_prompt, WARM_TOKENS + SOLO_STEPS)
        eng.run()
    tt = [eng._t0 + t for t in chat.token_times_s]
    w0, w1 = tt[WARM_TOKENS - 1], tt[-1]
    gaps = [b - a for a, b in zip(tt[WARM_TOKENS - 1:], tt[WARM_TOKENS:])]
    return {"main": thread_totals(ev.rows, "MainThread", w0, w1), "steps": len(gaps),
            "itl_p50_ms": 1e3 * pct(gaps, 50), "itl_p99_ms": 1e3 * pct(gaps, 99)}


def _run_alone(model, spec, doc_prompt) -> dict:
    eng = make_executor(model, spec, "off")
    ev = _Events()
    with instrumented(eng, ev):
        t0 = eng._t0 + eng.now()
        res = alone(eng, doc_prompt)
    w1 = t0 + res["alone_ttft_s"]
    return {"prefill": thread_totals(ev.rows, "mlxlab-prefill", t0, w1), "ttft_s": res["alone_ttft_s"]}


def _run_together(model, spec, chat_prompt, doc_prompt, max_chat) -> dict:
    eng = make_executor(model, spec, "off")
    ev = _Events()
    submit = eng.submit
    arrivals: List[float] = []

    def timed_submit(*a, **k):
        arrivals.append(time.perf_counter())
        return submit(*a, **k)

    eng.submit = timed_submit
    eng.step = ev.timed("step", eng.step)
    with instrumented(eng, ev):
        res = together(eng, chat_prompt, doc_prompt, max_chat)
    del eng.step
    w0 = arrivals[1]
    w1 = w0 + res["ttft_s"]
    steps = res["chat_tokens_in_window"]
    return {"main": thread_totals(ev.rows, "MainThread", w0, w1),
            "prefill": thread_totals(ev.rows, "mlxlab-prefill", w0, w1), "ttft_s": res["ttft_s"],
            "slowest_steps": slowest_steps(ev.rows, w0, w1),
            "steps": steps, "itl_p50_ms": 1e3 * pct(res["gaps"], 50), "itl_p99_ms": 1e3 * pct(res["gaps"], 99)}


def _per_step_ms(t: Dict[str, float], steps: int) -> Dict[str, float]:
    n = max(1, int(steps))
    return {k: 1e3 * t[k] / n for k in ("model", "async_eval", "flush", "host") if k in t}


def growth_parts(alone: Dict[str, float], together: Dict[str, float], ttft_alone: float,
                 ttft_together: float) -> Dict[str, float]:
    """The document's TTFT growth beside the chat (s), split by where the prefill thread spent it,
    from its seconds alone and together (``host``, ``eval``, ``model`` of :func:`thread_totals`):
    ``python`` (building the graph, holding the GIL or waiting for it), ``device_wait`` (inside
    ``eval``), ``dispatch`` (the rest of its model calls: ``async_eval`` handing layers to the
    device, GIL released) and ``outside_calls`` (the window less the model calls: waiting for the
    main thread to hand over or collect, and the first token)."""
    d = {k: together[k] - alone[k] for k in ("host", "eval", "model")}
    total = ttft_together - ttft_alone
    return {"total": total, "python": d["host"], "device_wait": d["eval"],
            "dispatch": d["model"] - d["host"] - d["eval"], "outside_calls": total - d["model"]}


def rescore(doc: dict) -> dict:
    """Recompute every ``ttft_growth_s`` of a saved profile from its stored seconds (the split
    above), in place; returns ``doc``."""
    for preset in doc["presets"].values():
        for r in preset["runs"].values():
            p = r["prefill_thread_s"]
            r["ttft_growth_s"] = growth_parts(p["alone"], p["together"], r["doc_ttft_s"]["alone"],
                                              r["doc_ttft_s"]["together"])
    return doc


def _med(runs: List[dict], *path) -> float:
    vals = []
    for r in runs:
        v = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return statistics.median(vals) if vals else float("nan")


def profile_setting(model, spec: dict, chat_prompt: List[int], doc_prompt: List[int], max_chat: int,
                    repeats: int = 3) -> dict:
    """One setting's solo / alone / together runs, ``repeats`` of each (the first is dropped as
    the process's first use of the setting's shapes); medians of the warm ones."""
    runs = {"solo": [], "alone": [], "together": []}
    for _ in range(repeats):
        runs["solo"].append(_run_solo(model, spec, chat_prompt))
        runs["alone"].append(_run_alone(model, spec, doc_prompt))
        runs["together"].append(_run_together(model, spec, chat_prompt, doc_prompt, max_chat))
    warm = {k: v[1:] if len(v) > 1 else v for k, v in runs.items()}
    s, a, t = warm["solo"], warm["alone"], warm["together"]
    chat_solo = {k: statistics.median(_per_step_ms(r["main"], r["steps"])[k] for r in s)
                 for k in ("model", "async_eval", "flush", "host")}
    chat_tog = {k: statistics.median(_per_step_ms(r["main"], r["steps"])[k] for r in t)
                for k in ("model", "async_eval", "flush", "host")}
    pre_alone = {k: _med(a, "prefill", k) for k in ("host", "eval", "model")}
    pre_tog = {k: _med(t, "prefill", k) for k in ("host", "eval", "model")}
    ttft_alone, ttft_tog = _med(a, "ttft_s"), _med(t, "ttft_s")
    return {
        "chat_itl_p50_ms": {"solo": _med(s, "itl_p50_ms"), "together": _med(t, "itl_p50_ms")},
        "chat_itl_p99_ms": {"solo": _med(s, "itl_p99_ms"), "together": _med(t, "itl_p99_ms")},
        "chat_step_ms": {"solo": chat_solo, "together": chat_tog},
        "doc_ttft_s": {"alone": ttft_alone, "together": ttft_tog, "over_alone": ttft_tog / ttft_alone},
        "prefill_thread_s": {"alone": pre_alone, "together": pre_tog},
        "ttft_growth_s": growth_parts(pre_alone, pre_tog, ttft_alone, ttft_tog),
        "slowest_steps": [st for r in t for st in r["slowest_steps"]],
        "runs": runs,
    }


def _fmt(parts: Dict[str, float], total: Optional[float] = None) -> str:
    head = f"{total:.1f}=" if total is not None else ""
    return head + "/".join(f"{k[:5]} {v:.2f}" for k, v in parts.items())


def overlap_profile(model, *, doc_tokens: int, chat_context: int, settings: Sequence[str] = ("overlap-2048",),
                    switch_intervals_s: Sequence[Optional[float]] = (None,), repeats: int = 3, seed: int = 0,
                    progress: bool = True) -> dict:
    """:func:`profile_setting` for each of ``settings`` (labels of
    :data:`mlxlab.studies.contention.run.SETTINGS`, overlap ones) under each GIL switch interval
    (None: Python's own). Returns ``{"runs": {"<label>@<interval>": ...}, "config": ...}``."""
    from mlxlab.core.presets import model_limits
    from mlxlab.engine.warmup import random_prompt

    bad = [s for s in settings if s not in SETTINGS or not SETTINGS[s]["overlap"]]
    if bad:
        raise ValueError(f"overlap_profile profiles overlap settings only; not those: {bad}")
    vocab, max_context = model_limits(model)
    chat_prompt = random_prompt(chat_context, vocab, seed)
    doc_prompt = random_prompt(doc_tokens, vocab, seed + 1)
    max_chat = min(1 << 20, int(max_context) - chat_context - 1)
    # the process's first use of every shape, outside the profile (an engine with its own warm-up)
    warm = make_executor(model, SETTINGS[settings[0]], "policy", doc_tokens)
    together(warm, chat_prompt, doc_prompt, max_chat)
    default = sys.getswitchinterval()
    out = {}
    t0 = time.perf_counter()
    try:
        for label in settings:
            for interval in switch_intervals_s:
                sys.setswitchinterval(default if interval is None else float(interval))
                key = f"{label}@{'default' if interval is None else interval}"
                out[key] = profile_setting(model, SETTINGS[label], chat_prompt, doc_prompt, max_chat, repeats)
                out[key]["switch_interval_s"] = sys.getswitchinterval()
                if progress:
                    r = out[key]
                    print(f"  {key}: ITL p99 {r['chat_itl_p99_ms']['together']:.2f}/{r['chat_itl_p99_ms']['solo']:.2f} ms, "
                          f"TTFT {r['doc_ttft_s']['together']:.3f}/{r['doc_ttft_s']['alone']:.3f} s; growth "
                          f"{_fmt(r['ttft_growth_s'])}; chat step "
                          f"together {_fmt(r['chat_step_ms']['together'])} solo {_fmt(r['chat_step_ms']['solo'])}; "
                          f"slowest {[_fmt(st['main_ms'], st['step_ms']) for st in r['slowest_steps'][:3]]}", flush=True)
    finally:
        sys.setswitchinterval(default)
    return {"runs": out, "wall_s": time.perf_counter() - t0,
            "config": {"doc_tokens": doc_tokens, "chat_context": chat_context, "settings": list(settings),
                       "switch_intervals_s": list(switch_intervals_s), "repeats": repeats, "seed": seed}}
