"""Where the engine's and the simulator's plans part in a validation (no MLX: the paper reads it).

Both sides run the same policy, so on a workload whose requests all arrive at once they run the
same steps and the comparison is one of step costs (:func:`mlxlab.studies.sim_validation.scoring.compare_periods`).
On traces with timed arrivals a request that lands a few milliseconds earlier or later joins a
different step, and from there the two timelines differ by whole steps. :func:`plan_divergences`
finds the first step where they part; :func:`plan_summary` counts them, beside how often the
engine's own repeats part from each other.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

PLAN_FIELDS = ("phase", "decode_batch", "prefill_tokens")  # what a step did, as the policy chose it


def plan_divergences(result: dict, *, against_engine: bool = False) -> List[dict]:
    """Where the engine's and the simulator's plans part, per run of a validation and per repeat
    (engine repeat r against the simulation on profile share r, ``result["steps"]``): the first
    step whose phase, decode batch or prefill tokens differ, with each side's step and start time.
    Before it the two clocks ran the same steps, so their errors are step costs; from it on the
    policy reacted to a different timeline (a chat that finished before a document arrived on one
    side and not on the other), and a small cost error can move a tenant's TTFT by whole steps.
    ``step`` is None where the plans are the same throughout (``same_steps`` long). With
    ``against_engine`` the engine's first repeat is compared with each later repeat instead (the
    "sim" side is then that repeat): how often the engine's own plan moves between repeats."""
    steps = result.get("steps") or {}
    cols = steps.get("columns") or []
    if not cols:
        return []
    idx = [cols.index(f) for f in PLAN_FIELDS]
    t0 = cols.index("start_s")
    out = []
    for run, sides in steps.get("runs", {}).items():
        pairs = list(zip(sides.get("engine", []), sides.get("sim", [])))
        if against_engine:  # the engine's first repeat against each later one: its own plan noise
            e = sides.get("engine", [])
            pairs = [(e[0], x) for x in e[1:]]
        for r, (eng, sim) in enumerate(pairs, start=1 if against_engine else 0):
            n = min(len(eng), len(sim))
            at = next((i for i in range(n) if [eng[i][j] for j in idx] != [sim[i][j] for j in idx]), None)
            if at is None and len(eng) != len(sim):
                at = n
            rec = {"run": run, "repeat": r, "step": at, "same_steps": n if at is None else at,
                   "engine_steps": len(eng), "sim_steps": len(sim)}
            if at is not None:
                for name, side in (("engine", eng), ("sim", sim)):
                    s = side[at] if at < len(side) else None
                    rec[name] = None if s is None else dict(zip(PLAN_FIELDS, (s[j] for j in idx)))
                    rec[f"{name}_t_s"] = None if s is None else float(s[t0])
            out.append(rec)
    return out


def format_divergence(d: dict) -> str:
    """One line of :func:`plan_divergences`."""
    head = f"{d['run']:28s} repeat {d['repeat']}"
    if d["step"] is None:
        return f"{head}  same plan ({d['same_steps']} steps)"

    def side(name):
        s = d[name]
        return "ended" if s is None else f"{s['phase']} b{s['decode_batch']} +{s['prefill_tokens']} tokens at {d[name + '_t_s']:.3f} s"
    return f"{head}  plans part at step {d['step']}: engine {side('engine')} | sim {side('sim')}"


def plan_summary(result: dict) -> Dict[str, dict]:
    """:func:`plan_divergences` counted, for the standard workloads and the held-out traces
    (runs named ``heldout-*``): ``runs`` compared, ``same`` (the simulator ran the engine's plan
    throughout), ``parted_step_median`` (where the others part), and ``engine_pairs`` /
    ``engine_same``: the engine's first repeat against its later ones."""
    out = {}
    sim, own = plan_divergences(result), plan_divergences(result, against_engine=True)
    for group, pick in (("standard", lambda d: not d["run"].startswith("heldout-")),
                        ("heldout", lambda d: d["run"].startswith("heldout-"))):
        ds, es = [d for d in sim if pick(d)], [d for d in own if pick(d)]
        parted = [d["step"] for d in ds if d["step"] is not None]
        out[group] = {"runs": len(ds), "same": sum(d["step"] is None for d in ds),
                      "parted_step_median": float(np.median(parted)) if parted else None,
                      "engine_pairs": len(es), "engine_same": sum(d["step"] is None for d in es)}
    return out
