"""Every notebook runs headless in quick mode through papermill (what CI and `mlxlab reproduce
--quick` do), writing into a temporary folder; notebooks are committed without outputs, with a
`parameters` cell and the cells of their jupytext source (`make notebooks`); a failing notebook
is reported with its name and cell."""

import json

import jupytext
import nbformat
import pytest

from mlxlab.core.claims import load_claims
from mlxlab.notebook import nb as nbmod
from mlxlab.notebook.reproduce import NOTEBOOKS, ReproduceError, list_notebooks, reproduce

ALL = list_notebooks()


def test_there_is_a_numbered_series():
    assert [p.name[:2] for p in ALL] == sorted(p.name[:2] for p in ALL)
    assert ALL and ALL[0].name.startswith("00_")


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_notebook_is_committed_clean_with_a_parameters_cell(path):
    book = nbformat.read(str(path), as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    assert any("parameters" in c.metadata.get("tags", []) for c in code)
    src = NOTEBOOKS / "src" / (path.stem + ".py")
    assert src.exists(), f"{src} is the plain-text source of {path.name}"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_notebook_has_the_cells_of_its_source(path):
    def cells(book):
        return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in book.cells]

    source = jupytext.read(NOTEBOOKS / "src" / (path.stem + ".py"), fmt="py:percent")
    assert cells(nbformat.read(str(path), as_version=4)) == cells(source), \
        f"{path.name} differs from its source: run `make notebooks`"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_notebook_runs_in_quick_mode(path, tmp_path):
    out = reproduce(quick=True, only=[path.name[:2]], out_dir=tmp_path / "nb", progress=False,
                    parameters={"results_dir": str(tmp_path / "results"), "figures_dir": str(tmp_path / "figures")})
    executed = nbformat.read(out[0]["output"], as_version=4)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    results = list((tmp_path / "results").glob("*.json"))
    assert results, "a notebook writes its measurements"
    docs = [json.loads(p.read_text()) for p in results]
    assert all("environment" in d and "parameters" in d for d in docs)
    # the verdicts are stored with the results, and every claim this notebook is named to test
    # in data/claims is decided there (a verdict computed after saving would be lost)
    decided = {v["claim"] for d in docs for v in d.get("verdicts", [])}
    owed = {c.id for c in load_claims().values() if c.notebook == path.stem}
    assert owed <= decided, f"{path.name} stores no verdict for {sorted(owed - decided)}"


def test_a_failing_notebook_is_named_with_its_cell(tmp_path):
    book = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("quick = True", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("raise ValueError('boom')"),
    ])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, str(tmp_path / "07_broken.ipynb"))
    with pytest.raises(ReproduceError, match=r"07_broken.ipynb failed in cell \d+: ValueError: boom"):
        reproduce(notebooks_dir=tmp_path, out_dir=tmp_path / "out", progress=False)


def test_verdict_table_refuses_unknown_verdicts_and_claims():
    with pytest.raises(ValueError, match="verdict"):
        nbmod.verdict_table([{"claim": "s000-step-decode", "measured": 1, "verdict": "sort of", "rule": "r", "fairness": "f"}])
    with pytest.raises(KeyError, match="no claim"):
        nbmod.verdict_table([{"claim": "made-up", "measured": 1, "verdict": "reproduced", "rule": "r", "fairness": "f"}])


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_papermill_parses_every_parameter_line(path, caplog):
    """papermill reads each parameter's comment as its help; a comment holding "=" made it log
    "Unable to parse line ..." for five notebooks on every run."""
    import logging

    import papermill as pm
    with caplog.at_level(logging.WARNING, logger="papermill"):
        params = pm.inspect_notebook(str(path))
    assert "quick" in params and not [r for r in caplog.records if "Unable to parse" in r.getMessage()]


def test_verdict_table_shows_measured_figures_rounded_in_a_few_words():
    table = nbmod.verdict_table([{"claim": "s000-step-decode", "measured": {"gap_s": 30.79564777756353, "by": {"a": 1.23456}},
                                  "verdict": "reproduced", "rule": "r", "fairness": "f"}])
    assert table.loc[0, "measured"] == "gap_s 30.8; by {a 1.23}"
