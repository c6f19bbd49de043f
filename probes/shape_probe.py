"""Shape probe: what a prefill chunk costs the first time the process meets its shape.

On an H100 with cuDNN attention on (mlx's default), ``stall_free`` at a 256-token budget gave the
chat a median ITL of 67-78 ms where ``interleave`` at 256-token chunks gave 26-31 ms
(``data/results/h100/tune_*_before_shape_cold.json``). Both run about 256 prompt tokens per step; ``stall_free``'s
chunk follows the decode batch, so its (query, key) shape is new nearly every step, while a fixed
chunk size meets the same shapes prompt after prompt. mlx keeps one cuDNN attention graph per exact
query, key and value shape and stride, and CUDA graphs of whole forwards besides. This probe asks
what a first use costs, and which change makes one: a new key length at a known chunk size, or a new
chunk size at a known key length.

One model forward of a ``--tokens`` chunk after ``--context`` cached tokens (the cache a fresh copy
of one prefilled prompt, then moved on by an untimed chunk of ``8 * (j + 1)`` tokens for trial ``j``),
for ``--trials`` trials:

* ``new_key``: the chunk at a context no trial used before (the same size as every other trial): a
  key length the process has not met; then ``new_key_again``, the same chunk again on a fresh copy;
* ``new_size``: a chunk of ``tokens - 8 * (j + 1)`` tokens, a size not run before, that ends at the
  key length the first trial's warm-up ran: a new query length at a known key length; then
  ``new_size_again``;
* ``repeat``: the warm-up's chunk again (size and key length both known).

Run it under each backend setting in a process of its own (mlx reads them once), e.g. cuDNN
attention off (``MLX_CUDA_USE_CUDNN_SDPA=0``) and CUDA graphs off (``MLX_USE_CUDA_GRAPHS=0``), and
compare ``first_use_extra_ms``: per trial, the first run less the same chunk's second, median.

Usage::

    python -m probes.shape_probe --model small --tokens 64 --context 256 --trials 4    # CPU smoke run
    bash scripts/h200_batch.sh shapes                                                  # the GPU runs

Writes ``data/results/<platform>/shape_probe[_LABEL].json``.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Dict, List

import mlx.core as mx

from probes import common
from probes.chunk_probe import prefilled

ALIGN = 8  # trials move the context and the size in steps of the engine's key alignment


def parse_args(argv=None):
    p = common.parser(__doc__, "shape_probe")
    p.add_argument("--tokens", type=int, default=256, help="the chunk size (stall_free's budget scale)")
    p.add_argument("--context", type=int, default=4096, help="tokens cached before the trials' chunks")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--label", default="", help="a name for this process's backend setting (file suffix)")
    args = common.parse(p, argv)
    if args.tokens <= ALIGN * args.trials:
        p.error(f"--tokens must exceed {ALIGN} x --trials ({ALIGN * args.trials}): new sizes shrink by {ALIGN}")
    if args.context < 0 or args.trials < 1:
        p.error("--context must be >= 0 and --trials >= 1")
    return args


def timed_chunk(module, toks, base, context: int, shift: int, n: int) -> float:
    """Seconds of one forward of ``n`` tokens after ``context + shift`` cached tokens, on a fresh copy
    of ``base`` (``context`` tokens) moved on by an untimed ``shift``-token chunk."""
    cache = common.copy_cache(module, base)
    if shift:
        module(toks[:, context:context + shift], cache=cache)
        mx.eval([c.state for c in cache])
    at = context + shift
    mx.synchronize()
    t0 = time.perf_counter()
    module(toks[:, at:at + n], cache=cache)
    mx.eval([c.state for c in cache])
    return time.perf_counter() - t0


def measure(module, toks, args) -> Dict[str, List[dict]]:
    """The trials (see the module docstring): per kind, one record per trial with its seconds."""
    n, c, base = args.tokens, args.context, args.base
    for _ in range(2):  # warm-up: the chunk at the base context (its size and key length known from now on)
        timed_chunk(module, toks, base, c, 0, n)
    out: Dict[str, List[dict]] = {k: [] for k in ("repeat", "new_key", "new_key_again", "new_size",
                                                  "new_size_again")}
    for j in range(args.trials):
        shift = ALIGN * (j + 1)
        out["repeat"].append({"trial": j, "tokens": n, "key": c + n, "s": timed_chunk(module, toks, base, c, 0, n)})
        for kind, (sh, size) in (("new_key", (shift, n)), ("new_size", (shift, n - shift))):
            first = timed_chunk(module, toks, base, c, sh, size)
            again = timed_chunk(module, toks, base, c, sh, size)
            key = c + sh + size
            out[kind].append({"trial": j, "tokens": size, "key": key, "s": first})
            out[kind + "_again"].append({"trial": j, "tokens": size, "key": key, "s": again})
        common.log("shapes", f"trial {j + 1}/{args.trials} ({time.perf_counter() - args.started:.1f} s)")
    return out


def summarize(runs: Dict[str, List[dict]]) -> dict:
    """Median milliseconds per kind, and per change (new key, new size) the median over trials of the
    first run less the second (``first_use_extra_ms``)."""
    out = {"median_ms": {k: 1e3 * statistics.median(r["s"] for r in v) for k, v in runs.items() if v}}
    out["first_use_extra_ms"] = {
        kind: 1e3 * statistics.median(a["s"] - b["s"] for a, b in zip(runs[kind], runs[kind + "_again"]))
        for kind in ("new_key", "new_size") if runs[kind]}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    model = common.load(args)
    total = args.context + ALIGN * args.trials + args.tokens
    toks = mx.random.randint(1, model.vocab_size, (1, total), key=mx.random.key(0)).astype(mx.uint32)
    args.base = prefilled(model.module, toks, args.context)
    runs = measure(model.module, toks, args)
    summary = summarize(runs)
    for k, v in summary["median_ms"].items():
        common.log("shapes", f"{k:15s} {v:8.2f} ms (median)")
    for k, v in summary["first_use_extra_ms"].items():
        common.log("shapes", f"first use, {k}: +{v:.2f} ms over the same chunk again")
    name = args.name + (f"_{args.label}" if args.label else "")
    common.save(args, "shape_probe", dict(model=args.model, bits=args.bits, dtype=str(model.dtype),
                                          tokens=args.tokens, context=args.context, trials=args.trials,
                                          label=args.label, runs=runs, **summary), name=name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
