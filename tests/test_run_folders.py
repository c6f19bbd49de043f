"""Results are never overwritten by accident: a command writes a new run folder
(``data/results/<platform>/runs/<time>/``, ignored by git) and replaces the committed results only
with ``--save``; the same for ``reproduce``'s full runs and ``train-tiny``'s weights."""

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from mlxlab.cli import build_parser, main
from mlxlab.core import results
from mlxlab.core.paths import ROOT
from mlxlab.core.results import platform_of, results_dir, run_folder

DATA = ROOT / "data"
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ(-\d+)?")


@pytest.fixture
def data(tmp_path, monkeypatch):
    """An empty data/ (MLXLAB_DATA) with the tiny preset and the claims the verdicts are checked against."""
    (tmp_path / "models").mkdir()
    shutil.copy(DATA / "models" / "tiny.json", tmp_path / "models")
    shutil.copytree(DATA / "claims", tmp_path / "claims")
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    monkeypatch.setenv("MLXLAB_NO_REEXEC", "1")
    return tmp_path


def _run(argv) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


# ---------------------------------------------------------------------------------- the decision
def test_run_folder_is_the_committed_folder_only_with_save(data):
    assert run_folder("x", save=True) == results_dir("x") == data / "results" / "x"
    a, b = run_folder("x"), run_folder("x")
    assert a != b and a.parent == b.parent == data / "results" / "x" / "runs" and a.is_dir() and b.is_dir()
    assert STAMP.fullmatch(a.name) and STAMP.fullmatch(b.name)


def test_a_second_run_in_the_same_second_gets_its_own_folder(data, monkeypatch):
    import datetime as dt

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2026, 12, 1, 17, 3, 22, tzinfo=dt.timezone.utc)

    monkeypatch.setattr(results._dt, "datetime", Frozen)
    assert [run_folder("x").name for _ in range(3)] == ["2026-12-01T17-03-22Z", "2026-12-01T17-03-22Z-2",
                                                        "2026-12-01T17-03-22Z-3"]


def test_platform_of_looks_through_run_and_quick_folders(tmp_path):
    res = tmp_path / "results"
    assert platform_of(res / "h200" / "a.json") == "h200"
    assert platform_of(res / "h200" / "runs" / "2026-12-01T17-03-22Z" / "a.json") == "h200"
    assert platform_of(res / "cpu" / "quick" / "a.json") == "cpu"


def test_every_default_output_is_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    from mlxlab.paper.render import DEFAULT_OUT
    from mlxlab.train.tiny import trained_weights_dir

    paths = [DATA / "results" / "cpu" / "runs" / "2026-12-01T17-03-22Z" / "bench_engine.json",
             DATA / "results" / "h200" / "quick" / "x.json", DEFAULT_OUT / "index.html",
             trained_weights_dir(save=False) / "byte-target" / "config.json"]
    out = subprocess.run(["git", "check-ignore", "--no-index", *map(str, paths)], cwd=ROOT, capture_output=True,
                         text=True)
    assert sorted(out.stdout.split()) == sorted(map(str, paths))
    committed = DATA / "results" / "cpu" / "bench_engine.json"  # and the committed results are not
    assert subprocess.run(["git", "check-ignore", "-q", "--no-index", str(committed)], cwd=ROOT).returncode == 1


def test_every_command_that_writes_results_takes_save():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    bench = next(a for a in sub["bench"]._actions if isinstance(a, argparse._SubParsersAction)).choices
    commands = {**{f"bench {k}": v for k, v in bench.items()}, **{k: sub[k] for k in (
        "profile", "validate-sim", "seed-scale", "reproduce", "train-tiny")}}
    for name, p in commands.items():
        assert "--save" in p._option_string_actions, f"mlxlab {name} has no --save"
    assert "--save" not in sub["paper"]._option_string_actions  # it writes build/paper/ only


# ---------------------------------------------------------------------------------- commands
def test_profile_writes_a_run_folder_and_replaces_the_committed_profile_only_with_save(data, capsys):
    committed = data / "profiles" / "seed001-m4max-35b.json"
    committed.parent.mkdir()
    committed.write_bytes(b'{"committed": true}\n')
    assert _run(["profile", "--seed001"]) == 0
    assert committed.read_bytes() == b'{"committed": true}\n'
    (run,) = (data / "results" / "sim-seed001" / "runs").iterdir()
    written = run / "seed001-m4max-35b.json"
    assert "cost_model" in json.loads(written.read_text()) and f"wrote {written}" in capsys.readouterr().out
    assert _run(["profile", "--seed001", "--save"]) == 0
    assert json.loads(committed.read_text()) == json.loads(written.read_text())


def _fake_contention(model, **kw):
    """What run_contention returns, for two settings (only the fields the verdicts and figure read)."""
    def row(itl_x, policy, label):
        return {"executor": "engine", "policy": policy, "policy_options": {}, "name": label, "label": label,
                "chat_itl_p99_over_solo": itl_x, "doc_ttft_over_best_alone": 1.0, "chat_itl_p99_ms": 10.0 * itl_x,
                "doc_ttft_s": 1.0, "warmup_s": 1.0, "chat_itl_p50_ms": 5.0, "chat_itl_p50_over_solo": 1.0,
                "chat_worst_gap_ms": 30.0, "chat_tok_s_during_prefill": 9.0, "alone_ttft_s": 1.0,
                "doc_ttft_over_alone": 1.0, "first_over_warm_itl_p99": 1.0,
                "first_run": {"chat_itl_p99_ms": 10.0 * itl_x, "chat_itl_p99_over_solo": 1.0,
                              "doc_ttft_over_best_alone": 1.0}}

    return {"solo": {"itl_p50_ms": 5.0, "itl_p99_ms": 10.0, "n": 40}, "best_alone_ttft_s": 1.0,
            "best_alone_setting": "slo", "settings": {"interleave-512": row(1.5, "interleave", "interleave-512"),
                                                      "slo": row(1.1, "slo", "slo")},
            "config": {"warmup": "policy", "repeats": 2, "doc_tokens": 300, "chat_context": 64}}


def test_bench_contention_leaves_committed_results_alone_unless_saved(data, tmp_path, monkeypatch, capsys):
    import mlxlab.studies.contention.run as ct
    import mlxlab.studies.sim_validation.charts as sim_charts

    monkeypatch.setattr(ct, "run_contention", _fake_contention)
    figures = tmp_path / "paper_figures"
    monkeypatch.setattr(sim_charts, "FIGURES", figures)
    committed = data / "results" / "scratch" / "contention.json"
    committed.parent.mkdir(parents=True)
    committed.write_text(json.dumps({"environment": {"git_commit": "abc"},
                                     "presets": {"other": {**_fake_contention(None), "model": {"preset": "other"}}}}))
    before = committed.read_bytes()
    argv = ["bench", "contention", "--models", "tiny", "--dtype", "float32", "--repeats", "2",
            "--settings", "interleave-512", "slo", "--platform", "scratch"]
    # --append with no file: the committed presets are read, the combined file goes to the run folder
    assert _run(argv + ["--append"]) == 0
    assert committed.read_bytes() == before and not figures.exists()
    (run,) = (committed.parent / "runs").iterdir()
    doc = json.loads((run / "contention.json").read_text())
    assert sorted(doc["presets"]) == ["other", "tiny"] and doc["presets"]["other"]["environment"]["git_commit"] == "abc"
    assert (run / "contention_scratch.png").stat().st_size > 0
    assert f"wrote {run / 'contention.json'}" in capsys.readouterr().out
    # --append FILE: the presets of that file instead (an earlier run's, say)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(committed.read_text().replace('"other"', '"earlier"'))
    assert _run(argv + ["--append", str(earlier)]) == 0
    (newest,) = set((committed.parent / "runs").iterdir()) - {run}
    assert sorted(json.loads((newest / "contention.json").read_text())["presets"]) == ["earlier", "tiny"]
    # --save: the committed file is replaced, and the figure goes where the paper embeds it
    assert _run(argv + ["--save"]) == 0
    assert sorted(json.loads(committed.read_text())["presets"]) == ["tiny"]
    assert (figures / "contention_scratch.png").stat().st_size > 0


def test_a_quick_scheduling_run_cannot_be_saved(data, capsys):
    code = main(["bench", "scheduling", "--model", "tiny", "--quick", "--save", "--platform", "scratch"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--save" in err[0] and "--quick" in err[0]
    assert not (data / "results").exists()


def test_train_tiny_writes_build_weights_unless_saved(data, monkeypatch, capsys):
    import mlxlab.cli.studies as cli_studies
    import mlxlab.train.tiny as tiny

    calls = []
    monkeypatch.setattr(tiny, "train_tiny", lambda name, **kw: calls.append((name, kw["out_dir"], kw["log_path"])))
    monkeypatch.setattr(cli_studies, "build_corpus", lambda verify: {"meta": {"python": "3"}, "train": b"a",
                                                                       "heldout": b"b"})
    assert _run(["train-tiny", "--models", "byte-draft"]) == 0
    build = ROOT / "build" / "weights"
    assert calls[-1] == ("byte-draft", build / "byte-draft", build / "train_log.jsonl")
    assert f"wrote {build / 'byte-draft'}" in capsys.readouterr().out
    assert _run(["train-tiny", "--models", "byte-draft", "--save"]) == 0
    assert calls[-1] == ("byte-draft", data / "weights" / "byte-draft", data / "weights" / "train_log.jsonl")
    assert tiny.trained_weights_dir(save=True) == tiny.weights_dir() == data / "weights"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train-tiny", "--save", "--out", "x"])


# ---------------------------------------------------------------------------------- reproduce
def test_a_full_reproduce_writes_a_run_folder_unless_saved(data, tmp_path, monkeypatch):
    import papermill

    from mlxlab.notebook import reproduce as R

    nbdir = tmp_path / "nbs"
    nbdir.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("quick = True",
                                                                             metadata={"tags": ["parameters"]})]),
                   str(nbdir / "01_x.ipynb"))
    seen = {}
    monkeypatch.setattr(papermill, "execute_notebook",
                        lambda src, out, parameters=None, **kw: seen.update(parameters) or shutil.copy(src, out))
    common = dict(platform="cpu", notebooks_dir=nbdir, out_dir=tmp_path / "out", progress=False, kernel_name="python3")
    done = R.reproduce(quick=False, **common)
    (run,) = (data / "results" / "cpu" / "runs").iterdir()
    assert seen["results_dir"] == str(run) and seen["figures_dir"] == str(run / "figures")
    assert Path(done[0]["html"]) == run / "notebooks" / "01_x.html" and done[0]["results"] == str(run)
    assert sorted(p.name for p in (data / "results" / "cpu").iterdir()) == ["runs"]
    # a results folder given as a parameter keeps the figures beside it, not in paper/figures/
    seen.clear()
    R.reproduce(quick=False, parameters={"results_dir": str(tmp_path / "mine")}, **common)
    assert seen["figures_dir"] == str(tmp_path / "mine" / "figures")
    # --save: the committed folders, passed to the notebooks (the HTML beside the results)
    seen.clear()
    done = R.reproduce(quick=False, save=True, **common)
    assert seen["results_dir"] == str(data / "results" / "cpu")
    assert Path(seen["figures_dir"]) == ROOT / "paper" / "figures"
    assert Path(done[0]["html"]) == data / "results" / "cpu" / "notebooks" / "01_x.html"
    assert done[0]["figures"] == str(ROOT / "paper" / "figures")
    with pytest.raises(R.ReproduceError, match="--quick"):
        R.reproduce(quick=True, save=True, **common)


def test_results_files_keep_every_value_with_scalar_lists_on_one_line():
    """dumps() only moves whitespace: the parsed document is the same, strings holding commas and
    spaces keep them, and a list of numbers takes one line."""
    import json

    from mlxlab.core.results import dumps

    doc = {"gaps_ms": [1.5, 2.0, -3e-05, None, True], "names": ["a,   b", 'q"z, \\n'],
           "nested": [[1, 2], [3]], "empty": [], "rows": [{"x": [4, 5]}]}
    text = dumps(doc)
    assert json.loads(text) == doc
    assert '"gaps_ms": [1.5, 2.0, -3e-05, null, true]' in text
    assert '"a,   b"' in text
    assert text.count("\n") < json.dumps(doc, indent=2).count("\n")


def test_a_notebook_run_by_hand_in_full_mode_writes_a_run_folder(data):
    """nb.setup(quick=False) with no folders (JupyterLab, by hand) gets a new run folder; only the
    committed folders passed explicitly (reproduce --save) mark the run as committed."""
    from mlxlab.notebook import nb

    s = nb.setup(quick=False, platform="cpu")
    assert s.results_dir.parent == (data / "results" / "cpu" / "runs").resolve()
    assert s.figures_dir == s.results_dir / "figures" and not s.committed
    saved = nb.setup(quick=False, platform="cpu", results_dir=str(data / "results" / "cpu"),
                     figures_dir=str(data / "figs"))
    assert saved.committed
    assert not nb.setup(quick=True, platform="cpu").committed
