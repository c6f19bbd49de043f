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

from mlxlab.notebook.labels import place_labels
from mlxlab.notebook.plots import PALETTE, use_theme
from mlxlab.studies.tune.run import BASELINE

#: mlx-lm's BatchGenerator's colour in the tune charts (a policy takes the palette's other colours)
MLX_LM_GREY = "#7f8c8d"

use_theme()


def _ms(v) -> float:
    return float("nan") if v is None or not math.isfinite(v) else 1e3 * v


WIDTH, HEIGHT = 460, 320  # the plot's size in pixels: the label placer works in them


def yscale_domain(ys, ylog: bool):
    """The y axis's domain as :func:`tune_chart` draws it."""
    if not ys:
        return [0.0, 1.0]
    return [min(ys) / 1.5, max(ys) * 1.5] if ylog else [0.0, max(ys) * 1.1]


def _pixels(df, xdom, ydom, ylog: bool):
    """Each row's point in the plot's pixels (x from the left, y from the top; the x axis is log)."""
    def frac(v, lo, hi, log):
        if log:
            v, lo, hi = (math.log(max(t, 1e-12)) for t in (v, lo, hi))
        return (v - lo) / (hi - lo) if hi > lo else 0.5
    return [(WIDTH * frac(x, *xdom, True), HEIGHT * (1 - frac(y, *ydom, ylog))) for x, y in zip(df["x"], df["y"])]


def _data(px, xdom, ydom, ylog: bool):
    """A pixel position (x from the left, y from the top) back in the axes' values: :func:`_pixels` inverted."""
    def value(f, lo, hi, log):
        return math.exp(math.log(lo) + f * (math.log(hi) - math.log(lo))) if log else lo + f * (hi - lo)
    return value(px[0] / WIDTH, *xdom, True), value(1 - px[1] / HEIGHT, *ydom, ylog)


def tune_chart(doc: Mapping, platform: str = "") -> alt.LayerChart:
    sim = pd.DataFrame([{"label": r["label"], "x": r["slo_ratio"], "y": _ms(r["objective_s"]),
                         "policy": r["policy"], "frontier": r["label"] in doc.get("frontier", [])}
                        for r in doc.get("grid", []) if math.isfinite(r["slo_ratio"])])
    conf = pd.DataFrame([{"label": r["label"], "x": r["slo_ratio"], "y": _ms(r["objective_s"]),
                          "lo": _ms(r["objective_range_s"][0]), "hi": _ms(r["objective_range_s"][1]),
                          "policy": "mlx-lm" if r["policy"] == BASELINE else r["policy"],
                          "sx": next((g["slo_ratio"] for g in doc.get("grid", []) if g["label"] == r["label"]), None),
                          "sy": _ms(r.get("sim_objective_s"))}
                         for r in doc.get("confirmed", []) if math.isfinite(r["slo_ratio"])])
    simmed = {r["label"]: r for r in doc.get("grid", [])}
    swept = pd.DataFrame([{"label": r["label"], "x": r["slo_ratio"], "y": _ms(r["objective_s"]), "policy": r["policy"],
                           "sx": simmed[r["label"]]["slo_ratio"], "sy": _ms(simmed[r["label"]]["objective_s"])}
                          for r in (doc.get("sweep") or {}).get("rows", [])
                          if math.isfinite(r["slo_ratio"]) and r["label"] in simmed])
    if sim.empty and conf.empty:
        raise ValueError("nothing to draw: no setting has a finite SLO ratio")
    xs = [v for v in list(sim.get("x", [])) + list(conf.get("x", [])) + list(swept.get("x", [])) + [1.0] if v > 0]
    ys = [v for v in list(sim.get("y", [])) + list(conf.get("lo", [])) + list(conf.get("hi", []))
          + list(swept.get("y", [])) if math.isfinite(v)]
    xdom = [min(xs) / 1.5, max(xs) * 1.5]  # ratios span orders of magnitude: a log axis
    # objectives can also span orders of magnitude (the H200's tune: 0.2 s to 16 s), which on a linear
    # axis piles the useful settings onto the floor: log past a 30x spread
    ylog = bool(ys) and min(ys) > 0 and max(ys) / min(ys) > 30
    yscale = alt.Scale(type="log" if ylog else "linear", domain=yscale_domain(ys, ylog), nice=False)
    x = alt.X("x:Q", scale=alt.Scale(type="log", domain=xdom, nice=False),
              title="binding SLO: its figure over its bound (≤ 1 meets every SLO; log)")
    y = alt.Y("y:Q", scale=yscale, title=f"objective: {doc.get('objective', '?')} (ms{'; log' if ylog else ''})")
    policies = sorted(set(sim.get("policy", [])) | set(conf.get("policy", [])))
    hues = [c for c in PALETTE if c != MLX_LM_GREY]  # the grey is mlx-lm's alone, however many policies come
    color = alt.Color("policy:N", scale=alt.Scale(domain=policies, range=[
        MLX_LM_GREY if p == "mlx-lm" else hues[i % len(hues)] for i, p in enumerate(policies)]), title="policy")
    region = alt.Chart(pd.DataFrame({"x0": [xdom[0]], "x1": [1.0]})).mark_rect(opacity=0.1, color=PALETTE[2]).encode(
        x=alt.X("x0:Q", scale=alt.Scale(type="log", domain=xdom, nice=False)), x2="x1:Q")
    edge = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(strokeDash=[4, 3], color="#2f6e4e").encode(x="x:Q")
    layers = [region, edge]
    if not sim.empty:
        front = sim[sim["frontier"]].sort_values("x")
        layers.append(alt.Chart(front).mark_line(color="#999", strokeDash=[2, 2]).encode(x=x, y=y))
        layers.append(alt.Chart(sim).mark_point(filled=False, size=60).encode(
            x=x, y=y, color=color, tooltip=["label", alt.Tooltip("x:Q", format=".2f"), alt.Tooltip("y:Q", format=".1f")]))
    if not swept.empty:  # the exhaustive sweep's medians: where the simulator put each setting, and where it ran
        tip = ["label", alt.Tooltip("x:Q", format=".2f"), alt.Tooltip("y:Q", format=".1f")]
        layers.append(alt.Chart(swept).mark_rule(opacity=0.25, strokeDash=[1, 2]).encode(
            x="sx:Q", y="sy:Q", x2="x:Q", y2="y:Q", color=color))
        layers.append(alt.Chart(swept).mark_square(size=40, opacity=0.7).encode(x=x, y=y, color=color, tooltip=tip))
    if not conf.empty:
        links = conf.dropna(subset=["sx", "sy"])
        if not links.empty:
            layers.append(alt.Chart(links).mark_rule(opacity=0.5).encode(x="sx:Q", y="sy:Q", x2="x:Q", y2="y:Q",
                                                                          color=color))
        layers.append(alt.Chart(conf).mark_rule().encode(x=x, y="lo:Q", y2="hi:Q", color=color))
        layers.append(alt.Chart(conf).mark_point(filled=True, size=90).encode(
            x=x, y=y, color=color, tooltip=["label", alt.Tooltip("x:Q", format=".2f"), alt.Tooltip("y:Q", format=".1f")]))
        conf = conf.reset_index(drop=True)
        ydom = yscale_domain(ys, ylog)
        marks = [df[["x", "y"]].dropna() for df in (sim, swept) if not df.empty]
        px = _pixels(conf, xdom, ydom, ylog)
        spots = place_labels(px, list(conf["label"]), WIDTH, HEIGHT,
                             obstacles=[q for df in marks for q in _pixels(df, xdom, ydom, ylog)])
        conf["dx"] = [s["x"] - p[0] for s, p in zip(spots, px)]  # the label's anchor from its point, pixels
        conf["dy"] = [s["y"] - p[1] for s, p in zip(spots, px)]
        conf["align"] = [s["align"] for s in spots]
        lead = [{"x": r["x"], "y": r["y"], "o": 0, "label": r["label"]} for r, s in zip(conf.to_dict("records"), spots)
                if s["moved"]]
        lead += [dict(zip(("x", "y"), _data((s["x"], s["y"]), xdom, ydom, ylog)), o=1, label=r["label"])
                 for r, s in zip(conf.to_dict("records"), spots) if s["moved"]]
        if lead:  # a label moved off its point's row: a thin line from the point to it
            layers.append(alt.Chart(pd.DataFrame(lead)).mark_line(color="#999999", strokeWidth=0.8).encode(
                x=x, y=y, detail="label:N", order="o:Q"))
        for _, row in conf.iterrows():  # one text mark per label: each has its own offset
            layers.append(alt.Chart(pd.DataFrame([row])).mark_text(
                align=row["align"], baseline="middle", dx=round(row["dx"]), dy=round(row["dy"]), fontSize=10).encode(
                x=x, y=y, text="label:N", color=color))
        chosen = conf[conf["label"] == (doc.get("choice") or {}).get("label")]
        if not chosen.empty:
            layers.append(alt.Chart(chosen).mark_point(size=420, strokeWidth=2, color="#111").encode(x=x, y=y))
    ch = doc.get("choice") or {}
    title = alt.TitleParams(
        f"Tuning for this trace: choice {ch.get('label')}" + ("" if ch.get("meets") else " (misses an SLO)"),
        subtitle=[f"SLOs {', '.join(doc.get('slos', []))}; hollow: simulated, filled: measured (bars: repeats)",
                  "dashed grey: the simulated Pareto frontier; ringed: the choice"]
        + ([f"squares: the exhaustive sweep's medians ({doc['sweep'].get('repeats')} repeats), dotted from the simulation"]
           if not swept.empty else []))
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=title)


def explorer_chart(doc: Mapping, tenant_metric: str = "") -> alt.LayerChart:
    """The frontier with a slider over the SLO's bound, working without a kernel (a Vega-Lite
    parameter over the precomputed grid, so the static HTML of the notebook and of the paper moves
    too): every simulated setting on the plane of its first SLO's figure (ms) against the objective;
    those at or under the slider's bound are drawn filled, and the best objective among them is
    ringed as the choice the simulation makes at that bound."""
    grid = [r for r in doc.get("grid", []) if r.get("checks")]
    if not grid:
        raise ValueError("no simulated setting with an SLO figure to explore")
    slo = grid[0]["checks"][0]["slo"]
    df = pd.DataFrame([{"label": r["label"], "policy": r["policy"], "x": _ms(r["checks"][0]["figure_s"]),
                        "y": _ms(r["objective_s"])} for r in grid]).dropna()
    if df.empty:
        raise ValueError("no simulated setting has a finite SLO figure and objective")
    lo, hi = float(df["x"].min()), float(df["x"].max())
    bound0 = _ms(grid[0]["checks"][0]["bound_s"])
    start = min(max(bound0, lo), hi) if math.isfinite(bound0) else hi
    bound = alt.param(name="bound", value=round(start, 3),
                      bind=alt.binding_range(min=round(lo * 0.95, 3), max=round(hi * 1.05, 3),
                                             step=max(round((hi - lo) / 200, 4), 1e-4),
                                             name=f"{slo.split('<=')[0]} bound (ms) "))
    x = alt.X("x:Q", title=f"simulated {slo.split('<=')[0]} (ms)", scale=alt.Scale(zero=False))
    y = alt.Y("y:Q", title=f"simulated objective: {doc.get('objective', '?')} (ms)", scale=alt.Scale(zero=False))
    base = alt.Chart(df)
    dots = base.mark_point(size=80).encode(
        x=x, y=y, color=alt.Color("policy:N", title="policy"),
        fill=alt.condition("datum.x <= bound", alt.Color("policy:N"), alt.value("transparent")),
        tooltip=["label", alt.Tooltip("x:Q", format=".1f"), alt.Tooltip("y:Q", format=".1f")]).add_params(bound)
    rule = alt.Chart(pd.DataFrame({"z": [0]})).transform_calculate(b="bound").mark_rule(
        strokeDash=[4, 3], color="#2f6e4e").encode(x="b:Q")
    chosen = base.transform_filter("datum.x <= bound").transform_joinaggregate(best="min(y)").transform_filter(
        "datum.y == datum.best")
    ring = chosen.mark_point(size=420, strokeWidth=2, color="#111").encode(x=x, y=y)
    name = chosen.mark_text(align="left", dx=14, dy=-10, fontSize=11, fontWeight="bold").encode(x=x, y=y, text="label:N")
    return alt.layer(dots, rule, ring, name).properties(
        width=460, height=300, title=alt.TitleParams(
            "Move the bound: the best simulated setting meeting it",
            subtitle="filled: at or under the bound; ringed: the lowest objective among them"))
