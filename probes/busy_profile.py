"""Busy-profile probe: ``mlxlab profile`` measured while another job shares the CPU, on and off.

A cost-model profile is a picture of the machine as it ran. To show how far a profile taken on a
shared machine lands from a quiet one (the paper's "Does a profile repeat?"), this probe starts a
load of its own beside the profile instead of waiting for one: ``--load-procs`` processes, each a
one-thread OpenBLAS matmul loop that runs ``--on-s`` seconds and sleeps ``--off-s``, with their
phases spread evenly, for the whole profile. The profile's command line is the one the quiet
profiles use (``mlxlab profile`` with the grid below); the probe then writes the profile as
``data/results/<platform>/<name>.json`` with the load's settings (``load``) and this probe's
command line as the one that re-runs it.

Usage::

    python -m probes.busy_profile                       # the committed cpu/profile_busy_cpu-small.json
    mlxlab validate-sim --model small --profile-spread data/results/cpu/profile_busy_cpu-small.json \\
        data/results/cpu/profile_spread_first_cpu-small.json --held-out 6 --held-out-seed 23
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--prefill-tokens", "32", "128", "256", "--contexts", "0", "768", "1792", "--decode-batches", "1", "2", "4",
        "--decode-contexts", "32", "638", "1277", "--join-contexts", "1277"]
# one load process: a 512x512 float32 matmul loop on one OpenBLAS thread, on for ON s, off for OFF s
LOAD = """
import sys, time, numpy as np
on, off, phase = map(float, sys.argv[1:4])
a = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
time.sleep(phase)
while True:
    end = time.monotonic() + on
    while time.monotonic() < end:
        a = np.tanh(a @ a)
    time.sleep(off)
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m probes.busy_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--repeats", type=int, default=5, help="profile passes (default: %(default)s)")
    p.add_argument("--load-procs", type=int, default=1, help="load processes (default: %(default)s)")
    p.add_argument("--on-s", type=float, default=20.0, help="seconds each load process runs (default: %(default)s)")
    p.add_argument("--off-s", type=float, default=20.0, help="seconds it then sleeps (default: %(default)s)")
    p.add_argument("--name", default=None, help="results file name (default: profile_busy_PLATFORM-MODEL)")
    p.add_argument("--platform", default=None, help="results folder name (default: detected)")
    args = p.parse_args(argv)
    for k in ("repeats", "load_procs"):
        if getattr(args, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be at least 1, got {getattr(args, k)}")
    if args.on_s <= 0 or args.off_s < 0:
        p.error(f"--on-s must be positive and --off-s not negative, got {args.on_s} and {args.off_s}")
    return args


def main(argv=None) -> int:
    from mlxlab.core.environment import platform_name
    from mlxlab.core.results import command_line

    args = parse_args(argv)
    plat = args.platform or platform_name()
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    period = args.on_s + args.off_s
    loads = [subprocess.Popen([sys.executable, "-c", LOAD, str(args.on_s), str(args.off_s),
                               str(period * i / args.load_procs)], env=env)
             for i in range(args.load_procs)]
    try:
        cmd = [sys.executable, "-m", "mlxlab.cli", "profile", "--model", args.model, *GRID,
               "--repeats", str(args.repeats), "--platform", plat]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    finally:
        for proc in loads:
            proc.kill()
            proc.wait()
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        print(f"the profile failed (exit {out.returncode}); nothing written", file=sys.stderr)
        return out.returncode
    wrote = [line.split("wrote ", 1)[1].strip() for line in out.stdout.splitlines() if line.startswith("wrote ")]
    if not wrote:
        print("the profile printed no 'wrote PATH' line; nothing written", file=sys.stderr)
        return 1
    doc = json.loads(Path(wrote[-1]).read_text())
    doc["load"] = {"processes": args.load_procs, "on_s": args.on_s, "off_s": args.off_s,
                   "kind": "512x512 float32 numpy matmul loop, one OpenBLAS thread per process, phases spread evenly"}
    # the probe's own command line, as the one that re-runs this file (kept with its folder, which
    # the paper's provenance table reads as ``python -m probes.busy_profile``)
    doc.setdefault("environment", {})["argv"] = ["probes/busy_profile.py"] + (command_line(sys.argv) or [""])[1:]
    dest = ROOT / "data" / "results" / plat / f"{args.name or f'profile_busy_{plat}-{args.model}'}.json"
    dest.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"passes {doc.get('drift', {}).get('spread', float('nan')):.1%} apart; wrote {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
