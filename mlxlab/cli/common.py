"""Arguments every command shares, so each is spelled and documented once."""

from __future__ import annotations

import argparse


def add_model_arguments(parser: argparse.ArgumentParser, default: str = "small") -> argparse.ArgumentParser:
    """``--model``, ``--bits`` and ``--dtype``, as every command and probe script that loads a
    model takes them (:func:`mlxlab.engine.models.load_model`'s arguments)."""
    parser.add_argument("--model", default=default, help="preset or local model directory")
    parser.add_argument("--bits", type=int, default=None, help="quantize weights to this many bits")
    parser.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: by device)")
    return parser
