"""Simulated draws on a saved validation's held-out traces (no device): does simulating several
timelines instead of one narrow the held-out errors?

A held-out trace's engine runs take different plans from one repeat to the next
(:mod:`mlxlab.studies.sim_validation.divergence`), so its metrics are draws from several timelines. This re-runs
the simulator on each refitted profile share of a saved validation in three ways and scores each
against the saved engine side, as ``validate-sim --rescore`` does:

* ``one``: one simulation per share (what ``validate-sim`` does);
* ``step noise S``: five seeded draws per share, every step's cost times an independent
  log-normal factor of spread S (the simulator's ``noise`` option);
* ``pace S``: five draws per share, every step of a draw scaled by one factor (the quintiles of
  a log-normal of spread S): a machine running faster or slower for a whole run, as the lone-chat
  sentinels between runs show.

Usage::

    python -m probes.sim_draws data/results/cpu/sim_validation_heldout.json
    python -m probes.sim_draws data/results/h200/sim_validation.json --platform h200

Writes ``data/results/<platform>/sim_draws.json``: per setting, the held-out summary (median and
worst relative error per metric).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from mlxlab.sim.fit import cell_medians, fit_cost_model, mark_cold_chunks
from mlxlab.studies.sim_validation import scoring as SS
from probes import common

QUINTILES = np.array([-1.28, -0.52, 0.0, 0.52, 1.28])  # z of five equally likely draws' midpoints


def parse_args(argv=None):
    p = common.parser(__doc__, "sim_draws", model=None)
    p.add_argument("validation", type=Path, help="a saved validate-sim --held-out results file")
    p.add_argument("--spreads", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    return common.parse(p, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = json.loads(args.validation.read_text())
    if not result.get("heldout"):
        raise SystemExit(f"{args.validation}: no held-out traces (run validate-sim --held-out N)")
    cms = [fit_cost_model(cell_medians(mark_cold_chunks(s, warm=i == 0)))
           for i, s in enumerate(SS.profile_shares(result["profile"]["records"]))]

    def paced(cm, f):
        c = copy.deepcopy(cm)
        c.coef = cm.coef * f
        return c

    settings = {"one": lambda cm: [(cm, {})]}
    for s in args.spreads:
        settings[f"step noise {s}"] = lambda cm, s=s: [(cm, {"noise": s, "seed": k}) for k in range(5)]
        settings[f"pace {s}"] = lambda cm, s=s: [(paced(cm, f), {}) for f in np.exp(s * QUINTILES)]
    out = {}
    for name, variants in settings.items():
        held = SS._rescored_heldout(result, cms, result["config"], lambda line: None, {}, variants)
        out[name] = {m: {"median_rel_error": v["median_rel_error"], "max_rel_error": v["max_rel_error"]}
                     for m, v in held["summary"].items()}
        common.log("sim_draws", f"{name:16s} " + "  ".join(
            f"{m} {v['median_rel_error']:.1%} (worst {v['max_rel_error']:.1%})" for m, v in out[name].items()))
    common.save(args, "sim_draws", {"source": str(args.validation), "settings": out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
