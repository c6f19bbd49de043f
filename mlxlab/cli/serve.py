"""``mlxlab serve``: the OpenAI-compatible server (:mod:`mlxlab.serve`) on one model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from mlxlab.cli.common import add_model_arguments, add_save_argument, positive_float, positive_int

SERVE_HELP = """\
Serve one model over an OpenAI-compatible HTTP API: /v1/models, /v1/completions,
/v1/chat/completions (streaming and not), /health and /metrics (Prometheus text). The engine
runs on its own thread with the policy and options given here; a client that disconnects
cancels its request. A preset uses a byte-level tokenizer (offline); a model directory its own
tokenizer and chat template. Stop with Ctrl-C (SIGINT) or SIGTERM: in-flight requests are
cancelled and the process exits 0. Example:
  mlxlab serve --model small --policy stall_free --policy-option token_budget=512 --port 8000
  curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
       -d '{"model": "small", "prompt": "hello", "max_tokens": 16}'
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``mlxlab`` command's subcommands."""
    sp = sub.add_parser("serve", help="an OpenAI-compatible server on the engine", description=SERVE_HELP)
    add_model_arguments(sp, default="small")
    sp.add_argument("--policy", default="interleave", help="scheduling policy (mlxlab.policies.POLICIES)")
    sp.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a policy option or an engine option (value read as JSON, else a string), e.g. "
                         "token_budget=512, or decode_apart=4096 (Engine(decode_apart=...): a row that far from the "
                         "decode batch's length decodes in its own forward instead of padding the batch); repeatable")
    sp.add_argument("--chunk-size", type=positive_int, default=2048, help="prefill chunk size (tokens)")
    sp.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                    help="prefill on a second thread and stream (overlap mode), or --no-overlap: serial steps; "
                         "neither: the policy chooses (slo runs overlapped on a GPU: Engine(overlap=None)), or "
                         "serial with --config (what tune ran on the engine)")
    sp.add_argument("--prefix-cache-tokens", type=positive_int, default=None,
                    help="keep a prefix cache of this many tokens (default: none)")
    sp.add_argument("--kv-budget-mb", type=positive_int, default=None,
                    help="admit requests by KV memory: one that fits beside the running ones waits, one that "
                         "could never fit is refused with the reason (default: no budget)")
    sp.add_argument("--max-in-flight", type=positive_int, default=None,
                    help="with this many requests in the engine, another gets 429 and Retry-After (default: no limit)")
    sp.add_argument("--tokenizer-processes", type=int, default=None, metavar="N",
                    help="tokenize prompts of 2,048+ characters in N worker processes: a model directory's tokenizer "
                         "holds the GIL for a whole encode, stalling the engine thread (mlxlab.serve.encode; a preset's "
                         "byte tokenizer never needs one). Default: 1 on a host of 4+ cores, else 0 (measured: it "
                         "shortens the chat's gaps on a 16-core host, not on 2 cores)")
    sp.add_argument("--draft-model", default=None, metavar="PRESET_OR_DIR",
                    help="a draft model sharing the model's vocabulary (loaded with the same --bits and --dtype): "
                         "requests with num_draft_tokens decode speculatively, each in its own lane beside the batch")
    sp.add_argument("--num-draft-tokens", type=positive_int, default=None, metavar="N",
                    help="with --draft-model: drafts per round for requests that name no num_draft_tokens "
                         "(default: those decode in the batch)")
    sp.add_argument("--compile-decode", action="store_true",
                    help="decode a lone stream (or rows of one length) with the compiled step (Engine(compile_decode=True)): "
                         "faster where a step is host-paced on the CPU, slower on the H200 so far (data/results/h200/"
                         "bench_engine_compiled.json)")
    sp.add_argument("--warmup", default="token", help="engine warm-up before serving: off, token, shapes or policy")
    sp.add_argument("--config", default=None, metavar="TUNE.json",
                    help="serve with the setting mlxlab tune chose (its policy, chunk size and policy options, "
                         "in place of --policy, --chunk-size and --policy-option)")
    sp.add_argument("--record", default=None, metavar="FILE.jsonl",
                    help="append one line per finished request to FILE (arrival, tenant, prompt length, hashes of "
                         "its 256-token prompt blocks (not the text), tokens asked and produced, TTFT and ITL as "
                         "served): the trace mlxlab tune --trace reads (mlxlab.core.traces)")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sp.add_argument("--port", type=positive_int, default=8000, help="port to listen on")
    sp.add_argument("--log-level", default="info", help="uvicorn's log level")
    sp.set_defaults(func=cli_serve)
    register_export(sub)


def register_export(sub: argparse._SubParsersAction) -> None:
    """Add ``export-model`` (a preset as an mlx-lm model directory both servers load) to ``mlxlab``."""
    ep = sub.add_parser("export-model", help="a preset as an mlx-lm model directory with an offline character tokenizer",
                        description="Save a preset's seeded random weights (quantized with --bits) as an mlx-lm model "
                                    "directory (config.json, model.safetensors) with a tokenizer in which every ASCII "
                                    "character is one token, so mlx_lm.server, mlx_lm.generate and mlxlab serve load "
                                    "the same model offline and a document of N characters is N tokens on each.")
    ep.add_argument("preset", help="a preset name (mlxlab.core.presets.available_presets())")
    ep.add_argument("--out", type=Path, required=True, help="the new model directory (must not hold files)")
    ep.add_argument("--bits", type=int, default=None, help="quantize weights to this many bits (e.g. 4)")
    ep.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: by device)")
    ep.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ep.add_argument("--overwrite", action="store_true", help="write into a folder that already holds files")
    ep.set_defaults(func=cli_export_model)


def cli_export_model(args: argparse.Namespace) -> int:
    from mlxlab.engine.export import export_model

    try:
        out = export_model(args.preset, args.out, bits=args.bits, dtype=args.dtype, seed=args.seed,
                           overwrite=args.overwrite)
    except (ValueError, FileExistsError) as e:
        print(f"mlxlab export-model: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}: load it with mlx_lm.server --model {out}, or mlxlab serve --model {out}")
    return 0


def register_bench(bsub: argparse._SubParsersAction) -> None:
    """Add ``bench serve`` (the HTTP path's overhead) to ``mlxlab bench``."""
    from mlxlab.cli.common import add_save_argument

    bs = bsub.add_parser("serve", help="the HTTP path's TTFT and ITL against the in-process engine")
    bs.add_argument("--models", nargs="+", default=["small"], help="presets or local model directories")
    bs.add_argument("--bits", type=int, default=None, help="quantize weights to this many bits")
    bs.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: by device)")
    bs.add_argument("--streams", nargs="+", type=positive_int, default=[1, 16], help="concurrent streams")
    bs.add_argument("--prompt-tokens", type=positive_int, default=256, help="each stream's prompt length")
    bs.add_argument("--max-tokens", type=positive_int, default=64, help="each stream's output tokens")
    bs.add_argument("--repeats", type=positive_int, default=3, help="rounds, the two paths alternating")
    bs.add_argument("--chunk-size", type=positive_int, default=2048, help="prefill chunk size")
    bs.add_argument("--platform", default=None, help="results folder name (default: detected)")
    bs.add_argument("--rescore", default=None, metavar="JSON",
                    help="decide the verdicts of a saved serve_overhead.json again, in place (nothing is run), and stop")
    add_save_argument(bs)
    bs.set_defaults(func=cli_bench_serve)
    register_bench_http(bsub)
    from mlxlab.cli.soak import register_bench_soak

    register_bench_soak(bsub)


def register_bench_http(bsub: argparse._SubParsersAction) -> None:
    """Add ``bench http`` (mlxlab serve against mlx_lm.server over HTTP) to ``mlxlab bench``."""
    bh = bsub.add_parser("http", help="mlxlab serve against mlx_lm.server over HTTP: a chat beside document clients",
                         description="Serve one model directory (mlxlab export-model) with mlx_lm.server and with "
                                     "mlxlab serve under each --policies, one server at a time on loopback, and run "
                                     "the seed-001 scene with real HTTP clients: a streaming chat alone, then beside "
                                     "--workers clients posting documents back to back (mlxlab.studies.serving.against).")
    bh.add_argument("--model-dir", default=None, help="a model directory both servers load (mlxlab export-model)")
    bh.add_argument("--rescore", default=None, metavar="JSON",
                    help="decide the verdicts of a saved bench http file again with this version's rules, in place "
                         "(nothing is run; marked rescored_by this commit), redraw its figure (with --save into "
                         "paper/figures/) and stop")
    bh.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="pool saved runs of one scene made in separate calls (each a serve_http*.json) into --name: "
                         "their repeats added up, summaries and verdicts decided again; nothing is run")
    bh.add_argument("--policies", nargs="+", default=["slo", "interleave"],
                    help="mlxlab serve's policies to run, each alone (slo) or with settings (slo:chunk_size=1024, "
                         "slo:itl_target_x=1.5: chunk_size is its --chunk-size, other keys --policy-option, also the "
                         "engine's, e.g. slo:decode_apart=4096)")
    bh.add_argument("--workers", type=positive_int, default=4, help="document clients posting back to back")
    bh.add_argument("--chat-chars", type=positive_int, default=1500, help="the chat's prompt (characters = tokens)")
    bh.add_argument("--chat-tokens", type=positive_int, default=300, help="tokens the chat streams")
    bh.add_argument("--doc-chars", type=positive_int, default=16000, help="each document's prompt (characters = tokens)")
    bh.add_argument("--doc-tokens", type=positive_int, default=8, help="tokens each document asks for")
    bh.add_argument("--repeats", type=positive_int, default=2, help="scenes per server after its warm-up round")
    bh.add_argument("--prefill-step", type=positive_int, default=2048,
                    help="mlx_lm.server's --prefill-step-size and mlxlab serve's --chunk-size")
    bh.add_argument("--window-s", type=positive_float, default=60.0,
                    help="seconds the chat runs beside the documents (chats one after another; the last one ends "
                         "it): the same window on every server, documents/min counted over it")
    bh.add_argument("--record", action="store_true",
                    help="each mlxlab server records its trace (mlxlab serve --record; the chat as tenant chat, the "
                         "documents as batch): into the run folder, or data/traces/ with --save (what mlxlab tune "
                         "--trace replays)")
    bh.add_argument("--platform", default=None, help="results folder name (default: detected)")
    bh.add_argument("--name", default="serve_http", help="results file name")
    add_save_argument(bh)
    bh.set_defaults(func=cli_bench_http)


def _trace_dir(args: argparse.Namespace, logs: Path) -> str:
    from mlxlab.core.workload import traces_dir

    where = traces_dir() if args.save else logs
    where.mkdir(parents=True, exist_ok=True)
    return str(where)


def _bad_policy_variant(policies, prefill_step: int) -> Optional[str]:
    """What is wrong with the first ``--policies`` entry that ``mlxlab serve`` would refuse (an
    unknown policy, a malformed or unknown setting), or None."""
    import inspect

    from mlxlab.engine.batch import checked_apart
    from mlxlab.engine.loop import Engine
    from mlxlab.policies import POLICIES, make_policy
    from mlxlab.studies.serving.against import policy_variant

    engine_keys = set(inspect.signature(Engine).parameters)  # decode_apart=4096 and the like go to the Engine
    for spec in policies:
        try:
            name, _, opts = policy_variant(spec, prefill_step)
            if name not in POLICIES:
                return f"unknown policy {name!r} in {spec!r}: choose from {', '.join(sorted(POLICIES))}"
            options = policy_options(opts)
            make_policy(name, **{k: v for k, v in options.items() if k not in engine_keys})
            if "decode_apart" in options:
                checked_apart(options["decode_apart"])
        except (ValueError, TypeError) as e:
            return f"{spec!r}: {e}"
    return None


def cli_bench_http(args: argparse.Namespace) -> int:
    from mlxlab.core.environment import platform_name
    from mlxlab.core.results import run_folder, save_results
    from mlxlab.studies.serving.against import against_mlx_lm, against_verdicts

    if args.rescore:
        return _rescore_http(Path(args.rescore), args)
    if args.merge:
        return _merge_http(args)
    if not args.model_dir:
        print("mlxlab bench http: give --model-dir DIR (a model directory: mlxlab export-model PRESET --out DIR) or "
              "--rescore FILE", file=sys.stderr)
        return 2
    if not Path(args.model_dir).is_dir():
        print(f"mlxlab bench http: no model directory {args.model_dir}: make one with mlxlab export-model PRESET "
              f"--out DIR", file=sys.stderr)
        return 2
    bad = _bad_policy_variant(args.policies, args.prefill_step)
    if bad:  # before mlx_lm.server runs for minutes
        print(f"mlxlab bench http: {bad}", file=sys.stderr)
        return 2
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped from outside: still stop the servers it started
    plat = args.platform or platform_name()
    logs = run_folder(plat, False)  # the servers' logs: always in an ignored run folder, never the committed results
    folder = logs if not args.save else run_folder(plat, True)
    model_arg = str(args.model_dir)
    sys.argv = [Path(a).name if a == model_arg else a for a in sys.argv]  # stored argv: no machine path
    params = {k: getattr(args, k) for k in ("policies", "workers", "chat_chars", "chat_tokens", "doc_chars",
                                            "doc_tokens", "repeats", "prefill_step", "window_s", "record")}
    params["model_dir"] = Path(model_arg).name
    partial = folder / f"{args.name}_partial.json"

    def keep_so_far(res_so_far: dict) -> None:  # a run stopped by a time limit keeps the servers that finished
        save_results(partial.stem, {**res_so_far, "partial": "the servers that finished before the run stopped; "
                                                             "no verdicts (mlxlab bench http writes them at its end)"},
                     platform=plat, folder=folder, parameters=params)

    res = against_mlx_lm(model_arg, policies=args.policies, workers=args.workers, chat_chars=args.chat_chars,
                         chat_tokens=args.chat_tokens, doc_chars=args.doc_chars, doc_tokens=args.doc_tokens,
                         repeats=args.repeats, prefill_step=args.prefill_step, window_s=args.window_s,
                         log_dir=str(logs), record_dir=_trace_dir(args, logs) if args.record else None,
                         on_server=keep_so_far)
    vs = against_verdicts(res)
    path = save_results(args.name, res, platform=plat, folder=folder, verdicts=vs, parameters=params)
    partial.unlink(missing_ok=True)  # the whole run is in path now
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    _http_figure(res, plat, args.name, None if args.save else folder)
    print(f"server logs in {logs}")
    print(f"wrote {path}")
    return 0


def _http_figure(res: dict, plat: str, name: str, folder) -> None:
    """Documents/min against the chat's ITL p99, a point per server: into ``folder``, or (None) the
    paper's figures (``paper/figures/``, ``paper/figures/PLATFORM/`` off the CPU)."""
    try:
        from mlxlab.notebook.plots import save_figure  # altair: only for the figure
        from mlxlab.studies.serving.charts import http_chart
        from mlxlab.studies.sim_validation.charts import FIGURES

        where = folder or (FIGURES if plat == "cpu" else FIGURES / plat)
        for p in save_figure(http_chart(res, plat), name, where):
            print(f"figure {p}")
    except Exception as e:  # noqa: BLE001 - reported; the results are already written
        print(f"[bench http] no figure: {e!r}", flush=True)


def _merge_http(args: argparse.Namespace) -> int:
    """``bench http --merge``: saved runs of one scene (separate calls) pooled into one file."""
    from mlxlab.core.results import environment_block, platform_of, run_folder, save_results
    from mlxlab.studies.serving.http_merge import merge_http

    parts = []
    for path in map(Path, args.merge):
        try:
            parts.append({**json.loads(path.read_text()), "source": path.name})
        except (OSError, ValueError) as e:
            print(f"mlxlab bench http: cannot read {path}: {e}", file=sys.stderr)
            return 2
    try:
        doc = merge_http(parts)
    except ValueError as e:
        print(f"mlxlab bench http: {e}", file=sys.stderr)
        return 2
    plat = args.platform or (parts[0].get("environment") or {}).get("platform") or platform_of(Path(args.merge[0]))
    vs = doc.pop("verdicts")
    doc["environment"] = {**parts[0]["environment"], "merged_from": [p["source"] for p in parts],
                          "merged_by": environment_block(plat)}  # the parts' machine: the merge measures nothing
    path = save_results(args.name, doc, platform=plat, folder=run_folder(plat, args.save), verdicts=vs,
                        parameters={**(parts[0].get("parameters") or {}), "repeats": doc["config"]["repeats"]})
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    _http_figure(doc, plat, args.name, None if args.save else path.parent)
    print(f"wrote {path}: {len(parts)} parts, {doc['config']['repeats']} repeats")
    return 0


def _rescore_http(path: Path, args: argparse.Namespace) -> int:
    """``bench http --rescore``: a saved file's verdicts decided again from its runs, in place."""
    from mlxlab.core.results import platform_of, run_folder
    from mlxlab.studies.serving import STUDY

    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict) or "servers" not in saved:
        print(f"mlxlab bench http: {path} is not a saved bench http results file (serve_http*.json)", file=sys.stderr)
        return 2
    doc = STUDY.rescore(path)
    plat = args.platform or platform_of(path)
    _http_figure(doc, plat, path.stem, None if args.save else run_folder(plat, False))
    for v in doc["verdicts"]:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"rescored {path}")
    return 0


def cli_bench_serve(args: argparse.Namespace) -> int:
    from mlxlab.core.environment import platform_name
    from mlxlab.core.results import run_folder, save_results
    from mlxlab.engine.models import load_model
    from mlxlab.studies.serving import STUDY
    from mlxlab.studies.serving.run import format_table, serve_overhead, serve_verdicts

    if args.rescore:
        for v in STUDY.rescore(args.rescore)["verdicts"]:
            print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
        return 0
    plat = args.platform or platform_name()
    params = {k: getattr(args, k) for k in ("models", "bits", "dtype", "streams", "prompt_tokens", "max_tokens",
                                            "repeats", "chunk_size")}
    out = {"presets": {}}
    for preset in args.models:
        model = load_model(preset, bits=args.bits, dtype=args.dtype)
        res = serve_overhead(model, model_name=preset, streams=args.streams, prompt_tokens=args.prompt_tokens,
                             max_tokens=args.max_tokens, repeats=args.repeats, chunk_size=args.chunk_size)
        out["presets"][preset] = res
        print(format_table(preset, res), flush=True)
    vs = serve_verdicts(out["presets"])
    path = save_results("serve_overhead", out, platform=plat, folder=run_folder(plat, args.save), parameters=params,
                        verdicts=vs)
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"wrote {path}")
    return 0


def policy_options(items) -> dict:
    """``["token_budget=512", "itl_target_s=0.05"]`` -> ``{"token_budget": 512, ...}``; a value
    that is not JSON stays a string. Raises ValueError on an item without ``=``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--policy-option takes KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def cli_serve(args: argparse.Namespace) -> int:
    from mlxlab import serve  # starlette, uvicorn, mlx: only when serving
    from mlxlab.engine.models import load_model
    from mlxlab.serve.encode import auto_processes

    options = policy_options(args.policy_option)
    if args.config:
        from mlxlab.studies.tune.run import serve_settings

        tuned = serve_settings(args.config)
        if tuned["model"] and Path(str(tuned["model"])).name != Path(str(args.model)).name:
            print(f"mlxlab serve: warning: {args.config} was tuned for {tuned['model']}, serving {args.model}",
                  file=sys.stderr)
        if not tuned["meets"]:
            print(f"mlxlab serve: warning: the setting in {args.config} met no SLO set on the engine", file=sys.stderr)
        if args.overlap and tuned["overlap"] is False:
            print(f"mlxlab serve: warning: {args.config} measured this setting in serial steps; --overlap serves "
                  f"a mode tune did not run", file=sys.stderr)
        args.policy, args.chunk_size, options = tuned["policy"], tuned["chunk_size"], {**tuned["options"], **options}
        args.overlap = tuned["overlap"] if args.overlap is None else args.overlap
    if args.num_draft_tokens is not None and args.draft_model is None:
        raise ValueError("--num-draft-tokens needs --draft-model")
    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    draft = load_model(args.draft_model, bits=args.bits, dtype=args.dtype) if args.draft_model else None
    prefix = None
    if args.prefix_cache_tokens:
        from mlxlab.engine.prefix_cache import PrefixCache

        prefix = PrefixCache(max_tokens=args.prefix_cache_tokens)
    server = serve.build(model, model_name=args.model, policy=args.policy, chunk_size=args.chunk_size,
                         overlap=args.overlap, prefix_cache=prefix, warmup=args.warmup,
                         kv_budget_bytes=args.kv_budget_mb << 20 if args.kv_budget_mb else None,
                         max_in_flight=args.max_in_flight, draft_model=draft,
                         num_draft_tokens=args.num_draft_tokens, compile_decode=args.compile_decode,
                         record=args.record, tokenizer_processes=auto_processes() if args.tokenizer_processes is None
                         else args.tokenizer_processes, **options)
    from mlxlab.engine.fused import alignment_warning, packing_warning

    for warn in (packing_warning(server.worker.engine.fuse), alignment_warning(args.policy, options)):
        if warn:
            print(f"mlxlab serve: warning: {warn}", file=sys.stderr)
    print(f"mlxlab serve: {args.model} ({model.num_params / 1e6:.1f}M params, {model.dtype}), policy {args.policy} "
          f"{options or ''}, chunk {args.chunk_size}{f', draft {args.draft_model}' if draft else ''}, "
          f"on http://{args.host}:{args.port}" + (f", recording to {args.record}" if args.record else "")
          + (f", {server.encoder.processes} tokenizer process(es)" if server.encoder.processes else ""), flush=True)
    serve.run(server, host=args.host, port=args.port, log_level=args.log_level)
    return 0
