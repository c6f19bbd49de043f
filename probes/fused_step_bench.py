"""Fused step bench: one decode beside a 511-token chunk (context 1,024), packed in one forward
(:func:`mlxlab.engine.fused.packed_forward`) against the two run back to back, median of
``--repeats``; the measurement behind the packing comment in ``mlxlab/engine/fused.py``.

Usage::

    python -m probes.fused_step_bench --model small --dtype float32

Writes ``data/results/<platform>/fused_step_bench.json``: every time of both ways and their medians.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.engine.fused import packed_forward
from probes import common

DECODE_CONTEXT, CHUNK_CONTEXT, CHUNK = 200, 1024, 511


def parse_args(argv=None):
    p = common.parser(__doc__, "fused_step_bench")
    p.add_argument("--repeats", type=int, default=7)
    return common.parse(p, argv)


class Step:
    """A decode row (``DECODE_CONTEXT`` tokens cached) and a long prompt's next ``CHUNK`` tokens
    (``CHUNK_CONTEXT`` cached), on fresh caches for every timing."""

    def __init__(self, model):
        self.module = model.module
        rng = random.Random(0)
        self.decode_prompt = [rng.randrange(model.vocab_size) for _ in range(DECODE_CONTEXT)]
        self.long_prompt = [rng.randrange(model.vocab_size) for _ in range(CHUNK_CONTEXT + CHUNK)]
        self.chunk = mx.array(self.long_prompt[CHUNK_CONTEXT:])

    def caches(self):
        dc = make_prompt_cache(self.module)
        self.module(mx.array(self.decode_prompt)[None], cache=dc)
        cc = make_prompt_cache(self.module)
        self.module(mx.array(self.long_prompt[:CHUNK_CONTEXT])[None], cache=cc)
        mx.eval([c.state for c in dc + cc])
        return dc, cc

    def fused(self) -> float:
        dc, cc = self.caches()
        t0 = time.perf_counter()
        tok = mx.argmax(packed_forward(self.module, mx.array([5]), dc, [(self.chunk, cc)]), axis=-1)
        mx.eval(tok, [c.state for c in cc])
        return time.perf_counter() - t0

    def unfused(self) -> float:
        dc, cc = self.caches()
        t0 = time.perf_counter()
        tok = mx.argmax(self.module(mx.array([[5]]), cache=dc)[:, -1, :], axis=-1)
        mx.eval(tok)
        self.module(self.chunk[None], cache=cc)
        mx.eval([c.state for c in cc])
        return time.perf_counter() - t0


def main(argv=None) -> int:
    args = parse_args(argv)
    model = common.load(args)
    step = Step(model)
    for way in (step.fused, step.unfused):  # first use of every shape
        way()
    times = {"fused_s": [], "unfused_s": []}
    for _ in range(args.repeats):
        times["fused_s"].append(step.fused())
        times["unfused_s"].append(step.unfused())
    medians = {f"{k.removesuffix('_s')}_median_s": statistics.median(v) for k, v in times.items()}
    common.log("fused", ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in medians.items()))
    common.save(args, "fused_step_bench", {"model": args.model, "bits": args.bits, "dtype": str(model.dtype),
                                           "decode_context": DECODE_CONTEXT, "chunk_context": CHUNK_CONTEXT,
                                           "chunk": CHUNK, "repeats": args.repeats, **times, **medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())
