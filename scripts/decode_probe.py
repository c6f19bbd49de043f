#!/usr/bin/env python3
"""Decode probe: does a lone stream's decode cost depend on what the process ran before it?

The H200 validation of the simulator found a lone stream decoding at 4.4 ms per token in the
engine's runs, while the profile, measured minutes apart in the same process, put the same
step at 5.3-9 ms. This probe measures one thing, the inter-token latency of a lone stream
(``lone``: one 1,024-token prompt, 64 tokens, ``interleave``, the median gap after the first
two tokens), again and again in one process, between "disturbers" that each stand for something
the profile or the validation runs do:

* ``packed``: a ``stall_free`` run (packed steps: one forward for decodes and a chunk) with a
  long prompt beside a chat;
* ``big_prefill``: one 16k-token prompt prefilled alone;
* ``batch2``: two streams decoding together (the batched path, then each one alone);
* ``profile_mixed`` / ``profile_plain``: a small :func:`mlxlab.sim.profiling.profile_device` grid with
  and without its mixed and packed steps; its own lone-decode cell is reported beside ``lone``;
* ``gc_off``: ``lone`` with Python's garbage collector off.

If ``lone`` after a disturber is slower than before it, the profile measures decode in a state
the workload runs do not share (or the other way round).

Usage::

    python scripts/decode_probe.py --model small --prompt 64 --tokens 16    # CPU smoke run
    bash scripts/h200_batch.sh decodes                                      # the H200 run

Writes ``data/results/<platform>/decode_probe.json``: each phase in order with its ITL median,
p90 and every gap.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxlab.cli.common import add_model_arguments  # noqa: E402
from mlxlab.core.environment import reexec_with_fast_blas  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--prompt", type=int, default=1024, help="the lone stream's prompt tokens")
    p.add_argument("--tokens", type=int, default=64, help="the lone stream's output tokens")
    p.add_argument("--long", type=int, default=16384, help="the long prompt of packed / big_prefill")
    p.add_argument("--name", default="decode_probe")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    reexec_with_fast_blas()
    from mlxlab import load_model
    from mlxlab.engine.loop import Engine
    from mlxlab.core.environment import mlx_env
    from mlxlab.sim.profiling import profile_device
    from mlxlab.core.results import save_results

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    vocab = model.vocab_size
    rng = random.Random(0)
    t_start = time.perf_counter()
    phases = []

    def prompt(n):
        return [rng.randrange(1, vocab) for _ in range(n)]

    def gaps(req, skip=2):
        t = req.token_times_s
        return [b - a for a, b in zip(t[skip:], t[skip + 1:])]

    def note(name, g, **extra):
        row = {"phase": name, "n": len(g), "p50_ms": 1e3 * statistics.median(g) if g else None,
               "p90_ms": 1e3 * sorted(g)[int(0.9 * (len(g) - 1))] if g else None,
               "gaps_ms": [round(1e3 * x, 3) for x in g], "at_s": round(time.perf_counter() - t_start, 2), **extra}
        phases.append(row)
        print(f"[decode_probe] {name:16s} p50 {row['p50_ms'] or float('nan'):7.2f} ms  p90 "
              f"{row['p90_ms'] or float('nan'):7.2f} ms  n={len(g)}  at {row['at_s']} s", flush=True)

    def lone(name="lone"):
        eng = Engine(model, policy="interleave")
        r = eng.submit(prompt(args.prompt), args.tokens)
        eng.run()
        note(name, gaps(r))

    def packed():
        eng = Engine(model, policy="stall_free")
        chat = eng.submit(prompt(args.prompt), args.tokens)
        eng.submit(prompt(args.long // 2), 8)
        eng.run()
        note("packed", gaps(chat), what="the chat's gaps under stall_free, packed steps, 8k prompt beside it")

    def big_prefill():
        eng = Engine(model, policy="interleave")
        eng.submit(prompt(args.long), 1)
        t0 = time.perf_counter()
        eng.run()
        note("big_prefill", [], seconds=time.perf_counter() - t0)

    def batch2():
        eng = Engine(model, policy="interleave")
        a = eng.submit(prompt(args.prompt), args.tokens)
        eng.submit(prompt(args.prompt), args.tokens // 2)
        eng.run()
        g = gaps(a)
        half = args.tokens // 2 - 2
        note("batch2", g[:half], after_alone=[round(1e3 * x, 3) for x in g[half + 2:]],
             alone_p50_ms=1e3 * statistics.median(g[half + 2:]) if g[half + 2:] else None)

    def profile(mixed):
        out = profile_device(model, prefill_tokens=(256,), contexts=(0,), decode_batches=(1, 2),
                             decode_contexts=(args.prompt,), repeats=1, mixed=mixed, warmup=False,
                             measure_overhead=False)
        cells = {r.get("cell"): r["duration_s"] for r in out["cells"]}
        b1 = [r["duration_s"] for r in out["records"] if r.get("cell", "").startswith("decode b1")]
        note("profile_mixed" if mixed else "profile_plain", b1,
             cells_ms={k: round(1e3 * v, 3) for k, v in cells.items() if k}, wall_s=out["wall_s"])

    lone("warm")  # first use of every kernel
    lone()
    lone()
    batch2()
    lone()
    packed()
    lone()
    lone()
    big_prefill()
    lone()
    profile(mixed=True)
    lone()
    profile(mixed=False)
    lone()
    gc.disable()
    try:
        lone("gc_off")
        lone("gc_off")
    finally:
        gc.enable()
    lone()
    packed()
    lone()
    path = save_results(args.name, {"kind": "decode_probe", "model": args.model, "bits": args.bits,
                                    "dtype": str(model.dtype), "prompt": args.prompt, "tokens": args.tokens,
                                    "long": args.long, "mlx_env": mlx_env()[0], "phases": phases,
                                    "wall_s": time.perf_counter() - t_start})
    print(f"[decode_probe] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
