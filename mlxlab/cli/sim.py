"""``mlxlab profile``, ``mlxlab validate-sim`` and ``mlxlab seed-scale``: cost-model profiles, the
simulator against the engine, and the case study at its own scale on the simulator.

Building the parser and importing this module load no MLX: the measuring code is imported when a
command that needs a device runs (after :func:`mlxlab.cli.main` has re-executed with the fast BLAS).
Each command writes a new run folder (:func:`mlxlab.core.results.run_folder`) and replaces the
committed results, profiles and figures only with ``--save``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlxlab.cli.cluster import add_cluster_argument, seed_scale_on_cluster
from mlxlab.cli.common import add_model_arguments, add_save_argument, positive_int
from mlxlab.core.environment import platform_name
from mlxlab.core.results import _git_commit, jsonable, platform_of, run_folder, save_results
from mlxlab.sim.profiles import (
    PROFILE_DEFAULTS,
    QUICK_DEFAULTS,
    load_profile,
    profile_path,
    profiles_dir,
    save_profile,
)
from mlxlab.sim.published import SEED001_NAME, seed001_profile, write_seed001_profile
from mlxlab.studies.seed_scale.run import format_claims, seed_scale_study
from mlxlab.studies.sim_validation.scoring import format_validation, rescore_validation

GRID_KEYS = ("prefill_tokens", "contexts", "decode_batches", "decode_contexts", "repeats")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``profile``, ``validate-sim`` and ``seed-scale`` to the ``mlxlab`` command's subcommands."""
    _add_profile(sub.add_parser("profile", help="measure a step-time grid and fit the cost model"))
    _add_validate(sub.add_parser("validate-sim", help="simulator against engine on the same workloads"))
    ss = sub.add_parser("seed-scale", help="the seed-001 study at its own scale on the simulator",
                        description="Run the second case study's experiments on the simulator with the published "
                                    "35B MoE cost model (data/profiles/seed001-35b-moe.json): the stall, the gate, the "
                                    "chunk-size trade-off and the prefix cache at the case study's own scale, with "
                                    "their verdicts.")
    where = ss.add_mutually_exclusive_group()
    where.add_argument("--out", default=None, metavar="DIR",
                       help="write seed_scale.json and its figure into DIR (default: a new folder "
                            "data/results/sim-seed001/runs/TIME/; with --save: data/results/sim-seed001/ and "
                            "paper/figures/)")
    add_save_argument(where, "data/results/sim-seed001/ and paper/figures/")
    ss.add_argument("--no-figure", action="store_true")
    add_cluster_argument(ss, "the plane's and the crawl's simulator points")
    ss.set_defaults(func=cli_seed_scale)


def _say(args: argparse.Namespace):
    return None if args.quiet else (lambda s: print(s, flush=True))


# ----------------------------------------------------------------------------- profile
def _add_profile(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--prefill-tokens", type=int, nargs="+", default=None,
                        help=f"chunk sizes (default {list(PROFILE_DEFAULTS['prefill_tokens'])})")
    parser.add_argument("--contexts", type=int, nargs="+", default=None,
                        help=f"contexts before a chunk (default {list(PROFILE_DEFAULTS['contexts'])})")
    parser.add_argument("--decode-batches", type=int, nargs="+", default=None,
                        help=f"decode batch sizes (default {list(PROFILE_DEFAULTS['decode_batches'])})")
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=None,
                        help=f"decode contexts (default {list(PROFILE_DEFAULTS['decode_contexts'])})")
    parser.add_argument("--join-contexts", type=int, nargs="+", default=None,
                        help="prompt lengths of the long rows that join a short row's decode "
                             "(default: the longest decode context)")
    parser.add_argument("--repeats", type=positive_int, default=None, help=f"default {PROFILE_DEFAULTS['repeats']}")
    parser.add_argument("--quick", action="store_true", help=f"a small grid: {QUICK_DEFAULTS}")
    parser.add_argument("--seed001", action="store_true",
                        help="write the seed-001 published profile (seed001-m4max-35b.json; data/profiles/ with "
                             "--save, else a new folder data/results/sim-seed001/runs/TIME/) and stop")
    parser.add_argument("--platform", default=None,
                        help="profile file prefix and results folder name (default: detected)")
    add_save_argument(parser, "data/profiles/PLATFORM-MODEL.json (validate-sim --profile finds it by name)",
                      "default: write it into a new folder data/results/PLATFORM/runs/TIME/ (ignored by git) "
                      "and print it", what="profile")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(func=cli_profile)


def cli_profile(args: argparse.Namespace) -> int:
    """Measure a grid on this device and save ``<platform>-<model>.json`` into a new run folder, or
    with ``--save`` into ``data/profiles/`` (or, with ``--seed001``, write the published seed-001
    profile)."""
    if args.seed001:
        path = write_seed001_profile(None if args.save else run_folder("sim-seed001") / f"{SEED001_NAME}.json")
        for k, v in seed001_profile()["derivation"].items():
            print(f"  {k:22s} {v}")
        print(f"wrote {path}")
        return 0
    from mlxlab.engine.models import load_model  # MLX: only once the command runs
    from mlxlab.sim.measure import profile_device  # MLX: only once the command runs

    base = QUICK_DEFAULTS if args.quick else PROFILE_DEFAULTS
    grid = {k: (getattr(args, k) or base[k]) for k in GRID_KEYS}
    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    print(f"[profile] {args.model}: {model.num_params / 1e6:.1f}M params, dtype={model.dtype}, bits={model.bits}; "
          f"grid {grid}", flush=True)
    prof = profile_device(model, **grid, join_contexts=args.join_contexts, log=_say(args))
    for f, c in prof["coefficients"].items():
        print(f"  {f:24s} {c:.4g}" if c is not None else f"  {f:24s} n/a")
    for kind, e in prof["fit"].items():
        print(f"  fit {kind:8s} n={e['n']:4d} median rel err {e['median']:.3f}  p90 {e['p90']:.3f}")
    plat = args.platform or platform_name()
    path = None if args.save else run_folder(plat) / profile_path(plat, args.model).name
    print(f"wrote {save_profile(prof, platform=plat, model_name=args.model, path=path)}")
    return 0


# ----------------------------------------------------------------------------- validate-sim
def _add_validate(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--policies", nargs="+", default=["interleave", "admission_gate", "stall_free"])
    parser.add_argument("--repeats", type=positive_int, default=3, help="engine runs per configuration (>= 2)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="workload prompt lengths x this (1: 1-2k-token batch prompts; ~8 on a GPU)")
    parser.add_argument("--chunk-size", type=positive_int, default=256)
    parser.add_argument("--profile", default=None, help="a saved profile (path or name) instead of measuring one")
    parser.add_argument("--platform", default=None, help="results folder name (default: detected)")
    parser.add_argument("--name", default="sim_validation", help="results file name")
    parser.add_argument("--rescore", "--resimulate", dest="rescore", default=None, metavar="JSON",
                        help="score a saved validation file again under this version's cost model and "
                             "simulator (no model, no device) and write <its name>_rescored.json into a new run "
                             "folder of its platform (with --save: beside it)")
    parser.add_argument("--cold-key", choices=("size", "shape"), default=None,
                        help="with --rescore: count the profile's cold chunks again by token count (size) or by "
                             "attention shape, token count and key length (shape: mlx CUDA with cuDNN attention "
                             "keeps one graph per shape), and simulate by that rule")
    parser.add_argument("--cold-capacity", type=positive_int, default=None, metavar="N",
                        help="with --cold-key shape: shapes kept warm (mlx's MLX_CUDA_SDPA_CACHE_SIZE; default 256)")
    parser.add_argument("--rescore-verdicts", nargs="+", default=None, metavar="JSON",
                        help="add the mlx-sim-accuracy verdict and the cost model's fingerprint and provenance to "
                             "saved validation files, in place, from their tables (nothing re-run or re-simulated; "
                             "marked rescored_by this commit) and stop")
    parser.add_argument("--held-out", type=int, default=0, metavar="N",
                        help="also run and score N held-out cases: seeded random traces, chunk sizes, policy "
                             "options and policies that neither the profile grid nor the standard runs use "
                             "(mlxlab.studies.sim_validation.heldout), reported apart")
    parser.add_argument("--held-out-seed", type=int, default=1, metavar="S", help="seed of the held-out cases")
    parser.add_argument("--held-out-scale", type=float, default=None,
                        help="the held-out cases' lengths x this (default: --scale)")
    parser.add_argument("--profile-spread", nargs="+", default=None, metavar="PROFILE",
                        help="simulate the standard workloads (and --held-out cases) on each of these saved profiles "
                             "of one machine and print how far apart the simulations are (no engine runs; a "
                             "preset --model for its limits); writes profile_spread.json into a new run folder")
    parser.add_argument("--steps", default=None, metavar="JSON",
                        help="print the step-level comparison of a saved validation (each run's median step period "
                             "by kind, engine against simulator) and stop")
    parser.add_argument("--sentinel-tokens", type=int, default=24,
                        help="output tokens of the lone chat run before each profile share and engine run "
                             "(its ITL tracks the machine's speed); 0 for none")
    add_save_argument(parser, "data/results/PLATFORM/ and paper/figures/")
    parser.add_argument("--no-figure", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(func=cli_validate)


def cli_validate(args: argparse.Namespace) -> int:
    """Run the validation and print its table; exit status 1 if a row fails. With ``--rescore
    FILE``: score that file again instead (no model, no device)."""
    if args.rescore_verdicts:
        return _rescore_verdicts(args.rescore_verdicts)
    if args.rescore:
        return _rescore(args)
    if args.profile_spread:
        return _profile_spread(args)
    if args.steps:
        from mlxlab.studies.sim_validation.divergence import format_divergence, plan_divergences
        from mlxlab.studies.sim_validation.scoring import compare_periods

        doc = json.loads(Path(args.steps).read_text())
        for r in compare_periods(doc):
            print(f"{r['run']:28s} {r['kind']:18s} engine {r['engine_s'] * 1e3:8.2f} ms  sim {r['sim_s'] * 1e3:8.2f} ms"
                  f"  sim/engine {r['ratio']:5.2f}  n {r['n']:4d}  {r['share']:4.0%} of the run")
        for d in plan_divergences(doc):
            print(format_divergence(d))
        return 0
    from mlxlab.engine.models import load_model  # MLX: only once the command runs
    from mlxlab.studies.sim_validation.run import (  # MLX, as above
        validate_simulator,
        validation_workloads,
    )

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    profile = _profile_doc(args.profile) if args.profile else None
    res = validate_simulator(model, validation_workloads(model, scale=args.scale), policies=args.policies,
                             repeats=args.repeats, profile=profile, chunk_size=args.chunk_size, scale=args.scale,
                             save=False, platform=args.platform, name=args.name,
                             sentinel_tokens=args.sentinel_tokens, heldout=args.held_out,
                             heldout_seed=args.held_out_seed, heldout_scale=args.held_out_scale, log=_say(args))
    plat = args.platform or platform_name()
    res["paths"] = _save_validation(res, model, args.name, plat, save=args.save, figure=not args.no_figure)
    res = jsonable(res)
    print(format_validation(res))
    print(f"wrote {res['paths']}")
    return 0 if res["passed"] and (res.get("heldout") or {}).get("passed", True) else 1


def _save_validation(out: dict, model, name: str, plat: str, *, save: bool, figure: bool) -> dict:
    """Write a validation as :func:`mlxlab.studies.sim_validation.run.validate_simulator` saves it
    (verdicts and parameters apart), into :func:`~mlxlab.core.results.run_folder`, and its figure
    ``<name>_<platform>.svg/.png`` (and, with held-out cases, ``<name>_heldout_<platform>``:
    :func:`mlxlab.studies.sim_validation.charts.heldout_chart`) beside it, or with ``save`` into
    paper/figures/ (the ones the paper embeds); returns the paths written."""
    folder = run_folder(plat, save)
    payload = {k: v for k, v in out.items() if k not in ("verdicts", "parameters", "paths")}
    paths = {"results": str(save_results(name, payload, platform=plat, folder=folder, verdicts=out["verdicts"],
                                         parameters=out["parameters"]))}
    if figure:
        try:
            from mlxlab.notebook.plots import save_figure  # altair: only for the figure
            from mlxlab.studies.sim_validation.charts import FIGURES, heldout_chart, validation_chart

            where = FIGURES if save else folder
            chart = validation_chart(out["table"], title=f"{name} ({plat}, {getattr(model, 'name', '')})")
            paths["figures"] = [str(p) for p in save_figure(chart, f"{name}_{plat}", where)]
            if (out.get("heldout") or {}).get("table"):
                held = heldout_chart(out["heldout"]["table"], title=f"simulator vs engine on held-out traces "
                                                                    f"({plat}, {getattr(model, 'name', '')})")
                paths["figures"] += [str(p) for p in save_figure(held, f"{name}_heldout_{plat}", where)]
        except Exception as e:  # noqa: BLE001 - a figure must not lose the numbers
            paths["figure_error"] = repr(e)
    return paths


def _profile_doc(path_or_name: str) -> dict:
    """A saved profile's whole document with its ``path``, so the validation keeps where its cost
    model came from (the file's environment: commit, time); resolved as :func:`load_profile` does."""
    p = Path(path_or_name)
    if not p.is_file():
        p = profiles_dir() / (p.name if p.suffix == ".json" else f"{p.name}.json")
    if not p.is_file():
        load_profile(path_or_name)  # raises, naming the saved profiles
    from mlxlab.core.paths import ROOT

    p = p.resolve()
    return {**json.loads(p.read_text()), "path": str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)}


def _profile_spread(args: argparse.Namespace) -> int:
    """``--profile-spread``: the simulations on each given profile, side by side (no device)."""
    from mlxlab.core.presets import model_limits, preset_config
    from mlxlab.studies.sim_validation.heldout import heldout_cases
    from mlxlab.studies.sim_validation.repeat import format_spread, profile_spread
    from mlxlab.studies.sim_validation.run import validation_workloads

    cfg = preset_config(args.model)
    cms = {str(p): load_profile(p) for p in args.profile_spread}
    cases = heldout_cases(args.held_out, args.held_out_seed, max_context=model_limits(cfg)[1],
                          scale=args.scale if args.held_out_scale is None else args.held_out_scale)
    res = profile_spread(cms, cfg, validation_workloads(cfg, scale=args.scale), args.policies, args.chunk_size,
                         heldout=cases)
    print(format_spread(res))
    plat = args.platform or platform_name()
    out = save_results("profile_spread", {**res, "config": {"model": args.model, "scale": args.scale,
                                                             "chunk_size": args.chunk_size, "policies": args.policies,
                                                             "heldout": [c.as_dict() for c in cases]}},
                       platform=plat, folder=run_folder(plat))
    print(f"wrote {out}")
    return 0


def _rescore(args: argparse.Namespace) -> int:
    from mlxlab.studies.sim_validation.verdict import cost_model_record, validation_verdicts

    from mlxlab.engine.fused import SDPA_CACHE_DEFAULT

    capacity = (args.cold_capacity or SDPA_CACHE_DEFAULT) if args.cold_key == "shape" else None
    res = rescore_validation(args.rescore, cold_key=args.cold_key, cold_capacity=capacity, log=_say(args))
    print(format_validation(res))
    src = Path(args.rescore)
    res["cost_model"] = cost_model_record(res["coefficients"], fitted_in_run=False, commit=_git_commit(),
                                          source=f"the profile shares of {src} fitted again by this code")
    vs = validation_verdicts(res, res["cost_model"])
    name = src.stem + "_rescored" + (f"_cold_{args.cold_key}" if args.cold_key else "")
    ok = name.startswith("sim_validation")  # a verdict is stored only under an experiment the claims name
    plat = platform_of(src)
    folder = src.parent if args.save else run_folder(plat)
    out = save_results(name, res, platform=plat, folder=folder, verdicts=vs if ok else None,
                       parameters={"source": str(src), "rescore": "simulator side re-run under this code",
                                   "cold_key": args.cold_key, "cold_capacity": capacity})
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"wrote {out}")
    return 0 if all(r["passed"] for r in res["table"]) else 1


def _rescore_verdicts(paths) -> int:
    from mlxlab.studies.sim_validation import STUDY

    for p in paths:
        doc = STUDY.rescore(p)
        cm = doc["cost_model"]
        print(f"{p}: " + "; ".join(f"{v['claim']} {v['verdict']}" for v in doc["verdicts"])
              + f"; cost model {cm['fingerprint']}" + (f" ({cm['note']})" if cm.get("note") else ""))
    return 0


# ----------------------------------------------------------------------------- seed-scale
def cli_seed_scale(args: argparse.Namespace) -> int:
    """The seed-001 study with the published profile: saved with its verdicts, which are printed
    with the calibration residuals; exit status 1 if a prediction is not reproduced."""
    if args.cluster:
        res = seed_scale_on_cluster(args)
    else:
        folder = args.out or (None if args.save else run_folder("sim-seed001"))  # None: the committed folders
        res = seed_scale_study(save=True, figure=not args.no_figure, folder=folder, log=print)
    print(format_claims(res))
    print(f"wrote {res.get('paths')}")
    return 1 if any(v["verdict"] == "not reproduced" for v in res["verdicts"]) else 0
