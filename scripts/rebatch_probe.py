#!/usr/bin/env python3
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

    python scripts/rebatch_probe.py --model small --label cpu              # CPU smoke run
    bash scripts/h200_batch.sh rebatch                                     # the H200 runs

Writes ``data/results/<platform>/rebatch_probe_<label>.json``.
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--lengths", type=int, nargs=4, default=[1500, 1700, 1900, 2100],
                   help="prompt lengths of the four rows (default: %(default)s)")
    p.add_argument("--long-lengths", type=int, nargs=4, default=[7000, 7400, 7800, 8200],
                   help="the same at longer contexts, run once (new shapes)")
    p.add_argument("--decodes", type=int, default=6, help="decode forwards timed after each change")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label", default="default", help="names the output file (e.g. the env variant)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    reexec_with_fast_blas()
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

    from mlxlab import load_model
    from mlxlab.core.environment import device_summary, mlx_env, platform_name
    from mlxlab.core.results import save_results

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    module = model.module
    vocab = model.config["vocab_size"]
    clock = time.perf_counter

    def prefill(n: int, seed: int):
        cache = make_prompt_cache(module)
        toks = mx.random.randint(1, vocab, (1, n), key=mx.random.key(seed)).astype(mx.uint32)
        for a in range(0, n, 2048):
            module(toks[:, a:a + 2048], cache=cache)
            mx.eval([c.state for c in cache])
        return cache

    def copy_plain(cache):
        """A private copy of lone KVCaches (merge/extract leave their inputs alone, but a decode
        writes into its cache)."""
        out = make_prompt_cache(module)
        for o, c in zip(out, cache):
            o.keys, o.values, o.offset = mx.array(c.keys), mx.array(c.values), c.offset
        mx.eval([o.state for o in out])
        return out

    def decode(cache, rows: int) -> float:
        t0 = clock()
        x = mx.zeros((rows, 1), dtype=mx.uint32) + 7
        logits = module(x, cache=cache)[:, -1, :]
        mx.eval(mx.argmax(logits, axis=-1))
        return clock() - t0

    def decodes(cache, rows: int, k: int):
        return [decode(cache, rows) for _ in range(k)]

    def change(fn):
        """(new cache, host seconds, eval seconds) of one batch change."""
        mx.synchronize()
        t0 = clock()
        out = fn()
        t1 = clock()
        mx.eval([c.state[:4] if isinstance(c, BatchKVCache) else c.state for c in out])
        mx.synchronize()
        return out, t1 - t0, clock() - t1

    def scenarios(lengths, reps, tag, rows_out):
        srcs = [prefill(n, seed=i) for i, n in enumerate(lengths)]
        for r in range(reps):
            row = lambda name, host, ev, ds: rows_out.append(  # noqa: E731
                dict(scenario=name, set=tag, repeat=r, host_s=host, eval_s=ev, decode_s=ds))
            plain = [copy_plain(s) for s in srcs]
            b4, h, e = change(lambda: [layer[0].merge(list(layer)) for layer in zip(*plain)])
            row("join4", h, e, decodes(b4, 4, args.decodes))

            def do_filter():
                for c in b4:
                    c.filter([0, 1])
                return b4
            b2, h, e = change(do_filter)
            row("filter2", h, e, decodes(b2, 2, args.decodes))
            b1, h, e = change(lambda: [c.extract(0) for c in b2])
            row("extract1", h, e, decodes(b1, 1, args.decodes))
            # both caches exist: alternate step types with no copy in between
            alt = []
            for _ in range(args.decodes):
                alt.append(decode(b1, 1))
                alt.append(decode(b2, 2))
            row("alternate", 0.0, 0.0, alt)
            row("steady_b1", 0.0, 0.0, decodes(b1, 1, args.decodes))
            row("steady_b2", 0.0, 0.0, decodes(b2, 2, args.decodes))
            print(f"[rebatch] {tag} repeat {r + 1}/{reps}: " + ", ".join(
                f"{x['scenario']} host {1e3 * x['host_s']:.1f} eval {1e3 * x['eval_s']:.1f} "
                f"d1 {1e3 * x['decode_s'][0]:.1f} d2 {1e3 * x['decode_s'][1]:.1f} "
                f"med {1e3 * statistics.median(x['decode_s'][2:] or x['decode_s']):.1f} ms"
                for x in rows_out if x['set'] == tag and x['repeat'] == r), flush=True)

    t_start = clock()
    # warm-up: every code path once at small shapes (first-use kernel compiles are not the question)
    warm = []
    scenarios([64, 80, 96, 112], 1, "warmup", warm)
    rows = []
    scenarios(args.lengths, args.repeats, "short", rows)
    scenarios(args.long_lengths, 1, "long", rows)
    env, _ = mlx_env()
    payload = dict(kind="rebatch_probe", label=args.label, model=args.model, bits=args.bits,
                   dtype=str(model.dtype), lengths=args.lengths, long_lengths=args.long_lengths,
                   environment=dict(device_summary(), mlx_env=env), rows=rows, warmup_rows=warm,
                   wall_s=clock() - t_start)
    path = save_results(f"rebatch_probe_{args.label}", payload, platform=platform_name())
    print(f"[rebatch] wrote {path} ({payload['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
