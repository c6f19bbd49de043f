"""The notebook campaign split across device calls (mlxlab.notebook.campaign) and figures saved
as specs where vl-convert is missing (plots.save_figure / render_pending)."""

import io
import json
import tarfile
from unittest import mock

import altair as alt
import nbformat
import pandas as pd
import pytest

from mlxlab.notebook import campaign as cg
from mlxlab.notebook import plots
from mlxlab.notebook.reproduce import ReproduceError, list_notebooks, reproduce


def _chart():
    base = alt.Chart(pd.DataFrame({"x": [1, 2, 3], "y": [3, 1, 2]})).mark_line().encode(x="x", y="y")
    return alt.layer(base, base.mark_point()) | base.properties(title="t")


def test_figure_without_vl_convert_is_a_spec_that_renders_to_the_same_files(tmp_path):
    plots.save_figure(_chart(), "direct", tmp_path)
    with mock.patch.object(plots, "can_render", lambda: False):
        paths = plots.save_figure(_chart(), "later", tmp_path)
    assert [p.name for p in paths] == ["later.vl.json"]
    assert not (tmp_path / "later.png").exists()
    written = plots.render_pending(tmp_path)
    assert sorted(p.name for p in written) == ["later.png", "later.svg"]
    assert not (tmp_path / "later.vl.json").exists()
    for ext in ("svg", "png"):
        assert (tmp_path / f"direct.{ext}").read_bytes() == (tmp_path / f"later.{ext}").read_bytes()


def test_entries_cover_every_notebook_and_each_preset_where_per_preset():
    es = cg.entries("h200")
    assert len({e.key for e in es}) == len(es)
    assert sorted({e.notebook for e in es}) == sorted(p.name[:2] for p in list_notebooks())
    for nb in ("00", "01", "02", "06"):
        assert sorted(e.preset for e in es if e.notebook == nb) == sorted(cg.PRESETS)
        assert all(e.params["bits"] == 4 and e.params["model_name"] == e.preset for e in es if e.notebook == nb)
    assert [e.params["models"] for e in es if e.notebook == "04"] == [[p] for p in cg.PRESETS]
    with pytest.raises(cg.CampaignError, match="no campaign for platform"):
        cg.entries("nowhere")


def _rec(key, status, seconds, started=1.0):
    return {"key": key, "status": status, "seconds": seconds, "started": started, "call": "c", "commit": "x"}


def test_pending_and_expected_time_follow_the_log():
    es = cg.entries("h200")
    first, second = es[0], es[1]
    runs = [_rec(first.key, "ok", 50.0), _rec(second.key, "timeout", 480.0)]
    todo = cg.pending("h200", runs)
    assert first not in todo and second in todo  # a timed-out entry is still pending
    assert cg.expected_s(second, runs) == 480.0  # at least the deadline it ran into
    assert cg.expected_s(es[2], runs) == es[2].estimate_s


def test_split_calls_packs_in_order_within_the_budget():
    es = [cg.Entry("00", p, {}, t) for p, t in zip(("a", "b", "c", "d"), (200.0, 250.0, 100.0, 700.0))]
    calls = cg.split_calls(es, [], 480.0)
    assert [[e.preset for e in c] for c in calls] == [["a", "b"], ["c"], ["d"]]
    assert all(sum(e.estimate_s for e in c) <= 480.0 or len(c) == 1 for c in calls)


def _archive(tmp_path, members):
    path = tmp_path / "campaign.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_collect_renders_figures_exports_html_and_merges_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(cg, "ROOT", tmp_path)
    old = _rec("00@qwen2.5-0.5b", "ok", 40.0, started=1.0)
    cg.write_log("h200", [old])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="verdict: reproduced\n")])])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"big": "x" * 100000}}}
    new = _rec("01@qwen2.5-0.5b", "ok", 90.0, started=2.0)
    log = json.dumps({"platform": "h200", "runs": [old, new]}).encode()
    arch = _archive(tmp_path, {
        "data/results/h200/campaign/campaign.json": log,
        "data/results/h200/campaign/qwen2.5-0.5b/prefill_step_size.json": b"{}",
        "data/results/h200/campaign/executed/01-qwen2.5-0.5b.ipynb": nbformat.writes(nb).encode(),
        "paper/figures/h200/campaign/qwen2.5-0.5b/sweep.vl.json": _chart().to_json().encode(),
    })
    got = cg.collect(arch, "h200")
    assert (tmp_path / "paper/figures/h200/campaign/qwen2.5-0.5b/sweep.png").is_file()
    assert not (tmp_path / "paper/figures/h200/campaign/qwen2.5-0.5b/sweep.vl.json").exists()
    html = tmp_path / "data/results/h200/campaign/html/01-qwen2.5-0.5b.html"
    assert got["html"] == [str(html.relative_to(tmp_path))]
    text = html.read_text()
    assert "verdict: reproduced" in text and "x" * 1000 not in text  # widget state dropped
    assert [r["key"] for r in cg.read_log("h200")] == ["00@qwen2.5-0.5b", "01@qwen2.5-0.5b"]  # no duplicate


def test_collect_refuses_a_member_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(cg, "ROOT", tmp_path / "repo")
    (tmp_path / "repo").mkdir()
    arch = _archive(tmp_path, {"../escape.txt": b"x"})
    with pytest.raises(cg.CampaignError, match="outside the checkout"):
        cg.collect(arch, "h200")
    assert not (tmp_path / "escape.txt").exists()


def test_run_refuses_unknown_entry_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(cg, "ROOT", tmp_path)
    with pytest.raises(cg.CampaignError, match="unknown campaign entries"):
        cg.run("h200", 10.0, call="t", only=["99@nothing"])


def test_out_name_needs_a_single_notebook():
    with pytest.raises(ReproduceError, match="names one executed notebook"):
        reproduce(quick=True, only=["00", "01"], out_name="x.ipynb", progress=False)


def test_run_skips_an_entry_too_long_for_what_is_left_and_runs_a_later_shorter_one(tmp_path, monkeypatch):
    monkeypatch.setattr(cg, "ROOT", tmp_path)
    long_, short = cg.Entry("04", None, {}, 1000.0), cg.Entry("07", None, {}, 1.0)
    monkeypatch.setattr(cg, "entries", lambda platform: [long_, short])
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd[cmd.index("--only") + 1])
        return mock.Mock(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(cg.subprocess, "run", fake_run)
    recs = cg.run("h200", 100.0, call="t")
    assert ran == ["07"] and [r["key"] for r in recs] == ["07@all"]
    assert [e.key for e in cg.pending("h200")] == ["04@all"]


def test_every_entry_passes_only_parameters_its_notebook_has():
    """reproduce refuses a --param the notebook lacks (it would run on its defaults), so an entry
    with a misspelt or stale parameter would fail on the device: catch it here first."""
    from mlxlab.notebook.reproduce import list_notebooks, split_parameters

    for platform in cg.ENTRIES:
        for e in cg.entries(platform):
            (nb,) = list_notebooks([e.notebook])
            assert split_parameters([nb], e.params) == {nb: e.params}, f"{e.key}: {sorted(e.params)}"
