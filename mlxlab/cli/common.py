"""Arguments every command shares, so each is spelled and documented once."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (repeats, tokens, sizes), refused with a
    one-line message otherwise."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds, ratios), refused with a one-line message
    otherwise."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return v


def add_model_arguments(parser: argparse.ArgumentParser, default: str = "small") -> argparse.ArgumentParser:
    """``--model``, ``--bits`` and ``--dtype``, as every command and probe script that loads a
    model takes them (:func:`mlxlab.engine.models.load_model`'s arguments)."""
    parser.add_argument("--model", default=default, help="preset or local model directory")
    parser.add_argument("--bits", type=int, default=None, help="quantize weights to this many bits")
    parser.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: by device)")
    return parser


#: where a command writes without --save (its figures too, beside its results)
SAVE_DEFAULT = "default: write a new folder data/results/PLATFORM/runs/TIME/ (ignored by git) and print it"


def add_save_argument(parser: argparse.ArgumentParser, where: str = "data/results/PLATFORM/",
                      default: str = SAVE_DEFAULT, what: str = "results") -> argparse.Action:
    """``--save``: replace the committed ``what`` in ``where``; without it a command writes where
    ``default`` says (a new run folder: :func:`mlxlab.core.results.run_folder`), so trying a
    command never overwrites the results the paper is built from. Returns the action."""
    return parser.add_argument("--save", action="store_true", help=f"replace the committed {what} in {where}; {default}")


def model_record(preset: str, model) -> dict:
    """What a results file records of the model it measured."""
    return {"preset": preset, "dtype": str(model.dtype), "bits": model.bits,
            "num_params": model.num_params, "nbytes": model.nbytes}
