"""``mlxlab bench`` (``engine``, ``scheduling``, ``contention``, ``speculation``) and ``mlxlab train-tiny``.

Building the parser and importing this module load no MLX: the studies are imported when a
command runs (after :func:`mlxlab.cli.main` has re-executed with the fast BLAS), and the few
defaults that live beside MLX code are read when the parser is built.

Each bench command writes a new run folder, ``data/results/<platform>/runs/<time>/``, and
replaces the committed results only with ``--save`` (:func:`mlxlab.core.results.run_folder`);
``train-tiny`` writes ``build/weights/`` unless ``--save`` (``data/weights/``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from mlxlab.cli.cluster import add_cluster_argument, contention_on_cluster
from mlxlab.cli.common import add_save_argument, model_record, positive_int
from mlxlab.cli.scheduling import add_bench_scheduling
from mlxlab.core.results import results_dir, run_folder, save_results
from mlxlab.train.corpus import build_corpus, heldout_prompts, load_pack, pack_corpus, split_path, write_split

def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` (with ``engine`` / ``scheduling`` / ``contention`` / ``speculation``) and ``train-tiny`` to the
    ``mlxlab`` command's subcommands."""
    bench = sub.add_parser("bench", help="side-by-side benchmarks against mlx-lm")
    bsub = bench.add_subparsers(dest="what", required=True)
    _add_bench_engine(bsub.add_parser(
        "engine", help="single-stream and batched throughput vs generate_step / BatchGenerator"))
    add_bench_scheduling(bsub.add_parser(
        "scheduling", help="the seed-001 stall and its fixes on the engine, beside BatchGenerator"))
    _add_bench_contention(bsub.add_parser(
        "contention", help="a chat streaming while a long document prefills: engine settings vs BatchGenerator",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter))
    from mlxlab.cli.disagg import register_bench as register_disagg  # bench disagg: its own module
    from mlxlab.cli.serve import register_bench  # bench serve lives beside serve

    register_bench(bsub)
    register_disagg(bsub)
    sp = bsub.add_parser("speculation", help="speculative decoding with the trained byte-level pair")
    add_speculate_arguments(sp)
    sp.set_defaults(func=cli_speculate)
    tt = sub.add_parser("train-tiny", help="train the byte-level target/draft pair on the stdlib corpus")
    add_train_arguments(tt)
    tt.set_defaults(func=cli_train)



# ----------------------------------------------------------------------------- bench engine


def _add_bench_engine(be: argparse.ArgumentParser) -> None:
    be.add_argument("--models", nargs="+", default=["small"], help="presets or local model directories")
    be.add_argument("--bits", type=int, default=None, help="quantize weights to this many bits")
    be.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: by device)")
    be.add_argument("--prompt-tokens", type=positive_int, default=512)
    be.add_argument("--decode-tokens", type=positive_int, default=128)
    be.add_argument("--batch", type=positive_int, default=8)
    be.add_argument("--chunk-size", type=positive_int, default=2048)
    be.add_argument("--repeats", type=positive_int, default=5)
    be.add_argument("--limit-batches", type=positive_int, nargs="+", default=[1, 8],
                    help="batch sizes of the decode-limit rows (engine vs the bare loop vs mlx-lm)")
    be.add_argument("--limit-context", type=positive_int, default=1024, help="prompt tokens per row of the decode-limit rows")
    be.add_argument("--limit-tokens", type=positive_int, default=128, help="decode tokens per row of the decode-limit rows")
    be.add_argument("--no-limit", action="store_true", help="skip the decode-limit rows")
    be.add_argument("--platform", default=None, help="results folder name (default: detected)")
    be.add_argument("--name", default="bench_engine", help="results file name")
    add_save_argument(be)
    be.set_defaults(func=cli_bench_engine)


def cli_bench_engine(args: argparse.Namespace) -> int:
    # mlx: the studies are imported when their command runs
    from mlxlab.engine.models import load_model
    from mlxlab.studies.engine_bench.run import bench_engine, verdicts
    from mlxlab.studies.engine_bench.decode_limit import decode_limit, decode_verdicts

    out, folder = {"presets": {}}, None
    params = {k: getattr(args, k) for k in ("models", "bits", "dtype", "prompt_tokens", "decode_tokens", "batch",
                                            "chunk_size", "repeats", "limit_batches", "limit_context",
                                            "limit_tokens", "no_limit")}
    for preset in args.models:
        model = load_model(preset, bits=args.bits, dtype=args.dtype)
        print(f"[bench engine] {preset}: {model.num_params / 1e6:.1f}M params, {model.nbytes / 2**20:.1f} MiB, "
              f"dtype={model.dtype}, bits={model.bits}", flush=True)
        res = bench_engine(model, prompt_tokens=args.prompt_tokens, decode_tokens=args.decode_tokens,
                           batch=args.batch, chunk_size=args.chunk_size, repeats=args.repeats)
        res["model"] = model_record(preset, model)
        out["presets"][preset] = res
        for k in ("single_prefill_tok_s", "single_decode_tok_s", "batched_decode_tok_s"):
            r = res[k]
            print(f"  {k:22s} mlxlab {r['mlxlab']['median']:10.1f}  mlx-lm {r['mlx_lm']['median']:10.1f}"
                  f"  ratio {r['ratio']:.3f}  paired {r['paired_ratio_median']:.3f}", flush=True)
        print(f"  greedy tokens agree: {res['greedy_tokens_agree']}, "
              f"common prefix (min): {res['greedy_common_prefix_min']}", flush=True)
        if not args.no_limit:
            res["decode_limit"] = decode_limit(model, batches=args.limit_batches, context=args.limit_context,
                                               tokens=args.limit_tokens, repeats=args.repeats)
            _print_limit(res["decode_limit"])
        # written after every preset, so a run cut short by a time limit keeps what it measured
        vs = verdicts(out["presets"])
        if not args.no_limit:
            vs += decode_verdicts({p: r["decode_limit"] for p, r in out["presets"].items() if "decode_limit" in r})
        folder = folder or run_folder(args.platform, args.save)
        path = save_results(args.name, out, platform=args.platform, folder=folder, verdicts=vs, parameters=params)
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"wrote {path}")
    return 0


# ----------------------------------------------------------------------------- bench contention


def _add_bench_contention(bc: argparse.ArgumentParser) -> None:
    from mlxlab.studies.contention.run import SETTINGS  # no MLX

    bc.add_argument("--models", nargs="+", default=["small"], help="presets or local model directories")
    bc.add_argument("--bits", type=int, default=None, help="quantize weights to this many bits (None: as stored)")
    bc.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (None: by device)")
    bc.add_argument("--doc-tokens", type=positive_int, default=4096, help="the document's prompt length")
    bc.add_argument("--chat-context", type=positive_int, default=1536, help="the chat's prompt length")
    bc.add_argument("--repeats", type=positive_int, default=3,
                    help="runs per setting (at least 2): run 1 is the first run, the rest are warm")
    bc.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS), metavar="LABEL",
                    help="settings to run, in this order within each repeat (choices: " + ", ".join(SETTINGS) + ")")
    bc.add_argument("--warmup", default="policy", help="every engine's warm-up mode (Engine(warmup=...))")
    bc.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    bc.add_argument("--platform", default=None, help="results folder name (None: detected)")
    bc.add_argument("--name", default="contention",
                    help="results file name; the figure <name>_<platform>.svg/.png goes beside it "
                         "(with --save: into paper/figures/)")
    bc.add_argument("--append", nargs="?", const="", default=None, metavar="JSON",
                    help="keep the presets of an earlier results file, JSON or (with no JSON) the committed "
                         "data/results/PLATFORM/NAME.json, each with the provenance of the run that measured it, "
                         "and add these; verdicts and the figure cover them all (default: off)")
    bc.add_argument("--rescore", default=None, metavar="JSON",
                    help="decide the verdicts of a saved contention file again with this version's rules, in place "
                         "(nothing is run; marked rescored_by this commit), redraw its figure and stop")
    add_save_argument(bc, "data/results/PLATFORM/ and paper/figures/")
    add_cluster_argument(bc, "each (model, setting) as one timed point, one at a time per accelerator")
    bc.set_defaults(func=cli_bench_contention)


def cli_bench_contention(args: argparse.Namespace) -> int:
    # mlx: the studies are imported when their command runs
    from mlxlab.core.environment import platform_name
    from mlxlab.engine.models import load_model
    from mlxlab.studies.contention.run import format_table, run_contention
    from mlxlab.studies.contention.verdict import verdicts

    if args.rescore:
        return _rescore_contention(Path(args.rescore), args)
    if args.cluster:
        return contention_on_cluster(args, _earlier_presets, _contention_figure)
    plat = args.platform or platform_name()
    params = {k: getattr(args, k) for k in ("models", "bits", "dtype", "doc_tokens", "chat_context", "repeats",
                                            "settings", "warmup", "seed")}
    earlier = Path(args.append) if args.append else results_dir(plat) / f"{args.name}.json"
    out, folder = {"presets": _earlier_presets(earlier, args.models) if args.append is not None else {}}, None
    for preset in args.models:
        model = load_model(preset, bits=args.bits, dtype=args.dtype)
        print(f"[bench contention] {preset}: {model.num_params / 1e6:.1f}M params, dtype={model.dtype}, "
              f"bits={model.bits}; document {args.doc_tokens} tokens, chat context {args.chat_context}, "
              f"repeats {args.repeats}, warm-up {args.warmup}", flush=True)
        res = run_contention(model, doc_tokens=args.doc_tokens, chat_context=args.chat_context, repeats=args.repeats,
                             settings=args.settings, warmup=args.warmup, seed=args.seed)
        res["model"] = model_record(preset, model)
        out["presets"][preset] = res
        print(format_table(preset, res), flush=True)
        # written after every preset, so a run cut short by a time limit keeps what it measured
        vs = verdicts(out["presets"])
        folder = folder or run_folder(plat, args.save)
        path = save_results(args.name, out, platform=plat, folder=folder, verdicts=vs, parameters=params)
        figures = _contention_figure(out["presets"], args.name, plat, None if args.save else folder)
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"wrote {path}" + "".join(f", {p}" for p in figures))
    return 0


def _rescore_contention(path: Path, args: argparse.Namespace) -> int:
    """``--rescore``: the saved file's verdicts decided again from its stored runs, in place."""
    from mlxlab.studies.contention import STUDY

    doc = STUDY.rescore(path)
    plat = args.platform or path.parent.name
    figures = _contention_figure(doc["presets"], path.stem, plat, None if args.save else run_folder(plat, False))
    for v in doc["verdicts"]:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"rescored {path}" + "".join(f", {p}" for p in figures))
    return 0


def _earlier_presets(path: Path, models) -> dict:
    """The presets of an earlier results file (``--append``), less those measured again now, each
    keeping the provenance of the run that measured it under ``environment``."""
    if not path.exists():
        print(f"[bench contention] --append: no {path} yet, starting a new file", flush=True)
        return {}
    doc = json.loads(path.read_text())
    env = doc.get("environment")
    kept = {k: {**v, "environment": v.get("environment", env)} for k, v in doc.get("payload", doc).get("presets", {}).items()
            if k not in models}
    print(f"[bench contention] --append: keeping {sorted(kept)} from {path.name}", flush=True)
    return kept


def _contention_figure(presets: dict, name: str, plat: str, folder: Optional[Path] = None) -> list:
    """The frontier figure as <name>_<platform>.svg/.png in ``folder`` (default: paper/figures/);
    [] (with a line saying why) when it cannot be drawn, so a figure never loses the numbers."""
    try:
        from mlxlab.notebook.plots import save_figure  # altair: only for the figure
        from mlxlab.studies.contention.charts import frontier_chart
        from mlxlab.studies.sim_validation.charts import FIGURES

        return save_figure(frontier_chart(presets, plat), f"{name}_{plat}", folder or FIGURES)
    except Exception as e:  # noqa: BLE001 - reported, the results are already written
        print(f"[bench contention] no figure: {e!r}", flush=True)
        return []


def _print_limit(limit: dict) -> None:
    for b, r in limit["batches"].items():
        t = r["tok_s"]
        print(f"  decode b{b:<3} bare {t['bare']['median']:9.1f}  engine {t['engine']['median']:9.1f}  "
              f"{r['mlx_lm_side']} {t['mlx_lm']['median']:9.1f} tok/s;  engine/bare "
              f"{r['engine_over_bare']['median']:.3f} [{r['engine_over_bare']['min']:.3f}, "
              f"{r['engine_over_bare']['max']:.3f}]  engine/mlx-lm {r['engine_over_mlx_lm']['median']:.3f}", flush=True)
        for side, p in r["host_profile"].items():
            parts = "  ".join(f"{k[:-3]} {v:7.1f}" for k, v in p.items() if k.endswith("_us"))
            print(f"      host us/step {side:6s} {parts}", flush=True)


# ----------------------------------------------------------------------------- bench speculation


def add_speculate_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``mlxlab bench speculation``."""
    # mlx: read when the parser is built (after main()'s re-exec), not when this module is imported
    from mlxlab.studies.speculation.run import DEFAULT_KS

    parser.add_argument("--target", default=None, help="model directory (default: data/weights/byte-target)")
    parser.add_argument("--draft", default=None, help="model directory (default: data/weights/byte-draft)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(DEFAULT_KS))
    parser.add_argument("--prompts", type=int, default=16, help="held-out code prompts")
    parser.add_argument("--prompt-len", type=int, default=96,
                        help="bytes per prompt (held-out code, ending mid-line)")
    parser.add_argument("--seed", type=int, default=1, help="prompt selection seed")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="prompt + max tokens should stay within the 256 bytes the models were trained on")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--dtype", default=None,
                        help="both models' dtype (default: float32 on a CPU, bfloat16 on a GPU). On the H200 "
                             "bfloat16 logits tie often enough that speculation leaves the target's greedy "
                             "output (data/results/h200/speculation_exactness.json); float16 and float32 do not")
    parser.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's speculative_generate_step")
    parser.add_argument("--corpus", default=None, metavar="PACK",
                        help="cut the prompts from a corpus pack's held-out split (`train-tiny --pack-corpus`) "
                             "instead of this interpreter's stdlib")
    parser.add_argument("--platform", default=None, help="results folder name (default: detected)")
    parser.add_argument("--name", default="speculation", help="results file name")
    add_save_argument(parser)


def cli_speculate(args: argparse.Namespace) -> int:
    # mlx: the studies are imported when their command runs
    from mlxlab.engine.models import load_model
    from mlxlab.studies.speculation.run import (
        format_study,
        speculation_study,
        teacher_forced_agreement,
        verdicts,
    )
    from mlxlab.train.tiny import DRAFT_PRESET, TARGET_PRESET, weights_dir

    target = load_model(args.target or weights_dir() / TARGET_PRESET, dtype=args.dtype)
    draft = load_model(args.draft or weights_dir() / DRAFT_PRESET, dtype=args.dtype)
    held = (load_pack(args.corpus) if args.corpus else build_corpus(verify=False))["heldout"]
    prompts = heldout_prompts(args.prompts, length=args.prompt_len, seed=args.seed, data=held, midline=True)
    study = speculation_study(target, draft, prompts, ks=args.ks, max_tokens=args.max_tokens,
                              repeats=args.repeats, mlx_lm=not args.no_mlx_lm,
                              log=lambda s: print(s, flush=True))
    study["teacher_forced"] = teacher_forced_agreement(target, draft, held, max_windows=128)
    print(f"teacher-forced greedy agreement on held-out code: {study['teacher_forced']['agreement']:.3f}")
    study["models"] = {"target": target.name, "draft": draft.name,
                       "target_params": target.num_params, "draft_params": draft.num_params,
                       "dtype": str(target.dtype)}
    print(format_study(study))
    params = {k: v for k, v in vars(args).items() if k not in ("func", "save")}
    path = save_results(args.name, study, platform=args.platform, folder=run_folder(args.platform, args.save),
                        verdicts=verdicts(study, k=4), parameters=params)
    print(f"wrote {path}")
    return 0


# ----------------------------------------------------------------------------- train-tiny


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``mlxlab train-tiny``."""
    # mlx: read when the parser is built (after main()'s re-exec), not when this module is imported
    from mlxlab.train.tiny import DRAFT_PRESET, TARGET_PRESET

    parser.add_argument("--models", nargs="+", default=[TARGET_PRESET, DRAFT_PRESET],
                        help="presets to train (default: byte-target byte-draft)")
    parser.add_argument("--steps", type=int, default=None, help="default: per-model recipe")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--batch", type=positive_int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", default=None,
                       help="weights folder (default: build/weights/, ignored by git; with --save: data/weights/); "
                            "each model goes to OUT/<preset>")
    add_save_argument(where, "data/weights/ (the pair `bench speculation` loads)",
                      "default: write build/weights/ (ignored by git)", what="weights")
    parser.add_argument("--log", default=None, help="JSONL log (default: OUT/train_log.jsonl, appended)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-windows", type=int, default=256,
                        help="held-out windows of seq-len bytes scored at the end (0: all)")
    parser.add_argument("--no-verify", action="store_true",
                        help="train on this interpreter's stdlib even if it differs from data/corpus/split.json")
    parser.add_argument("--write-split", action="store_true",
                        help="(re)record data/corpus/split.json from this interpreter, then train")
    parser.add_argument("--corpus", default=None, metavar="PACK",
                        help="train on a corpus pack (--pack-corpus) instead of this interpreter's stdlib: the "
                             "committed split on a machine with another Python")
    parser.add_argument("--pack-corpus", default=None, metavar="PACK",
                        help="write the verified corpus to PACK (tar.xz, ~1.5 MB) and stop")


def cli_train(args: argparse.Namespace) -> int:
    # mlx: the trainer is imported when its command runs
    from mlxlab.train.tiny import recipe, train_tiny, trained_weights_dir

    if args.pack_corpus:
        path = pack_corpus(args.pack_corpus)
        print(f"[train-tiny] wrote {path} ({path.stat().st_size / 1e6:.1f} MB), the split of {split_path()}")
        return 0
    if args.write_split:
        rec = write_split()
        print(f"[train-tiny] wrote {split_path()}: {rec['num_files']} files, {rec['bytes']} bytes")
    corpus = load_pack(args.corpus) if args.corpus else build_corpus(verify=not args.no_verify)
    print(f"[train-tiny] corpus ({corpus['meta']['python']}): train {len(corpus['train'])} bytes, "
          f"held-out {len(corpus['heldout'])} bytes", flush=True)
    out_root = Path(args.out) if args.out else trained_weights_dir(args.save)
    log_path = Path(args.log) if args.log else out_root / "train_log.jsonl"
    for name in args.models:
        r = recipe(name)
        for k in ("steps", "seq_len", "batch", "lr", "warmup", "seed"):
            if getattr(args, k, None) is not None:
                r[k] = getattr(args, k)
        train_tiny(name, out_dir=out_root / name, log_path=log_path, corpus=corpus, eval_every=args.eval_every,
                   final_eval_windows=args.eval_windows or None, print_fn=lambda s: print(s, flush=True), **r)
        print(f"wrote {out_root / name}", flush=True)
    print(f"wrote {log_path}")
    return 0
