"""What a newcomer's first hour costs, measured: the README's two commands on a fresh clone.

    .venv/bin/python scripts/first_hour.py [--save] [--skip-test]

Clones this checkout's HEAD into a temporary folder (a fresh clone: no ``.venv``, no ``build/``),
then times ``make reproduce`` (which sets up ``.venv`` from the project's own files and runs every
notebook headless in quick mode) and ``make test``, and measures the disk each leaves: ``.venv``,
``build/`` and the whole clone. It records the machine's core count and its load average before
and after each command (the times are a two-core machine's when nothing else runs; a load above
the core count says something else shared them), and the last line of each command's output
(pytest's tally). The README quotes these numbers from the file, never typed:
``data/results/<platform>/first_hour.json`` with ``--save``, else a new run folder.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlxlab.core.results import run_folder, save_results  # noqa: E402


def du_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed), 0 when it does not exist."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def timed(cmd: list, cwd: Path, log: Path) -> dict:
    """Run ``cmd`` in ``cwd`` with its output in ``log``; seconds, exit status, load around it
    (the clone's temporary path written as ``.`` in what is kept: no machine paths in results)."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                            env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "MLXLAB_DATA")}).returncode
    seconds = time.perf_counter() - t0
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return {"command": " ".join(cmd), "seconds": round(seconds, 1), "exit_status": rc,
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            "last_line": lines[-1][-300:].replace(str(cwd), ".") if lines else ""}


def pytest_counts(line: str) -> dict:
    """``'961 passed, 2 skipped in 612.3s'`` -> ``{'passed': 961, 'skipped': 2}``."""
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", line)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", action="store_true", help="replace data/results/<platform>/first_hour.json")
    ap.add_argument("--skip-test", action="store_true", help="time make reproduce only")
    args = ap.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="mlxlab-first-hour-"))
    clone = work / "mlxlab"
    logs = {}
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        runs = {"reproduce": timed(["make", "reproduce"], clone, work / "reproduce.log")}
        sizes = {"venv_bytes": du_bytes(clone / ".venv"), "build_bytes": du_bytes(clone / "build")}
        if not args.skip_test:
            runs["test"] = timed(["make", "test"], clone, work / "test.log")
            runs["test"]["counts"] = pytest_counts(runs["test"]["last_line"])
        sizes["clone_bytes"] = du_bytes(clone)
        for name in runs:
            logs[name] = (work / f"{name}.log").read_text(errors="replace")[-4000:].replace(str(clone), ".")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    payload = {"commit_measured": head, "cores": os.cpu_count(), "runs": runs, "sizes": sizes, "log_tails": logs}
    folder = run_folder(save=args.save)
    path = save_results("first_hour", payload, folder=folder, parameters={"skip_test": args.skip_test})
    for name, r in runs.items():
        print(f"{r['command']:16s} {r['seconds']:8.1f} s  exit {r['exit_status']}  load {r['load_before']}->{r['load_after']}  "
              f"{r['last_line'][:120]}")
    print(f".venv {sizes['venv_bytes'] / 1e9:.2f} GB, build {sizes['build_bytes'] / 1e6:.0f} MB, clone "
          f"{sizes['clone_bytes'] / 1e9:.2f} GB -> {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0 if all(r["exit_status"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
