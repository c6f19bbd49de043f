"""Overlap probe: a chat stream decoding while a long prompt prefills, with the engine's overlap
mode off and on, for several chunk sizes.

Per model and chunk size it measures, ``--repeats`` times each:

* ``chat alone``: the chat stream's ITL with nothing else running (once per model);
* ``long alone``: the long prompt's TTFT with nothing else running, per mode;
* ``together``: the chat decodes; once it has produced 8 tokens the long prompt arrives. Reported:
  the chat's ITL over the gaps that overlap the long prompt's prefill (arrival to its first
  token), pooled over repeats, and the long prompt's TTFT (median over repeats).

Modes: ``off`` is ``Engine(overlap=False)`` (mlx-lm's BatchGenerator behaviour under the
``interleave`` policy: a decode step then a chunk, in turn); ``layer``, ``pipelined`` and
``chunk`` are ``Engine(overlap=True, overlap_sync=...)``: decode on the main thread, chunks on a
prefill thread with its own stream, evaluated layer by layer, layer by layer one layer ahead, or
once per chunk.

``--model`` takes several presets, comma-separated (``--long-tokens`` then one length, or one
per model).

Usage (CPU; OpenBLAS is preloaded automatically on Linux)::

    python -m probes.overlap_probe --model small --long-tokens 2048 --chunks 128,256,512,1024,2048

On the H200 (the mlx CUDA bundle as scripts/h200.sh sets it up)::

    PYTHONPATH=$PWD/.mlxcuda/site:$PWD MLXLAB_PLATFORM=h200 python3 -m probes.overlap_probe \\
        --model qwen2.5-coder-1.5b --bits 4 --long-tokens 32768 --chunks 256,512,1024,2048,4096

Writes ``data/results/<platform>/<name>.json`` (``--name``, default ``overlap_probe``).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

from mlxlab.engine.loop import Engine
from probes import common

WARM_TOKENS = 8  # chat tokens produced before the long prompt arrives
AFTER_TOKENS = 2  # chat tokens after the long prompt's first token, so the window's last gap closes
MODES = {
    "off": dict(overlap=False),
    "layer": dict(overlap=True, overlap_sync="layer"),
    "pipelined": dict(overlap=True, overlap_sync="pipelined"),
    "chunk": dict(overlap=True, overlap_sync="chunk"),
}


def parse_args(argv=None):
    p = common.parser(__doc__, "overlap_probe")
    p.add_argument("--long-tokens", default="2048", help="long prompt length (one, or one per model, comma-separated)")
    p.add_argument("--chat-prompt", type=int, default=64, help="chat prompt length")
    p.add_argument("--chat-tokens", type=int, default=64, help="minimum chat output tokens per run")
    p.add_argument("--chunks", default="128,256,512,1024,2048", help="chunk sizes, comma-separated")
    p.add_argument("--modes", default="off,layer,pipelined,chunk", help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--policy", default="interleave", help="scheduling policy name")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the unrecorded warm-up (the chat once, the long prompt once per chunk size and mode)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-save", action="store_true")
    args = common.parse(p, argv)
    args.models = [m for m in args.model.split(",") if m]
    longs = [int(x) for x in str(args.long_tokens).split(",") if x]
    if len(longs) == 1:
        longs = longs * len(args.models)
    if len(longs) != len(args.models):
        p.error("--long-tokens takes one length or one per model")
    args.longs = longs
    args.chunk_list = [int(x) for x in args.chunks.split(",") if x]
    args.mode_list = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.mode_list if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}; choose from {list(MODES)}")
    return args


def _ms(x):
    return None if x is None else round(1e3 * x, 3)


def pct(values, p):
    return float(np.percentile(values, p)) if len(values) else float("nan")


def chat_alone(model, chat_prompt, args):
    eng = Engine(model, policy=args.policy, chunk_size=max(args.chunk_list))
    chat = eng.submit(chat_prompt, WARM_TOKENS + args.chat_tokens)
    eng.run()
    return chat.itl_s[WARM_TOKENS - 1:]  # steady-state gaps, as in the together runs


def long_alone(model, long_prompt, chunk, mode, args):
    with Engine(model, policy=args.policy, chunk_size=chunk, **MODES[mode]) as eng:
        req = eng.submit(long_prompt, 1)
        eng.run()
    return req.ttft_s


def together(model, chat_prompt, long_prompt, chunk, mode, args):
    """The chat decodes; the long prompt arrives once the chat has WARM_TOKENS tokens. Returns
    (window gaps, long TTFT, chat tokens in the window, whether the chat ran out of tokens)."""
    max_chat = min(1 << 20, int(getattr(model, "max_context", 1 << 20)) - len(chat_prompt) - 1)
    with Engine(model, policy=args.policy, chunk_size=chunk, **MODES[mode]) as eng:
        chat = eng.submit(chat_prompt, max_chat)
        while len(chat.output_tokens) < WARM_TOKENS and eng.has_work:
            eng.step()
        t_long = eng.now()
        long = eng.submit(long_prompt, 1)
        while eng.has_work:
            if long.done and len(chat.output_tokens) >= args.chat_tokens and \
                    sum(t > long.token_times_s[0] for t in chat.token_times_s) >= AFTER_TOKENS:
                break
            eng.step()
        eng.flush()
    t_first = long.token_times_s[0]
    tt = chat.token_times_s
    window = [b - a for a, b in zip(tt, tt[1:]) if b > t_long and a < t_first]
    return window, long.ttft_s, sum(t_long < t <= t_first for t in tt), chat.done


def warm_up(model, chat_prompt, long_prompt, args):
    t = time.perf_counter()
    chat_alone(model, chat_prompt, args)
    for chunk in args.chunk_list:  # every chunk shape and context length once (GPU kernels JIT)
        for mode in args.mode_list:
            long_alone(model, long_prompt, chunk, mode, args)
    common.log("overlap probe", f"warm-up {time.perf_counter() - t:.1f} s")


def solo_chat(model, chat_prompt, args):
    """The chat's gaps alone over the repeats, and their summary."""
    gaps = []
    for _ in range(args.repeats):
        gaps += chat_alone(model, chat_prompt, args)
    solo = {"itl_p50_ms": _ms(pct(gaps, 50)), "itl_p99_ms": _ms(pct(gaps, 99)), "itl_max_ms": _ms(max(gaps)),
            "n": len(gaps)}
    common.log("overlap probe", f"chat alone: ITL p50 {solo['itl_p50_ms']:.2f} ms, p99 {solo['itl_p99_ms']:.2f} ms, "
                                f"max {solo['itl_max_ms']:.2f} ms")
    return gaps, solo


def measure(model, chat_prompt, long_prompt, args) -> dict:
    """(chunk, mode) -> every repeat's long-alone TTFT, together TTFT, window gaps and chat counts."""
    raw = {(c, m): {"alone": [], "ttft": [], "gaps": [], "in_window": [], "chat_done": 0}
           for c in args.chunk_list for m in args.mode_list}
    for rep in range(args.repeats):
        for (chunk, mode), r in raw.items():
            r["alone"].append(long_alone(model, long_prompt, chunk, mode, args))
            gaps, ttft, n_in, chat_done = together(model, chat_prompt, long_prompt, chunk, mode, args)
            r["gaps"] += gaps
            r["ttft"].append(ttft)
            r["in_window"].append(n_in)
            r["chat_done"] += int(chat_done)
        common.log("overlap probe", f"repeat {rep + 1}/{args.repeats} done")
    return raw


def summarize(name, long_tokens, raw, solo_gaps, args) -> list:
    """One row per chunk size and mode: the chat's window ITL against alone, the long TTFT against
    alone in the same mode, against overlap off at that chunk, and against the best chunk off."""
    off = "off" in args.mode_list
    best_alone = min(statistics.median(raw[(c, "off")]["alone"]) for c in args.chunk_list) if off else None
    rows = []
    for chunk in args.chunk_list:
        off_alone = statistics.median(raw[(chunk, "off")]["alone"]) if off else None
        for mode in args.mode_list:
            r = raw[(chunk, mode)]
            alone, ttft = statistics.median(r["alone"]), statistics.median(r["ttft"])
            g = r["gaps"]
            rows.append({
                "model": name, "long_tokens": long_tokens, "chunk": chunk, "mode": mode,
                "chat_itl_p50_ms": _ms(pct(g, 50)), "chat_itl_p99_ms": _ms(pct(g, 99)),
                "chat_itl_max_ms": _ms(max(g) if g else float("nan")),
                "itl_p50_x_solo": pct(g, 50) / pct(solo_gaps, 50),
                "chat_tokens_during_prefill": statistics.median(r["in_window"]),
                "long_ttft_s": ttft, "long_alone_ttft_s": alone,
                "ttft_x_alone": ttft / alone,
                "ttft_x_alone_off": (ttft / off_alone) if off_alone else None,
                "ttft_x_best_alone": (ttft / best_alone) if best_alone else None,
                "chat_ran_out": r["chat_done"],
                "long_ttft_s_runs": r["ttft"], "long_alone_ttft_s_runs": r["alone"],
            })
    return rows


def probe_model(name, long_tokens, args):
    model = common.load(args, name)
    rng = random.Random(args.seed)
    chat_prompt = [rng.randrange(model.vocab_size) for _ in range(args.chat_prompt)]
    long_prompt = [rng.randrange(model.vocab_size) for _ in range(long_tokens)]
    common.log("overlap probe", f"{name}: {model.num_params / 1e6:.1f}M params, dtype={model.dtype}, "
               f"bits={model.bits}, device={mx.default_device()}; long prompt {long_tokens}, chat "
               f"{args.chat_prompt}+{args.chat_tokens}, chunks {args.chunk_list}, modes {args.mode_list}, "
               f"repeats {args.repeats}")
    if not args.no_warmup:
        warm_up(model, chat_prompt, long_prompt, args)
    solo_gaps, solo = solo_chat(model, chat_prompt, args)
    raw = measure(model, chat_prompt, long_prompt, args)
    return {"model": {"name": name, "dtype": str(model.dtype), "bits": model.bits,
                      "num_params": model.num_params},
            "long_tokens": long_tokens, "chat_alone": solo,
            "rows": summarize(name, long_tokens, raw, solo_gaps, args)}


def format_table(results) -> str:
    w = max([14] + [len(r["model"]["name"]) + 2 for r in results])
    head = (f"{'model':<{w}}{'chunk':>6} {'mode':<10}{'ITL p50':>9}{'p99':>9}{'max':>9}{'x solo':>8}"
            f"{'toks':>6}{'TTFT s':>9}{'alone s':>9}{'x alone':>8}{'x off':>7}{'x best':>7}")
    lines = [head, "-" * len(head)]

    def opt(x):
        return f"{x:>7.2f}" if x is not None else f"{'-':>7}"

    for res in results:
        s = res["chat_alone"]
        lines.append(f"{res['model']['name']:<{w}}{'':>6} {'solo':<10}{s['itl_p50_ms']:>9.2f}"
                     f"{s['itl_p99_ms']:>9.2f}{s['itl_max_ms']:>9.2f}{1.0:>8.2f}")
        for r in res["rows"]:
            lines.append(f"{r['model']:<{w}}{r['chunk']:>6} {r['mode']:<10}{r['chat_itl_p50_ms']:>9.2f}"
                         f"{r['chat_itl_p99_ms']:>9.2f}{r['chat_itl_max_ms']:>9.1f}{r['itl_p50_x_solo']:>8.2f}"
                         f"{r['chat_tokens_during_prefill']:>6.0f}{r['long_ttft_s']:>9.3f}"
                         f"{r['long_alone_ttft_s']:>9.3f}{r['ttft_x_alone']:>8.2f}{opt(r['ttft_x_alone_off'])}"
                         f"{opt(r['ttft_x_best_alone'])}")
    lines.append("ITL in ms over the chat gaps overlapping the long prompt's prefill (pooled over repeats); "
                 "toks: chat tokens during that prefill (median); TTFT: median; x alone: TTFT / long alone in "
                 "the same mode and chunk; x off: / long alone with overlap off, same chunk; x best: / the best "
                 "long-alone TTFT over chunk sizes with overlap off.")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        common.log("overlap probe", f"warning: load average {load_before[0]:.1f} on {os.cpu_count()} CPUs: other "
                   f"processes compete with the probe's threads; CPU timings will be inflated")
    results = [probe_model(m, n, args) for m, n in zip(args.models, args.longs)]
    print(format_table(results))
    if not args.no_save:
        config = {k: v for k, v in vars(args).items() if k not in ("models", "longs", "started")}
        common.save(args, "overlap_probe", {"config": config, "cpu_threads": os.cpu_count(),
                                            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                                            "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
