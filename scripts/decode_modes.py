#!/usr/bin/env python3
"""Decode modes: the batch-of-two decode step of the H200 validations, engine against profile.

The one simulator comparison that missed in all three H200 validations is the chats' ITL p50
under ``chat+batch`` / ``interleave``, whose median gap is a decode of the two chat rows. This
script gathers every such step (two rows, no batch change, contexts summing to at most 6,000
tokens) from each validation file on record, beside the profile's ``decode b2 c32`` cell of
the same file, and writes their medians and a histogram figure. No device needed: the steps are
in the files (``validate_simulator`` keeps them).

Usage::

    python scripts/decode_modes.py        # data/results/h200/decode_modes.json, paper/figures/decode_modes_h200.*
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxlab.core.paths import data_dir
from mlxlab.core.results import save_results  # noqa: E402
from mlxlab.studies.sim_validation import decode_periods, decode_periods_chart, save_chart  # noqa: E402

RUN, BATCH, MAX_CONTEXT, CELL = "chat+batch/interleave", 2, 6000, "decode b2 c32"


def main() -> int:
    folder = data_dir() / "results" / "h200"
    files = [p for p in folder.glob("sim_validation*.json") if not p.stem.endswith("_rescored")]
    written = {p: json.loads(p.read_text()).get("environment", {}).get("written_at", "") for p in files}
    files.sort(key=written.get)  # in the order they ran
    samples, rows = {}, []
    for p in files:
        d = json.loads(p.read_text())
        if RUN not in d.get("steps", {}).get("runs", {}) or not d.get("profile", {}).get("records"):
            continue
        s = decode_periods(d, RUN, BATCH, max_context=MAX_CONTEXT, profile_cell=CELL)
        if not any(s["profile"]):
            continue
        samples[f"{written[p][11:16]} {p.stem.replace('sim_validation', '').strip('_') or 'latest'}"] = s
        med = lambda runs: [round(1e3 * statistics.median(r), 2) for r in runs if r]  # noqa: E731
        rows.append({"file": p.name, "engine_run_medians_ms": med(s["engine"]), "sim_share_medians_ms": med(s["sim"]),
                     "profile_share_medians_ms": med(s["profile"]), "steps": sum(map(len, s["engine"]))})
        print(f"{p.name:45s} engine {rows[-1]['engine_run_medians_ms']}  profile {rows[-1]['profile_share_medians_ms']}")
    out = save_results("decode_modes", {"kind": "decode_modes", "run": RUN, "batch": BATCH, "max_context": MAX_CONTEXT,
                                        "profile_cell": CELL, "rows": rows}, platform="h200")
    figs = save_chart(decode_periods_chart(samples, title=f"two-row decode steps, {RUN} (h200)"), "decode_modes_h200")
    print(f"wrote {out} and {[str(f) for f in figs]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
