"""The ``mlxlab`` command: benchmarks against mlx-lm, the notebooks, profiles, the simulator, training."""

from __future__ import annotations

import argparse
import sys

from mlxlab.cli.common import add_model_arguments
from mlxlab.core.environment import mlx_env, reexec_with_fast_blas


def _bench_engine(args) -> int:
    from mlxlab.core.results import save_results
    from mlxlab.engine.models import load_model
    from mlxlab.studies.bench import bench_engine

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
                  f"  ratio {r['ratio']:.3f}  paired {r['paired_ratio_median']:.3f}", flush=True)
        print(f"  greedy tokens agree: {res['greedy_tokens_agree']}, common prefix (min): {res['greedy_common_prefix_min']}", flush=True)
        # written after every preset, so a run cut short by a time limit keeps what it measured
        path = save_results(args.name, out, platform=args.platform)
    print(f"wrote {path}")
    return 0


QUICK = {"chunk_sizes": [128, 512, 2048], "repeats": 3}


def _bench_scheduling(args) -> int:
    from mlxlab.core.results import save_results
    from mlxlab.engine.models import load_model
    from mlxlab.studies.scheduling import (
        ALL_POLICIES,
        default_scale,
        format_table,
        scheduling_study,
    )

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    scale = args.scale or (default_scale(model) / 2 if args.quick else default_scale(model))
    chunk_sizes = args.chunk_sizes or (QUICK["chunk_sizes"] if args.quick else [256, 512, 1024, 2048])
    repeats = args.repeats or (QUICK["repeats"] if args.quick else 3)
    print(f"[bench scheduling] {args.model}: {model.num_params / 1e6:.1f}M params, dtype={model.dtype}, "
          f"bits={model.bits}; scale {scale:.4g}, chunks {chunk_sizes}, workers {args.workers}, "
          f"repeats {repeats}", flush=True)
    import json

    from mlxlab.core.results import results_dir

    runs_path = results_dir(args.platform) / f"{args.name}_runs.jsonl"  # every run as it ends
    runs_path.parent.mkdir(parents=True, exist_ok=True)
    runs_path.write_text("")

    def on_run(row: dict) -> None:
        with runs_path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    study = scheduling_study(model, platform_scale=scale, policies=args.policies or ALL_POLICIES,
                             chunk_sizes=chunk_sizes, workers=args.workers, repeats=repeats,
                             stall_chunk=args.stall_chunk, gate_chunk=args.gate_chunk, seed=args.seed,
                             slo_min_chunk=args.slo_min_chunk, slo_chunk_multiple=args.slo_chunk_multiple,
                             log=None if args.quiet else (lambda line: print(line, flush=True)), on_run=on_run)
    study["model"] = {"preset": args.model, "dtype": str(model.dtype), "bits": model.bits,
                      "num_params": model.num_params, "nbytes": model.nbytes}
    study["config"]["quick"] = bool(args.quick)
    # backend switches change what is measured (e.g. MLX_CUDA_USE_CUDNN_SDPA=0): keep them with it
    study["config"]["mlx_env"], study["config"]["mlx_env_warnings"] = mlx_env()
    print(format_table(study))
    path = save_results(args.name, study, platform=args.platform)
    print(f"wrote {path} ({study['wall_s']:.0f} s)")
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
    bs = bsub.add_parser("scheduling", help="the seed-001 stall and its fixes on the engine, beside BatchGenerator")
    add_model_arguments(bs)
    bs.add_argument("--quick", action="store_true",
                    help="half the prompt scale, chunks 128/512/2048, 3 repeats (about 1 minute on a CPU with tiny)")
    bs.add_argument("--repeats", type=int, default=None, help="runs per configuration (default 3)")
    bs.add_argument("--scale", type=float, default=None,
                    help="long prompts are 16k-32k tokens times this (default: 1 on a GPU, 1/16 on a CPU)")
    bs.add_argument("--chunk-sizes", type=int, nargs="+", default=None)
    bs.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    bs.add_argument("--policies", nargs="+", default=None,
                    help="subset of interleave mlx_lm admission_gate stall_free slo overlap")
    bs.add_argument("--stall-chunk", type=int, default=2048)
    bs.add_argument("--gate-chunk", type=int, default=512)
    bs.add_argument("--slo-min-chunk", type=int, default=32,
                    help="smallest chunk slo may choose (on a CPU a 32-token chunk alone can exceed its ITL target)")
    bs.add_argument("--slo-chunk-multiple", type=int, default=1,
                    help="slo rounds its chunks down to multiples of this (fewer shapes for a backend that "
                         "prepares work per query length, e.g. mlx CUDA)")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--quiet", action="store_true", help="no line per run")
    bs.add_argument("--platform", default=None, help="results folder name (default: detected)")
    bs.add_argument("--name", default="scheduling", help="results file name")
    bs.set_defaults(func=_bench_scheduling)

    from mlxlab.engine.speculative import add_speculate_arguments, cli_speculate
    sp = bsub.add_parser("speculation", help="speculative decoding with the trained byte-level pair")
    add_speculate_arguments(sp)
    sp.set_defaults(func=cli_speculate)

    rp = sub.add_parser("reproduce", help="run the notebooks headless through papermill")
    rp.add_argument("--quick", action="store_true", help="quick mode: small sizes, a minute or two each")
    rp.add_argument("--only", nargs="+", default=None, help="notebook numbers or name parts, e.g. 5 or admission")
    rp.add_argument("--platform", default=None, help="results folder name (default: detected)")
    rp.set_defaults(func=_reproduce)

    pp = sub.add_parser("paper", help="regenerate paper/results.md from data/results")
    pp.set_defaults(func=_paper)

    from mlxlab.sim.profiling import add_profile_arguments, cli_profile
    pr = sub.add_parser("profile", help="measure a step-time grid and fit the cost model")
    add_profile_arguments(pr)
    pr.set_defaults(func=cli_profile)

    from mlxlab.studies.sim_validation import add_validate_arguments, cli_validate
    va = sub.add_parser("validate-sim", help="simulator against engine on the same workloads")
    add_validate_arguments(va)
    va.set_defaults(func=cli_validate)

    from mlxlab.studies.sim_validation import cli_seed_scale
    ss = sub.add_parser("seed-scale", help="the seed-001 study at its own scale on the simulator")
    ss.set_defaults(func=cli_seed_scale)

    from mlxlab.train.tiny import add_train_arguments, cli_train
    tt = sub.add_parser("train-tiny", help="train the byte-level target/draft pair on the stdlib corpus")
    add_train_arguments(tt)
    tt.set_defaults(func=cli_train)
    return p


def _reproduce(args) -> int:
    from mlxlab.notebook.reproduce import ReproduceError, reproduce

    try:
        done = reproduce(quick=args.quick, only=args.only, platform=args.platform)
    except ReproduceError as exc:
        print(f"mlxlab reproduce: {exc}", file=sys.stderr)
        return 1
    for d in done:
        print(f"{d['notebook']:40s} {d['seconds']:7.1f} s  -> {d['output']}")
    return 0


def _paper(args) -> int:
    from mlxlab.notebook.paper import write_results

    print(f"wrote {write_results()}")
    return 0


def main(argv=None) -> int:
    reexec_with_fast_blas()
    args = build_parser().parse_args(argv)
    for warning in mlx_env()[1]:
        print(f"warning: {warning}", file=sys.stderr)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
