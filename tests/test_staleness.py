"""The paper build names results measured by code that has changed since, from git's history."""

import subprocess

import pytest

from mlxlab.core.paths import ROOT
from mlxlab.paper import staleness as st


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


pytestmark = pytest.mark.skipif(not st.has_history() or _git("rev-parse", "--is-shallow-repository") == "true",
                                reason="needs this checkout's full git history")


def test_older_follows_ancestry():
    head, parent = _git("rev-parse", "HEAD"), _git("rev-parse", "HEAD~1")
    assert st.older(parent, head) is True
    assert st.older(head, parent) is False and st.older(head, head) is False
    assert st.older("0000000", head) is None, "a commit this history lacks is unknown, not old"


def test_a_file_measured_before_its_study_changed_is_flagged_and_one_after_is_not():
    changed = st.last_change(st.measuring_paths("serving"))
    before = _git("rev-parse", f"{changed}~1")
    doc = {"environment": {"git_commit": before[:7]},
           "verdicts": [{"claim": "mlx-serve-chat-itl", "decided_by": before[:7] + "-dirty"}]}
    row = st.file_status(ROOT / "data/results/cpu/serve_http.json", doc)
    assert row["made"] == before[:7] and row["study_changed"] == changed
    assert row["measured_by_older_code"] is True
    doc["environment"] = {"git_commit": "x", "source_commit": _git("rev-parse", "HEAD")}  # a device copy
    assert st.file_status(ROOT / "data/results/cpu/serve_http.json", doc)["measured_by_older_code"] is False
    # a probe's file has no study: nothing to compare
    assert st.file_status(ROOT / "data/results/h200/chunk_probe.json", doc)["measured_by_older_code"] is None


def test_the_report_lists_each_flagged_file():
    rows = [{"label": "cpu/a.json", "made": "abc1234", "decided": ["abc1234"], "measured_by_older_code": True,
             "decided_by_older_rules": False, "study_changed": "def5678", "rules_changed": None},
            {"label": "cpu/b.json", "made": "abc1234", "decided": [], "measured_by_older_code": False,
             "decided_by_older_rules": None, "study_changed": "abc1234", "rules_changed": None}]
    text = st.staleness_markdown(rows)
    assert "Of the 2 files, 1 were measured before" in text and "`cpu/a.json` `abc1234` < `def5678`" in text
    assert "cpu/b.json" not in text and "0 store verdicts decided before their rules last changed" in text


def test_only_code_that_measures_makes_a_measurement_old():
    # the newest commit counted for a study touched a module besides its charts and verdicts
    for name in ("serving", "contention", "tune"):
        code = st.last_change(st.measuring_paths(name))
        files = _git("show", "--name-only", "--format=", code).splitlines()
        mine = [f for f in files if f.startswith(f"mlxlab/studies/{name}/")]
        assert mine and not all(f.endswith(("charts.py", "verdict.py")) for f in mine), (name, code, mine)
    # a commit that only redrew a figure is not counted: the chart module's own newest change, when it
    # touched no other module of the package, lies outside what measures
    chart = st.last_change(("mlxlab/studies/serving/charts.py",))
    others = [f for f in _git("show", "--name-only", "--format=", chart).splitlines()
              if f.startswith("mlxlab/studies/serving/") and not f.endswith(("charts.py", "verdict.py"))]
    if not others:
        assert st.last_change(st.measuring_paths("serving")) != chart
