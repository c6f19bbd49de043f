#!/usr/bin/env python3
"""Presize probe: a long prompt's prefill with the engine's KV cache sized up front, or grown by
mlx-lm's 256-token step as chunks arrive.

The engine sizes each new prompt's ``KVCache`` for the whole prompt at its first write
(``mlxlab.engine._presize``); mlx-lm's cache instead reallocates and copies itself whenever a
chunk overflows it, at a size the allocator has not seen before. This probe times the same prompt
alone (``interleave``, one request, one output token) both ways, alternating, at a few chunk
sizes, in one process, and reports the medians and their ratio.

Usage::

    python scripts/presize_probe.py --model small --prompt 2048 --chunks 256,512   # CPU smoke run
    bash scripts/h200_batch.sh presize                                             # the H200 run

Writes ``data/results/<platform>/presize_probe.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxlab.cli.common import add_model_arguments  # noqa: E402
from mlxlab.core.environment import reexec_with_fast_blas  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--prompt", type=int, default=16384)
    p.add_argument("--chunks", default="512,2048", help="chunk sizes, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="presize_probe")
    args = p.parse_args(argv)
    reexec_with_fast_blas()
    import mlx.core as mx

    import mlxlab.engine.loop as engine_mod
    from mlxlab import load_model
    from mlxlab.core.environment import mlx_env
    from mlxlab.core.results import save_results

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    rng = random.Random(0)
    prompt = [rng.randrange(1, model.vocab_size) for _ in range(args.prompt)]
    presize = engine_mod._presize
    t_start = time.perf_counter()

    def once(chunk: int, sized: bool) -> float:
        engine_mod._presize = presize if sized else (lambda caches, tokens: None)
        try:
            mx.clear_cache()
            eng = engine_mod.Engine(model, policy="interleave", chunk_size=chunk)
            r = eng.submit(prompt, 1)
            eng.run()
            return r.ttft_s
        finally:
            engine_mod._presize = presize

    rows = []
    for chunk in [int(c) for c in args.chunks.split(",")]:
        once(chunk, True), once(chunk, False)  # first use of this chunk's shapes
        times = {True: [], False: []}
        for r in range(args.repeats):
            for sized in ((True, False) if r % 2 == 0 else (False, True)):
                times[sized].append(once(chunk, sized))
        row = {"chunk": chunk, "presized_s": times[True], "grown_s": times[False],
               "presized_median_s": statistics.median(times[True]), "grown_median_s": statistics.median(times[False])}
        row["speedup"] = row["grown_median_s"] / row["presized_median_s"]
        rows.append(row)
        print(f"[presize] chunk {chunk:5d}: presized {row['presized_median_s'] * 1e3:8.1f} ms, grown "
              f"{row['grown_median_s'] * 1e3:8.1f} ms, speedup {row['speedup']:.3f}x", flush=True)
    path = save_results(args.name, {"kind": "presize_probe", "model": args.model, "bits": args.bits,
                                    "dtype": str(model.dtype), "prompt": args.prompt, "repeats": args.repeats,
                                    "mlx_env": mlx_env()[0], "rows": rows, "wall_s": time.perf_counter() - t_start})
    print(f"[presize] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
