"""Rebatch probe: what a change of the decode batch costs, phase by phase, and why.

The simulator's validation on the H200 found that a step which changes the decode batch (rows
join or leave) costs the engine 2-6x what the bytes it copies predict, and that the cost does
not grow with those bytes. This probe takes such a change apart on the model directly, with the
same mlx-lm cache calls the engine makes (``BatchKVCache.merge`` / ``filter`` / ``extract``):

* ``host``: Python building the change (lazy ops, plus any sync the cache call makes itself);
* ``eval``: evaluating the changed caches (the copies on the device);
* ``d1 .. dK``: the decode forwards after the change, each built, run and read on its own.

Scenarios, each repeated ``--repeats`` times with the same shapes (a cost that only the first
repeat pays is a first-use cost, not a per-change one), then once at longer contexts:

* ``join4``: four prefilled caches merged into one 4-row batch;
* ``filter2``: that batch filtered to 2 rows;
* ``extract1``: the 2-row batch back to a lone KVCache;
* ``alternate``: decode steps alternating between an existing lone cache and an existing 2-row
  batch, no copies at all: what switching step *type* costs by itself;
* ``steady_b1`` / ``steady_b2``: decode steps with nothing changing.

mlx's CUDA backend records kernels into CUDA graphs (``MLX_USE_CUDA_GRAPHS``, default on),
at most ``MLX_MAX_OPS_PER_BUFFER`` (default 20) kernels each, and keeps the instantiated graphs
in a cache of ``MLX_CUDA_GRAPH_CACHE_SIZE`` (default 100) entries. A step whose graphs are not in
that cache pays ``cudaGraphInstantiate`` for each. Run the probe under different values of those
variables (each needs a new process: mlx reads them once) to see which part of the cost they
own. The environment is stored with the results.

Usage::

    python -m probes.rebatch_probe --model small --label cpu   # CPU smoke run
    bash scripts/h200_batch.sh rebatch                         # the H200 runs

Writes ``data/results/<platform>/rebatch_probe_<label>.json``.
"""

from __future__ import annotations

import statistics
import sys
import time

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from probes import common

clock = time.perf_counter


def parse_args(argv=None):
    p = common.parser(__doc__, None)
    p.add_argument("--lengths", type=int, nargs=4, default=[1500, 1700, 1900, 2100],
                   help="prompt lengths of the four rows (default: %(default)s)")
    p.add_argument("--long-lengths", type=int, nargs=4, default=[7000, 7400, 7800, 8200],
                   help="the same at longer contexts, run once (new shapes)")
    p.add_argument("--decodes", type=int, default=6, help="decode forwards timed after each change")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label", default="default", help="names the output file (e.g. the env variant)")
    return common.parse(p, argv)


def prefill(model, n: int, seed: int):
    """A lone KVCache holding ``n`` random tokens."""
    cache = make_prompt_cache(model.module)
    toks = mx.random.randint(1, model.vocab_size, (1, n), key=mx.random.key(seed)).astype(mx.uint32)
    for a in range(0, n, 2048):
        model.module(toks[:, a:a + 2048], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def decode(module, cache, rows: int) -> float:
    """Seconds of one decode forward of ``rows`` rows, built, run and read on its own."""
    t0 = clock()
    x = mx.zeros((rows, 1), dtype=mx.uint32) + 7
    logits = module(x, cache=cache)[:, -1, :]
    mx.eval(mx.argmax(logits, axis=-1))
    return clock() - t0


def change(fn):
    """(new cache, host seconds, eval seconds) of one batch change."""
    mx.synchronize()
    t0 = clock()
    out = fn()
    t1 = clock()
    mx.eval([c.state[:4] if isinstance(c, BatchKVCache) else c.state for c in out])
    mx.synchronize()
    return out, t1 - t0, clock() - t1


def filtered(b4, rows):
    for c in b4:
        c.filter(rows)
    return b4


def one_repeat(module, srcs, k: int) -> list:
    """Every scenario once: (name, host s, eval s, decode seconds) in order."""
    out = []
    plain = [common.copy_cache(module, s) for s in srcs]  # a decode writes into its cache
    b4, h, e = change(lambda: [layer[0].merge(list(layer)) for layer in zip(*plain)])
    out.append(("join4", h, e, [decode(module, b4, 4) for _ in range(k)]))
    b2, h, e = change(lambda: filtered(b4, [0, 1]))
    out.append(("filter2", h, e, [decode(module, b2, 2) for _ in range(k)]))
    b1, h, e = change(lambda: [c.extract(0) for c in b2])
    out.append(("extract1", h, e, [decode(module, b1, 1) for _ in range(k)]))
    alt = []  # both caches exist: alternate step types with no copy in between
    for _ in range(k):
        alt += [decode(module, b1, 1), decode(module, b2, 2)]
    out.append(("alternate", 0.0, 0.0, alt))
    out.append(("steady_b1", 0.0, 0.0, [decode(module, b1, 1) for _ in range(k)]))
    out.append(("steady_b2", 0.0, 0.0, [decode(module, b2, 2) for _ in range(k)]))
    return out


def scenarios(model, lengths, reps: int, tag: str, k: int) -> list:
    """The scenarios ``reps`` times over four rows of ``lengths`` tokens, as result rows."""
    srcs = [prefill(model, n, seed=i) for i, n in enumerate(lengths)]
    rows = []
    for r in range(reps):
        done = [dict(scenario=name, set=tag, repeat=r, host_s=h, eval_s=e, decode_s=ds)
                for name, h, e, ds in one_repeat(model.module, srcs, k)]
        rows += done
        common.log("rebatch", f"{tag} repeat {r + 1}/{reps}: " + ", ".join(
            f"{x['scenario']} host {1e3 * x['host_s']:.1f} eval {1e3 * x['eval_s']:.1f} "
            f"d1 {1e3 * x['decode_s'][0]:.1f} d2 {1e3 * x['decode_s'][1]:.1f} "
            f"med {1e3 * statistics.median(x['decode_s'][2:] or x['decode_s']):.1f} ms" for x in done))
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    model = common.load(args)
    # warm-up: every code path once at small shapes (first-use kernel compiles are not the question)
    warm = scenarios(model, [64, 80, 96, 112], 1, "warmup", args.decodes)
    rows = scenarios(model, args.lengths, args.repeats, "short", args.decodes)
    rows += scenarios(model, args.long_lengths, 1, "long", args.decodes)
    common.save(args, "rebatch_probe", dict(label=args.label, model=args.model, bits=args.bits,
                                            dtype=str(model.dtype), lengths=args.lengths,
                                            long_lengths=args.long_lengths, rows=rows, warmup_rows=warm),
                name=f"rebatch_probe_{args.label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
