"""What the HTTP path costs (issue 18): the same requests through ``mlxlab serve`` (the openai
client, in a process of its own, over loopback, streaming) and submitted to an in-process
:class:`mlxlab.Engine`, on the same model object, for 1 and N concurrent streams.

Per round and concurrency, the two paths run back to back, in alternating order, with the same
options and prompts (random ids, one per stream): in-process on a fresh engine on this thread,
over HTTP through one server started for the whole study, as a server runs. A server per round
(the first version) put a new engine thread, and so a new mlx stream, behind every round: on the
H200 its first request then paid the new stream's first use, 4-8x the in-process TTFT at one
stream (``data/results/h200/serve_overhead_server_per_round.json``). TTFT is from sending (HTTP)
or submitting (in-process) to the first token; ITL is the gap between a stream's consecutive
tokens, as the client sees them arrive (HTTP: the arrival of each SSE chunk, stamped per token)
or as the engine reads them. Figures are pooled over the rounds; the ratios are HTTP over
in-process. Importing this module loads no MLX.
"""

from __future__ import annotations

import time
from typing import Dict, List, Sequence

import numpy as np


def _pct(xs: Sequence[float], p: float) -> float:
    return float(np.percentile(xs, p)) if len(xs) else float("nan")


def _summary(ttft: List[float], itl: List[float]) -> Dict[str, float]:
    return {"ttft_p50_ms": 1e3 * _pct(ttft, 50), "ttft_p99_ms": 1e3 * _pct(ttft, 99),
            "itl_p50_ms": 1e3 * _pct(itl, 50), "itl_p99_ms": 1e3 * _pct(itl, 99), "n_ttft": len(ttft),
            "n_itl": len(itl)}


def in_process(model, prompts: List[List[int]], max_tokens: int, **engine_options) -> Dict[str, list]:
    from mlxlab.engine.loop import Engine

    eng = Engine(model, **engine_options)
    reqs = [eng.submit(p, max_tokens) for p in prompts]
    eng.run()
    return {"ttft": [r.ttft_s for r in reqs], "itl": [g for r in reqs for g in r.itl_s],
            "tokens": [r.output_tokens for r in reqs]}


# the HTTP client runs in a process of its own, as a tenant's would: in the server's process its
# parsing of every streamed chunk would take the GIL from the engine thread and be counted as the
# server's cost. It prints one JSON line: per stream, the send time, its token ids and their times.
_CLIENT = r"""
import asyncio, json, sys, time
import openai
url, model, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts = json.loads(sys.stdin.read())

async def one(client, prompt):
    t0 = time.perf_counter()
    times, tokens = [], []
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True)
    async for chunk in stream:
        ids = chunk.choices[0].token_ids or []
        now = time.perf_counter()
        times.extend([now] * len(ids))
        tokens.extend(ids)
    return {"t0": t0, "times": times, "tokens": tokens}

async def main():
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600) as client:
        await client.models.list()  # the connection and the client warm before the clock
        return await asyncio.gather(*(one(client, p) for p in prompts))

print(json.dumps(asyncio.run(main())))
"""


def over_http(url: str, prompts: List[List[int]], max_tokens: int, model_name: str) -> Dict[str, list]:
    """The prompts as concurrent streams from a client process (the openai package) to the server
    at ``url``; the client's clock times them."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CLIENT, url, model_name, str(max_tokens)], input=json.dumps(prompts),
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the HTTP client failed: {out.stderr[-2000:]}")
    results = json.loads(out.stdout.strip().splitlines()[-1])
    return {"ttft": [r["times"][0] - r["t0"] for r in results if r["times"]],
            "itl": [b - a for r in results for a, b in zip(r["times"], r["times"][1:])],
            "tokens": [r["tokens"] for r in results]}


def serve_overhead(model, *, model_name: str, streams: Sequence[int] = (1, 16), prompt_tokens: int = 256,
                   max_tokens: int = 64, repeats: int = 3, seed: int = 0, progress: bool = True,
                   **engine_options) -> dict:
    """The HTTP path against the in-process engine (see the module docstring): per concurrency,
    ``http`` and ``in_process`` summaries (TTFT and ITL p50/p99 in ms), their ratios, and whether
    the two paths produced the same tokens (greedy: they must)."""
    from mlxlab.core.presets import model_limits
    from mlxlab.engine.warmup import random_prompt

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    from mlxlab import serve

    vocab, _ = model_limits(model)
    t_start = time.perf_counter()
    url, stop = serve.start_background(serve.build(model, model_name=model_name, **engine_options))
    try:
        return _rounds(model, url, model_name, streams, prompt_tokens, max_tokens, repeats, seed, progress,
                       engine_options, t_start, vocab, random_prompt)
    finally:
        stop()


def first_differences(a: List[List[int]], b: List[List[int]]) -> List:
    """Per stream, the first position where the two token lists differ (None where they agree)."""
    out = []
    for x, y in zip(a, b):
        i = next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), None)
        out.append(i if i is not None or len(x) == len(y) else min(len(x), len(y)))
    return out


def _rounds(model, url, model_name, streams, prompt_tokens, max_tokens, repeats, seed, progress, engine_options,
            t_start, vocab, random_prompt) -> dict:
    out: Dict[str, dict] = {}
    # a throwaway run of each path first, at the largest concurrency: kernels (mlx CUDA compiles one
    # per shape on first use: a first 16-stream round on the H200 had a TTFT p99 of 42 s), the
    # server's thread and stream and the client warm up
    warm = [random_prompt(prompt_tokens, vocab, seed + 1000 + i) for i in range(max(streams))]
    in_process(model, warm, 4, **engine_options)
    over_http(url, warm, 4, model_name)
    for n in streams:
        prompts = [random_prompt(prompt_tokens, vocab, seed + i) for i in range(n)]
        pooled = {"http": {"ttft": [], "itl": []}, "in_process": {"ttft": [], "itl": []}}
        rounds: Dict[str, List[dict]] = {"http": [], "in_process": []}  # each round's own figures: the spread
        same, diffs = True, []
        for rep in range(repeats):
            order = ("http", "in_process") if rep % 2 == 0 else ("in_process", "http")
            got = {}
            for path in order:
                got[path] = (over_http(url, prompts, max_tokens, model_name) if path == "http"
                             else in_process(model, prompts, max_tokens, **engine_options))
                pooled[path]["ttft"] += got[path]["ttft"]
                pooled[path]["itl"] += got[path]["itl"]
                rounds[path].append(_summary(got[path]["ttft"], got[path]["itl"]))
            same = same and got["http"]["tokens"] == got["in_process"]["tokens"]
            diffs.append(first_differences(got["http"]["tokens"], got["in_process"]["tokens"]))
            if progress:
                print(f"  streams {n}, round {rep + 1}/{repeats}: done", flush=True)
        h, e = _summary(**pooled["http"]), _summary(**pooled["in_process"])
        out[str(n)] = {"http": h, "in_process": e, "same_tokens": same, "first_difference": diffs,
                       "ratios": {k: h[k] / e[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
                                  if e[k] > 0}, "rounds": rounds,
                       "paired_ratios": {k: [a[k] / b[k] if b[k] > 0 else float("nan")
                                             for a, b in zip(rounds["http"], rounds["in_process"])]
                                         for k in ("itl_p99_ms", "ttft_p50_ms")}}
    return {"streams": out, "wall_s": time.perf_counter() - t_start,
            "config": {"streams": list(streams), "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
                       "repeats": repeats, "seed": seed, "engine_options": engine_options}}


def format_table(name: str, res: dict) -> str:
    lines = [f"{name}: HTTP (openai client, streaming, loopback) against the in-process engine",
             f"{'streams':>8} {'path':<11}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}  (ms)"]
    for n, r in res["streams"].items():
        for path in ("in_process", "http"):
            s = r[path]
            lines.append(f"{n:>8} {path:<11}{s['ttft_p50_ms']:>10.2f}{s['ttft_p99_ms']:>10.2f}"
                         f"{s['itl_p50_ms']:>9.2f}{s['itl_p99_ms']:>9.2f}")
        rt = r["ratios"]
        lines.append(f"{'':>8} {'http / in':<11}{rt.get('ttft_p50_ms', float('nan')):>9.2f}x"
                     f"{rt.get('ttft_p99_ms', float('nan')):>9.2f}x{rt.get('itl_p50_ms', float('nan')):>8.2f}x"
                     f"{rt.get('itl_p99_ms', float('nan')):>8.2f}x  same tokens: {r['same_tokens']}")
    return "\n".join(lines)


SERVE_ITL_X = 1.5  # HTTP over in-process ITL p99, at most (data/claims/mlxlab.yaml, mlx-serve-itl)


def serve_verdicts(presets: Dict[str, dict]) -> List[dict]:
    """``mlx-serve-itl`` from :func:`serve_overhead` results by preset: per preset and concurrency the
    HTTP ITL p99 over the in-process one (pooled over the rounds) against SERVE_ITL_X, with a noise band
    from the rounds' own ratios (:func:`~mlxlab.studies.rules.paired_band`, 3 x MAD / sqrt(rounds)): a
    ratio nearer the bound than its band is inconclusive (results before 2026-12-07 #25 store no rounds
    and are decided on the pooled ratio alone). Reproduced when every ratio is under the bound beyond its
    band, not reproduced when one is over it beyond its band, else inconclusive. Measured: the worst
    ratio and where, every ratio and band, and the TTFT p50 the HTTP path added (ms)."""
    from mlxlab.core.claims import verdict
    from mlxlab.studies.rules import noise_outcome, paired_band

    ratios, bands, extra_ttft, same, outs = {}, {}, {}, {}, {}
    for name, res in presets.items():
        for n, r in (res.get("streams") or {}).items():
            key = f"{name}:{n}"
            ratios[key] = round(float(r["ratios"].get("itl_p99_ms", float("nan"))), 3)
            extra_ttft[key] = round(r["http"]["ttft_p50_ms"] - r["in_process"]["ttft_p50_ms"], 1)
            same[key] = bool(r.get("same_tokens"))
            paired = (r.get("paired_ratios") or {}).get("itl_p99_ms")
            if paired and ratios[key] == ratios[key]:
                bands[key] = round(paired_band(paired, 0.0)[1], 3)
                outs[key] = noise_outcome(ratios[key] <= SERVE_ITL_X, margin=SERVE_ITL_X - ratios[key],
                                          band=bands[key], repeats=len(paired))
    finite = {k: v for k, v in ratios.items() if v == v}
    worst = max(finite, key=finite.get) if finite else None
    per = {k: (outs[k]["verdict"] if k in outs else ("reproduced" if v <= SERVE_ITL_X else "not reproduced"))
           for k, v in finite.items()}
    v = ("not measured" if worst is None else "not reproduced" if "not reproduced" in per.values()
         else "inconclusive" if "inconclusive" in per.values() else "reproduced")
    measured = None if worst is None else {"worst": finite[worst], "where": worst, "itl_p99_ratio": ratios,
                                           "http_extra_ttft_p50_ms": extra_ttft, "same_tokens": same}
    if measured is not None and bands:
        need = [o.get("repeats_to_resolve") for o in outs.values() if o.get("repeats_to_resolve")]
        measured.update({"itl_p99_ratio_band": bands, "unresolved": sorted(k for k, x in per.items()
                                                                           if x == "inconclusive"),
                         "repeats_to_resolve": max(need) if need else None})
    return [verdict(
        "mlx-serve-itl", v, measured=measured,
        rule=f"Per preset and concurrency: the HTTP path's ITL p99 (gaps between the arrivals of a stream's tokens "
             f"at the client, pooled over the rounds) over the in-process engine's (gaps as the engine reads its "
             f"tokens), at most {SERVE_ITL_X:g}. Each ratio has a noise band from its rounds' own ratios (3 x their "
             f"median absolute deviation / sqrt(rounds)): reproduced when every ratio is under the bound by more "
             f"than its band, not reproduced when one is over it by more than its band, else inconclusive (with "
             f"the repeats that would resolve it). Results that store no rounds are decided on the pooled ratio "
             f"alone. Measured: the worst, every ratio and band, and the TTFT p50 the HTTP path adds in ms "
             f"(reported, not decided).",
        fairness="The same model object, prompts and engine options on both paths, the rounds alternating which path "
                 "runs first, the client in a process of its own. Tokens that reach the client in one chunk share a "
                 "stamp, which lowers the HTTP side's ITL p50 (so only p99 is decided). same_tokens compares the two "
                 "paths' greedy tokens. On the H200 they differ: mlx's batch-1 decode is not repeatable run to run "
                 "(data/results/h200/determinism_probe.json), and over HTTP the arrivals spread, so rows are batched "
                 "with other rows than in-process; with random weights' near-tied logits either flips greedy tokens.")]


def decide_stored(doc: dict, path=None) -> List[dict]:
    """The verdicts of a saved ``serve_overhead.json`` (:class:`~mlxlab.studies.base.Study`'s
    ``decide``), from its stored summaries; nothing is re-run."""
    if "faults_by_kind" in doc:  # mlxlab bench soak
        from mlxlab.studies.serving.soak_verdict import soak_verdicts

        return soak_verdicts(doc)
    if "servers" in doc:  # mlxlab bench http
        from mlxlab.studies.serving.against import against_verdicts

        return against_verdicts(doc)
    if "presets" not in doc:
        raise ValueError(f"{path or 'this document'} is not a serve-overhead or bench-http result (no presets, "
                         "no servers)")
    return serve_verdicts(doc["presets"])
