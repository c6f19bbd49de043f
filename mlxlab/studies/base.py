"""One way to write a study: what every experiment package declares, and what it gets for it.

A study is one package under ``mlxlab/studies/`` mirroring one notebook (or one CLI study with no
notebook). Inside, the same few modules wherever they apply: ``plan.py`` (what runs: parameters,
grid), ``run.py`` (measuring), ``verdict.py`` (claims decided from stored data), ``charts.py``
(figures). Its ``__init__.py`` declares a :class:`Study`: the results files it writes, the
notebook and command that write them, and where its ``decide`` and ``charts`` functions live, as
``"module:function"`` strings so that declaring a study imports neither MLX nor Altair.

From that declaration every study gets the same plumbing: its claims (those of ``data/claims``
whose ``experiment`` names one of its results files), rescoring a saved file in place
(:meth:`Study.rescore`: ``decide`` on the stored document, the measurements untouched,
``rescored_by`` this code's commit), and a place in the map that ``tests/test_study_map.py``
checks (notebook <-> package <-> claims <-> paper).

No MLX here.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union


def resolve(ref: str) -> Callable:
    """``"mlxlab.studies.x.verdict:decide"`` -> the function."""
    module, _, name = ref.partition(":")
    if not name:
        raise ValueError(f"{ref!r} is not 'module:function'")
    return getattr(importlib.import_module(module), name)


def results_name(path: Union[str, Path]) -> str:
    """The experiment name of a results file: its stem (``gate.json`` -> ``gate``)."""
    return Path(path).stem


def belongs(stem: str, results: str) -> bool:
    """Whether a results file named ``stem`` is one of experiment ``results``: the name itself or
    a variant of it (``scheduling_slo`` of ``scheduling``), the rule the claims files use."""
    return stem == results or stem.startswith(results + "_")


@dataclass(frozen=True)
class Study:
    """What one experiment package declares.

    ``name``: the package (``mlxlab.studies.<name>``); ``results``: the results-file names it
    writes (the ``experiment`` names of ``data/claims``; variants ``<name>_<x>`` belong to it too);
    ``notebook``: the notebook it mirrors (``NN_title``), or None for a CLI-only study; ``command``:
    the CLI command that runs it; ``decide``: ``"module:function"`` taking a stored results
    document (and its path) and returning its verdict records, from stored data only (None: the
    study decides no claim); ``charts``: ``"module:function"`` drawing its main figure from a
    stored document; ``paper``: the heading of the paper section it feeds."""

    name: str
    title: str
    results: Tuple[str, ...]
    paper: str
    notebook: Optional[str] = None
    command: Optional[str] = None
    decide: Optional[str] = None
    charts: Optional[str] = None

    @property
    def package(self) -> str:
        return f"mlxlab.studies.{self.name}"

    def claims(self) -> Dict[str, Any]:
        """The claims of ``data/claims`` that one of this study's results files decides."""
        from mlxlab.core.claims import load_claims

        return {cid: c for cid, c in load_claims().items() if any(e in self.results for e in c.experiments)}

    def owns(self, path: Union[str, Path]) -> bool:
        """Whether a results file is one of this study's (by its name)."""
        return any(belongs(results_name(path), r) for r in self.results)

    def verdicts_of(self, doc: dict, path: Union[str, Path]) -> List[dict]:
        """The verdicts ``decide`` gives a stored document, checked against the claims files."""
        from mlxlab.core.claims import check_verdicts

        if self.decide is None:
            raise ValueError(f"study {self.name} decides no claim: {path} has nothing to rescore")
        return check_verdicts(resolve(self.decide)(doc, Path(path)), experiment=results_name(path))

    def rescore(self, path: Union[str, Path]) -> dict:
        """Decide a saved results file's verdicts again with this code's rules, in place: the
        measurements and the run's ``environment`` stay as they were, ``rescored_by`` records this
        code's commit. Returns the new document."""
        from mlxlab.core.results import rescore_verdicts_in_place

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no results file {path}: name a saved {self.results[0]}.json")
        return rescore_verdicts_in_place(path, lambda d: self.verdicts_of(d, path),
                                         f"verdicts decided again from the stored measurements by {self.decide}; "
                                         "nothing was re-run")

    def chart(self, doc: dict, platform: str = ""):
        """The study's main figure drawn from a stored document (Altair; None without ``charts``)."""
        return resolve(self.charts)(doc, platform) if self.charts else None


def load_doc(path: Union[str, Path]) -> dict:
    """A results file as a dict, with a clear error for a path that is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no results file {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a results file (JSON): {e}") from e
