"""Whether ``mlxlab tune`` can be trusted (``mlxlab tune --sweep``): the exhaustive engine sweep of
the same grid on the same trace, and the claims it decides from stored data.

* ``mlx-tune-regret``: how much worse the tuned choice is on the engine than the best setting the
  sweep found meeting the SLOs, on the objective (medians over the sweep's repeats, both measured
  in the sweep, so one set of conditions), or where none met them on the binding SLO's ratio; above
  the target, inconclusive where the two settings' ranges over the sweep's repeats overlap on that
  metric (for the ratio, each whole repeat's run scored alone: :func:`ratio_range`);
* ``mlx-tune-rank``: Kendall's tau between the simulated and the measured ranking of the grid, on
  the objective and on the binding SLO's ratio (the smaller of the two decides); below the target,
  inconclusive when every pair the simulator orders against the engine is a pair whose measured
  repeats overlap (the sweep itself cannot order them; for the SLO ratio, each repeat's run scored
  alone: :func:`ratio_range`), not reproduced when one is not; beside it, :func:`agreement`: how well
  the sweep's own repeats order the grid against each other, and the simulation each repeat alone;
* ``mlx-tune-speed``: tune's wall time (profile, simulation, confirmation) over the sweep's.

Regret is decided on the choice the file stores (what tune recommended when it ran). Where this
code's :func:`mlxlab.studies.tune.slo.choose` picks another setting from the same stored
confirmation, :func:`evaluation` says which and what its regret would be (``rechosen``): context for
a change of the choice rule, not a verdict.

The simulator's absolute error on the grid (median over settings of |simulated - measured| /
measured) is kept beside them. Importing this module loads no MLX.
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Mapping, Optional

REGRET_MAX = 0.05
TAU_MIN = 0.8
SPEED_MAX = 0.2


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def kendall_tau(a: List[float], b: List[float]) -> Optional[float]:
    """Kendall's tau-b of two rankings (scipy); None with fewer than 3 finite pairs or no spread."""
    from scipy.stats import kendalltau

    pairs = [(x, y) for x, y in zip(a, b) if _finite(x) and _finite(y)]
    if len(pairs) < 3:
        return None
    t = kendalltau([p[0] for p in pairs], [p[1] for p in pairs]).statistic
    return None if t is None or math.isnan(t) else float(t)


def discordant(sim: List[float], meas: List[float], ranges: List[Optional[List[float]]],
               labels: List[str]) -> List[dict]:
    """The pairs the simulated values order one way and the measured ones the other, each with
    whether its measured repeat ranges overlap (``ranges[i]`` None: unknown, taken as separate)."""
    out = []
    for i in range(len(sim)):
        for j in range(i + 1, len(sim)):
            if not all(_finite(x) for x in (sim[i], sim[j], meas[i], meas[j])):
                continue
            if (sim[i] - sim[j]) * (meas[i] - meas[j]) < 0:
                a, b = ranges[i], ranges[j]
                overlap = bool(a and b and a[0] <= b[1] and b[0] <= a[1])
                out.append({"pair": [labels[i], labels[j]], "measured_overlap": overlap,
                            "measured_gap": abs(meas[i] - meas[j]) / min(meas[i], meas[j]) if min(meas[i], meas[j]) > 0
                            else None})
    return out


def repeat_ratios(doc: Mapping, label: str) -> List[float]:
    """The binding SLO's ratio of each of ``label``'s whole sweep repeats (its stored runs scored
    against the stored SLOs and solo figures), in repeat order; empty without runs or SLOs."""
    from mlxlab.studies.tune.slo import check, parse_slo, worst_ratio

    sweep = doc.get("sweep") or {}
    runs = ((sweep.get("runs") or {}).get(label) or [])[:sweep.get("repeats") or 0]
    if not runs or not doc.get("slos"):
        return []
    slos = [parse_slo(t) for t in doc["slos"]]
    return [v for v in (worst_ratio(check(run, slos, doc.get("solo") or {})) for run in runs) if _finite(v)]


def ratio_range(doc: Mapping, label: str) -> Optional[List[float]]:
    """:func:`repeat_ratios` as ``[min, max]``; None without runs or SLOs."""
    vals = repeat_ratios(doc, label)
    return [min(vals), max(vals)] if vals else None


def agreement(doc: Mapping) -> dict:
    """How well the sweep's own whole repeats order the grid against each other, beside how well the
    simulation orders each of them: per metric (``objective``, ``slo``: the binding SLO's ratio, each
    run scored alone), ``repeats``, the median Kendall's tau over the pairs of repeats, and
    ``simulated``, the median over the repeats of the simulation's tau against that repeat alone.
    Like for like: one engine run against another, the simulation against one engine run. Context
    for the rank claim, not a rule of it: where the engine's runs order the settings against each
    other far below the bound, the medians the claim compares with rest on that noise. Empty without
    two whole repeats of three settings."""
    from mlxlab.studies.tune.slo import check, figure, parse_objective, parse_slo, worst_ratio

    sweep = doc.get("sweep") or {}
    reps, runs = sweep.get("repeats") or 0, sweep.get("runs") or {}
    sim = {r["label"]: r for r in doc.get("grid") or []}
    labels = [lb for lb in runs if lb in sim and len(runs[lb]) >= reps]
    if reps < 2 or len(labels) < 3 or not doc.get("slos") or not doc.get("objective"):
        return {}
    slos, (tenant, metric) = [parse_slo(t) for t in doc["slos"]], parse_objective(doc["objective"])
    score = {"objective": lambda run: figure(run, tenant, metric),
             "slo": lambda run: worst_ratio(check(run, slos, doc.get("solo") or {}))}
    simulated = {"objective": [sim[lb]["objective_s"] for lb in labels], "slo": [sim[lb]["slo_ratio"] for lb in labels]}
    out = {}
    for k, f in score.items():
        vals = [[f(runs[lb][r]) for lb in labels] for r in range(reps)]
        pairs = [t for t in (kendall_tau(vals[a], vals[b]) for a in range(reps) for b in range(a + 1, reps))
                 if t is not None]
        sims = [t for t in (kendall_tau(simulated[k], v) for v in vals) if t is not None]
        out[k] = {"repeats": statistics.median(pairs) if pairs else None,
                  "simulated": statistics.median(sims) if sims else None}
    return out


def rechosen(doc: Mapping, rows: List[dict], best: Optional[dict], key: str) -> Optional[dict]:
    """This code's choice from ``doc``'s stored confirmation where it is not the stored one:
    ``label``, ``why``, its ``regret`` against the sweep's ``best`` on ``key`` (as the stored
    choice's is scored) and its sweep ``objective_s`` beside the stored choice's. None where the
    two agree or the confirmation predates the worst-repeat checks."""
    from mlxlab.studies.tune.slo import choose

    conf = [r for r in doc.get("confirmed") or [] if r.get("policy") != "mlx_lm.BatchGenerator"]
    if not conf or not all("checks_worst" in r for r in conf):
        return None
    now, stored = choose(conf), (doc.get("choice") or {}).get("label")
    if now.label is None or now.label == stored:
        return None
    mine = next((r for r in rows if r["label"] == now.label), None)
    was = next((r for r in rows if r["label"] == stored), None)
    return {"label": now.label, "why": now.why,
            "regret": mine[key] / best[key] - 1.0 if mine and best and best[key] > 0 else None,
            "objective_s": mine["objective_s"] if mine else None,
            "stored_objective_s": was["objective_s"] if was else None}


def evaluation(doc: Mapping) -> dict:
    """The figures the claims need, from a ``tune.json`` with its ``sweep`` block."""
    sweep = doc.get("sweep") or {}
    rows = sweep.get("rows") or []
    sim = {r["label"]: r for r in doc.get("grid") or []}
    label = (doc.get("choice") or {}).get("label")
    feasible = [r for r in rows if r.get("meets_worst")] or [r for r in rows if r.get("meets")]
    mine = next((r for r in rows if r["label"] == label), None)
    # with settings meeting the SLOs, regret is on the objective among them; with none, tune picks the
    # setting closest to its bounds, and regret is on that: the binding SLO's ratio
    key = "objective_s" if feasible else "slo_ratio"
    pool = feasible or [r for r in rows if _finite(r.get("slo_ratio"))]
    best = min(pool, key=lambda r: r[key]) if pool else None
    out: dict = {"settings": len(rows), "choice": label, "best": best["label"] if best else None,
                 "feasible": len(feasible), "regret_on": "objective" if feasible else "binding SLO ratio"}
    if best and mine and best[key] > 0:
        out["regret"] = mine[key] / best[key] - 1.0
        out["choice_meets"] = bool(mine.get("meets"))
        # among the settings the regret is taken over (on the objective: those that met the SLOs in every
        # repeat, else at the median); one outside them missed an SLO where they did not, whatever its objective
        out["choice_in_pool"] = mine in pool
        out["choice_meets_worst"] = bool(mine.get("meets_worst"))
        if mine not in pool:  # how often it missed: each whole repeat's run scored alone
            out["choice_repeat_ratios"] = repeat_ratios(doc, label)
        if feasible:
            out["choice_range_s"], out["best_range_s"] = mine["objective_range_s"], best["objective_range_s"]
        else:  # the binding SLO's ratio over the sweep's whole repeats, each run scored alone
            out["choice_ratio_range"], out["best_ratio_range"] = ratio_range(doc, label), ratio_range(doc, best["label"])
    again = rechosen(doc, rows, best, key)
    if again:
        out["rechosen"] = again
    both = [(sim[r["label"]], r) for r in rows if r["label"] in sim]
    out["tau_objective"] = kendall_tau([s["objective_s"] for s, _ in both], [m["objective_s"] for _, m in both])
    out["tau_slo"] = kendall_tau([s["slo_ratio"] for s, _ in both], [m["slo_ratio"] for _, m in both])
    labels = [m["label"] for _, m in both]
    out["discordant_objective"] = discordant([s["objective_s"] for s, _ in both], [m["objective_s"] for _, m in both],
                                             [m.get("objective_range_s") for _, m in both], labels)
    out["discordant_slo"] = discordant([s["slo_ratio"] for s, _ in both], [m["slo_ratio"] for _, m in both],
                                       [ratio_range(doc, m["label"]) for _, m in both], labels)
    errs = [abs(s["objective_s"] - m["objective_s"]) / m["objective_s"] for s, m in both
            if _finite(s["objective_s"]) and _finite(m["objective_s"]) and m["objective_s"] > 0]
    serr = [abs(s["slo_ratio"] - m["slo_ratio"]) / m["slo_ratio"] for s, m in both
            if _finite(s["slo_ratio"]) and _finite(m["slo_ratio"]) and m["slo_ratio"] > 0]
    out["agreement"] = agreement(doc)
    out["sim_error_objective"] = statistics.median(errs) if errs else None
    out["sim_error_slo_ratio"] = statistics.median(serr) if serr else None
    tw, sw = (doc.get("wall_s") or {}).get("total"), sweep.get("wall_s")
    out["tune_wall_s"], out["sweep_wall_s"] = tw, sw
    if sweep.get("repeats_planned") and _finite(sw) and 0 < (sweep.get("repeats") or 0) < sweep["repeats_planned"]:
        # a sweep the time budget cut short: its wall time at the repeats it was asked for, as tune ran them
        sw = sw * sweep["repeats_planned"] / sweep["repeats"]
        out["sweep_wall_s_planned"] = sw
    out["speed_x"] = tw / sw if _finite(tw) and _finite(sw) and sw > 0 else None
    return out


def _fair(doc: Mapping) -> str:
    t, sw = (doc.get("trace") or {}), (doc.get("sweep") or {})
    order = "an order shuffled per repeat" if sw.get("order") == "shuffle" else "rotating order"
    return (f"Tune and the sweep on one model object and one trace ({t.get('requests', '?')} requests, "
            f"{t.get('format', '?')} format), the sweep running every grid setting "
            f"{sw.get('repeats', '?')} times in {order} after tune; the trace was never "
            f"used to fit the profile (a fixed device grid).")


def tune_verdicts(doc: Mapping) -> List[Dict]:
    from mlxlab.core.claims import verdict

    e = evaluation(doc)
    fair = _fair(doc)
    if not doc.get("sweep"):
        why = "no exhaustive engine sweep in these results (mlxlab tune --sweep)"
        return [verdict(c, "not measured", measured=None, rule=why, fairness=fair)
                for c in ("mlx-tune-regret", "mlx-tune-rank", "mlx-tune-speed")]
    if (doc["sweep"].get("repeats") or 0) < 2:
        why = (f"the exhaustive sweep has {doc['sweep'].get('repeats') or 0} whole repeat(s) of the "
               f"{doc['sweep'].get('repeats_planned', '?')} asked for; its ranges need two (mlxlab tune --resume FILE "
               f"runs the rest)")
        return [verdict(c, "not measured", measured=None, rule=why, fairness=fair)
                for c in ("mlx-tune-regret", "mlx-tune-rank", "mlx-tune-speed")]
    out = []
    rule = (f"The chosen setting's objective over the best SLO-meeting setting's, both medians of the sweep's engine "
            f"repeats, less 1 (where no setting met the SLOs, the same on the binding SLO's ratio, which tune then "
            f"brings closest to its bound). Reproduced at most {REGRET_MAX:.0%}; inconclusive above it while the two "
            f"settings' ranges over the repeats overlap on that metric (the objective, or the SLO ratio of each "
            f"whole repeat's run scored alone: the sweep cannot tell them apart); not reproduced otherwise. "
            f"SLO-meeting: met every SLO in every repeat of the sweep where any setting did, else at the median. A "
            f"choice outside those settings is not within 5% of them whatever its objective: inconclusive where it "
            f"met the SLOs at the median but not in every repeat (the repeats disagree on it), else not reproduced.")
    if e.get("regret") is None:
        out.append(verdict("mlx-tune-regret", "not measured", measured=e, rule=rule, fairness=fair))
    else:
        mine, best = ((e.get("choice_range_s"), e.get("best_range_s")) if "choice_range_s" in e
                      else (e.get("choice_ratio_range"), e.get("best_ratio_range")))
        overlap = bool(mine and best and mine[0] <= best[1] and best[0] <= mine[1])
        v = "reproduced" if e["regret"] <= REGRET_MAX else "inconclusive" if overlap else "not reproduced"
        if not e.get("choice_in_pool", True):
            v = "inconclusive" if e.get("choice_meets") and not e.get("choice_meets_worst") else "not reproduced"
        out.append(verdict("mlx-tune-regret", v, measured={**e, "within_noise": v == "inconclusive"}, rule=rule,
                           fairness=fair))
    taus = [t for t in (e["tau_objective"], e["tau_slo"]) if t is not None]
    rule = (f"Kendall's tau-b between the simulated and the measured values over the sweep's settings, on the "
            f"objective and on the binding SLO's ratio; reproduced when both are at least {TAU_MIN:g}. Below it, "
            f"inconclusive when every pair the simulator orders against the engine, on each metric below "
            f"{TAU_MIN:g}, has overlapping measured repeats (the sweep could not order those pairs either; the "
            f"SLO ratio's range: each whole repeat's run scored alone); not reproduced otherwise.")
    if not taus:
        rank = "not measured"
    elif min(taus) >= TAU_MIN:
        rank = "reproduced"
    else:
        low = [k for k, t in (("objective", e["tau_objective"]), ("slo", e["tau_slo"])) if t is not None and t < TAU_MIN]
        noise = all(d["measured_overlap"] for k in low for d in e[f"discordant_{k}"])
        rank = "inconclusive" if noise else "not reproduced"
    out.append(verdict("mlx-tune-rank", rank, measured={**e, "within_noise": rank == "inconclusive"}, rule=rule,
                       fairness=fair))
    rule = (f"Tune's wall time over the exhaustive sweep's (a sweep the time budget stopped early: its wall time "
            f"scaled to the repeats asked for); reproduced at most {SPEED_MAX:g}.")
    out.append(verdict("mlx-tune-speed", "not measured" if e["speed_x"] is None else
                       ("reproduced" if e["speed_x"] <= SPEED_MAX else "not reproduced"), measured=e, rule=rule,
                       fairness=fair))
    return out


def decide_stored(doc: dict, path=None) -> List[Dict]:
    return tune_verdicts(doc)
