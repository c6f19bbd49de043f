"""What every probe shares: its command line, its model, its log lines and its results file.

A probe is a one-off device measurement behind a comment or a cost term (not library code): run
it from the project root as ``python -m probes.NAME --help``. :func:`parser` gives it the model
arguments every ``mlxlab`` command takes plus ``--name`` and ``--platform``; :func:`parse`
restarts the process with the fast BLAS first (as the CLI does); :func:`save` writes the result
through :func:`mlxlab.core.results.save_results`, with the ``MLX_*`` settings and the wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.cli.common import add_model_arguments
from mlxlab.core.environment import mlx_env, reexec_with_fast_blas
from mlxlab.core.results import save_results
from mlxlab.engine.models import load_model


def parser(doc: str, name: Optional[str], *, model: Optional[str] = "small") -> argparse.ArgumentParser:
    """The probe's parser: its docstring as the help, ``--model/--bits/--dtype`` (left out when
    ``model`` is None), ``--name`` (default ``name``; left out when None, for a probe that names
    its own files) and ``--platform``."""
    prog = f"python -m probes.{Path(sys.argv[0]).stem}"
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if model is not None:
        add_model_arguments(p, default=model)
    if name is not None:
        p.add_argument("--name", default=name, help="results file name (default: %(default)s)")
    p.add_argument("--platform", default=None, help="results folder name (default: detected)")
    return p


def over_tunes(doc: str, name: str, tunes_help: str) -> argparse.ArgumentParser:
    """The parser of a probe that reads stored tune files: its docstring as the help, the files
    (``tunes``, described by ``tunes_help``) and ``--save`` (write ``data/results/sim-tune/NAME.json``,
    committed, instead of a run folder); add the probe's own options, then :func:`parse`."""
    p = argparse.ArgumentParser(prog=f"python -m probes.{name}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tunes", nargs="+", help=tunes_help)
    p.add_argument("--save", action="store_true", help=f"write data/results/sim-tune/{name}.json (committed), not a "
                                                       "run folder")
    return p


def each_tune(paths: Sequence[str], select: Callable[[dict, str], Any], why: str) -> Iterator[Tuple[str, dict, Any]]:
    """The stored tune files of ``paths`` as ``(path, doc, select(doc, path))`` where that is not empty; for the
    others one line, ``PATH: WHY; skipped`` (a probe over stored files says what it left out)."""
    for path in paths:
        doc = json.loads(Path(path).read_text())
        found = select(doc, path)
        if not found:
            print(f"{path}: {why}; skipped")
            continue
        yield path, doc, found


def parse(p: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Restart with the fast BLAS if that changes anything, then parse; ``args.started`` is the
    clock the saved ``wall_s`` counts from."""
    reexec_with_fast_blas()
    args = p.parse_args(argv)
    args.started = time.perf_counter()
    return args


def load(args: argparse.Namespace, name: Optional[str] = None):
    """The model ``--model`` (or ``name``) names, with ``--bits`` and ``--dtype``."""
    return load_model(name or args.model, bits=args.bits, dtype=args.dtype)


def copy_cache(module, cache) -> list:
    """A private copy of a prompt cache of lone ``KVCache`` layers, evaluated (a forward writes
    into the cache it runs on; an empty layer stays empty)."""
    out = make_prompt_cache(module)
    for o, c in zip(out, cache):
        if c.keys is not None:
            o.keys, o.values, o.offset = mx.array(c.keys), mx.array(c.values), c.offset
    mx.eval([o.state for o in out if o.keys is not None])
    return out


def log(kind: str, line: str) -> None:
    print(f"[{kind}] {line}", flush=True)


def save(args: argparse.Namespace, kind: str, payload: dict, *, name: Optional[str] = None) -> Path:
    """Write ``{"kind": kind, **payload}`` with the ``MLX_*`` settings and the wall time since
    :func:`parse` to ``data/results/<platform>/<name>.json`` (``name`` defaults to ``--name``)."""
    doc = {"kind": kind, **payload, "mlx_env": mlx_env()[0], "wall_s": time.perf_counter() - args.started}
    path = save_results(name or args.name, doc, platform=args.platform)
    log(kind, f"wrote {path}")
    return path


def save_over_stored(kind: str, payload: dict, platform: Optional[str], *, save: bool = False,
                     name: Optional[str] = None) -> Path:
    """Write a probe's findings over stored results files, ``{"kind": kind, **payload}``, to a new run
    folder (``data/results/<platform>/runs/<time>/``, ignored by git), or with ``save`` to
    ``data/results/<platform>/`` (committed results); ``name`` defaults to ``kind``."""
    from mlxlab.core.results import run_folder

    path = save_results(name or kind, {"kind": kind, **payload}, platform=platform,
                        folder=None if save else run_folder(platform))
    log(kind, f"wrote {path}")
    return path

