"""Side-by-side benchmarks: the engine against mlx-lm on the same model object, in one run.

Every figure is a median over repeats (p99 and the raw samples are kept too), and every ratio
is mlxlab / mlx-lm measured in the same process, alternating the two sides so drift in the
machine hits both equally.
"""

from __future__ import annotations

import statistics
import time
from typing import Dict, List, Sequence

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step

from mlxlab.core.metrics import median_and_p99
from mlxlab.core.presets import model_limits, module_of
from mlxlab.engine.loop import Engine
from mlxlab.engine.warmup import random_prompt


def window_throughput(token_times: Sequence[Sequence[float]]) -> float:
    """Decode tokens per second while every stream is decoding: tokens stamped inside
    [latest first token, earliest last token] over that window's length."""
    start = max(t[0] for t in token_times)
    end = min(t[-1] for t in token_times)
    if end <= start:
        return float("nan")
    n = sum(1 for ts in token_times for x in ts[1:] if start < x <= end)
    return n / (end - start)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def mlx_lm_single(model, prompt: List[int], max_tokens: int, prefill_step_size: int) -> Dict:
    """One request through mlx-lm's ``generate_step``: TTFT, decode tok/s and the tokens."""
    t0 = time.perf_counter()
    times, tokens = [], []
    for tok, _ in generate_step(mx.array(prompt), module_of(model), max_tokens=max_tokens,
                                prefill_step_size=prefill_step_size):
        times.append(time.perf_counter())
        tokens.append(int(tok))
    return {"ttft_s": times[0] - t0, "times": times, "tokens": tokens}


def engine_single(model, prompt: List[int], max_tokens: int, chunk_size: int) -> Dict:
    eng = Engine(model, policy="interleave", chunk_size=chunk_size)
    req = eng.submit(prompt, max_tokens)
    eng.run()
    return {"ttft_s": req.ttft_s, "times": req.token_times_s, "tokens": req.output_tokens}


def mlx_lm_batched(model, prompts: List[List[int]], max_tokens: int, prefill_step_size: int) -> Dict:
    """All prompts into one ``BatchGenerator`` at once, run to completion; per-stream token times."""
    gen = BatchGenerator(module_of(model), max_tokens=max_tokens, prefill_step_size=prefill_step_size)
    uids = gen.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    times = {u: [] for u in uids}
    tokens = {u: [] for u in uids}
    left = set(uids)
    while left:
        for r in gen.next_generated():
            times[r.uid].append(time.perf_counter())
            tokens[r.uid].append(int(r.token))
            if r.finish_reason is not None:
                left.discard(r.uid)
    gen.close()
    return {"times": [times[u] for u in uids], "tokens": [tokens[u] for u in uids]}


def engine_batched(model, prompts: List[List[int]], max_tokens: int, chunk_size: int) -> Dict:
    eng = Engine(model, policy="interleave", chunk_size=chunk_size)
    reqs = [eng.submit(p, max_tokens) for p in prompts]
    eng.run()
    return {"times": [r.token_times_s for r in reqs], "tokens": [r.output_tokens for r in reqs]}


def _ratio(ours: List[float], theirs: List[float]) -> Dict:
    """Both sides' median/p99, the ratio of medians, and the median of the per-repeat ratios
    (each repeat runs both sides back to back, so pairing cancels slow drift of the machine)."""
    a, b = median_and_p99(ours), median_and_p99(theirs)
    paired = sorted(x / y for x, y in zip(ours, theirs))
    return {"mlxlab": a, "mlx_lm": b, "ratio": a["median"] / b["median"],
            "paired_ratio_median": float(statistics.median(paired)), "paired_ratios": paired}


def bench_engine(model, *, prompt_tokens: int = 512, decode_tokens: int = 128, batch: int = 8,
                 batch_prompt_tokens: int = 64, chunk_size: int = 2048, repeats: int = 5,
                 seed: int = 0, progress: bool = True) -> Dict:
    """Single-stream prefill and decode tok/s against ``generate_step`` and decode throughput
    of ``batch`` concurrent streams against ``BatchGenerator``, on the same model object.

    Returns a dict with, per metric, both sides' median/p99 and the ratio mlxlab / mlx-lm
    (above 1 means the engine is faster), plus whether greedy tokens agreed."""
    vocab = model_limits(model)[0]
    prompt = random_prompt(prompt_tokens, vocab, seed)
    prompts = [random_prompt(batch_prompt_tokens + 3 * i, vocab, seed + 1 + i) for i in range(batch)]

    # Warm up both paths (kernel compilation, allocator) before anything is timed.
    mlx_lm_single(model, prompt[:64], 4, chunk_size)
    engine_single(model, prompt[:64], 4, chunk_size)
    mlx_lm_batched(model, [p[:16] for p in prompts], 4, chunk_size)
    engine_batched(model, [p[:16] for p in prompts], 4, chunk_size)

    s = {k: [] for k in ("prefill_ours", "prefill_ref", "decode_ours", "decode_ref", "batch_ours", "batch_ref")}
    agree_single, agree_batch = True, True
    prefix = {"single": [], "batched": []}  # tokens equal before the first difference, per repeat
    steps = range(repeats)
    if progress:
        from tqdm.auto import tqdm  # notebook plumbing, optional
        steps = tqdm(steps, desc="bench engine", leave=False)
    for i in steps:
        # alternate which side goes first so slow drift in the machine hits both alike
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            if side == 0:
                ref = mlx_lm_single(model, prompt, decode_tokens, chunk_size)
                s["prefill_ref"].append(prompt_tokens / ref["ttft_s"])
                s["decode_ref"].append((len(ref["times"]) - 1) / (ref["times"][-1] - ref["times"][0]))
                bref = mlx_lm_batched(model, prompts, decode_tokens, chunk_size)
                s["batch_ref"].append(window_throughput(bref["times"]))
            else:
                ours = engine_single(model, prompt, decode_tokens, chunk_size)
                s["prefill_ours"].append(prompt_tokens / ours["ttft_s"])
                s["decode_ours"].append((len(ours["times"]) - 1) / (ours["times"][-1] - ours["times"][0]))
                bours = engine_batched(model, prompts, decode_tokens, chunk_size)
                s["batch_ours"].append(window_throughput(bours["times"]))
        agree_single &= ours["tokens"] == ref["tokens"]
        agree_batch &= bours["tokens"] == bref["tokens"]
        prefix["single"].append(common_prefix(ours["tokens"], ref["tokens"]))
        prefix["batched"].append(min(common_prefix(a, b) for a, b in zip(bours["tokens"], bref["tokens"])))
    return {
        "config": {"prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens, "batch": batch,
                   "batch_prompt_tokens": batch_prompt_tokens, "chunk_size": chunk_size,
                   "repeats": repeats, "seed": seed},
        "single_prefill_tok_s": _ratio(s["prefill_ours"], s["prefill_ref"]),
        "single_decode_tok_s": _ratio(s["decode_ours"], s["decode_ref"]),
        "batched_decode_tok_s": _ratio(s["batch_ours"], s["batch_ref"]),
        "greedy_tokens_agree": {"single": agree_single, "batched": agree_batch},
        # in bfloat16 a near-tie can flip one token and everything after it differs: how far they agree
        "greedy_common_prefix_min": {k: min(v) for k, v in prefix.items()},
        "samples": s,
    }
