"""Presize probe: a long prompt's prefill with the engine's KV cache sized up front, or grown by
mlx-lm's 256-token step as chunks arrive.

The engine sizes each new prompt's ``KVCache`` for the whole prompt at its first write
(``mlxlab.engine.batch.presize``); mlx-lm's cache instead reallocates and copies itself whenever a
chunk overflows it, at a size the allocator has not seen before. This probe times the same prompt
alone (``interleave``, one request, one output token) both ways, alternating, at a few chunk
sizes, in one process, and reports the medians and their ratio.

Usage::

    python -m probes.presize_probe --model small --prompt 2048 --chunks 256,512   # CPU smoke run
    bash scripts/h200_batch.sh presize                                            # the H200 run

Writes ``data/results/<platform>/presize_probe.json``.
"""

from __future__ import annotations

import random
import statistics
import sys

import mlx.core as mx

import mlxlab.engine.loop as loop
from probes import common


def parse_args(argv=None):
    p = common.parser(__doc__, "presize_probe")
    p.add_argument("--prompt", type=int, default=16384)
    p.add_argument("--chunks", default="512,2048", help="chunk sizes, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    return common.parse(p, argv)


def ttft(model, prompt: list, chunk: int, sized: bool) -> float:
    """The prompt's TTFT alone on the engine, its cache sized up front or (``sized`` False) grown."""
    presize = loop.presize  # the name the engine's step calls
    loop.presize = presize if sized else (lambda caches, tokens: None)
    try:
        mx.clear_cache()
        eng = loop.Engine(model, policy="interleave", chunk_size=chunk)
        r = eng.submit(prompt, 1)
        eng.run()
        return r.ttft_s
    finally:
        loop.presize = presize


def compare(model, prompt: list, chunk: int, repeats: int) -> dict:
    """Both ways at one chunk size, alternating which goes first; the medians and their ratio."""
    for sized in (True, False):  # first use of this chunk's shapes
        ttft(model, prompt, chunk, sized)
    times = {True: [], False: []}
    for r in range(repeats):
        for sized in ((True, False) if r % 2 == 0 else (False, True)):
            times[sized].append(ttft(model, prompt, chunk, sized))
    row = {"chunk": chunk, "presized_s": times[True], "grown_s": times[False],
           "presized_median_s": statistics.median(times[True]), "grown_median_s": statistics.median(times[False])}
    row["speedup"] = row["grown_median_s"] / row["presized_median_s"]
    common.log("presize", f"chunk {chunk:5d}: presized {row['presized_median_s'] * 1e3:8.1f} ms, grown "
                          f"{row['grown_median_s'] * 1e3:8.1f} ms, speedup {row['speedup']:.3f}x")
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    model = common.load(args)
    rng = random.Random(0)
    prompt = [rng.randrange(1, model.vocab_size) for _ in range(args.prompt)]
    rows = [compare(model, prompt, int(c), args.repeats) for c in args.chunks.split(",")]
    common.save(args, "presize_probe", {"model": args.model, "bits": args.bits, "dtype": str(model.dtype),
                                        "prompt": args.prompt, "repeats": args.repeats, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
