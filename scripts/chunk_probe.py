#!/usr/bin/env python3
"""Chunk probe: what one prefill chunk costs as a function of its exact token count.

The H200 validation of the simulator found steps whose chunk was a token or two off a round
size (2047 after 2048s, 511 under ``stall_free``'s 512-token budget with one decode) costing up
to twice their round neighbours. This probe times one chunk forward (``model(tokens, cache)``,
evaluated) for sizes around round numbers, at fixed contexts, each size ``--repeats`` times in
an interleaved order (so drift hits every size alike), on a fresh copy of the same prefilled
cache each time.

Usage::

    python scripts/chunk_probe.py --model small --sizes 64,63,65 --contexts 128   # CPU smoke run
    bash scripts/h200_batch.sh chunks                                             # the H200 run

Writes ``data/results/<platform>/chunk_probe.json``: per (context, size) the median and every
time, and the same per token.
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

SIZES = "2048,2047,2040,2056,1024,1023,1016,1000,512,511,510,508,504,496,480,256,255,128"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--sizes", default=SIZES, help="chunk token counts, comma-separated")
    p.add_argument("--contexts", default="0,8192", help="tokens already in the cache, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="chunk_probe")
    p.add_argument("--plot", metavar="RESULTS_JSON", default=None,
                   help="only draw paper/figures/chunk_alignment_<platform> from a saved result (no model run)")
    args = p.parse_args(argv)
    if args.plot:
        return plot(args.plot)
    reexec_with_fast_blas()
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxlab import load_model
    from mlxlab.core.environment import device_summary, mlx_env, platform_name
    from mlxlab.core.results import save_results

    sizes = [int(x) for x in args.sizes.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    module = model.module
    vocab = model.config["vocab_size"]
    toks = mx.random.randint(1, vocab, (1, max(contexts) + max(sizes)), key=mx.random.key(0)).astype(mx.uint32)
    clock = time.perf_counter

    def base(ctx: int):
        cache = make_prompt_cache(module)
        for a in range(0, ctx, 2048):
            module(toks[:, a:min(ctx, a + 2048)], cache=cache)
            mx.eval([c.state for c in cache])
        return cache

    def copy(cache):
        out = make_prompt_cache(module)
        for o, c in zip(out, cache):
            if c.keys is not None:
                o.keys, o.values, o.offset = mx.array(c.keys), mx.array(c.values), c.offset
        mx.eval([o.state for o in out if o.keys is not None])
        return out

    t_start = clock()
    bases = {c: base(c) for c in contexts}
    for c in contexts:  # warm-up: every size once at every context (first-use kernel builds)
        for n in sizes:
            cache = copy(bases[c])
            module(toks[:, c:c + n], cache=cache)
            mx.eval([x.state for x in cache])
    times = {(c, n): [] for c in contexts for n in sizes}
    order = [(c, n) for c in contexts for n in sizes]
    rng = random.Random(0)
    for r in range(args.repeats):
        rng.shuffle(order)
        for c, n in order:
            cache = copy(bases[c])
            mx.synchronize()
            t0 = clock()
            module(toks[:, c:c + n], cache=cache)
            mx.eval([x.state for x in cache])
            times[(c, n)].append(clock() - t0)
        print(f"[chunks] repeat {r + 1}/{args.repeats} done ({clock() - t_start:.1f} s)", flush=True)
    rows = []
    for c in contexts:
        for n in sizes:
            med = statistics.median(times[(c, n)])
            rows.append(dict(context=c, tokens=n, median_s=med, per_token_us=1e6 * med / n, times_s=times[(c, n)]))
            print(f"[chunks] context {c:6d} chunk {n:5d}: {1e3 * med:8.2f} ms ({1e6 * med / n:6.1f} us/token)")
    env, _ = mlx_env()
    path = save_results(args.name, dict(kind="chunk_probe", model=args.model, bits=args.bits, dtype=str(model.dtype),
                                        repeats=args.repeats, rows=rows,
                                        environment=dict(device_summary(), mlx_env=env),
                                        wall_s=clock() - t_start), platform=platform_name())
    print(f"[chunks] wrote {path}")
    return 0


def plot(path: str) -> int:
    """Chunk time against chunk size, one line per context, each point marked by how its key
    length (context + size) is aligned: a multiple of 8, of 4 or 2, or odd."""
    import json

    import altair as alt
    import pandas as pd

    from mlxlab.studies.sim_validation import save_chart

    doc = json.loads(Path(path).read_text())
    df = pd.DataFrame(doc["rows"])
    key = df.context + df.tokens
    df["key length"] = ["multiple of 8" if k % 8 == 0 else ("multiple of 2 or 4" if k % 2 == 0 else "odd")
                        for k in key]
    df["ms"] = df.median_s * 1e3
    df["context"] = df.context.map(lambda c: f"context {c}")
    base = alt.Chart(df).encode(x=alt.X("tokens:Q", title="chunk tokens", scale=alt.Scale(type="log", base=2)),
                                y=alt.Y("ms:Q", title="chunk forward (ms, median)"))
    aligned = base.transform_filter("datum['key length'] == 'multiple of 8'").mark_line(color="gray").encode(
        detail="context:N")
    pts = base.mark_point(filled=True, size=70).encode(
        color=alt.Color("key length:N", sort=["multiple of 8", "multiple of 2 or 4", "odd"]),
        shape=alt.Shape("context:N"),
        tooltip=["context", "tokens", alt.Tooltip("ms:Q", format=".1f"), alt.Tooltip("per_token_us:Q", format=".1f")])
    plat = Path(path).parent.name
    chart = (aligned + pts).properties(width=520, height=300, title=f"one prefill chunk by its exact size "
                                                                      f"({plat}, {doc.get('model')}, {doc.get('bits')}-bit)")
    for p in save_chart(chart, f"chunk_alignment_{plat}"):
        print(f"[chunks] wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
