"""``mlxlab bench disagg``: the chat beside a document on one engine against a prefill worker and
a decode worker in two processes over mlx's ring backend (:mod:`mlxlab.studies.disagg.run`), with
its verdicts (:mod:`mlxlab.studies.disagg.verdict`); ``--simulate`` and ``--rescore`` run nothing.

Building the parser loads no MLX; the study launches its own processes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from mlxlab.cli.common import add_save_argument, positive_int


def register_bench(bsub: argparse._SubParsersAction) -> None:
    """Add ``bench disagg`` to ``mlxlab bench``'s subcommands."""
    bd = bsub.add_parser("disagg", help="prefill/decode disaggregation over mx.distributed (ring, loopback) "
                                        "vs one engine: chat ITL, document TTFT, KV transfer",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bd.add_argument("--model", default="small", help="preset (both processes build it with the same seed)")
    bd.add_argument("--dtype", default="float32", help="float32 / bfloat16 / float16")
    bd.add_argument("--doc-tokens", type=positive_int, default=2048, help="the document's prompt length")
    bd.add_argument("--chat-context", type=positive_int, default=256, help="the chat's prompt length")
    bd.add_argument("--doc-max-tokens", type=positive_int, default=8,
                    help="the document's output tokens (above 1, so its KV has a reader and travels)")
    bd.add_argument("--chunk-size", type=positive_int, default=512, help="prefill chunk (one engine and the prefill worker)")
    bd.add_argument("--policy", default="interleave", help="the single engine's and the prefill worker's policy")
    bd.add_argument("--repeats", type=positive_int, default=3, help="fresh-process runs of each setting, alternating")
    bd.add_argument("--rounds", type=positive_int, default=2,
                    help="workload rounds per process on fresh engines; the last (warm) is measured")
    bd.add_argument("--threads", type=positive_int, default=1,
                    help="OPENBLAS_NUM_THREADS of each worker process; the one engine gets the two workers' sum, "
                         "so both sides hold the same threads")
    bd.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    bd.add_argument("--settings", nargs="+", default=["single", "disagg"],
                    choices=["single", "disagg", "disagg-busywait", "split"],
                    help="what runs, in this order within each repeat (disagg-busywait: mlx's ring threads left "
                         "busy-polling while they wait; split: two independent engines, the chat on one and the "
                         "document on the other, no KV moved)")
    bd.add_argument("--name", default="disagg", help="results file name (disagg or disagg_SOMETHING)")
    bd.add_argument("--bits", type=positive_int, default=None, help="quantize the preset's weights to this many bits")
    bd.add_argument("--gpus", action="store_true",
                    help="each process on a GPU of its own (CUDA_VISIBLE_DEVICES: the one engine on 0, prefill rank "
                         "and split chat side on 0, decode rank and document side on 1): two GPUs of one host")
    bd.add_argument("--platform", default=None, help="results folder name (None: detected)")
    bd.add_argument("--simulate", nargs="?", const="", default=None, metavar="JSON",
                    help="run nothing: simulate the measured disagg.json (default: the committed one) on --profile, "
                         "one engine and the two workers with its fitted KV transfer, and write disagg_sim.json")
    bd.add_argument("--profile", default="cpu-small", help="the simulator's cost profile (with --simulate)")
    bd.add_argument("--rescore", default=None, metavar="JSON",
                    help="run nothing: decide the verdicts of a saved disagg.json again with this version's rules, in "
                         "place (the simulations run again on its stored runs; marked rescored_by this commit), "
                         "redraw its figure and stop")
    add_save_argument(bd, "data/results/PLATFORM/ and paper/figures/")
    bd.set_defaults(func=cli_bench_disagg)


def cli_bench_disagg(args: argparse.Namespace) -> int:
    import os

    from mlxlab.core.environment import platform_name
    from mlxlab.core.results import run_folder, save_results
    from mlxlab.studies.disagg.run import format_table, run_study
    from mlxlab.studies.disagg.verdict import verdicts

    plat = args.platform or platform_name()
    if args.rescore:
        return _rescore(Path(args.rescore), args)
    if args.simulate is not None:
        return _simulate(args, plat)
    params = {k: getattr(args, k) for k in ("model", "dtype", "doc_tokens", "chat_context", "doc_max_tokens",
                                            "chunk_size", "policy", "repeats", "rounds", "threads", "seed", "settings", "bits", "gpus")}
    print(f"[bench disagg] {args.model}: document {args.doc_tokens} tokens, chat context {args.chat_context}, "
          f"{args.repeats} repeats x {args.settings}, {args.threads} OpenBLAS thread(s) per worker, "
          f"{2 * args.threads} for the one engine; "
          f"load {os.getloadavg()}", flush=True)
    res = run_study(model=args.model, dtype=args.dtype, doc_tokens=args.doc_tokens, chat_context=args.chat_context,
                    doc_max_tokens=args.doc_max_tokens, chunk_size=args.chunk_size, policy=args.policy,
                    repeats=args.repeats, rounds=args.rounds, threads=args.threads, seed=args.seed,
                    settings=args.settings, bits=args.bits, gpus=args.gpus)
    print(format_table(res), flush=True)
    vs = verdicts(res, platform=plat)
    folder = run_folder(plat, args.save)
    if args.name != "disagg" and not args.name.startswith("disagg_"):
        raise ValueError(f"--name {args.name}: a disaggregation results file is disagg or disagg_SOMETHING")
    path = save_results(args.name, res, platform=plat, folder=folder, verdicts=vs, parameters=params)
    figures = _figure({**res, "verdicts": vs}, plat, None if args.save else folder, args.name)
    _print_verdicts(vs)
    print(f"wrote {path}" + "".join(f", {p}" for p in figures))
    return 0


def _print_verdicts(vs) -> None:
    from mlxlab.core.claims import measured_text

    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {measured_text(v['measured'])}")


def _figure(doc: dict, plat: str, folder: Optional[Path], name: str = "disagg") -> list:
    """The study's figure as disagg.svg/.png in ``folder`` (default: paper/figures/, or its
    <platform>/ folder off the CPU, where the notebooks' saved runs put theirs); [] (with a line
    saying why) when it cannot be drawn, so a figure never loses the numbers."""
    try:
        from mlxlab.notebook.plots import save_figure  # altair: only for the figure
        from mlxlab.studies.disagg.charts import disagg_chart
        from mlxlab.studies.sim_validation.charts import FIGURES

        return save_figure(disagg_chart(doc, plat), name, folder or (FIGURES if plat == "cpu" else FIGURES / plat))
    except Exception as e:  # noqa: BLE001 - reported, the results are already written
        print(f"[bench disagg] no figure: {e!r}", flush=True)
        return []


def _rescore(path: Path, args: argparse.Namespace) -> int:
    """``--rescore``: the saved file's verdicts decided again from its stored runs, in place."""
    import json

    from mlxlab.core.results import platform_of, run_folder
    from mlxlab.studies.disagg import STUDY

    if not path.is_file():
        raise SystemExit(f"no results file {path}: name a saved disagg.json")
    vs = STUDY.rescore(path)["verdicts"]
    plat = args.platform or platform_of(path)
    figures = _figure(json.loads(path.read_text()), plat, None if args.save else run_folder(plat, False))
    _print_verdicts(vs)
    print(f"rescored {path}" + "".join(f", {p}" for p in figures))
    return 0


def _simulate(args: argparse.Namespace, plat: str) -> int:
    import json

    from mlxlab.core.results import results_dir, run_folder, save_results
    from mlxlab.studies.disagg.sim import validate

    path = Path(args.simulate) if args.simulate else results_dir(plat) / "disagg.json"
    if not path.is_file():
        raise SystemExit(f"no measured results at {path}: run mlxlab bench disagg first (or name the file)")
    res = validate(json.loads(path.read_text()), profile=args.profile)
    res["measured_file"] = path.name
    for name, row in res["settings"].items():
        print(name + ": " + "; ".join(f"{k} sim {v['simulated']:.4g} / measured {v['measured']:.4g}"
                                       for k, v in row.items() if v["measured"] is not None))
    out = save_results("disagg_sim", res, platform=plat, folder=run_folder(plat, args.save),
                       parameters={"measured": path.name, "profile": args.profile})
    print(f"wrote {out}")
    return 0
