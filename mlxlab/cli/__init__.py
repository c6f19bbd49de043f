"""The ``mlxlab`` command: benchmarks against mlx-lm, the notebooks, profiles, the simulator, training.

This module only wires the subcommands; each group lives beside the code it runs and adds its
parsers through ``register(subparsers)``: :mod:`mlxlab.cli.studies` (``bench engine`` /
``scheduling`` / ``speculation``, ``train-tiny``), :mod:`mlxlab.cli.sim` (``profile``,
``validate-sim``, ``seed-scale``) and :mod:`mlxlab.cli.tools` (``reproduce``, ``paper``). A handler
takes the parsed ``args`` and returns the exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from mlxlab.cli import serve, sim, studies, tools, tune
from mlxlab.core.environment import mlx_env, reexec_with_fast_blas


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default (unless its help already says it); descriptions
    keep their line breaks."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or action.nargs == 0:
            return text
        return super()._get_help_string(action)


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxlab", description="Measure and tune LLM serving on MLX.")
    sub = p.add_subparsers(dest="cmd", required=True)
    for group in (studies, tools, sim, serve, tune):
        group.register(sub)
    for parser in _parsers(p):
        parser.formatter_class = _Help
        for action in parser._actions:  # an option with no help text still shows its default
            if action.help is None and action.option_strings and action.nargs != 0:
                action.help = "(default: %(default)s)"
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    reexec_with_fast_blas()  # before anything loads mlx: LD_PRELOAD only acts at process start
    parser = build_parser()
    args = parser.parse_args(argv)
    for warning in mlx_env()[1]:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        # a user's mistake (an unknown preset, a size that does not fit): one line, no traceback;
        # MLXLAB_DEBUG=1 shows the traceback
        if os.environ.get("MLXLAB_DEBUG"):
            raise
        print(f"mlxlab {args.cmd}: error: {e}", file=sys.stderr)
        return 2
