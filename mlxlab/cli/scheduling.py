"""``mlxlab bench scheduling``: the seed-001 scheduling study on the engine, beside mlx-lm, its
parts pooled (``--merge``) and its saved results rescored (``--rescore``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlxlab.cli.common import add_model_arguments, add_save_argument, model_record, positive_int
from mlxlab.core.environment import mlx_env
from mlxlab.core.results import environment_block, run_folder, save_results

# `bench scheduling --quick`: these chunk sizes and repeats, half the prompt scale
QUICK = {"chunk_sizes": [128, 512, 2048], "repeats": 3}


# ----------------------------------------------------------------------------- bench scheduling


def add_bench_scheduling(bs: argparse.ArgumentParser) -> None:
    add_model_arguments(bs)
    bs.add_argument("--quick", action="store_true",
                    help="half the prompt scale, chunks 128/512/2048, 3 repeats (about 1 minute on a CPU with tiny); "
                         "never saved: --save refuses it")
    bs.add_argument("--repeats", type=positive_int, default=None, help="runs per configuration (default 3)")
    bs.add_argument("--scale", type=float, default=None,
                    help="long prompts are 16k-32k tokens times this (default: 1 on a GPU, 1/16 on a CPU, "
                         "less where the model's context is shorter)")
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
    add_save_argument(bs)
    bs.add_argument("--keep-runs", action="store_true",
                    help="keep every run's numbers, the plan and the calibration in the results file, and rewrite "
                         "it after each repeat: a part that --merge can pool with others")
    bs.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="pool the results files of parts run with --keep-runs (same plan, code and model; e.g. "
                         "repeats split over several GPU calls) into --name, and stop (no model, no device)")
    bs.add_argument("--rescore", nargs="+", default=None, metavar="JSON",
                    help="add the claims' verdicts to saved scheduling results, in place, from their tables "
                         "(no model, no device; marked rescored_by this commit) and stop")
    bs.set_defaults(func=cli_bench_scheduling)


def _jsonl_appender(path: Path):
    """A callback that appends each row to ``path`` as one JSON line (the file starts empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")

    def append(row: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    return append


def _rescore_scheduling(paths) -> int:
    from mlxlab.cli.tools import rescore_files
    from mlxlab.studies.scheduling import STUDY  # no MLX

    return rescore_files(paths, STUDY, "bench scheduling")


def _write_scheduling(study: dict, args, folder, preset, bits, dtype, announce: bool = True) -> Path:
    from mlxlab.studies.scheduling.verdict import parameters, verdicts

    vs = verdicts(study)
    if announce:
        for v in vs:
            print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    params = parameters(study, preset=preset, bits=bits, dtype=dtype)
    return save_results(args.name, study, platform=args.platform, folder=folder, verdicts=vs, parameters=params)


def _merge_scheduling(args: argparse.Namespace) -> int:
    from mlxlab.studies.scheduling.run import format_table
    from mlxlab.studies.scheduling.merge import merge_parts

    parts = []
    for path in args.merge:
        doc = json.loads(Path(path).read_text())
        parts.append({**doc, "source": str(path)})
    study = merge_parts(parts)
    env = parts[0]["environment"]  # the parts' machine, not this one: the merge measures nothing
    study["environment"] = {**env, "merged_from": [str(p) for p in args.merge],
                            "merged_by": environment_block(args.platform)}
    args.platform = args.platform or env.get("platform")
    p0 = parts[0].get("parameters", {})
    print(format_table(study))
    path = _write_scheduling(study, args, run_folder(args.platform, args.save), p0.get("model"), p0.get("bits"),
                             p0.get("dtype"))
    print(f"wrote {path}: {len(parts)} parts, {study['config']['repeats']} repeats")
    return 0


def cli_bench_scheduling(args: argparse.Namespace) -> int:
    if args.rescore:
        return _rescore_scheduling(args.rescore)
    if args.merge:
        return _merge_scheduling(args)
    if args.quick and args.save:
        raise ValueError("--save replaces the committed results, which a --quick run must not: drop one")
    # mlx: the studies are imported when their command runs
    from mlxlab.engine.models import load_model
    from mlxlab.studies.scheduling.run import format_table, scheduling_study
    from mlxlab.studies.scheduling.plan import ALL_POLICIES, default_scale

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    scale = args.scale or (default_scale(model) / 2 if args.quick else default_scale(model))
    chunk_sizes = args.chunk_sizes or (QUICK["chunk_sizes"] if args.quick else [256, 512, 1024, 2048])
    repeats = args.repeats or (QUICK["repeats"] if args.quick else 3)
    print(f"[bench scheduling] {args.model}: {model.num_params / 1e6:.1f}M params, dtype={model.dtype}, "
          f"bits={model.bits}; scale {scale:.4g}, chunks {chunk_sizes}, workers {args.workers}, "
          f"repeats {repeats}", flush=True)
    folder = run_folder(args.platform, args.save)  # the committed folder only with --save (never --quick)
    on_run = _jsonl_appender(folder / f"{args.name}_runs.jsonl")  # every run as it ends

    def finish(study: dict, announce: bool = True) -> Path:
        study["model"] = model_record(args.model, model)
        study["config"]["quick"] = bool(args.quick)
        # backend switches change what is measured (e.g. MLX_CUDA_USE_CUDNN_SDPA=0): keep them with it
        study["config"]["mlx_env"], study["config"]["mlx_env_warnings"] = mlx_env()
        return _write_scheduling(study, args, folder, args.model, args.bits, args.dtype, announce)

    def on_repeat(partial: dict) -> None:  # a part cut short by a call's time limit keeps its repeats
        print(f"[bench scheduling] {partial['config']['repeats']} repeat(s) done: wrote {finish(partial, False)}",
              flush=True)

    study = scheduling_study(model, platform_scale=scale, policies=args.policies or ALL_POLICIES,
                             chunk_sizes=chunk_sizes, workers=args.workers, repeats=repeats,
                             stall_chunk=args.stall_chunk, gate_chunk=args.gate_chunk, seed=args.seed,
                             slo_min_chunk=args.slo_min_chunk, slo_chunk_multiple=args.slo_chunk_multiple,
                             log=None if args.quiet else (lambda line: print(line, flush=True)), on_run=on_run,
                             keep_runs=args.keep_runs, on_repeat=on_repeat if args.keep_runs else None)
    print(format_table(study))
    path = finish(study)
    print(f"wrote {path} ({study['wall_s']:.0f} s)")
    return 0
