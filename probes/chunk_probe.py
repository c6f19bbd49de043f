"""Chunk probe: what one prefill chunk costs as a function of its exact token count.

The H200 validation of the simulator found steps whose chunk was a token or two off a round
size (2047 after 2048s, 511 under ``stall_free``'s 512-token budget with one decode) costing up
to twice their round neighbours. This probe times one chunk forward (``model(tokens, cache)``,
evaluated) for sizes around round numbers, at fixed contexts, each size ``--repeats`` times in
an interleaved order (so drift hits every size alike), on a fresh copy of the same prefilled
cache each time.

Usage::

    python -m probes.chunk_probe --model small --sizes 64,63,65 --contexts 128   # CPU smoke run
    bash scripts/h200_batch.sh chunks                                            # the H200 run

Writes ``data/results/<platform>/chunk_probe.json``: per (context, size) the median and every
time, and the same per token.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.core.paths import ROOT
from probes import common

SIZES = "2048,2047,2040,2056,1024,1023,1016,1000,512,511,510,508,504,496,480,256,255,128"


def parse_args(argv=None):
    p = common.parser(__doc__, "chunk_probe")
    p.add_argument("--sizes", default=SIZES, help="chunk token counts, comma-separated")
    p.add_argument("--contexts", default="0,8192", help="tokens already in the cache, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--plot", metavar="RESULTS_JSON", default=None,
                   help="only draw paper/figures/chunk_alignment_<platform> from a saved result (no model run)")
    args = common.parse(p, argv)
    args.sizes = [int(x) for x in args.sizes.split(",")]
    args.contexts = [int(x) for x in args.contexts.split(",")]
    return args


def prefilled(module, toks, ctx: int):
    """A cache holding the first ``ctx`` tokens, prefilled in 2,048-token chunks."""
    cache = make_prompt_cache(module)
    for a in range(0, ctx, 2048):
        module(toks[:, a:min(ctx, a + 2048)], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def chunk_seconds(module, toks, base, ctx: int, n: int) -> float:
    """One ``n``-token chunk forward after ``ctx`` cached tokens, evaluated."""
    cache = common.copy_cache(module, base)
    mx.synchronize()
    t0 = time.perf_counter()
    module(toks[:, ctx:ctx + n], cache=cache)
    mx.eval([x.state for x in cache])
    return time.perf_counter() - t0


def measure(module, toks, args) -> dict:
    """(context, size) -> the chunk's seconds over the repeats, sizes in a shuffled order each repeat."""
    bases = {c: prefilled(module, toks, c) for c in args.contexts}
    order = [(c, n) for c in args.contexts for n in args.sizes]
    for c, n in order:  # warm-up: every size once at every context (first-use kernel builds)
        chunk_seconds(module, toks, bases[c], c, n)
    times = {key: [] for key in order}
    rng = random.Random(0)
    for r in range(args.repeats):
        rng.shuffle(order)
        for c, n in order:
            times[(c, n)].append(chunk_seconds(module, toks, bases[c], c, n))
        common.log("chunks", f"repeat {r + 1}/{args.repeats} done ({time.perf_counter() - args.started:.1f} s)")
    return times


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot:
        return plot(args.plot)
    model = common.load(args)
    toks = mx.random.randint(1, model.vocab_size, (1, max(args.contexts) + max(args.sizes)),
                             key=mx.random.key(0)).astype(mx.uint32)
    times = measure(model.module, toks, args)
    rows = []
    for c in args.contexts:
        for n in args.sizes:
            med = statistics.median(times[(c, n)])
            rows.append(dict(context=c, tokens=n, median_s=med, per_token_us=1e6 * med / n, times_s=times[(c, n)]))
            common.log("chunks", f"context {c:6d} chunk {n:5d}: {1e3 * med:8.2f} ms ({1e6 * med / n:6.1f} us/token)")
    common.save(args, "chunk_probe", dict(model=args.model, bits=args.bits, dtype=str(model.dtype),
                                          repeats=args.repeats, rows=rows))
    return 0


def plot(path: str) -> int:
    """Chunk time against chunk size, one line per context, each point marked by how its key
    length (context + size) is aligned: a multiple of 8, of 4 or 2, or odd."""
    # the figure's libraries here, not at the top: the GPU bundle (and the shape probe, which imports
    # prefilled) has no altair or pandas
    import altair as alt
    import pandas as pd

    from mlxlab.notebook.plots import save_figure

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
    for p in save_figure(chart, f"chunk_alignment_{plat}", ROOT / "paper" / "figures"):
        common.log("chunks", f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
