"""What every notebook does the same way: where outputs go, the model it runs, the verdict table.

Quick runs (CI, ``mlxlab reproduce --quick``) write results to ``data/results/<platform>/quick/``
and figures to ``build/figures/``; a full run, by hand in JupyterLab or through ``mlxlab
reproduce``, writes a new ``data/results/<platform>/runs/<time>/`` folder. None of them overwrites
the full runs the paper uses (``data/results/<platform>/`` and ``paper/figures/``): only
``mlxlab reproduce --save`` passes those as the notebooks' ``results_dir`` / ``figures_dir``
parameters (:func:`mlxlab.notebook.reproduce.notebook_folders` holds the defaults).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pandas as pd

from mlxlab.core import results
from mlxlab.core.environment import device_summary, platform_name
from mlxlab.notebook.plots import save_figure
from mlxlab.notebook.reproduce import notebook_folders
from mlxlab.notebook.widgets import offline

from mlxlab.core.claims import VERDICTS, check_verdicts, measured_text  # noqa: F401  (VERDICTS: the notebooks' vocabulary)


@dataclass
class Setup:
    platform: str
    quick: bool
    results_dir: Path
    figures_dir: Path
    environment: dict
    committed: bool = False  # results_dir is the committed data/results/<platform>/ (mlxlab reproduce --save)

    def save(self, name: str, payload: dict, *, verdicts: Optional[List[dict]] = None,
             parameters: Optional[dict] = None) -> Path:
        """Write results JSON into this run's results folder: the measurements, the verdicts
        (:func:`mlxlab.core.claims.verdict` records, checked against the claims files first)
        and the notebook's parameters, with the run's provenance."""
        return results.save_results(name, {"quick": self.quick, **payload}, platform=self.platform,
                                    folder=self.results_dir, verdicts=verdicts, parameters=parameters)

    def figure(self, chart, name: str) -> List[Path]:
        return save_figure(chart, name, self.figures_dir)


def setup(quick: bool = True, platform: Optional[str] = None, results_dir: Optional[str] = None,
          figures_dir: Optional[str] = None) -> Setup:
    """Resolve a notebook's output folders and describe the machine; prints one line."""
    plat = platform or platform_name()
    res, fig = notebook_folders(quick, plat, results_dir, figures_dir)
    res.mkdir(parents=True, exist_ok=True)
    fig.mkdir(parents=True, exist_ok=True)
    env = device_summary()
    offline()  # charts render without internet in JupyterLab
    print(f"platform={plat} quick={quick} device={env['device']} ({env['device_name']}) blas={env['blas']} "
          f"mlx={env['mlx']} mlx-lm={env['mlx_lm']}\nresults -> {res}\nfigures -> {fig}")
    committed = res.resolve() == results.results_dir(plat).resolve()
    return Setup(plat, quick, res.resolve(), fig.resolve(), env, committed)


def verdict_table(records: List[dict]) -> pd.DataFrame:
    """The closing table of a notebook, from the verdict records it stored: claim id, the claim,
    published, measured here, verdict, rule and fairness note. Raises ValueError on a record
    :func:`~mlxlab.core.claims.check_verdicts` rejects."""
    rows = check_verdicts(records)
    table = pd.DataFrame(rows, columns=["claim", "text", "published", "measured", "verdict", "rule", "fairness"])
    # numbers to three significant digits and nested records in a few words, not raw floats and reprs
    for col in ("published", "measured"):
        table[col] = [measured_text(v, limit=8) for v in table[col]]
    return table
