"""``mlxlab profile``, ``mlxlab validate-sim`` and ``mlxlab seed-scale``: cost-model profiles, the
simulator against the engine, and the case study at its own scale on the simulator.

Building the parser and importing this module load no MLX: the measuring code is imported when a
command that needs a device runs (after :func:`mlxlab.cli.main` has re-executed with the fast BLAS).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlxlab.cli.common import add_model_arguments
from mlxlab.core.results import jsonable
from mlxlab.sim.profiles import (
    PROFILE_DEFAULTS,
    QUICK_DEFAULTS,
    load_profile,
    save_profile,
)
from mlxlab.sim.published import seed001_profile, write_seed001_profile
from mlxlab.studies.seed_scale import format_claims, seed_scale_study
from mlxlab.studies.sim_scoring import format_validation, rescore_validation

GRID_KEYS = ("prefill_tokens", "contexts", "decode_batches", "decode_contexts", "repeats")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``profile``, ``validate-sim`` and ``seed-scale`` to the ``mlxlab`` command's subcommands."""
    _add_profile(sub.add_parser("profile", help="measure a step-time grid and fit the cost model"))
    _add_validate(sub.add_parser("validate-sim", help="simulator against engine on the same workloads"))
    ss = sub.add_parser("seed-scale", help="the seed-001 study at its own scale on the simulator")
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
    parser.add_argument("--repeats", type=int, default=None, help=f"default {PROFILE_DEFAULTS['repeats']}")
    parser.add_argument("--quick", action="store_true", help=f"a small grid: {QUICK_DEFAULTS}")
    parser.add_argument("--seed001", action="store_true",
                        help="write the seed-001 published profile (data/profiles/seed001-m4max-35b.json) and stop")
    parser.add_argument("--platform", default=None, help="profile file prefix (default: detected)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(func=cli_profile)


def cli_profile(args: argparse.Namespace) -> int:
    """Measure a grid on this device and save ``data/profiles/<platform>-<model>.json`` (or, with
    ``--seed001``, write the published seed-001 profile)."""
    if args.seed001:
        path = write_seed001_profile()
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
    print(f"wrote {save_profile(prof, platform=args.platform, model_name=args.model)}")
    return 0


# ----------------------------------------------------------------------------- validate-sim
def _add_validate(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--policies", nargs="+", default=["interleave", "admission_gate", "stall_free"])
    parser.add_argument("--repeats", type=int, default=3, help="engine runs per configuration (>= 2)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="workload prompt lengths x this (1: 1-2k-token batch prompts; ~8 on a GPU)")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--profile", default=None, help="a saved profile (path or name) instead of measuring one")
    parser.add_argument("--platform", default=None, help="results folder name (default: detected)")
    parser.add_argument("--name", default="sim_validation", help="results file name")
    parser.add_argument("--rescore", default=None, metavar="JSON",
                        help="score a saved validation file again under this version's cost model and "
                             "simulator (no model, no device) and write <its name>_rescored.json beside it")
    parser.add_argument("--sentinel-tokens", type=int, default=24,
                        help="output tokens of the lone chat run before each profile share and engine run "
                             "(its ITL tracks the machine's speed); 0 for none")
    parser.add_argument("--no-figure", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(func=cli_validate)


def cli_validate(args: argparse.Namespace) -> int:
    """Run the validation and print its table; exit status 1 if a row fails. With ``--rescore
    FILE``: score that file again instead (no model, no device)."""
    if args.rescore:
        return _rescore(args)
    from mlxlab.engine.models import load_model  # MLX: only once the command runs
    from mlxlab.studies.sim_validation import (  # MLX, as above
        validate_simulator,
        validation_workloads,
    )

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    profile = load_profile(args.profile) if args.profile else None
    res = validate_simulator(model, validation_workloads(model, scale=args.scale), policies=args.policies,
                             repeats=args.repeats, profile=profile, chunk_size=args.chunk_size, scale=args.scale,
                             platform=args.platform, name=args.name, figure=not args.no_figure,
                             sentinel_tokens=args.sentinel_tokens, log=_say(args))
    print(format_validation(res))
    print(f"wrote {res.get('paths')}")
    return 0 if res["passed"] else 1


def _rescore(args: argparse.Namespace) -> int:
    res = rescore_validation(args.rescore, log=_say(args))
    print(format_validation(res))
    src = Path(args.rescore)
    out = src.with_name(src.stem + "_rescored.json")
    out.write_text(json.dumps(jsonable(res), indent=1))
    print(f"wrote {out}")
    return 0 if all(r["passed"] for r in res["table"]) else 1


# ----------------------------------------------------------------------------- seed-scale
def cli_seed_scale(args: argparse.Namespace) -> int:
    """The seed-001 study with the published profile: saved, its claims printed; exit status 1
    if a claim is not reproduced."""
    res = seed_scale_study(save=True, figure=True, log=print)
    print(format_claims(res))
    print(f"wrote {res.get('paths')}")
    return 0 if all(c["verdict"] == "reproduced" for c in res["claims"]) else 1
