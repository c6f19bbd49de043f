"""Compiled decode probe: where the compiled decode step (mlxlab.engine.compiled) gains and loses.

The compiled step attends over mlx-lm's whole KV buffer with the position as an array and a mask
past it, so one graph serves 256 tokens. Two things change at once against ``generate_step``:
the mask (attention over the buffer, a mask array) and the compile (no Python graph per token,
fused elementwise kernels). This probe separates them on one lone stream, the same prompt and
model object, order rotating per repeat:

* ``plain``: mlx-lm's loop on plain ``KVCache`` (generate_step's path, pipelined the same way);
* ``masked``: the compiled step's cache view and mask, not compiled (the mask's cost alone);
* ``compiled``: the same under ``mx.compile`` (mlxlab's ``Engine(compile_decode=True)`` step).

Decode tok/s over ``--tokens`` after a ``--context``-token prompt, median over ``--repeats``,
and whether the three give the same greedy tokens.

Usage::

    python -m probes.compiled_decode_probe --model tiny --context 256 --tokens 64   # CPU smoke run
    bash scripts/h200.sh ... (see scripts/h200_batch.sh)                           # the H200 run
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.core.presets import model_limits
from mlxlab.engine.compiled import CompiledDecode, _BufferView
from mlxlab.engine.warmup import random_prompt
from probes import common

SIDES = ("plain", "masked", "compiled")


def _prefilled(module, prompt):
    cache = make_prompt_cache(module)
    module(mx.array(prompt[:-1])[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _masked_step(module):
    """The compiled step's forward, uncompiled: the whole buffer, the position as an array, the mask."""
    def step(inputs, caches):
        for c in caches:
            CompiledDecode._room(c)
        views = [_BufferView([c.keys, c.values, mx.array(c.offset, dtype=mx.int32)]) for c in caches]
        logits = module(inputs[:, None], cache=views)[:, -1, :]
        for c, v in zip(caches, views):
            c.keys, c.values = v.state[0], v.state[1]
            c.offset += 1
        return logits
    return step


def decode(module, prompt, tokens: int, side: str, compiled: CompiledDecode) -> tuple:
    cache = _prefilled(module, prompt)
    if side == "plain":
        step = lambda x, c: module(x[:, None], cache=c)[:, -1, :]  # noqa: E731
    elif side == "masked":
        step = _masked_step(module)
    else:
        step = compiled.step
    y = mx.array([prompt[-1]], dtype=mx.uint32)
    out, t0 = [], None
    nxt = mx.argmax(step(y, cache), axis=-1)
    mx.async_eval(nxt)
    for i in range(tokens):
        cur = nxt
        nxt = mx.argmax(step(cur, cache), axis=-1)
        mx.async_eval(nxt)
        out.append(cur.item())
        if i == 1:
            t0 = time.perf_counter()
    return out, (tokens - 2) / (time.perf_counter() - t0)


def main(argv=None) -> int:
    p = common.parser(__doc__, "compiled_decode_probe")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    args = common.parse(p, argv)
    model = common.load(args)
    module = model.module
    prompt = random_prompt(args.context, model_limits(model)[0], 0)
    compiled = CompiledDecode(module)
    for side in SIDES:  # warm-up: kernels, and the compiled step traced at this buffer size
        decode(module, prompt, 8, side, compiled)
    rates = {s: [] for s in SIDES}
    tokens = {}
    for r in range(args.repeats):
        order = SIDES[r % 3:] + SIDES[:r % 3]
        for side in order:
            toks, rate = decode(module, prompt, args.tokens, side, compiled)
            rates[side].append(rate)
            tokens[side] = toks
        common.log("compiled", f"repeat {r + 1}: " + ", ".join(f"{s} {rates[s][-1]:.1f}" for s in SIDES))
    med = {s: statistics.median(v) for s, v in rates.items()}
    common.log("compiled", "median tok/s " + ", ".join(f"{s} {med[s]:.1f}" for s in SIDES)
               + f"; masked/plain {med['masked'] / med['plain']:.3f}, compiled/masked "
               f"{med['compiled'] / med['masked']:.3f}, compiled/plain {med['compiled'] / med['plain']:.3f}")
    common.save(args, "compiled_decode_probe", {
        "model": args.model, "bits": args.bits, "dtype": str(model.dtype), "context": args.context,
        "tokens": args.tokens, "repeats": args.repeats, "tok_s": rates, "median_tok_s": med,
        "masked_over_plain": med["masked"] / med["plain"], "compiled_over_masked": med["compiled"] / med["masked"],
        "compiled_over_plain": med["compiled"] / med["plain"], "traces": compiled.traces,
        "same_tokens": {"masked_vs_plain": tokens["masked"] == tokens["plain"],
                        "compiled_vs_plain": tokens["compiled"] == tokens["plain"]}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
