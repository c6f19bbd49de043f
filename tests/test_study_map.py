"""The map between notebooks, study packages, claims and the paper: ``mlxlab/studies/`` stays the
notebooks' twin, and every study rescores the same one way."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxlab.core.claims import load_claims
from mlxlab.studies import PACKAGES, all_studies, study_for
from mlxlab.studies.base import Study, belongs

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "mlxlab" / "studies"
#: the only modules beside the packages: the protocol, the rules the verdicts share, the child process
SHARED = {"__init__.py", "base.py", "rules.py", "fresh_process.py"}
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))


def test_studies_holds_only_the_declared_packages_and_the_shared_modules():
    loose = {p.name for p in STUDIES.glob("*.py")}
    assert loose <= SHARED, f"modules outside a study package: {sorted(loose - SHARED)}"
    packages = {p.name for p in STUDIES.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(PACKAGES)


def test_every_study_declares_itself_under_its_own_package_name():
    for name, study in zip(PACKAGES, all_studies()):
        assert isinstance(study, Study) and study.name == name
        assert study.notebook or study.command, f"{name}: neither a notebook nor a command runs it (orphaned)"


def test_every_notebook_has_a_study_and_imports_it():
    owned = {s.notebook for s in all_studies() if s.notebook}
    assert owned == set(NOTEBOOKS), f"notebooks without a study: {sorted(set(NOTEBOOKS) - owned)}"
    for s in all_studies():
        if s.notebook:
            src = (ROOT / "notebooks" / "src" / f"{s.notebook}.py").read_text()
            assert re.search(rf"mlxlab\.studies\.{s.name}\b", src), f"{s.notebook} does not import {s.package}"


def test_every_claim_is_decided_by_one_study_and_every_study_decides_a_claim():
    claims = load_claims()
    for cid, c in claims.items():
        for e in c.experiments:
            study = study_for(f"{e}.json")
            assert cid in study.claims(), f"{cid}: experiment {e} is the {study.name} study's, which lists no such claim"
    for s in all_studies():
        assert s.claims(), f"study {s.name} decides no claim of data/claims (orphaned)"


def test_every_study_names_a_section_the_paper_has():
    headings = {m.group(1).strip() for m in re.finditer(r"^## (.+)$", (ROOT / "paper" / "paper.md.j2").read_text(), re.M)}
    for s in all_studies():
        assert s.paper in headings, f"{s.name}: no paper section {s.paper!r}"


def test_decide_and_charts_name_functions_that_exist():
    import importlib

    for s in all_studies():
        for ref in filter(None, (s.decide, s.charts)):
            module, _, fn = ref.partition(":")
            assert module.startswith(s.package + "."), f"{s.name} points outside its package: {ref}"
            assert callable(getattr(importlib.import_module(module), fn)), ref


def test_study_for_picks_the_longest_results_name_and_refuses_an_unknown_one():
    assert study_for("data/results/cpu/scheduling_slo_min4.json").name == "scheduling"
    assert study_for("sim_validation_heldout.json").name == "sim_validation"
    assert belongs("contention_levers", "contention") and not belongs("contentions", "contention")
    with pytest.raises(ValueError, match="no study writes results named 'nothing'"):
        study_for("nothing.json")


def test_declaring_the_studies_loads_no_mlx():
    code = ("import sys\nfrom mlxlab.studies import all_studies\nall_studies()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'altair')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_mlxlab_rescore_decides_a_saved_file_again_and_keeps_its_measurements(tmp_path):
    src = ROOT / "data" / "results" / "cpu" / "contention.json"
    path = tmp_path / "contention.json"
    shutil.copy(src, path)
    out = subprocess.run([sys.executable, "-m", "mlxlab.cli", "rescore", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = json.loads(src.read_text()), json.loads(path.read_text())
    assert after["presets"] == before["presets"] and after["environment"] == before["environment"]
    assert "nothing was re-run" in after["rescored_by"]["what"]
    assert [v["claim"] for v in after["verdicts"]] == [v["claim"] for v in before["verdicts"]]


def test_mlxlab_rescore_refuses_a_file_of_no_study_and_leaves_it_alone(tmp_path):
    path = tmp_path / "mystery.json"
    path.write_text('{"verdicts": []}\n')
    out = subprocess.run([sys.executable, "-m", "mlxlab.cli", "rescore", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "no study writes results named 'mystery'" in out.stderr
    assert path.read_text() == '{"verdicts": []}\n'
