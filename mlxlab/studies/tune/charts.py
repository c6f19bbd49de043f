"""The figure of ``mlxlab tune``: every grid setting on the plane of the binding SLO (its figure over
its bound: left of 1 meets every SLO) against the objective, simulated (hollow) and, for the
confirmed ones, measured on the engine (filled, bars spanning the repeats, a line from each
simulated point to its measurement), mlx-lm's ``BatchGenerator`` as measured, the SLO region
shaded, the Pareto frontier of the simulation drawn, and the choice ringed."""

from __future__ import annotations

import math
from typing import Mapping

import altair as alt
import pandas as pd

from mlxlab.notebook.plots import PALETTE, use_theme
from mlxlab.studies.tune.run import BASELINE

use_theme()


def _ms(v) -> float:
    return float("nan") if v is None or not math.isfinite(v) else 1e3 * v


def tune_chart(doc: Mapping) -> alt.LayerChart:
    sim = pd.DataFrame([{"label": r["label"], "x": r["slo_ratio"], "y": _ms(r["objective_s"]),
                         "policy": r["policy"], "frontier": r["label"] in doc.get("frontier", [])}
                        for r in doc.get("grid", []) if math.isfinite(r["slo_ratio"])])
    conf = pd.DataFrame([{"label": r["label"], "x": r["slo_ratio"], "y": _ms(r["objective_s"]),
                          "lo": _ms(r["objective_range_s"][0]), "hi": _ms(r["objective_range_s"][1]),
                          "policy": "mlx-lm" if r["policy"] == BASELINE else r["policy"],
                          "sx": next((g["slo_ratio"] for g in doc.get("grid", []) if g["label"] == r["label"]), None),
                          "sy": _ms(r.get("sim_objective_s"))}
                         for r in doc.get("confirmed", []) if math.isfinite(r["slo_ratio"])])
    if sim.empty and conf.empty:
        raise ValueError("nothing to draw: no setting has a finite SLO ratio")
    xs = list(sim["x"]) + list(conf["x"]) + [1.0]
    ys = [v for v in list(sim["y"]) + list(conf.get("lo", [])) + list(conf.get("hi", [])) if math.isfinite(v)]
    xdom = [0, max(xs) * 1.1]
    ydom = [0, max(ys) * 1.1 if ys else 1]
    x = alt.X("x:Q", scale=alt.Scale(domain=xdom), title="binding SLO: its figure over its bound (≤ 1 meets every SLO)")
    y = alt.Y("y:Q", scale=alt.Scale(domain=ydom), title=f"objective: {doc.get('objective', '?')} (ms)")
    policies = sorted(set(sim.get("policy", [])) | set(conf.get("policy", [])))
    color = alt.Color("policy:N", scale=alt.Scale(domain=policies, range=[
        "#7f8c8d" if p == "mlx-lm" else PALETTE[i % len(PALETTE)] for i, p in enumerate(policies)]), title="policy")
    region = alt.Chart(pd.DataFrame({"x0": [0.0], "x1": [1.0]})).mark_rect(opacity=0.1, color=PALETTE[2]).encode(
        x=alt.X("x0:Q", scale=alt.Scale(domain=xdom)), x2="x1:Q")
    edge = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(strokeDash=[4, 3], color="#2f6e4e").encode(x="x:Q")
    layers = [region, edge]
    if not sim.empty:
        front = sim[sim["frontier"]].sort_values("x")
        layers.append(alt.Chart(front).mark_line(color="#999", strokeDash=[2, 2]).encode(x=x, y=y))
        layers.append(alt.Chart(sim).mark_point(filled=False, size=60).encode(
            x=x, y=y, color=color, tooltip=["label", alt.Tooltip("x:Q", format=".2f"), alt.Tooltip("y:Q", format=".1f")]))
    if not conf.empty:
        links = conf.dropna(subset=["sx", "sy"])
        if not links.empty:
            layers.append(alt.Chart(links).mark_rule(opacity=0.5).encode(x="sx:Q", y="sy:Q", x2="x:Q", y2="y:Q",
                                                                          color=color))
        layers.append(alt.Chart(conf).mark_rule().encode(x=x, y="lo:Q", y2="hi:Q", color=color))
        layers.append(alt.Chart(conf).mark_point(filled=True, size=90).encode(
            x=x, y=y, color=color, tooltip=["label", alt.Tooltip("x:Q", format=".2f"), alt.Tooltip("y:Q", format=".1f")]))
        layers.append(alt.Chart(conf).mark_text(align="left", dx=8, dy=-6, fontSize=10).encode(
            x=x, y=y, text="label:N", color=color))
        chosen = conf[conf["label"] == (doc.get("choice") or {}).get("label")]
        if not chosen.empty:
            layers.append(alt.Chart(chosen).mark_point(size=420, strokeWidth=2, color="#111").encode(x=x, y=y))
    ch = doc.get("choice") or {}
    title = alt.TitleParams(
        f"Tuning for this trace: choice {ch.get('label')}" + ("" if ch.get("meets") else " (misses an SLO)"),
        subtitle=[f"SLOs {', '.join(doc.get('slos', []))}; hollow: simulated, filled: measured (bars: repeats)",
                  "dashed grey: the simulated Pareto frontier; ringed: the choice"])
    return alt.layer(*layers).properties(width=460, height=320, title=title)
