"""What a newcomer meets first: `make lab` starts as root and headless, a bare `pytest` collects
every test file, and the first-hour script reads pytest's tally right."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _lab_line(**make_vars) -> str:
    args = ["make", "-n", "lab", *(f"{k}={v}" for k, v in make_vars.items())]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if "jupyter lab" in ln][-1]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_lab_allows_root_and_runs_without_a_browser_where_there_is_no_display():
    root_headless = _lab_line(USER_ID=0, DISPLAY="")
    assert "--allow-root" in root_headless
    if sys.platform.startswith("linux"):
        assert "--no-browser" in root_headless
    user_desktop = _lab_line(USER_ID=1000, DISPLAY=":0")
    assert "--allow-root" not in user_desktop and "--no-browser" not in user_desktop
    assert "--port 8890" in _lab_line(LAB_ARGS="--port 8890")


def test_a_bare_pytest_collects_the_tests_that_import_probes():
    """`pytest` (not `python -m pytest`) does not put the checkout on sys.path by itself: without
    pyproject's pythonpath the probes' tests fail to collect."""
    pytest_exe = Path(sys.executable).parent / "pytest"
    if not pytest_exe.exists():
        pytest.skip("no pytest script beside this Python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(pytest_exe), "--collect-only", "-q", "tests/test_busy_profile.py"], cwd=ROOT,
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.lower()


def _first_hour():
    spec = importlib.util.spec_from_file_location("first_hour", ROOT / "scripts" / "first_hour.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_first_hour_reads_pytests_tally_and_measures_disk(tmp_path):
    fh = _first_hour()
    assert fh.pytest_counts("961 passed, 2 skipped, 1 failed in 612.30s (0:10:12)") == \
        {"passed": 961, "skipped": 2, "failed": 1}
    assert fh.pytest_counts("no tests ran") == {}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 1000)
    (tmp_path / "g").write_bytes(b"y" * 24)
    assert fh.du_bytes(tmp_path) == 1024 and fh.du_bytes(tmp_path / "missing") == 0
