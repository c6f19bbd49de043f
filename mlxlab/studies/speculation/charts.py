"""The speculative-decoding notebook's figures: the analytic speedup against the draft length with
the measured points (``speculative_speedup_vs_k``), and where speculation pays over acceptance
rate and draft cost (``speculative_where_it_pays``), its break-even contour drawn and labelled.
The analytic model is :mod:`mlxlab.engine.speculative`'s (imported when a chart is built: MLX)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import altair as alt
import numpy as np
import pandas as pd

from mlxlab.notebook.plots import PALETTE, hline, use_theme

use_theme()

#: the label of the cells where no draft length pays
NO_PAY = "no draft length pays: slower than the target alone"


def breakeven_c(a: float, ks: Iterable[int] = range(1, 17), v: float = 1.0) -> float:
    """The largest draft cost ratio ``c`` at which some ``k`` in ``ks`` still breaks even
    (speedup = 1) at acceptance ``a``: the break-even contour of :func:`where_it_pays_chart`."""
    from mlxlab.engine.speculative import breakeven_cost_ratio

    return max(breakeven_cost_ratio(a, int(k), v) for k in ks)


def speedup_vs_k_chart(a: float, c: float, v: float, measured: pd.DataFrame,
                       ks: Sequence[int] = range(1, 17)) -> alt.LayerChart:
    """The analytic speedup over draft length ``k`` at acceptance ``a``, cost ratio ``c`` and
    verification cost ``v`` (line), this run's measured speedups (``measured``: columns k,
    speedup, a_hat; dots, each at its own a and c), and the labelled break-even line."""
    from mlxlab.engine.speculative import analytic_speedup, best_k

    ks = [int(k) for k in ks]
    what = ["analytic model", "measured here (own a, c)"]
    color = alt.Color("what:N", title=None, scale=alt.Scale(domain=what, range=[PALETTE[0], PALETTE[4]]),
                      legend=alt.Legend(orient="bottom"))
    curve = pd.DataFrame({"k": ks, "speedup": [analytic_speedup(a, k, c, v) for k in ks], "what": what[0]})
    x = alt.X("k:Q", title="draft tokens k", axis=alt.Axis(tickMinStep=1))
    y = alt.Y("speedup:Q", title="speedup over the target alone (x)")
    line = alt.Chart(curve, title=f"a={a:.2f}, c={c:.2f}, v={v:.2f}: best k={best_k(a, c, ks, v=v)[0]}").mark_line(
        point=True).encode(x=x, y=y, color=color, tooltip=["k", alt.Tooltip("speedup:Q", format=".3f")])
    meas = measured.assign(what=what[1])
    dots = alt.Chart(meas).mark_point(size=80, filled=True).encode(
        x="k:Q", y="speedup:Q", color=color, tooltip=["k", "a_hat", alt.Tooltip("speedup:Q", format=".3f")])
    return line + dots + hline(1.0, "1 = as fast as the target alone", align="right")


def where_it_pays_chart(a_values: Sequence[float], c_values: Sequence[float], *, v: float = 1.0,
                        ks: Sequence[int] = range(1, 17),
                        measured: Optional[dict] = None) -> alt.LayerChart:
    """The best analytic speedup over ``ks`` on a grid of acceptance rates ``a_values`` and draft
    cost ratios ``c_values`` (evenly spaced), at verification cost ``v``. Cells where no ``k``
    pays (the best is not to speculate) are drawn apart in grey-blue and named in the legend; the
    black line is the break-even contour (speedup = 1, :func:`breakeven_c`), labelled; above it
    speculation is slower than plain decoding. ``measured``: ``{"a": ..., "c": ..., "label": ...}``,
    a point for this run's pair."""
    from mlxlab.engine.speculative import best_k

    a_values, c_values, ks = np.asarray(a_values, float), np.asarray(c_values, float), [int(k) for k in ks]
    if len(a_values) < 2 or len(c_values) < 2:
        raise ValueError("where_it_pays_chart needs at least two acceptance rates and two cost ratios")
    da, dc = float(np.diff(a_values).mean()), float(np.diff(c_values).mean())
    rows = []
    for a in a_values:
        for c in c_values:
            k, s = best_k(float(a), float(c), ks, v=v)
            rows.append({"a": a, "c": c, "a0": a - da / 2, "a1": a + da / 2, "c0": c - dc / 2, "c1": c + dc / 2,
                         "best_k": k, "best_speedup": s, "region": NO_PAY if k == 0 else "pays"})
    grid = pd.DataFrame(rows)
    a_dom = [float(grid.a0.min()), float(grid.a1.max())]
    c_dom = [float(grid.c0.min()), float(grid.c1.max())]
    x = alt.X("a0:Q", title="acceptance rate a", scale=alt.Scale(domain=a_dom, nice=False, zero=False))
    y = alt.Y("c0:Q", title="draft cost ratio c (draft step / target step)",
              scale=alt.Scale(domain=c_dom, nice=False, zero=False))
    tip = [alt.Tooltip("a:Q", format=".2f"), alt.Tooltip("c:Q", format=".3f"), "best_k",
           alt.Tooltip("best_speedup:Q", format=".2f")]
    pays = alt.Chart(grid[grid.best_k > 0]).mark_rect().encode(
        x=x, x2="a1:Q", y=y, y2="c1:Q", tooltip=tip,
        color=alt.Color("best_speedup:Q", title="best speedup (x)", scale=alt.Scale(scheme="oranges", domainMin=1)))
    none = alt.Chart(grid[grid.best_k == 0]).mark_rect().encode(
        x=x, x2="a1:Q", y=y, y2="c1:Q", tooltip=tip,
        fill=alt.Fill("region:N", title=None, scale=alt.Scale(domain=[NO_PAY], range=["#c9d6e3"]),
                      legend=alt.Legend(orient="bottom", labelLimit=0)))
    fine = np.linspace(a_dom[0], a_dom[1], 200).clip(0.0, 1.0)
    contour = pd.DataFrame({"a": fine, "c": [breakeven_c(float(a), ks, v) for a in fine]})
    contour = contour[(contour.c >= c_dom[0]) & (contour.c <= c_dom[1])]
    layers = [pays, none]
    if len(contour):
        edge = contour.iloc[[3 * len(contour) // 4]].assign(t="speedup = 1 (break-even)")  # on the grey side
        ax = alt.X("a:Q", scale=alt.Scale(domain=a_dom, nice=False, zero=False))
        cy = alt.Y("c:Q", scale=alt.Scale(domain=c_dom, nice=False, zero=False))
        layers += [alt.Chart(contour).mark_line(color="black", strokeWidth=2).encode(x=ax, y=cy),
                   alt.Chart(edge).mark_text(align="right", dx=-10, dy=-4, fontSize=11, fontWeight="bold").encode(
                       x=ax, y=cy, text="t:N")]
    if measured:
        pt = pd.DataFrame([{"a": measured["a"], "c": measured["c"],
                            "t": measured.get("label", f"measured here (a={measured['a']:.2f}, c={measured['c']:.2f})")}])
        ax = alt.X("a:Q", scale=alt.Scale(domain=a_dom, nice=False, zero=False))
        cy = alt.Y("c:Q", scale=alt.Scale(domain=c_dom, nice=False, zero=False))
        layers += [alt.Chart(pt).mark_point(shape="cross", size=160, filled=True, color=PALETTE[4]).encode(x=ax, y=cy),
                   alt.Chart(pt).mark_text(baseline="top", dy=10, fontSize=10, color=PALETTE[4]).encode(
                       x=ax, y=cy, text="t:N")]
    title = alt.TitleParams(f"Best analytic speedup over k = {ks[0]}-{ks[-1]} (v = {v:g})",
                            subtitle="above the black line no draft length is faster than the target alone")
    return alt.layer(*layers, title=title).resolve_scale(color="independent", fill="independent").properties(
        width=380, height=320)


def pair_rows(studies: dict) -> pd.DataFrame:
    """One row per (draft, k) of ``bench speculation`` results (``{label: study}``): the measured
    decode speedup's median and its min and max over the repeats (each paired with its repeat's
    baseline), and the analytic model's at the measured acceptance and cost ratio, with v = 1
    (the textbook formula) and with the measured cost v of a verification pass."""
    rows = []
    for label, s in studies.items():
        c = s["cost"]["c"]
        for r in s["rows"]:
            reps = r["speedup_decode_repeats"]
            rows.append({"draft": f"{label} (c = {c:.2f})", "k": r["k"], "a_hat": r["a_hat"], "v": r["v"],
                         "measured": r["speedup_decode_paired"], "lo": min(reps), "hi": max(reps),
                         "analytic (v = 1)": r["speedup_analytic"], "analytic (measured v)": r["speedup_analytic_v"]})
    return pd.DataFrame(rows)


def pair_speedups_chart(studies: dict, title: Optional[str] = None) -> alt.FacetChart:
    """Measured decode speedup over draft length k (dots: median, bars: min-max over repeats)
    against the analytic model with v = 1 and with the measured verification cost, one panel per
    draft of ``studies`` (``{label: bench speculation result}``)."""
    df = pair_rows(studies)
    what = ["analytic (v = 1)", "analytic (measured v)", "measured (median, min-max)"]
    model = df.melt(id_vars=["draft", "k"], value_vars=what[:2], var_name="what", value_name="speedup")
    meas = df[["draft", "k", "a_hat", "v", "lo", "hi"]].assign(what=what[2], speedup=df["measured"])
    data = pd.concat([model, meas], ignore_index=True)
    color = alt.Color("what:N", title=None, scale=alt.Scale(domain=what, range=[PALETTE[0], PALETTE[2], PALETTE[4]]),
                      legend=alt.Legend(orient="bottom", labelLimit=0))
    x = alt.X("k:Q", title="draft tokens k", axis=alt.Axis(tickMinStep=1))
    y = alt.Y("speedup:Q", title="decode speedup over the target alone (x)", scale=alt.Scale(zero=False))
    is_meas = alt.datum.what == what[2]
    base = alt.Chart()
    lines = base.mark_line(point=True, strokeDash=[4, 3]).encode(
        x=x, y=y, color=color, tooltip=["k", "what", alt.Tooltip("speedup:Q", format=".3f")]
    ).transform_filter(~is_meas)
    bars = base.mark_rule(strokeWidth=2).encode(x="k:Q", y="lo:Q", y2="hi:Q", color=color).transform_filter(is_meas)
    dots = base.mark_point(size=70, filled=True).encode(
        x="k:Q", y="speedup:Q", color=color,
        tooltip=["k", alt.Tooltip("speedup:Q", format=".3f"), alt.Tooltip("a_hat:Q", format=".2f"),
                 alt.Tooltip("v:Q", format=".2f")]).transform_filter(is_meas)
    one = base.mark_rule(color="black", strokeDash=[2, 2]).encode(y=alt.datum(1.0))
    return alt.layer(lines, bars, dots, one, data=data).properties(width=300, height=240).facet(
        facet=alt.Facet("draft:N", title=None, sort=list(dict.fromkeys(df["draft"]))), columns=2,
        title=title or alt.Undefined)
