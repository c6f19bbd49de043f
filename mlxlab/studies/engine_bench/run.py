"""Side-by-side benchmarks: the engine against mlx-lm on the same model object, in one run.

Every figure is a median over repeats (p99 and the raw samples are kept too), and every ratio
is mlxlab / mlx-lm measured in the same process, alternating the two sides so drift in the
machine hits both equally. :func:`verdicts` scores the claims these runs decide
(``mlx-engine-exact``, ``mlx-engine-speed``, ``s001-batching-cheap``); the overview notebook and
``mlxlab bench engine`` both store them.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Dict, List, Mapping, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step

from mlxlab.core.claims import verdict
from mlxlab.core.metrics import median_and_p99
from mlxlab.core.presets import model_limits, module_of
from mlxlab.engine.loop import Engine
from mlxlab.engine.warmup import random_prompt
from mlxlab.studies.rules import common_prefix, noise_outcome, paired_band


def window_throughput(token_times: Sequence[Sequence[float]]) -> float:
    """Decode tokens per second while every stream is decoding: tokens stamped inside
    [latest first token, earliest last token] over that window's length."""
    start = max(t[0] for t in token_times)
    end = min(t[-1] for t in token_times)
    if end <= start:
        return float("nan")
    n = sum(1 for ts in token_times for x in ts[1:] if start < x <= end)
    return n / (end - start)


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
    (above 1 means the engine is faster), whether greedy tokens agreed, and
    ``batch_step_cost`` (:func:`batch_step_cost`: the engine's batch-``batch`` decode step
    against one stream of that batch decoding alone)."""
    vocab = model_limits(model)[0]
    prompt = random_prompt(prompt_tokens, vocab, seed)
    prompts = [random_prompt(batch_prompt_tokens + 3 * i, vocab, seed + 1 + i) for i in range(batch)]

    # Warm up both paths (kernel compilation, allocator) before anything is timed.
    mlx_lm_single(model, prompt[:64], 4, chunk_size)
    engine_single(model, prompt[:64], 4, chunk_size)
    mlx_lm_batched(model, [p[:16] for p in prompts], 4, chunk_size)
    engine_batched(model, [p[:16] for p in prompts], 4, chunk_size)

    s = {k: [] for k in ("prefill_ours", "prefill_ref", "decode_ours", "decode_ref", "batch_ours", "batch_ref",
                         "solo_ours")}
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
                # one stream of the batch alone: the batch-1 step at the batch's own context
                solo = engine_single(model, prompts[0], decode_tokens, chunk_size)
                s["solo_ours"].append((len(solo["times"]) - 1) / (solo["times"][-1] - solo["times"][0]))
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
        "batch_step_cost": batch_step_cost(s["batch_ours"], s["solo_ours"], batch),
        "greedy_tokens_agree": {"single": agree_single, "batched": agree_batch},
        # in bfloat16 a near-tie can flip one token and everything after it differs: how far they agree
        "greedy_common_prefix_min": {k: min(v) for k, v in prefix.items()},
        "samples": s,
    }


def batch_step_cost(batched_tok_s: Sequence[float], solo_tok_s: Sequence[float], batch: int) -> Dict:
    """What one decode step of ``batch`` streams costs against a step of one stream at the same
    context, per repeat: step_ms_batch = 1000 * batch / aggregate tok/s, step_ms_b1 = 1000 / solo
    tok/s, ``ratio_x`` their ratio (1: batching is free, ``batch``: no sharing at all) and
    ``aggregate_speedup_x`` = aggregate / solo tok/s, both as the median of per-repeat values."""
    pairs = [(b, s) for b, s in zip(batched_tok_s, solo_tok_s) if math.isfinite(b) and math.isfinite(s) and b > 0]
    ratios = sorted(batch * s / b for b, s in pairs)
    return {"batch": batch, "step_ms_b1": median_and_p99([1e3 / s for _, s in pairs]),
            "step_ms_batch": median_and_p99([1e3 * batch / b for b, _ in pairs]),
            "ratio_x": float(statistics.median(ratios)) if ratios else float("nan"), "paired_ratios": ratios,
            "aggregate_speedup_x": float(statistics.median([b / s for b, s in pairs])) if pairs else float("nan")}


def exactness_check(model, lengths: Sequence[int] = (7, 40, 90, 3), max_tokens: int = 12, chunk_size: int = 16,
                    seed: int = 0) -> Dict:
    """Greedy tokens of requests that arrive two engine steps apart (so they join while others
    prefill and decode) against ``generate_step`` on each prompt alone. Per request: equal,
    the common prefix, and the reference's gap between its two best log-probabilities where
    the streams part (a near-tie there means rounding, not a bug, chose the token)."""
    vocab = model_limits(model)[0]
    prompts = [random_prompt(n, vocab, seed + i) for i, n in enumerate(lengths)]
    eng = Engine(model, chunk_size=chunk_size)
    reqs = []
    for p in prompts:
        reqs.append(eng.submit(p, max_tokens))
        eng.step()
        eng.step()
    eng.run()
    rows = []
    for p, r in zip(prompts, reqs):
        ref, gaps = [], []
        for tok, logprobs in generate_step(mx.array(p), module_of(model), max_tokens=max_tokens):
            top2 = mx.sort(logprobs.reshape(-1))[-2:]
            ref.append(int(tok))
            gaps.append(float((top2[1] - top2[0]).item()))
        n = common_prefix(r.output_tokens, ref)
        rows.append({"prompt_tokens": len(p), "equal": r.output_tokens == ref, "common_prefix": n,
                     "tokens": len(ref), "ref_top2_gap_at_split": gaps[n] if n < len(gaps) else None})
    return {"chunk_size": chunk_size, "max_tokens": max_tokens, "requests": rows}


SPEED_METRICS = {"prefill": ("single_prefill_tok_s", "generate_step"),
                 "decode": ("single_decode_tok_s", "generate_step"),
                 "batched_decode": ("batched_decode_tok_s", "BatchGenerator")}


def _exact_verdict(presets: Mapping[str, Mapping], exact: Optional[Mapping]) -> Dict:
    rows = list(exact["requests"]) if exact else []
    single = all(r["greedy_tokens_agree"]["single"] for r in presets.values())
    batched = all(r["greedy_tokens_agree"]["batched"] for r in presets.values())
    prefixes = [r["common_prefix"] for r in rows if not r["equal"]]
    for res in presets.values():
        agree, pre = res["greedy_tokens_agree"], res.get("greedy_common_prefix_min", {})
        prefixes += [pre[k] for k in ("single", "batched") if not agree[k] and k in pre]
    equal = sum(r["equal"] for r in rows)
    dtypes = sorted({str(r["model"]["dtype"]).replace("mlx.core.", "") for r in presets.values() if "model" in r})
    measured = {"exact_requests_equal": equal if exact else None, "exact_requests": len(rows) if exact else None,
                "bench_single_agree": single, "bench_batched_agree": batched,
                "decode_tokens": min((r["config"]["decode_tokens"] for r in presets.values()), default=None),
                "common_prefix_min_tokens": min(prefixes) if prefixes else None,
                "dtype": ",".join(dtypes) or None}
    ok = single and batched and equal == len(rows)
    return verdict(
        "mlx-engine-exact", "reproduced" if ok else "not reproduced", measured=measured,
        rule="Reproduced when every compared stream has the reference's greedy tokens exactly: the staggered-arrival "
             "check against generate_step (when run) and every bench repeat, one stream against generate_step and "
             "eight against BatchGenerator; any difference is not reproduced (common_prefix_min_tokens: how far "
             "the first differing stream agreed).",
        fairness="Same model object and prompts on both sides, in one process; in bfloat16 or float16 a near-tie "
                 "between the two best logits can flip a token through rounding alone, so a difference on a GPU "
                 "dtype is weaker evidence than one in float32.")


def _speed_verdict(presets: Mapping[str, Mapping], floor: float) -> Dict:
    measured, slower, unseen, worst = {}, [], [], {}
    repeats = min((r["config"]["repeats"] for r in presets.values()), default=None)
    for name, res in presets.items():
        for m, (key, _vs) in SPEED_METRICS.items():
            paired = res[key].get("paired_ratios") or [res[key]["ratio"]]
            med, band = paired_band(paired, floor)
            if not math.isfinite(med):
                continue
            noise = paired_band(paired, 0.0)[1]  # the measured spread alone: the floor is the resolution
            out = noise_outcome(med >= 1 - floor, margin=med - (1 - floor), band=noise, repeats=repeats)
            if out["verdict"] == "not reproduced":
                slower.append(f"{name}:{m}")
            elif out["verdict"] == "inconclusive":
                unseen.append((f"{name}:{m}", out.get("repeats_to_resolve")))
            if m not in worst or med - band < worst[m][0] - worst[m][1]:
                worst[m] = (med, band)
    for m in SPEED_METRICS:
        med, band = worst.get(m, (None, None))
        measured[f"{m}_ratio_x"], measured[f"{m}_band_x"] = med, band
    need = [n for _, n in unseen if n]
    measured.update({"slower": ",".join(slower), "unresolved": ",".join(k for k, _ in unseen),
                     "within_noise": bool(unseen) and not slower, "repeats_to_resolve": max(need) if need else None,
                     "presets": len(presets), "repeats": repeats})
    if len(worst) < len(SPEED_METRICS):
        v = "not measured"
    else:
        v = "not reproduced" if slower else ("inconclusive" if unseen else "reproduced")
    return verdict(
        "mlx-engine-speed", v, measured=measured,
        rule=f"Per model and metric, the median of the per-repeat paired ratios mlxlab / mlx-lm (prefill and decode "
             f"vs generate_step, 8-stream decode vs BatchGenerator) against 1 - {floor:g} (at least as fast, to "
             f"the benchmark's {floor:g} resolution), with the noise 3 x MAD / sqrt(repeats) of the paired ratios "
             f"(band = max({floor:g}, noise)). A metric is slower when its median is below that line by more than "
             f"its noise, and unresolved when its noise reaches across the line (the repeats cannot tell; repeats_to_resolve: how "
             f"many would). Not reproduced when a metric is slower, inconclusive when none is but one is "
             f"unresolved, reproduced otherwise; *_ratio_x / *_band_x are the closest-to-slower model's.",
        fairness="Both sides run on the same model object in the same process, back to back in every repeat with "
                 "the order alternating, after an untimed warm-up of both; the band widens with the measured "
                 "repeat-to-repeat spread, so few or noisy repeats can only hide a small slowdown, not invent one.")


def _cheap_verdict(presets: Mapping[str, Mapping], cheap_max_x: float) -> Dict:
    costs = {n: r["batch_step_cost"] for n, r in presets.items() if "batch_step_cost" in r
             and math.isfinite(r["batch_step_cost"]["ratio_x"])}
    rule = (f"Cheap means a decode step of the whole batch costs at most {cheap_max_x:g}x a one-stream step at the "
            f"same context (so B streams decode at least B/{cheap_max_x:g} times as fast as one); reproduced when "
            f"the median per-repeat ratio step_cost_ratio_x is at most {cheap_max_x:g} on every model (the worst is "
            f"reported, with its band 3 x MAD / sqrt(repeats)), not reproduced otherwise.")
    if not costs:
        return verdict("s001-batching-cheap", "not measured", measured=None, rule=rule,
                       fairness="these runs have no batch_step_cost (written before it was measured)")
    name, c = max(costs.items(), key=lambda kv: kv[1]["ratio_x"])
    _med, band = paired_band(c["paired_ratios"], 0.0)
    measured = {"step_cost_ratio_x": c["ratio_x"], "step_cost_band_x": band, "batch": c["batch"],
                "step_ms_b1": c["step_ms_b1"]["median"], "step_ms_batch": c["step_ms_batch"]["median"],
                "aggregate_speedup_x": c["aggregate_speedup_x"], "model": name}
    return verdict(
        "s001-batching-cheap", "reproduced" if c["ratio_x"] <= cheap_max_x else "not reproduced", measured=measured,
        rule=rule,
        fairness="The engine's batched decode (all streams decoding) against one stream of that batch decoding alone "
                 "on the same engine and model, in the same repeat; the seed's model is a 35B MoE read from 546 GB/s "
                 "memory, where weight reads dominate a step far more than for a small model on this device.")


def verdicts(presets: Mapping[str, Mapping], exact: Optional[Mapping] = None, *, speed_floor: float = 0.02,
             cheap_max_x: float = 2.0) -> List[Dict]:
    """The verdicts of ``mlx-engine-exact``, ``mlx-engine-speed`` and ``s001-batching-cheap`` from
    :func:`bench_engine` results by model name (``presets``) and, optionally, an
    :func:`exactness_check`. Measured keys: exact: exact_requests_equal, exact_requests,
    bench_single_agree, bench_batched_agree, decode_tokens, common_prefix_min_tokens, dtype;
    speed: {prefill,decode,batched_decode}_ratio_x and _band_x, slower, presets, repeats;
    cheap: step_cost_ratio_x, step_cost_band_x, batch, step_ms_b1, step_ms_batch,
    aggregate_speedup_x, model."""
    return [_exact_verdict(presets, exact), _speed_verdict(presets, speed_floor), _cheap_verdict(presets, cheap_max_x)]
