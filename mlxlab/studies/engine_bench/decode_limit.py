"""The decode limit: the engine's decode against the fastest loop this stack can run.

The **bare loop** is the least a serving loop can do on mlx-lm: B rows of equal length in one
plain ``KVCache`` per layer (no padding, no mask array, no per-row offsets), greedy, pipelined as
``generate_step`` pipelines (step k is built and queued before step k-1's tokens are read), with
no bookkeeping at all. Whatever the engine spends above it is its own overhead: Python
bookkeeping, masks and padding, cache merges, extra syncs. :func:`decode_limit` runs the bare
loop, the engine and mlx-lm (``generate_step`` at batch 1, ``BatchGenerator`` above) on the same
model object and prompts, alternating their order per repeat, and :func:`host_profile` splits one
decode step of the bare loop and of the engine into where the host's time goes.

A decode step on a small model on a GPU is paced by the host: the device finishes a step sooner
than Python can build the next graph. Then the step costs graph building plus bookkeeping, and the
profile shows which part of that the engine adds.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.core.claims import verdict
from mlxlab.core.metrics import median_and_p99
from mlxlab.core.presets import model_limits, module_of
from mlxlab.engine import loop
from mlxlab.engine.loop import Engine, thread_stream
from mlxlab.engine.warmup import random_prompt
from mlxlab.studies.engine_bench.run import mlx_lm_batched, mlx_lm_single, window_throughput

PREFILL_STEP = 2048  # the bare loop's untimed prefill runs in chunks of this many tokens


def _prefill_rows(module, prompts: List[List[int]]) -> tuple:
    """The rows' prompts less their last tokens into one plain cache (untimed); returns (cache,
    last tokens)."""
    cache = make_prompt_cache(module)
    x = mx.array(prompts, dtype=mx.uint32)
    for a in range(0, x.shape[1] - 1, PREFILL_STEP):
        module(x[:, a:min(a + PREFILL_STEP, x.shape[1] - 1)], cache=cache)
        mx.eval([c.state for c in cache])
    return cache, x[:, -1]


def bare_decode(model, prompts: List[List[int]], tokens: int, timer: Optional[Dict[str, float]] = None) -> Dict:
    """Decode ``tokens`` greedy tokens for equal-length ``prompts`` in the bare loop (see the module
    docstring). Returns ``times`` (when each step's tokens were read) and ``tokens`` per row.
    With ``timer``, adds the seconds spent building graphs (``graph``), queueing them (``queue``),
    waiting for tokens (``wait``) and in the whole decode loop (``step``) to it, and the steps
    (``steps``)."""
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("the bare loop decodes rows of equal length only")
    module = module_of(model)
    with mx.stream(thread_stream()):  # the engine's stream, so both sides run alike
        cache, y = _prefill_rows(module, prompts)
        clock = time.perf_counter
        t = {"graph": 0.0, "queue": 0.0, "wait": 0.0}

        def step(y):
            t0 = clock()
            out = mx.argmax(module(y[:, None], cache=cache)[:, -1, :], axis=-1)
            t1 = clock()
            mx.async_eval(out)
            t["graph"] += t1 - t0
            t["queue"] += clock() - t1
            return out

        start = clock()  # the decode loop's span (the prefill above is not a decode step)
        y = step(y)
        times, out = [], []
        for _ in range(tokens):
            nxt = step(y)
            t0 = clock()
            out.append(y.tolist())
            times.append(clock())
            t["wait"] += times[-1] - t0
            y = nxt
    if timer is not None:
        t["step"] = clock() - start
        for k, v in t.items():
            timer[k] = timer.get(k, 0.0) + v
        timer["steps"] = timer.get("steps", 0) + tokens + 1
    return {"times": times, "tokens": [list(r) for r in zip(*out)]}


def engine_decode(model, prompts: List[List[int]], tokens: int, **engine_options) -> Dict:
    """The same requests through the engine (``interleave``, every prompt prefilled before any
    decode is timed). Returns per-row token ``times`` and ``tokens``."""
    eng = Engine(model, **engine_options)
    reqs = [eng.submit(p, tokens) for p in prompts]
    eng.run()
    return {"times": [r.token_times_s for r in reqs], "tokens": [r.output_tokens for r in reqs]}


def _rate(times: Sequence[float], rows: int) -> float:
    return rows * (len(times) - 1) / (times[-1] - times[0])


def _mlx_lm(model, prompts, tokens) -> Dict:
    if len(prompts) == 1:
        r = mlx_lm_single(model, prompts[0], tokens, PREFILL_STEP)
        return {"rate": _rate(r["times"], 1), "tokens": [r["tokens"]], "name": "generate_step"}
    r = mlx_lm_batched(model, prompts, tokens, PREFILL_STEP)
    return {"rate": window_throughput(r["times"]), "tokens": r["tokens"], "name": "BatchGenerator"}


def _paired(a: List[float], b: List[float]) -> Dict:
    ratios = sorted(x / y for x, y in zip(a, b))
    return {"median": float(statistics.median(ratios)), "min": ratios[0], "max": ratios[-1], "ratios": ratios}


def decode_limit(model, *, batches: Sequence[int] = (1, 8), context: int = 1024, tokens: int = 128,
                 repeats: int = 5, seed: int = 0, progress: bool = True) -> Dict:
    """Decode tok/s of the bare loop, the engine, the engine with its compiled decode step
    (``compile_decode=True``) and mlx-lm at each batch size, ``repeats`` times in alternating order,
    on rows of ``context`` prompt tokens. Per batch: each side's median/p99, the paired per-repeat
    ratios engine / bare, mlx-lm / bare, engine / mlx-lm, compiled / mlx-lm and compiled / engine,
    whether the engine's greedy tokens equal the bare loop's and mlx-lm's and the compiled engine's
    the engine's, and :func:`host_profile`."""
    for name, v in (("context", context), ("tokens", tokens), ("repeats", repeats)):
        if not isinstance(v, int) or v < 2:
            raise ValueError(f"{name} must be an integer of at least 2, got {v!r}")
    vocab = model_limits(model)[0]
    out = {"config": {"batches": list(batches), "context": context, "tokens": tokens, "repeats": repeats,
                      "seed": seed}, "batches": {}}
    bar = None
    if progress:
        from tqdm.auto import tqdm  # notebook plumbing, optional
        bar = tqdm(total=len(batches) * repeats, desc="decode limit")
    for b in batches:
        prompts = [random_prompt(context, vocab, seed + 100 * b + i) for i in range(b)]
        warm = [p[:64] for p in prompts]  # kernels and allocator, untimed
        bare_decode(model, warm, 4), engine_decode(model, warm, 4), _mlx_lm(model, warm, 4)
        engine_decode(model, prompts, 4, compile_decode=True)  # traces the compiled step at these rows' buffer
        s = {"bare": [], "engine": [], "mlx_lm": [], "compiled": []}
        agree = {"engine_vs_bare": True, "engine_vs_mlx_lm": True, "compiled_vs_engine": True}
        ref_name = "generate_step" if b == 1 else "BatchGenerator"
        for i in range(repeats):
            sides = ["bare", "engine", "mlx_lm", "compiled"]
            for side in (sides if i % 2 == 0 else sides[::-1]):
                if side == "bare":
                    r = bare_decode(model, prompts, tokens)
                    s["bare"].append(_rate(r["times"], b))
                    bare_tokens = r["tokens"]
                elif side in ("engine", "compiled"):
                    r = engine_decode(model, prompts, tokens, compile_decode=side == "compiled")
                    s[side].append(window_throughput(r["times"]))
                    if side == "engine":
                        eng_tokens = r["tokens"]
                    else:
                        compiled_tokens = r["tokens"]
                else:
                    r = _mlx_lm(model, prompts, tokens)
                    s["mlx_lm"].append(r["rate"])
                    ref_tokens = r["tokens"]
            agree["engine_vs_bare"] &= eng_tokens == bare_tokens
            agree["engine_vs_mlx_lm"] &= eng_tokens == ref_tokens
            agree["compiled_vs_engine"] &= compiled_tokens == eng_tokens
            if bar is not None:
                bar.update()
        out["batches"][str(b)] = {
            "mlx_lm_side": ref_name, "tok_s": {k: median_and_p99(v) for k, v in s.items()}, "samples": s,
            "engine_over_bare": _paired(s["engine"], s["bare"]),
            "mlx_lm_over_bare": _paired(s["mlx_lm"], s["bare"]),
            "engine_over_mlx_lm": _paired(s["engine"], s["mlx_lm"]),
            "compiled_over_mlx_lm": _paired(s["compiled"], s["mlx_lm"]),
            "compiled_over_engine": _paired(s["compiled"], s["engine"]),
            "greedy_tokens_agree": agree,
            "host_profile": host_profile(model, prompts, min(tokens, 64)),
        }
    if bar is not None:
        bar.close()
    return out


class _TimedModule:
    """Stands in for an mlx-lm model and adds the seconds its calls take (graph building: the
    arrays are lazy) to ``timer["graph"]``; every other attribute is the model's."""

    def __init__(self, module, timer: Dict[str, float]):
        self._module, self._timer = module, timer

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._module(*args, **kwargs)
        finally:
            self._timer["graph"] += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self._module, name)


class _TimedMx:
    """``mx`` as the engine's loop module sees it, with ``async_eval`` timed into ``timer["queue"]``."""

    def __init__(self, timer: Dict[str, float]):
        self._timer = timer

    def async_eval(self, *args):
        t0 = time.perf_counter()
        try:
            return mx.async_eval(*args)
        finally:
            self._timer["queue"] += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(mx, name)


@contextlib.contextmanager
def _timed_loop_mx(timer: Dict[str, float]):
    saved = loop.mx
    loop.mx = _TimedMx(timer)
    try:
        yield
    finally:
        loop.mx = saved


def _engine_profile(model, prompts: List[List[int]], tokens: int) -> Dict[str, float]:
    timer = {"graph": 0.0, "queue": 0.0, "wait": 0.0, "deliver": 0.0, "step": 0.0}
    eng = Engine(model)
    for p in prompts:
        eng.submit(p, tokens)
    while eng._queue or eng._ready:  # prefill and the first decode, untimed
        eng.step()
    flush, deliver = eng._flush, eng._deliver

    def timed_flush():
        t0 = time.perf_counter()
        d0 = timer["deliver"]
        flush()
        timer["wait"] += time.perf_counter() - t0 - (timer["deliver"] - d0)

    def timed_deliver(*args):
        t0 = time.perf_counter()
        deliver(*args)
        timer["deliver"] += time.perf_counter() - t0

    eng._flush, eng._deliver, eng.module = timed_flush, timed_deliver, _TimedModule(eng.module, timer)
    steps = 0
    with _timed_loop_mx(timer):
        while eng.has_work:
            t0 = time.perf_counter()
            eng.step()
            timer["step"] += time.perf_counter() - t0
            steps += 1
        eng.flush()
    return _per_step(timer, steps)


def _per_step(timer: Dict[str, float], steps: int) -> Dict[str, float]:
    """Microseconds per step of each part, and ``other_us``: the step less every timed part
    (bookkeeping: planning, records, rows)."""
    out = {f"{k}_us": 1e6 * v / steps for k, v in timer.items() if k not in ("step", "steps")}
    out["step_us"] = 1e6 * timer["step"] / steps
    out["other_us"] = out["step_us"] - sum(v for k, v in out.items() if k != "step_us")
    out["steps"] = steps
    return out


def host_profile(model, prompts: List[List[int]], tokens: int = 64) -> Dict[str, Dict[str, float]]:
    """Where a decode step's host time goes, in microseconds per step, for the bare loop and the
    engine on the same rows: ``graph`` (calling the model: building the lazy graph), ``queue``
    (``mx.async_eval``: handing it to the device; it blocks when the device is far behind),
    ``wait`` (reading the previous step's tokens: waiting for the device), ``deliver`` (the
    engine handing tokens to requests) and ``other`` (the rest: planning, records, rows). A step
    whose ``wait`` is near zero is paced by the host."""
    timer: Dict[str, float] = {}
    bare_decode(model, prompts, tokens, timer=timer)
    steps = timer.pop("steps")
    return {"bare": _per_step(timer, steps), "engine": _engine_profile(model, prompts, tokens)}


def limit_verdict(presets: Dict[str, Dict], low: float = 0.9) -> Dict:
    """The ``mlx-decode-near-limit`` verdict from :func:`decode_limit` results by preset: reproduced
    when the median paired ratio engine / bare loop is at least ``low`` at every batch size on every
    preset. Measured: the worst preset and batch, its ratio and spread, and the same for engine /
    mlx-lm."""
    rows = [(name, b, r) for name, res in presets.items() for b, r in res["batches"].items()]
    rule = (f"Per preset and batch size, the median of per-repeat paired ratios engine / bare loop decode tok/s "
            f"(same model object, prompts and process, order alternating per repeat); reproduced when every "
            f"median is at least {low:g}, not reproduced otherwise. The bare loop decodes equal-length rows in "
            f"one plain KVCache with no bookkeeping.")
    fairness = ("Both sides greedy on the same rows, after an untimed warm-up of both; the engine includes its "
                "planning, records and token delivery, the bare loop nothing but the model; the paired ratios' "
                "min and max show the repeat-to-repeat spread.")
    if not rows:
        return verdict("mlx-decode-near-limit", "not measured", measured=None, rule=rule,
                       fairness="no decode-limit rows in these results")
    name, b, worst = min(rows, key=lambda x: x[2]["engine_over_bare"]["median"])
    vs_ref = min(rows, key=lambda x: x[2]["engine_over_mlx_lm"]["median"])
    measured = {"engine_over_bare_x": worst["engine_over_bare"]["median"],
                "engine_over_bare_min_x": worst["engine_over_bare"]["min"],
                "engine_over_bare_max_x": worst["engine_over_bare"]["max"],
                "model": name, "batch": int(b),
                "engine_over_mlx_lm_x": vs_ref[2]["engine_over_mlx_lm"]["median"],
                "engine_over_mlx_lm_at": f"{vs_ref[0]}:b{vs_ref[1]}",
                "presets": len(presets)}
    ok = worst["engine_over_bare"]["median"] >= low
    return verdict("mlx-decode-near-limit", "reproduced" if ok else "not reproduced", measured=measured,
                   rule=rule, fairness=fairness)


def _b1_rows(presets: Dict[str, Dict]) -> List[tuple]:
    return [(name, res["batches"]["1"]) for name, res in presets.items() if "1" in res.get("batches", {})]


def _against_mlx_lm(claim_id: str, rows: List[tuple], key: str, target: float, what: str) -> Dict:
    """A verdict on ``key`` (paired ratios against generate_step at batch 1) being at least
    ``target`` on every preset, inconclusive where a preset's repeats straddle the target."""
    rule = (f"At batch 1, per preset, the median of per-repeat paired ratios {what} / generate_step decode tok/s "
            f"(same model object, prompts and process, order alternating per repeat). Reproduced when every "
            f"preset's median is at least {target:g} and its lowest paired ratio too; not reproduced when a "
            f"preset's highest paired ratio is below {target:g}; inconclusive when a preset's repeats straddle "
            f"{target:g} (the spread cannot place it).")
    fairness = ("Both sides greedy on the same prompt, after an untimed warm-up of both (and of the compiled step "
                "at this buffer size); min and max of the paired ratios give the repeat-to-repeat spread.")
    rows = [(n, r[key]) for n, r in rows if key in r]
    if not rows:
        return verdict(claim_id, "not measured", measured=None, rule=rule,
                       fairness="no batch-1 decode-limit rows with this side in these results")
    measured = {n: {"median_x": p["median"], "min_x": p["min"], "max_x": p["max"]} for n, p in rows}
    below = [n for n, p in rows if p["max"] < target]
    straddle = [n for n, p in rows if p["min"] < target <= p["max"]]
    v = "not reproduced" if below else ("inconclusive" if straddle else "reproduced")
    measured = {"presets": measured, "below": below, "straddling": straddle, "within_noise": bool(straddle) and not below}
    return verdict(claim_id, v, measured=measured, rule=rule, fairness=fairness)


def parity_verdict(presets: Dict[str, Dict]) -> Dict:
    """``mlx-decode-b1-parity``: the engine's batch-1 decode at least as fast as ``generate_step``."""
    return _against_mlx_lm("mlx-decode-b1-parity", _b1_rows(presets), "engine_over_mlx_lm", 1.0, "engine")


def compiled_verdict(presets: Dict[str, Dict], target: float = 1.3) -> Dict:
    """``mlx-compiled-decode``: the compiled decode step at least ``target`` x ``generate_step`` at
    batch 1 (the claim's presets: the 0.5b and 1b ones where measured, else every preset)."""
    rows = _b1_rows(presets)
    named = [(n, r) for n, r in rows if n in ("qwen2.5-0.5b", "llama-3.2-1b")]
    return _against_mlx_lm("mlx-compiled-decode", named or rows, "compiled_over_mlx_lm", target,
                           "engine with compile_decode=True")


def decode_verdicts(presets: Dict[str, Dict]) -> List[Dict]:
    """The three verdicts the decode-limit rows decide."""
    return [limit_verdict(presets), parity_verdict(presets), compiled_verdict(presets)]
