"""``mlxlab reproduce`` and ``mlxlab paper``: the notebooks headless, and the paper's results tables."""

from __future__ import annotations

import argparse
import sys

from mlxlab.notebook.paper import write_results
from mlxlab.notebook.reproduce import ReproduceError, reproduce


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``reproduce`` and ``paper`` to the ``mlxlab`` command's subcommands."""
    rp = sub.add_parser("reproduce", help="run the notebooks headless through papermill")
    rp.add_argument("--quick", action="store_true", help="quick mode: small sizes, a minute or two each")
    rp.add_argument("--only", nargs="+", default=None, help="notebook numbers or name parts, e.g. 5 or admission")
    rp.add_argument("--platform", default=None, help="results folder name (default: detected)")
    rp.set_defaults(func=cli_reproduce)

    pp = sub.add_parser("paper", help="regenerate paper/results.md from data/results")
    pp.set_defaults(func=cli_paper)


def cli_reproduce(args: argparse.Namespace) -> int:
    try:
        done = reproduce(quick=args.quick, only=args.only, platform=args.platform)
    except ReproduceError as exc:
        print(f"mlxlab reproduce: {exc}", file=sys.stderr)
        return 1
    for d in done:
        print(f"{d['notebook']:40s} {d['seconds']:7.1f} s  -> {d['output']}")
    return 0


def cli_paper(args: argparse.Namespace) -> int:
    print(f"wrote {write_results()}")
    return 0
