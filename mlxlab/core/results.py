"""One results format: JSON under ``data/results/<platform>/`` with the environment attached.

:func:`environment_block` is the provenance every written result carries (device, BLAS, versions,
platform, commit, time); :func:`save_results` writes a result with it, and every other writer of a
measurement (notebooks, profiles, probes) calls one of the two. :func:`run_folder` decides where a
command writes: a new ignored ``runs/<time>/`` folder unless it is asked to replace the committed
results (``--save``), so a trial run never overwrites the files the paper is built from.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from mlxlab.core.environment import device_summary, platform_name
from mlxlab.core.git import _git, _git_commit, _git_dirty  # noqa: F401 (re-exported)
from mlxlab.core.paths import ROOT, data_dir


def results_dir(platform: Optional[str] = None) -> Path:
    """The committed results of one platform: ``data/results/<platform>/`` (default: detected)."""
    return data_dir() / "results" / (platform or platform_name())


def run_folder(platform: Optional[str] = None, save: bool = False) -> Path:
    """Where a command writes its results (and its figures, unless it saves).

    With ``save``: :func:`results_dir`, whose committed files the command replaces. Without: a new
    folder ``data/results/<platform>/runs/<UTC time>/`` (ignored by git; e.g.
    ``runs/2026-12-01T17-03-22Z/``), created here, with ``-2``, ``-3``... appended when a run of
    the same second already took the name, so two runs never share one. Call it when the first
    file is about to be written, so a command that fails before measuring leaves no empty folder.
    """
    if save:
        return results_dir(platform)
    runs = results_dir(platform) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")
    for n in itertools.count(1):
        folder = runs / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()  # atomic: of two runs racing for one name, one gets FileExistsError
            return folder
        except FileExistsError:
            continue


def platform_of(path: Union[str, Path]) -> str:
    """The results platform a results file belongs to: the name of its folder under
    ``data/results/``, looking through a ``runs/<time>/`` or ``quick/`` folder (a file elsewhere:
    the name of its own folder)."""
    folder = Path(path).resolve().parent
    if folder.name == "quick":
        return folder.parent.name
    if folder.parent.name == "runs":
        return folder.parent.parent.name
    return folder.name


def rescore_verdicts_in_place(path: Union[str, Path], decide, what: str) -> dict:
    """A saved results file's ``verdicts`` decided again by ``decide(doc)`` (a list of verdict
    records; ``decide`` may also add what the verdicts read, such as a table or ``parameters``)
    and written back in place, indented as the file was, with ``rescored_by`` (this code's commit,
    dirty flag, time and ``what`` was done); the measurements and the run's ``environment`` stay
    as they were. The provenance keys lead the document. Returns the document."""
    path = Path(path)
    original = path.read_text()
    doc = json.loads(original)
    doc["verdicts"] = decide(doc)
    doc["rescored_by"] = {"commit": _git_commit(), "dirty": _git_dirty(),
                          "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "what": what}
    first = [k for k in ("environment", "parameters", "verdicts", "rescored_by") if k in doc]
    doc = {**{k: doc[k] for k in first}, **{k: v for k, v in doc.items() if k not in first}}
    write_json_like(path, jsonable(doc), original)
    return doc


def write_json_like(path: Path, doc: dict, original: str) -> None:
    """Write ``doc`` to ``path`` laid out as ``original`` was: :func:`dumps` for a file indented by
    two (the layout :func:`save_results` writes), else ``json.dumps`` at the original's indent (a
    rewrite then differs from the file only where the document does)."""
    lines = original.splitlines()
    second = lines[1] if len(lines) > 1 else ""
    indent = len(second) - len(second.lstrip(" ")) if second.strip() else None
    text = dumps(doc) if indent == 2 and _scalar_lists_inline(original) else json.dumps(doc, indent=indent or None)
    path.write_text(text + ("\n" if original.endswith("\n") or not original else ""))


def _scalar_lists_inline(text: str) -> bool:
    """Whether a JSON text lays its scalar lists on one line (as :func:`dumps` does)."""
    return _SCALAR_LIST.search(text) is None


def command_line(argv: Sequence[str]) -> Optional[list]:
    """The command that wrote a result, without this machine's paths: the program's file name,
    then the arguments with the checkout's own path made relative. None inside a notebook kernel,
    whose command line names only the kernel's connection file (the notebook's parameters are
    stored instead)."""
    argv = [str(a) for a in argv]
    if not argv or "ipykernel" in argv[0]:
        return None
    root = str(ROOT) + os.sep
    return [Path(argv[0]).name] + [a.replace(root, "") for a in argv[1:]]


def environment_block(platform: Optional[str] = None) -> dict:
    """Where and with what a measurement ran: :func:`~mlxlab.core.environment.device_summary`
    plus the results platform (default: detected), the git commit and whether the tree was
    dirty, the ``MLX_*`` variables set, the command line and the UTC time."""
    import sys

    from mlxlab.core.environment import mlx_env

    block = {**device_summary(), "platform": platform or platform_name(), "git_commit": _git_commit(),
             "git_dirty": _git_dirty(), "mlx_env": mlx_env()[0], "argv": command_line(sys.argv),
             "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if os.environ.get("MLXLAB_SOURCE_COMMIT"):
        # a copy of the tree whose .git lags behind (the lent GPU machine's): the commit the copy
        # was made from, as the caller declares it; git_commit/git_dirty then describe the stale .git
        block["source_commit"] = os.environ["MLXLAB_SOURCE_COMMIT"]
    return block


def jsonable(x: Any) -> Any:
    # JSON has no NaN: write null so other tools can read the file
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return jsonable(x.item())
    return x


# a JSON list of scalars (numbers, strings without newlines, null/true/false) as json.dumps(indent=2) lays it
# out: one item a line; dumps() puts such lists on one line
_SCALAR = r'(?:-?[0-9][0-9.eE+-]*|null|true|false|"(?:[^"\\\n]|\\.)*")'
_SCALAR_LIST = re.compile(r"\[\n\s+(" + _SCALAR + r"(?:,\n\s+" + _SCALAR + r")*)\n\s*\]")


def dumps(doc: Any) -> str:
    """``doc`` as indented JSON (``indent=2``) with every list of scalars on one line: a results
    file's dicts stay one key a line, and its long series of gaps and times take a third less
    room than one number a line (the committed files travel to the GPU machine under a size limit)."""
    return _SCALAR_LIST.sub(lambda m: "[" + re.sub(r",\n\s+", ", ", m.group(1)) + "]", json.dumps(doc, indent=2))


def save_results(name: str, payload: dict, platform: Optional[str] = None,
                 folder: Union[None, str, Path] = None, *, verdicts: Optional[Sequence[dict]] = None,
                 parameters: Optional[dict] = None) -> Path:
    """Write ``payload`` with an ``environment`` block (:func:`environment_block`) to
    ``<folder>/<name>.json``, ``folder`` defaulting to ``data/results/<platform>/``; returns the path.

    ``verdicts``: the :func:`mlxlab.core.claims.verdict` records this run decides, checked
    against the claims files (each must be a claim that experiment ``name`` tests) before
    anything is written; ``parameters``: the run's parameters, stored as given."""
    from mlxlab.core.claims import check_verdicts

    checked = check_verdicts(verdicts, experiment=name) if verdicts is not None else None
    path = Path(folder or results_dir(platform)) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"environment": environment_block(platform),
           **({"parameters": parameters} if parameters is not None else {}),
           **({"verdicts": checked} if checked is not None else {}), **payload}
    path.write_text(dumps(jsonable(doc)) + "\n")
    return path
