"""The ``mlxlab`` command: benchmarks against mlx-lm, the notebooks, profiles, the simulator, training.

This module only wires the subcommands; each group lives beside the code it runs and adds its
parsers through ``register(subparsers)``: :mod:`mlxlab.cli.studies` (``bench engine`` /
``scheduling`` / ``speculation``, ``train-tiny``), :mod:`mlxlab.cli.sim` (``profile``,
``validate-sim``, ``seed-scale``) and :mod:`mlxlab.cli.tools` (``reproduce``, ``paper``). A handler
takes the parsed ``args`` and returns the exit status.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from mlxlab.cli import sim, studies, tools
from mlxlab.core.environment import mlx_env, reexec_with_fast_blas


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxlab", description="Measure and tune LLM serving on MLX.")
    sub = p.add_subparsers(dest="cmd", required=True)
    for group in (studies, tools, sim):
        group.register(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    reexec_with_fast_blas()  # before anything loads mlx: LD_PRELOAD only acts at process start
    args = build_parser().parse_args(argv)
    for warning in mlx_env()[1]:
        print(f"warning: {warning}", file=sys.stderr)
    return args.func(args)
