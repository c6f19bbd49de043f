"""Does a profile repeat? The same workloads simulated on two or more profiles of one machine (no
MLX, no device).

Two ``mlxlab profile`` runs in a row on one machine should give simulations within a few percent
of each other, or the profile itself moves the answer as much as the simulator's error does.
:func:`profile_spread` runs every standard validation workload under every policy, and any
held-out cases (:mod:`mlxlab.studies.sim_validation.heldout`), on the simulator once per profile, and
reports per tenant and metric the spread of the simulated values, ``(max - min) / median``, and
per metric its median and maximum over the rows.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from mlxlab.core.runner import run_workload
from mlxlab.sim.simulator import Simulator
from mlxlab.studies.sim_validation.heldout import HeldOutCase
from mlxlab.studies.sim_validation.scoring import METRICS, metric


def profile_spread(cost_models: Dict[str, object], model, workloads: Dict[str, object],
                   policies: Sequence[str], chunk_size: int, heldout: Sequence[HeldOutCase] = ()) -> dict:
    """``cost_models``: label -> cost model (two or more); ``model``: a preset config dict or
    loaded model (its vocabulary and context); ``workloads``: name -> workload, each run under
    every policy at ``chunk_size``; ``heldout``: cases run under their own policy and options.
    Returns ``{"profiles", "table", "summary"}``: a row per (workload, policy, tenant, metric)
    with ``values`` (one per profile, in order) and ``spread``; per metric ``median_spread``,
    ``max_spread``, ``n``."""
    if len(cost_models) < 2:
        raise ValueError(f"a spread needs two or more profiles, got {len(cost_models)}")
    vocab = int(model["vocab_size"]) if isinstance(model, dict) else int(model.vocab_size)
    runs = [(w, wl, p, chunk_size, {}) for w, wl in workloads.items() for p in policies]
    runs += [(c.name, c.workload(vocab), c.policy, c.chunk_size, c.options) for c in heldout]
    rows: List[dict] = []
    for wname, wl, policy, chunk, options in runs:
        sums = [run_workload(Simulator.for_model(model, cm, policy=policy, chunk_size=chunk, **options), wl).summary
                for cm in cost_models.values()]
        for tenant in [t for t in sums[0] if t != "all"]:
            for key, stat, label in METRICS:
                vals = [metric(s, tenant, key, stat) for s in sums]
                if not all(np.isfinite(vals)) or min(vals) <= 0:
                    continue
                rows.append({"workload": wname, "policy": policy, "tenant": tenant, "metric": label,
                             "heldout": wname in {c.name for c in heldout}, "values": vals,
                             "spread": float((max(vals) - min(vals)) / np.median(vals))})
    summary = {}
    for _, _, label in METRICS:
        sp = [r["spread"] for r in rows if r["metric"] == label]
        if sp:
            summary[label] = {"median_spread": float(np.median(sp)), "max_spread": float(max(sp)), "n": len(sp)}
    return {"profiles": list(cost_models), "table": rows, "summary": summary}


def format_spread(result: dict) -> str:
    """The spread table as fixed-width text."""
    lines = [f"profiles: {', '.join(result['profiles'])}",
             f"{'workload':14s} {'policy':15s} {'tenant':6s} {'metric':11s} {'values (ms)':>30s} {'spread':>7s}"]
    for r in result["table"]:
        vals = " ".join(f"{v * 1e3:9.2f}" for v in r["values"])
        lines.append(f"{r['workload']:14s} {r['policy']:15s} {r['tenant']:6s} {r['metric']:11s} {vals:>30s} "
                     f"{r['spread']:7.1%}")
    for label, s in result["summary"].items():
        lines.append(f"{label:11s} spread median {s['median_spread']:.1%}, max {s['max_spread']:.1%} ({s['n']} rows)")
    return "\n".join(lines)
