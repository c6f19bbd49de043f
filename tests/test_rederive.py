"""Every committed verdict follows from its stored measurements under today's rules: each results
file under data/results/ that stores verdicts is decided again by its study's ``decide`` (nothing
is measured) and must give the same verdict for every claim, from the same kind of source. A rule
change that moves a verdict fails here until the files are rescored (``mlxlab rescore``)."""

import json
from pathlib import Path

import pytest

from mlxlab.studies import study_for

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "data" / "results"


def committed_results_with_verdicts():
    out = []
    for p in sorted(RESULTS.rglob("*.json")):
        parts = p.relative_to(RESULTS).parts
        if "runs" in parts or "quick" in parts or "executed" in parts:
            continue
        if json.loads(p.read_text()).get("verdicts"):
            out.append(p)
    return out


FILES = committed_results_with_verdicts()


def _decided(records):
    return {r["claim"]: (r["verdict"], r.get("source", "measurement")) for r in records}


def test_there_are_committed_verdicts_to_check():
    assert len(FILES) > 40


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(RESULTS)) for p in FILES])
def test_a_committed_verdict_is_what_its_stored_measurements_give_today(path):
    doc = json.loads(path.read_text())
    study = study_for(path)
    assert study.decide, f"{path.name}: study {study.name} has no decide, so its verdicts cannot be checked"
    again = study.verdicts_of(json.loads(path.read_text()), path)
    stored = _decided(doc["verdicts"])
    diff = {c: (stored.get(c), v) for c, v in _decided(again).items() if stored.get(c) != v}
    diff.update({c: (v, None) for c, v in stored.items() if c not in _decided(again)})
    assert not diff, (f"{path.relative_to(ROOT)}: stored verdicts differ from today's rules (claim: stored, today): "
                      f"{diff}; run `mlxlab rescore {path.relative_to(ROOT)}`")


def test_every_committed_verdict_names_the_code_that_decided_it():
    missing = [str(p.relative_to(RESULTS)) for p in FILES
               if any(not r.get("decided_by") for r in json.loads(p.read_text())["verdicts"])]
    assert not missing, f"verdicts without decided_by (rescore them): {missing}"
