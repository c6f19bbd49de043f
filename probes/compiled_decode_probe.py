"""Compiled decode probe: where the compiled decode step (mlxlab.engine.compiled) gains and loses.

The compiled step attends over mlx-lm's whole KV buffer with the position as an array and a mask
past it, so one graph serves 256 tokens. Two things change at once against ``generate_step``:
the mask (attention over the buffer, a mask array) and the compile (no Python graph per token,
fused elementwise kernels). This probe separates them on one lone stream, the same prompt and
model object, order rotating per repeat:

* ``plain``: mlx-lm's loop on plain ``KVCache`` (generate_step's path, pipelined the same way);
* ``masked``: the compiled step's cache view and mask, not compiled (the mask's cost alone);
* ``compiled``: the same under ``mx.compile`` (mlxlab's ``Engine(compile_decode=True)`` step);
* ``prefix``: a mask-free compiled step: ``mx.compile(shapeless=True)`` over the keys written so
  far (the exact prefix, as generate_step attends), the new token's keys concatenated inside and
  written into the buffer outside. No mask, so the GPU keeps its fused one-query attention kernel
  (mlx's CUDA ``sdpa_vector`` takes no mask array; with one the step falls back to matmul,
  softmax, matmul), and one trace serves every length. It needs every op of the forward to infer
  its shapes; on the CPU the RoPE and attention fallbacks slice, which a shapeless graph cannot,
  so there the side is recorded as unsupported with the error.

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

SIDES = ("plain", "masked", "compiled", "prefix")


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


class _PrefixView:
    """One layer's cache inside the mask-free step: the written keys and values (an input of any
    length), the new token's appended to them, kept in ``new`` for the step to return."""

    def __init__(self, keys, values, offset):
        self.keys, self.values, self.offset, self.new = keys, values, offset, None

    def update_and_fetch(self, keys, values):
        self.new = (keys, values)
        return mx.concatenate([self.keys, keys], axis=2), mx.concatenate([self.values, values], axis=2)

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        return None  # one query sees every written key, as generate_step's does


class PrefixStep:
    """The mask-free compiled step: one shapeless trace per batch size (the forward's reshapes
    bake the batch in), the written prefix passed in, the new keys and values passed out."""

    def __init__(self, module):
        self.module, self.fns, self.traces = module, {}, 0

    def _forward(self, inputs, offset, kv):
        self.traces += 1  # runs only while tracing
        views = [_PrefixView(kv[i], kv[i + 1], offset) for i in range(0, len(kv), 2)]
        logits = self.module(inputs, cache=views)
        return logits, [a for v in views for a in v.new]

    def __call__(self, inputs, caches):
        fn = self.fns.get(inputs.shape[0])
        if fn is None:
            fn = self.fns[inputs.shape[0]] = mx.compile(self._forward, shapeless=True)
        off = caches[0].offset
        kv = []
        for c in caches:
            CompiledDecode._room(c)
            kv += [c.keys[..., :off, :], c.values[..., :off, :]]
        logits, new = fn(inputs[:, None], mx.array(off, dtype=mx.int32), kv)
        for i, c in enumerate(caches):
            c.keys[..., off:off + 1, :] = new[2 * i]
            c.values[..., off:off + 1, :] = new[2 * i + 1]
            c.offset += 1
        return logits[:, -1, :]


def decode(module, prompt, tokens: int, side: str, compiled) -> tuple:
    cache = _prefilled(module, prompt)
    if side == "plain":
        step = lambda x, c: module(x[:, None], cache=c)[:, -1, :]  # noqa: E731
    elif side == "masked":
        step = _masked_step(module)
    elif side == "prefix":
        step = compiled["prefix"]
    else:
        step = compiled["compiled"].step
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
    steps = {"compiled": CompiledDecode(module), "prefix": PrefixStep(module)}
    sides, unsupported = [], {}
    for side in SIDES:  # warm-up: kernels, and the compiled steps traced at this buffer size
        try:
            decode(module, prompt, 8, side, steps)
            sides.append(side)
        except ValueError as e:  # a graph the device cannot trace (the prefix step on the CPU)
            unsupported[side] = str(e)
            common.log("compiled", f"{side}: not supported on this device ({e})")
    rates = {s: [] for s in sides}
    tokens = {}
    for r in range(args.repeats):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for side in order:
            toks, rate = decode(module, prompt, args.tokens, side, steps)
            rates[side].append(rate)
            tokens[side] = toks
        common.log("compiled", f"repeat {r + 1}: " + ", ".join(f"{s} {rates[s][-1]:.1f}" for s in sides))
    med = {s: statistics.median(v) for s, v in rates.items()}
    over = {f"{a}_over_{b}": med[a] / med[b] for a, b in
            [("masked", "plain"), ("compiled", "masked"), ("compiled", "plain"), ("prefix", "plain"),
             ("prefix", "compiled")] if a in med and b in med}
    common.log("compiled", "median tok/s " + ", ".join(f"{s} {med[s]:.1f}" for s in sides) + "; "
               + ", ".join(f"{k} {v:.3f}" for k, v in over.items()))
    common.save(args, "compiled_decode_probe", {
        "model": args.model, "bits": args.bits, "dtype": str(model.dtype), "context": args.context,
        "tokens": args.tokens, "repeats": args.repeats, "tok_s": rates, "median_tok_s": med, **over,
        "unsupported": unsupported, "traces": {k: v.traces for k, v in steps.items()},
        "same_tokens": {f"{s}_vs_plain": tokens[s] == tokens["plain"] for s in sides if s != "plain"}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
