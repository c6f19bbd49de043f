"""``mlxlab reproduce`` refuses a parameter no notebook has, keeps the last good run when one
fails, and ends with what the run found: a verdict tally per notebook and the copies to open."""

import json

import nbformat
import pytest

from mlxlab.cli import main
from mlxlab.cli.tools import reproduce_summary
from mlxlab.notebook.reproduce import ReproduceError, reproduce, split_parameters, tally_text, verdict_tally

WRITER = """
import json, pathlib
res = pathlib.Path(results_dir)
res.mkdir(parents=True, exist_ok=True)
(res / "r.json").write_text(json.dumps({"verdicts": [{"claim": "c", "verdict": verdict}], "tag": tag}))
if fail:
    (res / "new.json").write_text("{}")
    raise RuntimeError("failed on purpose")
"""


def _notebook(path, params: str, body: str = WRITER):
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
                                           nbformat.v4.new_code_cell(body)])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, str(path))
    return path


PARAMS = "quick = True\nresults_dir = None\nfigures_dir = None\nverdict = 'reproduced'\ntag = 'a'\nfail = False"


def test_an_unknown_parameter_is_refused_with_the_notebooks_parameters_before_anything_runs(tmp_path):
    _notebook(tmp_path / "01_a.ipynb", PARAMS)
    with pytest.raises(ReproduceError, match=r"--param chunk: no notebook .* 01_a.ipynb: verdict, tag, fail"):
        reproduce(notebooks_dir=tmp_path, out_dir=tmp_path / "out", parameters={"chunk": "abc"},
                  progress=False, kernel_name="python3")
    assert not list((tmp_path / "out").glob("*.ipynb")), "nothing ran"


def test_the_cli_refuses_a_name_the_notebook_lacks(capsys, monkeypatch):
    """The issue's case: --param chunk=abc on notebook 05 (whose parameter is chunk_sizes or similar)."""
    monkeypatch.setenv("MLXLAB_NO_REEXEC", "1")
    assert main(["reproduce", "--quick", "--only", "05", "--param", "chunk=abc"]) == 1
    err = capsys.readouterr().err
    assert "--param chunk: no notebook of this run has such a parameter" in err and "05_admission_gate.ipynb:" in err


def test_a_name_some_notebooks_lack_goes_to_the_others_only(tmp_path):
    a = _notebook(tmp_path / "01_a.ipynb", "quick = True\nmodel_name = 'tiny'")
    b = _notebook(tmp_path / "02_b.ipynb", "quick = True\nmodels = ['tiny']")
    assert split_parameters([a, b], {"model_name": "small", "quick": True}) == {a: {"model_name": "small"}, b: {}}


def test_a_failed_run_keeps_the_last_good_copy_and_results(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_w.ipynb", PARAMS)
    res, out = tmp_path / "res", tmp_path / "out"
    common = dict(notebooks_dir=nbs, out_dir=out, progress=False, kernel_name="python3")
    done = reproduce(parameters={"results_dir": str(res), "figures_dir": str(tmp_path / "fig")}, **common)
    good = (out / "01_w.ipynb").read_text()
    assert json.loads((res / "r.json").read_text())["tag"] == "a"
    assert done[0]["verdicts"] == {"reproduced": 1} and [p.endswith("r.json") for p in done[0]["written"]] == [True]

    with pytest.raises(ReproduceError, match="01_w.ipynb failed in cell .*failed on purpose") as exc:
        reproduce(parameters={"results_dir": str(res), "figures_dir": str(tmp_path / "fig"), "tag": "b", "fail": True},
                  **common)
    assert exc.value.done == []
    assert (out / "01_w.ipynb").read_text() == good, "the last good executed copy stays"
    assert json.loads((res / "r.json").read_text())["tag"] == "a", "the changed results file is put back"
    assert not (res / "new.json").exists(), "a file the failed run created is removed"
    assert (out / "01_w.failed.ipynb").exists() and not list(out.glob("*.running.ipynb"))


def test_the_tally_counts_stored_verdicts_and_the_summary_names_what_to_open(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"verdicts": [{"verdict": "reproduced"}, {"verdict": "not reproduced"},
                                          {"verdict": "reproduced"}]}))
    (tmp_path / "fig.png").write_bytes(b"png")
    counts = verdict_tally([f, tmp_path / "fig.png"])
    assert counts == {"reproduced": 2, "not reproduced": 1}
    assert tally_text(counts) == "2 reproduced, 1 not reproduced" and tally_text({}) == "no verdicts"
    text = reproduce_summary([{"notebook": "01_a.ipynb", "seconds": 3.0, "output": str(tmp_path / "01_a.ipynb"),
                               "results": str(tmp_path), "figures": str(tmp_path), "verdicts": counts,
                               "skipped_parameters": ["model_name"]},
                              {"notebook": "02_b.ipynb", "seconds": 2.0, "output": str(tmp_path / "02_b.ipynb"),
                               "results": str(tmp_path), "figures": str(tmp_path), "verdicts": {"artifact": 1}}])
    assert "01_a.ipynb" in text and "2 reproduced, 1 not reproduced" in text
    assert "all 2 notebooks" in text and "2 reproduced, 1 not reproduced, 1 artifact" in text
    assert "has no parameter model_name" in text and str(tmp_path / "02_b.ipynb") in text
