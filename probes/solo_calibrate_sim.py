"""Solo calibration: a stored tune's grid simulated again with the cost model's fixed decode cost
moved so the simulation of the tenant's solo run matches the solo run tune measured.

``mlxlab tune`` runs the SLO's tenant alone on the engine for its relative bounds (``solo``), a
decode-only run of batch one whose ITL is one step plus the per-step host overhead. On the H100
files the simulator put that tenant's decode faster than the engine ran it in the same session
(coder-1.5b's chat: 3.3 ms simulated against 4.1 ms measured alone), and a chat that decodes more
slowly spends longer beside the documents: ``probes/tail_steps.py`` counted 19-29 of its gaps
meeting a document's chunk on the engine against 11 simulated. This asks, with no device, whether
moving every decode forward's fixed cost (``decode_step``) by the difference orders the grid as
the engine did: Kendall's tau and the median errors against the measured sweep,
as the ``mlx-tune-rank`` verdict computes them, before and after. ``mlxlab tune`` calibrates so
since (:mod:`mlxlab.studies.tune.calibrate`); this re-simulates the sweeps stored before it.

Usage::

    python -m probes.solo_calibrate_sim data/results/h100/tune_*.json

Prints a table and writes ``solo_calibrate_sim.json`` to a new run folder
(``data/results/sim-<platform>/runs/<time>/``, ignored by git; ``--save``: ``data/results/sim-<platform>/``,
the platform the tunes ran on).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from probes import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m probes.solo_calibrate_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tunes", nargs="+", help="tune.json files with a whole sweep, profile.cost_model and a solo run")
    p.add_argument("--tenant", default="chat", help="whose solo run calibrates (default: %(default)s)")
    p.add_argument("--traces", default="data/traces/samples", help="the folder holding the tunes' trace files")
    p.add_argument("--save", action="store_true",
                   help="write data/results/sim-<platform>/solo_calibrate_sim.json (the paper's), not a run folder")
    return common.parse(p, argv)


def solo_itl_p50(point: dict, cost_model, tenant: str) -> float:
    """The tenant's ITL p50 alone on ``cost_model``, as tune's solo run
    (:func:`mlxlab.studies.tune.calibrate.solo_itl_p50`)."""
    from mlxlab.studies.tune.calibrate import solo_itl_p50 as solo

    return solo(cost_model, point["arrivals"], point["limits"], tenant)


def calibrated(doc: dict, point: dict, tenant: str):
    """The profile's fitted cost model calibrated on the stored solo run as tune now does
    (:func:`mlxlab.studies.tune.calibrate.calibrate_decode`), and how far ``decode_step`` moved."""
    from mlxlab.core.costmodel import StepCostModel
    from mlxlab.studies.tune.calibrate import calibrate_decode

    fitted = StepCostModel.from_dict(doc["profile"]["cost_model"])
    cm, rec = calibrate_decode(fitted, point["arrivals"], point["limits"], tenant,
                               doc["solo"][tenant][tenant]["itl_s"]["p50"])
    return cm, rec["decode_step_s"][1] - rec["decode_step_s"][0]


def grid_rows(doc: dict, point: dict, cost_model) -> list:
    """The grid simulated on ``cost_model``: the rows the rank verdict scores."""
    from mlxlab.studies.tune.run import simulate_setting

    out = []
    for g in doc["grid"]:
        r = simulate_setting({**point, "cost_model": cost_model,
                              "setting": {k: g[k] for k in ("label", "policy", "chunk_size", "options")}})
        out.append({"label": g["label"], "objective_s": r["objective_s"], "slo_ratio": r["slo_ratio"],
                    "meets": r["meets"]})
    return out


def chunk_gaps(point: dict, doc: dict, cost_model, tenant: str, labels=("interleave-4096", "admission_gate-4096")) -> dict:
    """For the grid's settings among ``labels``: how many of ``tenant``'s gaps a chunk ended inside
    and its ITL p99 in seconds, simulated on ``cost_model`` (``probes/tail_steps.py`` measured these)."""
    from mlxlab.sim.simulator import Simulator
    from probes.tail_steps import replay

    out = {}
    for g in (g for g in doc["grid"] if g["label"] in labels):
        sim = Simulator(cost_model, policy=g["policy"], chunk_size=int(g["chunk_size"]),
                        **{**point["limits"], **g["options"]})
        r = replay(sim, point["arrivals"], tenant, cost_model, 1)["gaps"]
        out[g["label"]] = {"chunk_gaps": r["chunk"]["n"], "itl_p99_s": r["p99_s"]}
    return out


def picks(rows: list, k: int) -> list:
    """The ``k`` settings tune would confirm from these simulated rows (those meeting every SLO
    first, by the objective; then by the worst SLO ratio), as :func:`mlxlab.studies.tune.run.tune`."""
    ranked = sorted(rows, key=lambda r: (not r["meets"], r["objective_s"] if r["meets"] else r["slo_ratio"]))
    return [r["label"] for r in ranked[:k]]


def main(argv=None) -> int:
    from probes.warm_carry_sim import score, sweep_files

    args = parse_args(argv)
    files, plat = [], None
    print(f"{'file':48s} {'solo p50 ms (meas/sim)':>22s} {'decode_step ms':>14s} {'tau SLO':>9s} {'tau obj':>9s} "
          f"{'err obj':>9s} {'err SLO':>9s}")
    def need(doc):
        return None if args.tenant in (doc.get("solo") or {}) else f"no solo run of {args.tenant}"

    for path, doc, point, where in sweep_files(args.tunes, args.traces, need):
        plat = plat or where
        cm2, delta = calibrated(doc, point, args.tenant)
        stored = [{k: g[k] for k in ("label", "objective_s", "slo_ratio", "meets")} for g in doc["grid"]]
        rows = grid_rows(doc, point, cm2)
        before, after = score(doc, stored), score(doc, rows)
        k = int(doc["parameters"].get("top_k") or 3)
        best = next(v for v in doc["verdicts"] if v["claim"] == "mlx-tune-regret")["measured"]["best"]
        for s_, r_, c_ in ((before, stored, point["cost_model"]), (after, rows, cm2)):
            s_["picks"] = picks(r_, k)
            s_["sweep_best_picked"] = best in s_["picks"]
            s_["tail"] = chunk_gaps(point, doc, c_, args.tenant)
        meas = doc["solo"][args.tenant][args.tenant]["itl_s"]["p50"]
        sims = [solo_itl_p50(point, c, args.tenant) for c in (point["cost_model"], cm2)]
        steps = [c.coefficients()["decode_step"] for c in (point["cost_model"], cm2)]
        for way, s, sim, st in zip(("stored", "calibrated"), (before, after), sims, steps):
            print(f"{Path(path).name + ' ' + way:48s} {meas * 1e3:10.2f} / {sim * 1e3:<9.2f} {st * 1e3:14.2f} "
                  f"{s['tau_slo']:9.2f} {s['tau_objective']:9.2f} {s['sim_error_objective']:9.0%} "
                  f"{s['sim_error_slo_ratio']:9.0%}  confirms {', '.join(s['picks'])}"
                  + (" (the sweep's best among them)" if s["sweep_best_picked"] else ""))
        files.append({"tune": Path(path).name, "solo_itl_p50_s": meas, "simulated_solo_itl_p50_s": sims,
                      "decode_step_s": steps, "moved_s": delta, "sweep_best": best,
                      "stored": before, "calibrated": after})
    if not files:
        raise SystemExit("no tune file with a whole sweep and a solo run")
    plat = f"sim-{plat}"  # a re-simulation of that platform's sweeps, made here: not a measurement of it
    common.save_over_stored("solo_calibrate_sim", {"tenant": args.tenant, "files": files}, plat, save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
