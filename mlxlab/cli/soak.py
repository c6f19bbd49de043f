"""``mlxlab bench soak``: ``mlxlab serve`` under the seed-001 scene and a seeded fault mix for a
while (:mod:`mlxlab.studies.serving.soak`), decided as ``mlx-serve-soak``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlxlab.cli.common import add_save_argument, positive_float, positive_int

SOAK_HELP = """\
Run one mlxlab serve process on loopback for --minutes (or --max-requests, whichever comes first)
under the seed-001 scene (one streaming chat after another beside --workers document clients) and
a fault about every --fault-gap-s seconds from a seeded generator: clients that disconnect
mid-prefill and mid-decode, malformed JSON, wrong types, prompts over the context, max_tokens 0 and
huge, bursts past --max-in-flight, a kv_bits no backend runs, unknown models, slow readers. It
samples the server's /metrics and /proc every few seconds; afterwards the load must drain (0 in
flight, 0 KV bytes) and memory come back; then SIGTERM at a random moment among a few open streams
must end each with its finish and exit 0; and a sample of the greedy outputs must equal a fresh
in-process engine's. Writes serve_soak.json (per-minute table, end checks, verdict mlx-serve-soak)
and its figure. Example:
  mlxlab bench soak --model small --minutes 20 --save
"""


def register_bench_soak(bsub: argparse._SubParsersAction) -> None:
    """Add ``bench soak`` to ``mlxlab bench``."""
    bs = bsub.add_parser("soak", help="mlxlab serve for a while under the scene and a seeded fault mix",
                         description=SOAK_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    bs.add_argument("--model", default="small", help="a preset or a model directory (mlxlab export-model)")
    bs.add_argument("--minutes", type=positive_float, default=None, help="how long the load runs (required to run one)")
    bs.add_argument("--max-requests", type=positive_int, default=100000, help="stop the load after this many requests")
    bs.add_argument("--seed", type=int, default=0, help="seed of the prompts, the faults and the samples")
    bs.add_argument("--max-in-flight", type=positive_int, default=8, help="the server's --max-in-flight")
    bs.add_argument("--workers", type=positive_int, default=2, help="document clients posting back to back")
    bs.add_argument("--chat-chars", type=positive_int, default=256, help="each chat's prompt (characters)")
    bs.add_argument("--chat-tokens", type=positive_int, default=64, help="tokens each chat streams")
    bs.add_argument("--doc-chars", type=positive_int, default=1024, help="each document's prompt (characters)")
    bs.add_argument("--doc-tokens", type=positive_int, default=8, help="tokens each document asks for")
    bs.add_argument("--policy", default="slo", help="the server's scheduling policy")
    bs.add_argument("--chunk-size", type=positive_int, default=512, help="the server's prefill chunk size")
    bs.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: by device)")
    bs.add_argument("--fault-gap-s", type=positive_float, default=2.0, help="mean seconds between faults")
    bs.add_argument("--sample-s", type=positive_float, default=5.0, help="seconds between samples of the server")
    bs.add_argument("--interval-s", type=positive_float, default=60.0, help="rows of the table (seconds)")
    bs.add_argument("--sample-outputs", type=int, default=12, help="finished requests compared with a fresh engine")
    bs.add_argument("--platform", default=None, help="results folder name (default: detected)")
    bs.add_argument("--name", default="serve_soak", help="results file name")
    bs.add_argument("--rescore", default=None, metavar="JSON",
                    help="decide a saved serve_soak file's verdict again with this version's rules, in place (nothing "
                         "is run; marked rescored_by this commit), redraw its figure (with --save into paper/figures/) "
                         "and stop")
    add_save_argument(bs)
    bs.set_defaults(func=cli_bench_soak)


def cli_bench_soak(args: argparse.Namespace) -> int:
    import signal

    from mlxlab.core.environment import platform_name
    from mlxlab.core.results import run_folder, save_results
    from mlxlab.studies.serving.soak import soak
    from mlxlab.studies.serving.soak_verdict import soak_verdicts

    if args.rescore:
        return _rescore_soak(Path(args.rescore), args)
    if args.minutes is None:
        raise ValueError("give --minutes (how long the load runs), or --rescore FILE to decide a saved run again")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped from outside: still stop the server it started
    plat = args.platform or platform_name()
    logs = run_folder(plat, False)  # the server's log: an ignored run folder, never the committed results
    res = soak(args.model, minutes=args.minutes, max_requests=args.max_requests, seed=args.seed,
               max_in_flight=args.max_in_flight, workers=args.workers, chat_chars=args.chat_chars,
               chat_tokens=args.chat_tokens, doc_chars=args.doc_chars, doc_tokens=args.doc_tokens, policy=args.policy,
               chunk_size=args.chunk_size, dtype=args.dtype, fault_gap_s=args.fault_gap_s, sample_s=args.sample_s,
               interval_s=args.interval_s, sample_outputs=args.sample_outputs, log_dir=str(logs))
    folder = logs if not args.save else run_folder(plat, True)
    vs = soak_verdicts(res)
    name = Path(args.model).name
    sys.argv = [name if a == str(args.model) else a for a in sys.argv]  # stored argv: no machine path
    params = {k: getattr(args, k) for k in ("minutes", "max_requests", "seed", "max_in_flight", "workers", "chat_chars",
                                            "chat_tokens", "doc_chars", "doc_tokens", "policy", "chunk_size", "dtype",
                                            "fault_gap_s", "sample_s", "interval_s", "sample_outputs")}
    path = save_results(args.name, res, platform=plat, folder=folder, verdicts=vs, parameters={**params, "model": name})
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    _soak_figure(res, plat, args.name, None if args.save else folder)
    print(f"server log in {logs}")
    print(f"wrote {path}")
    return 0


def _soak_figure(res: dict, plat: str, name: str, folder) -> None:
    """The figure (memory and latency over the run): into ``folder``, or with ``folder`` None the
    paper's figures of ``plat``."""
    try:
        from mlxlab.notebook.plots import save_figure  # altair: only for the figure
        from mlxlab.studies.serving.soak_charts import soak_chart
        from mlxlab.studies.sim_validation.charts import FIGURES

        where = folder if folder is not None else (FIGURES if plat == "cpu" else FIGURES / plat)
        for p in save_figure(soak_chart(res, plat), name, where):
            print(f"figure {p}")
    except Exception as e:  # noqa: BLE001 - reported; the results are already written
        print(f"[bench soak] no figure: {e!r}", flush=True)


def _rescore_soak(path: Path, args: argparse.Namespace) -> int:
    """``bench soak --rescore``: a saved file's verdict decided again from its records, in place."""
    import json

    from mlxlab.core.results import platform_of, run_folder
    from mlxlab.studies import study_for

    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict) or "end" not in saved or "totals" not in saved:
        print(f"mlxlab bench soak: {path} is not a saved bench soak results file (serve_soak*.json)", file=sys.stderr)
        return 2
    doc = study_for(path).rescore(path)
    plat = args.platform or platform_of(path)
    _soak_figure(doc, plat, path.stem, None if args.save else run_folder(plat, False))
    for v in doc["verdicts"]:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"rescored {path}")
    return 0
