"""Decode modes: the batch-of-two decode step of the H200 validations, engine against profile.

The one simulator comparison that missed in all three H200 validations is the chats' ITL p50
under ``chat+batch`` / ``interleave``, whose median gap is a decode of the two chat rows. This
probe gathers every such step (two rows, no batch change, contexts summing to at most 6,000
tokens) from each validation file on record, beside the profile's ``decode b2 c32`` cell of
the same file, and writes their medians and a histogram figure. No device needed: the steps are
in the files (``validate_simulator`` keeps them).

Usage::

    python -m probes.decode_modes   # data/results/h200/decode_modes.json, paper/figures/decode_modes_h200.*
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from mlxlab.core.paths import ROOT
from mlxlab.core.results import results_dir
from mlxlab.notebook.plots import save_figure
from mlxlab.studies.sim_validation.charts import decode_periods_chart
from mlxlab.studies.sim_validation.scoring import decode_periods
from probes import common

RUN, BATCH, MAX_CONTEXT, CELL = "chat+batch/interleave", 2, 6000, "decode b2 c32"


def parse_args(argv=None):
    p = common.parser(__doc__, "decode_modes", model=None)
    p.set_defaults(platform="h200")
    return common.parse(p, argv)


def validations(folder: Path) -> list:
    """(path, document, written_at) of each validation run on file (re-scorings left out), in
    the order they ran."""
    docs = [(p, json.loads(p.read_text())) for p in folder.glob("sim_validation*.json")
            if not p.stem.endswith("_rescored")]
    return sorted(((p, d, d.get("environment", {}).get("written_at", "")) for p, d in docs), key=lambda x: x[2])


def medians_ms(runs: list) -> list:
    return [round(1e3 * statistics.median(r), 2) for r in runs if r]


def main(argv=None) -> int:
    args = parse_args(argv)
    samples, rows = {}, []
    for p, d, written in validations(results_dir(args.platform)):
        if RUN not in d.get("steps", {}).get("runs", {}) or not d.get("profile", {}).get("records"):
            continue
        s = decode_periods(d, RUN, BATCH, max_context=MAX_CONTEXT, profile_cell=CELL)
        if not any(s["profile"]):
            continue
        samples[f"{written[11:16]} {p.stem.replace('sim_validation', '').strip('_') or 'latest'}"] = s
        rows.append({"file": p.name, "engine_run_medians_ms": medians_ms(s["engine"]),
                     "sim_share_medians_ms": medians_ms(s["sim"]), "profile_share_medians_ms": medians_ms(s["profile"]),
                     "steps": sum(map(len, s["engine"]))})
        common.log("decode_modes", f"{p.name:45s} engine {rows[-1]['engine_run_medians_ms']}  "
                                   f"profile {rows[-1]['profile_share_medians_ms']}")
    common.save(args, "decode_modes", {"run": RUN, "batch": BATCH, "max_context": MAX_CONTEXT,
                                       "profile_cell": CELL, "rows": rows})
    chart = decode_periods_chart(samples, title=f"two-row decode steps, {RUN} ({args.platform})")
    for f in save_figure(chart, f"decode_modes_{args.platform}", ROOT / "paper" / "figures"):
        common.log("decode_modes", f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
