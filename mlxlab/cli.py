"""The ``mlxlab`` command: ``mlxlab bench engine`` (and the other tools as they land)."""

from __future__ import annotations

import argparse
import json
import sys

from .platform import reexec_with_fast_blas


def _bench_engine(args) -> int:
    from .bench import bench_engine
    from .models import load_model
    from .results import save_results

    out = {"presets": {}}
    for preset in args.models:
        model = load_model(preset, bits=args.bits, dtype=args.dtype)
        print(f"[bench engine] {preset}: {model.num_params / 1e6:.1f}M params, {model.nbytes / 2**20:.1f} MiB, "
              f"dtype={model.dtype}, bits={model.bits}", flush=True)
        res = bench_engine(model, prompt_tokens=args.prompt_tokens, decode_tokens=args.decode_tokens,
                           batch=args.batch, chunk_size=args.chunk_size, repeats=args.repeats)
        res["model"] = {"preset": preset, "dtype": str(model.dtype), "bits": model.bits,
                        "num_params": model.num_params, "nbytes": model.nbytes}
        out["presets"][preset] = res
        for k in ("single_prefill_tok_s", "single_decode_tok_s", "batched_decode_tok_s"):
            r = res[k]
            print(f"  {k:22s} mlxlab {r['mlxlab']['median']:10.1f}  mlx-lm {r['mlx_lm']['median']:10.1f}"
                  f"  ratio {r['ratio']:.3f}", flush=True)
        print(f"  greedy tokens agree: {res['greedy_tokens_agree']}", flush=True)
    path = save_results(args.name, out, platform=args.platform)
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxlab", description="Measure and tune LLM serving on MLX.")
    sub = p.add_subparsers(dest="cmd", required=True)
    bench = sub.add_parser("bench", help="side-by-side benchmarks against mlx-lm")
    bsub = bench.add_subparsers(dest="what", required=True)
    be = bsub.add_parser("engine", help="single-stream and batched throughput vs generate_step / BatchGenerator")
    be.add_argument("--models", nargs="+", default=["small"], help="presets or local model directories")
    be.add_argument("--bits", type=int, default=None, help="quantize weights to this many bits")
    be.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: by device)")
    be.add_argument("--prompt-tokens", type=int, default=512)
    be.add_argument("--decode-tokens", type=int, default=128)
    be.add_argument("--batch", type=int, default=8)
    be.add_argument("--chunk-size", type=int, default=2048)
    be.add_argument("--repeats", type=int, default=5)
    be.add_argument("--platform", default=None, help="results folder name (default: detected)")
    be.add_argument("--name", default="bench_engine", help="results file name")
    be.set_defaults(func=_bench_engine)
    return p


def main(argv=None) -> int:
    reexec_with_fast_blas()
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
