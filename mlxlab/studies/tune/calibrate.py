"""The profile's decode cost calibrated on tune's own solo run.

``mlxlab tune`` runs each tenant a relative SLO names alone on the engine (its ``solo`` figures), and
a lone chat is a run of batch-one decode steps: its ITL p50 is what one decode forward costs the
engine in this session, host work included. The device profile measures decode in its own rig, and
on the H100 the two parted by up to a quarter (coder-1.5b's chat alone: 4.1 ms a token measured,
3.3 ms simulated), so the simulated chat spent less time beside the documents than the engine's did
and met fewer of their chunks (``probes/tail_steps.py``: 11 of its gaps against 19-29 measured).
Moving the fixed cost of a decode forward (``decode_step``) until the simulated solo ITL p50 is the
measured one brought that count to 24-28 and the simulated p99 to 91-97 ms against 86-87 measured,
and over four stored H100 sweeps raised Kendall's tau on the SLO ratio in two (0.50 to 0.63, 0.78 to
0.88) and left it in two, the simulator's error on the SLO ratio falling in two (16% to 7%, 11% to 8%)
and moving a point in the others (``probes/solo_calibrate_sim.py``,
``data/results/sim-h100/solo_calibrate_sim.json``). The per-step host overhead cannot do it: a pipelined decode hides
it. The solo run is tune's own measurement, so the sweep that scores the ranking stays held out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence, Tuple

REF = {"label": "interleave-2048", "policy": "interleave", "chunk_size": 2048, "options": {}}  # the solo runs' setting


def solo_itl_p50(cost_model, arrivals: Sequence, limits: dict, tenant: str) -> float:
    """``tenant``'s ITL p50 alone (its arrivals only) simulated on ``cost_model`` with the solo runs'
    setting (:data:`REF`)."""
    from mlxlab.core.runner import run_workload
    from mlxlab.core.workload import TraceWorkload
    from mlxlab.sim.simulator import Simulator

    sim = Simulator(cost_model, policy=REF["policy"], chunk_size=REF["chunk_size"], **limits)
    wl = TraceWorkload([a for a in arrivals if a.tenant == tenant], name=tenant)
    return run_workload(sim, wl).summary[tenant]["itl_s"]["p50"]


def calibrate_decode(cost_model, arrivals: Sequence, limits: dict, tenant: str, measured_p50: float,
                     rounds: int = 24, simulate: Optional[Callable] = None) -> Tuple[object, dict]:
    """``cost_model`` with ``decode_step`` moved (not below 0) until ``tenant``'s simulated solo ITL
    p50 is ``measured_p50``, and the record of it: the tenant, the measured and simulated p50 (before,
    after) and ``decode_step`` (before, after), in seconds. The p50 grows with ``decode_step`` but not
    one for one, and in steps where the chats' decodes meet or part (pipelining hides a forward's cost
    where the host's work is longer), so the search brackets the measured p50 and bisects, ``rounds``
    simulations at most, and keeps the closest point it simulated: never farther than where it started.
    (Until 12-07 it added the gap to ``decode_step`` five times over, which on a CPU tune of the chat x8
    trace ended 3.3 ms off where it began 2.4 ms off: that simulated p50 jumps from 11.0 to 14.2 ms as
    ``decode_step`` passes 9.86 ms, across the measured 13.35; the search ends 0.84 ms off.) ``simulate(cost_model)``: the solo p50 of a model
    (default :func:`solo_itl_p50` on ``arrivals``)."""
    from mlxlab.core.costmodel import FEATURES

    i = FEATURES.index("decode_step")
    sim = simulate or (lambda m: solo_itl_p50(m, arrivals, limits, tenant))

    def at(x: float):
        coef = cost_model.coef.copy()
        coef[i] = max(0.0, x)
        m = dataclasses.replace(cost_model, coef=coef)
        return m, sim(m)

    x0 = float(cost_model.coef[i])
    before = sim(cost_model)
    best = (abs(before - measured_p50), x0, cost_model, before)
    lo, hi = (x0, None) if before <= measured_p50 else (None, x0)  # the bracket: p50(lo) <= measured < p50(hi)
    step = max(abs(measured_p50 - before), 1e-6)
    for _ in range(rounds):
        if best[0] < 1e-6:
            break
        if hi is None:  # widen upwards until the p50 passes the measured one
            x = lo + step
            step *= 2
        elif lo is None:  # widen downwards (not below 0)
            x = max(0.0, hi - step)
            step *= 2
        else:
            x = (lo + hi) / 2
        m, f = at(x)
        if abs(f - measured_p50) < best[0]:
            best = (abs(f - measured_p50), x, m, f)
        if f <= measured_p50:
            lo = x
        else:
            hi = x
        if lo is None and x == 0.0:  # the p50 stays above the measured one with no decode cost at all
            break
        if lo is not None and hi is not None and hi - lo < 1e-7:
            break
    _, x, cm, now = best
    return cm, {"tenant": tenant, "measured_itl_p50_s": measured_p50, "simulated_itl_p50_s": [before, now],
                "decode_step_s": [x0, float(max(0.0, x))]}


def calibrate_from_solos(cost_model, arrivals: Sequence, limits: dict, solos: dict,
                         say: Optional[Callable[[str], None]] = None) -> Tuple[object, Optional[dict]]:
    """:func:`calibrate_decode` on the first tenant (by name) with a solo ITL p50; the model as it
    was and None where no solo run has one (absolute SLOs only, or a tenant asking one token), or
    the model has no decode cost to move."""
    if not hasattr(cost_model, "coef"):
        return cost_model, None
    for t in sorted(solos):
        p50 = ((solos[t].get(t) or {}).get("itl_s") or {}).get("p50")
        if t != "all" and p50 is not None and math.isfinite(p50) and p50 > 0:
            cm, rec = calibrate_decode(cost_model, arrivals, limits, t, p50)
            if say is not None:
                say(f"[tune] decode cost calibrated on {t}'s solo run: ITL p50 {p50 * 1e3:.2f} ms measured, "
                    f"{rec['simulated_itl_p50_s'][0] * 1e3:.2f} ms simulated before, "
                    f"{rec['simulated_itl_p50_s'][1] * 1e3:.2f} ms after (decode_step "
                    f"{rec['decode_step_s'][0] * 1e3:.2f} -> {rec['decode_step_s'][1] * 1e3:.2f} ms)")
            return cm, {**rec, "cost_model": cm.as_dict()}
    return cost_model, None
