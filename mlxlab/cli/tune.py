"""``mlxlab tune``: serving settings for a model and a trace (:mod:`mlxlab.studies.tune`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from mlxlab.cli.cluster import add_cluster_argument, open_sweep
from mlxlab.cli.common import add_model_arguments, add_save_argument, positive_float, positive_int
from mlxlab.studies.tune.grid import GRIDS

TUNE_HELP = """\
Find the serving settings for this model and this traffic: profile the device (cached), simulate a
grid of policies x chunk sizes x token budgets on the trace, keep the Pareto frontier, confirm the
best settings and mlx-lm's BatchGenerator on the real engine, and print the choice with a ready
`mlxlab serve` line. Writes tune.json (grid, frontier, confirmed points simulated and measured,
the choice and why) and its figure.

  mlxlab tune --model small --workload chat+batch --slo 'chat.itl_p99<=2x' --quick
  mlxlab tune --model DIR --trace served.jsonl --slo 'chat.itl_p99<=40ms' --slo 'batch.ttft_p50<=1.5x'
  mlxlab serve --model DIR --config data/results/cpu/runs/TIME/tune.json

SLOs: TENANT.METRIC<=VALUE, VALUE in ms, s or x (times the tenant's figure when it runs alone,
measured in the run); METRIC one of ttft_p50/p90/p99, itl_p50/p90/p99, itl_max, e2e_p50/p99.
Traces: `mlxlab serve --record FILE.jsonl`, a Mooncake JSONL or an Azure LLM-inference CSV
(mlxlab.core.traces). --sweep also runs every grid setting on the engine and decides
mlx-tune-regret, mlx-tune-rank and mlx-tune-speed.
"""


def register(sub: argparse._SubParsersAction) -> None:
    tp = sub.add_parser("tune", help="serving settings for your model and traffic: simulated, confirmed, served",
                        description=TUNE_HELP)
    add_model_arguments(tp, default="small")
    src = tp.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", default=None, metavar="FILE",
                     help="a recorded, Mooncake or Azure trace (a path, or the name of a committed sample in data/traces/samples)")
    src.add_argument("--workload", default=None, metavar="PRESET",
                     help="a workload preset instead (chat-solo, chat+batch, seed-001), at --scale")
    tp.add_argument("--trace-format", default="auto", help="auto, mlxlab, mooncake or azure")
    tp.add_argument("--split-tokens", type=positive_int, default=None,
                    help="an imported trace's requests with at least this many prompt tokens are tenant batch, the "
                         "rest chat (the public formats name no tenant)")
    tp.add_argument("--time-scale", type=positive_float, default=1.0,
                    help="arrival times x this (a trace's or a preset's: below 1 replays it faster)")
    tp.add_argument("--length-scale", type=positive_float, default=1.0,
                    help="an imported trace's token lengths x this (a datacenter trace on a laptop)")
    tp.add_argument("--max-requests", type=positive_int, default=None, help="replay only the first N requests")
    tp.add_argument("--output-scale", type=tenant_factor, action="append", default=None, metavar="TENANT=F",
                    help="that tenant's requests ask for F times their output tokens (after --length-scale; "
                         "repeatable): more of a chat's gaps, so its ITL p99 rests on more than a handful")
    tp.add_argument("--scale", type=positive_float, default=1 / 32, help="--workload's lengths x this")
    tp.add_argument("--slo", action="append", default=[], metavar="TENANT.METRIC<=VALUE", help="an SLO; repeatable")
    tp.add_argument("--objective", default=None, metavar="TENANT.METRIC",
                    help="what to minimize among the settings meeting the SLOs (default: batch.ttft_p50 where the "
                         "trace has a batch tenant, else all.ttft_p50)")
    tp.add_argument("--top-k", type=positive_int, default=3, help="simulated settings confirmed on the engine")
    tp.add_argument("--repeats", type=positive_int, default=3,
                    help="engine replays per confirmed setting (>= 2): at most, as a setting its repeats put out of the "
                         "choice sits out the next and the confirmation stops once they decide it; the sweep's, all")
    tp.add_argument("--solo-repeats", type=positive_int, default=None,
                    help="runs of each tenant alone whose median sets its relative (x) bounds (default: --repeats, at "
                         "least 5 but with --quick: on the CPU the median of 2 of 20 runs moved over a 17-22%% band between "
                         "random draws, that of 5 over 12-13%%; probes/solo_estimators.py)")
    tp.add_argument("--no-race", action="store_true",
                    help="confirm every setting --repeats times even where fewer already decide the choice")
    tp.add_argument("--warm-up", choices=("auto", "on", "off"), default="auto",
                    help="run each confirmed setting (and the solo runs' setting) once before the confirmation (the "
                         "solo runs), not kept: its first uses of attention shapes then land in no kept run (auto: on "
                         "where attention is prepared per shape, mlx's CUDA backend with cuDNN attention)")
    tp.add_argument("--steady", action="store_true",
                    help="score every setting as a server that has run it a while: simulated on its second run, each "
                         "engine run (confirmation and --sweep) after one of the same setting in that process, not kept "
                         "(where attention is prepared per shape, a first run pays each new shape's graph); --resume sweeps as "
                         "the file was tuned")
    tp.add_argument("--quick", action="store_true", help="a small profile and grid (CI, a first look)")
    tp.add_argument("--grid", choices=GRIDS, default="standard",
                    help="standard: 10-12 settings; wide: each policy's own knob varied too (chunk size, token budget, "
                         "slo's ITL target, the admission gate's threshold), 16-19 settings; full: every policy's knobs "
                         "crossed, the decode-window gate too, 30-33: simulated at almost no cost, confirmed at the same "
                         "top-k")
    tp.add_argument("--reprofile", action="store_true", help="measure the device profile again, not from the cache")
    tp.add_argument("--no-baseline", action="store_true", help="skip mlx-lm's BatchGenerator on the engine")
    tp.add_argument("--no-calibrate", action="store_true",
                    help="simulate on the profile as fitted, not with its decode cost moved to the solo run measured here")
    tp.add_argument("--sweep", action="store_true",
                    help="also run every grid setting on the engine (the exhaustive sweep) and decide the regret, "
                         "rank and speed claims")
    tp.add_argument("--time-budget-s", type=positive_float, default=None, metavar="S",
                    help="--sweep's wall-time budget for the whole command: after its first run the sweep starts "
                         "another only where the slowest run so far still fits (the results say where it stopped; "
                         "--resume runs the rest)")
    tp.add_argument("--resume", default=None, metavar="TUNE_JSON",
                    help="go on with a saved tune file's exhaustive sweep (the same model, trace and SLOs as its run, "
                         "on the same device): its runs are kept, the missing ones up to --repeats repeats run, and "
                         "the file is rewritten in place; tune itself is not run again")
    tp.add_argument("--seed", type=int, default=0, help="the workload's and the replayed prompts' seed")
    add_cluster_argument(tp, "the simulated grid's points (the profile and the engine runs stay here)")
    tp.add_argument("--platform", default=None, help="results folder name (default: detected)")
    tp.add_argument("--name", default="tune", help="results file name")
    add_save_argument(tp)
    tp.set_defaults(func=cli_tune)


def tenant_factor(text: str) -> tuple:
    """An argparse type: ``TENANT=F`` with F a finite number above 0, as ``(tenant, F)``."""
    tenant, eq, f = text.partition("=")
    if not eq or not tenant.strip():
        raise argparse.ArgumentTypeError(f"give TENANT=F (e.g. chat=4), got {text!r}")
    return tenant.strip(), positive_float(f)


class _Millisecond:
    """A cost model charging every step one millisecond (fixes a preset's arrivals)."""

    def predict(self, *args, **kwargs) -> float:
        return 1e-3


def _arrivals(args, model) -> tuple:
    """The trace's arrivals and its summary for the results."""
    from mlxlab.core.presets import model_limits
    from mlxlab.core.traces import prepare_trace, to_arrivals

    vocab, ctx = model_limits(model)
    if args.workload:
        from mlxlab.core.workload import workload_preset

        wl = workload_preset(args.workload, vocab_size=vocab, scale=args.scale, seed=args.seed, max_context=ctx)
        from mlxlab.core.runner import run_workload
        from mlxlab.sim.simulator import Simulator

        # the preset's closed-loop arrivals, fixed once by a run where every step costs a millisecond (a chat's
        # next turn comes its think time after the last): every setting then replays the same open-loop trace
        arrivals = run_workload(Simulator.for_model(model, _Millisecond()), wl).trace
        if args.time_scale != 1.0:
            arrivals = [dataclasses.replace(a, time_s=a.time_s * args.time_scale) for a in arrivals]
        if args.max_requests:
            arrivals = arrivals[:args.max_requests]
        tenants = sorted({a.tenant for a in arrivals})
        return arrivals, {"format": "workload", "name": wl.name, "requests": len(arrivals), "time_scale": args.time_scale,
                          "tenants": {t: sum(a.tenant == t for a in arrivals) for t in tenants}}
    trace = prepare_trace(args.trace, args.trace_format, split_tokens=args.split_tokens, time_scale=args.time_scale,
                          length_scale=args.length_scale, output_scale=args.output_scale, max_requests=args.max_requests)
    for i, r in enumerate(trace.requests):
        if r.prompt_tokens + r.max_tokens > ctx:
            raise ValueError(f"{args.trace}: request {i + 1} needs {r.prompt_tokens + r.max_tokens} tokens of context, "
                             f"past {args.model}'s {ctx}: pass --length-scale below 1 or --max-requests")
    return to_arrivals(trace, vocab, args.seed), trace.summary()


_SAME = ("model", "bits", "dtype", "trace", "workload", "trace_format", "split_tokens", "time_scale", "length_scale",
         "output_scale", "max_requests", "scale", "slo", "objective", "top_k", "quick", "grid", "seed")
_STORED_DEFAULT = {"grid": "standard"}  # a file from before the parameter ran with this


def _parameters(args) -> dict:
    """The run's parameters as stored (the trace by its file name: no machine paths in results)."""
    params = {k: getattr(args, k) for k in _SAME[:-1] + ("repeats", "sweep", "time_budget_s", "seed", "cluster")}
    params["race"] = not getattr(args, "no_race", False)
    params["warm_up"] = getattr(args, "warm_up", "auto")
    params["steady"] = bool(getattr(args, "steady", False))
    params["solo_repeats"] = getattr(args, "solo_repeats", None)
    if params["trace"]:
        params["trace"] = Path(args.trace).name
        sys.argv = [Path(a).name if a == args.trace else a for a in sys.argv]
    return params


def _resume(args, slos, t_start: float) -> int:
    """``--resume FILE``: the stored tune's sweep, on from its stored runs, written back in place."""
    import json

    from mlxlab.core.results import environment_block, platform_of, save_results
    from mlxlab.engine.models import load_model
    from mlxlab.studies.tune.run import sweep
    from mlxlab.studies.tune.verdict import tune_verdicts

    path = Path(args.resume)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--resume {path}: not a readable tune results file ({e})") from None
    if not isinstance(doc, dict) or not {"grid", "solo", "choice", "parameters"} <= set(doc):
        raise ValueError(f"--resume {path}: not a tune results file (no grid, solo figures or choice in it)")
    doc.pop("verdicts", None)  # decided again from the sweep below: a stored payload key would win over them
    mine = _parameters(args)
    differ = [k for k in _SAME if doc["parameters"].get(k, _STORED_DEFAULT.get(k)) != mine.get(k)]
    if differ:
        raise ValueError(f"--resume {path}: give the arguments it was run with; these differ: " + ", ".join(
            f"{k} {mine.get(k)!r} (stored {doc['parameters'].get(k)!r})" for k in differ))
    block = environment_block()  # this machine, once: its device name, commit and time
    here, there = block.get("device_name"), (doc.get("environment") or {}).get("device_name")
    if here != there:
        raise ValueError(f"--resume {path}: it was measured on {there!r}, this is {here!r}: a sweep must run on the "
                         f"device tune ran on")
    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    arrivals, _ = _arrivals(args, model)
    # each call's commit: a device copy's git says little (MLXLAB_SOURCE_COMMIT, the declared one, goes with it)
    def call_entry(env: dict) -> dict:
        return {k: env.get(k) for k in ("git_commit", "git_dirty", "source_commit", "written_at")
                if k != "source_commit" or env.get(k)}

    # the call that made the file: the sweep runs it made, if any (a later call's go with its own entry)
    first = {**call_entry(doc.get("environment") or {}),
             **{k: doc["sweep"][k] for k in ("ran", "warm_each") if k in (doc.get("sweep") or {})}}
    calls = list((doc.get("sweep") or {}).get("calls") or [first])  # the run that made the file, then each resume
    plat = args.platform or platform_of(path)
    params = {**doc["parameters"], "repeats": args.repeats, "sweep": True}
    write = lambda: save_results(path.stem, doc, platform=plat, folder=path.parent, parameters=params,  # noqa: E731
                                 verdicts=tune_verdicts(doc))
    env = call_entry(block)
    say = lambda s: print(s, flush=True)  # noqa: E731
    deadline = t_start + args.time_budget_s if args.time_budget_s else None

    def keep(block):  # this call's warm-up runs and the runs it made go with this call's entry
        mine = {k: block.pop(k) for k in ("warm_up", "warm_each", "ran") if k in block}
        doc["sweep"] = {**block, "calls": calls + [{**env, **mine}]}
        write()

    # a fresh process: its first run would pay the process's first uses (sweep's warm_up)
    keep(sweep(model, arrivals, doc, repeats=args.repeats, say=say, deadline=deadline, on_progress=keep,
               warm_up=True, warm_each=set() if doc.get("steady") else None))  # a steady tune's sweep stays so
    _figure(doc, path.stem, plat, None if args.save else path.parent)
    _say_verdicts(tune_verdicts(doc))
    print(f"wrote {path}")
    return 0


def _say_verdicts(verdicts: list) -> None:
    """Each claim's verdict; under the rank claim how well the sweep's own repeats order the grid
    against each other, beside the simulation against each one (its tau rests on that spread)."""
    for v in verdicts:
        print(f"[{v['verdict']}] {v['claim']}")
        agree = (v.get("measured") or {}).get("agreement") if v["claim"] == "mlx-tune-rank" else None
        for k, a in (agree or {}).items():
            if a.get("repeats") is not None and a.get("simulated") is not None:
                print(f"  {k}: the sweep's repeats order the grid against each other at tau {a['repeats']:.2f}, "
                      f"the simulation each repeat at {a['simulated']:.2f}")


def _figure(doc: dict, name: str, plat: str, folder) -> None:
    """tune.json's figure: into ``folder``, or with ``folder`` None the paper's figures as NAME_PLATFORM."""
    try:
        from mlxlab.notebook.plots import save_figure  # altair: only for the figure
        from mlxlab.studies.sim_validation.charts import FIGURES
        from mlxlab.studies.tune.charts import tune_chart

        where, fig = (FIGURES, f"{name}_{plat}") if folder is None else (folder, name)
        for p in save_figure(tune_chart(doc), fig, where):
            print(f"figure {p}")
    except Exception as e:  # noqa: BLE001 - reported; the results are written
        print(f"[tune] no figure: {e!r}", file=sys.stderr)


def cli_tune(args: argparse.Namespace) -> int:
    from mlxlab.core.environment import platform_name
    from mlxlab.core.results import run_folder, save_results
    from mlxlab.engine.models import load_model
    from mlxlab.studies.tune.confirm import race_text
    from mlxlab.studies.tune.run import serve_command, sweep, tune
    from mlxlab.studies.tune.slo import parse_slo
    from mlxlab.studies.tune.verdict import tune_verdicts

    t_start = time.perf_counter()
    if not args.slo:
        raise ValueError("give at least one --slo, e.g. --slo 'chat.itl_p99<=2x'")
    slos = [parse_slo(s) for s in args.slo]
    if args.repeats < 2:
        raise ValueError("--repeats must be at least 2: the choice needs the engine's run-to-run spread")
    if args.output_scale and args.workload:
        raise ValueError("--output-scale scales a trace's tenants: a --workload preset sets its own lengths")
    args.output_scale = dict(args.output_scale) if args.output_scale else None  # stored and compared as a dict
    if args.resume:
        return _resume(args, slos, t_start)
    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    arrivals, trace = _arrivals(args, model)
    print(f"[tune] {args.model}: {len(arrivals)} requests ({trace.get('tenants')}), SLOs {', '.join(s.text for s in slos)}",
          flush=True)
    say = lambda s: print(s, flush=True)  # noqa: E731
    common = dict(objective=args.objective, top_k=args.top_k, repeats=args.repeats, quick=args.quick,
                  reprofile=args.reprofile, baseline=not args.no_baseline, say=say, calibrate=not args.no_calibrate,
                  scaled=args.output_scale, grid_name=args.grid, race=not args.no_race,
                  warm_up={"auto": None, "on": True, "off": False}[args.warm_up], steady=args.steady,
                  solo_repeats=args.solo_repeats)
    if args.cluster:
        with open_sweep(args.cluster) as cluster:
            doc = tune(model, arrivals, slos, mapper=cluster.mapper(timed=False, desc="tune: simulating"), **common)
            doc["cluster"] = cluster.provenance()
    else:
        doc = tune(model, arrivals, slos, **common)
    doc["trace"] = trace
    plat = args.platform or platform_name()
    folder = run_folder(plat, args.save)
    params = _parameters(args)
    doc["parameters"] = params  # what save_results stores as the run's parameters (the model among them)
    write = lambda: save_results(args.name, doc, platform=plat, folder=folder, parameters=params,  # noqa: E731
                                 verdicts=tune_verdicts(doc) if args.sweep else None)
    if args.sweep:
        write()  # tune's own results first: a sweep cut by a time limit keeps them and its finished runs
        deadline = t_start + args.time_budget_s if args.time_budget_s else None
        doc["sweep"] = sweep(model, arrivals, doc, repeats=args.repeats, say=say, deadline=deadline,
                             on_progress=lambda block: (doc.__setitem__("sweep", block), write()),
                             warm_each={r["label"] for r in doc["confirmed"]} if args.steady else None)
    path = write()
    ch = doc["choice"]
    print(f"[tune] choice: {ch['label']} ({'meets every SLO' if ch['meets'] else 'meets no SLO set: ' + str(ch['binding'])})"
          f": {ch['why']}")
    for r in doc["confirmed"]:
        print(f"  {r['label']:24s} objective {r['objective_s'] * 1e3:9.1f} ms  worst SLO ratio {r['slo_ratio']:.2f}"
              f"  {r.get('repeats', '?')} repeats"
              + (f"  (simulated {r['sim_objective_s'] * 1e3:.1f} ms)" if "sim_objective_s" in r else ""))
    if race_text(doc.get("race")):
        print(f"[tune] {race_text(doc.get('race'))}")
    cmd = serve_command(doc, args.model, args.bits, args.dtype, config=str(path))
    if cmd:
        print(f"serve it:\n  {cmd}")
    _figure(doc, args.name, plat, folder if not args.save else None)
    _say_verdicts(tune_verdicts(doc) if args.sweep else [])
    print(f"wrote {path}")
    return 0
