"""The simulator studies' charts: a validation's simulated against measured values, decode-period
histograms, and seed 001 at its own scale. Altair with the one mlxlab theme
(:func:`mlxlab.notebook.plots.use_theme`); the studies save them with
:func:`mlxlab.notebook.plots.save_figure` into :data:`FIGURES`."""

from __future__ import annotations

from typing import Dict, List

import altair as alt
import pandas as pd

from mlxlab.core.paths import ROOT
from mlxlab.notebook.plots import log_axis, use_theme

FIGURES = ROOT / "paper" / "figures"  # where the studies' figures go (save_figure's folder)

#: the validation's metric names as a reader reads them
METRIC_LABELS = {"ttft_p50_s": "TTFT p50", "itl_p50_s": "ITL p50", "itl_p99_s": "ITL p99", "itl_mean_s": "ITL mean",
                 "ttft_p99_s": "TTFT p99", "latency_p50_s": "latency p50"}

use_theme()


def validation_chart(rows: List[dict], title: str = "simulator vs engine"):
    """Simulated against measured, log-log, one point per (workload, policy, tenant, metric), with
    the y = x line and the 10% band, both labelled."""
    df = pd.DataFrame([{k: v for k, v in r.items() if k not in ("engine_runs", "sim_runs")} for r in rows])
    df["engine_ms"], df["sim_ms"] = df.engine * 1e3, df.sim * 1e3
    df["metric"] = [METRIC_LABELS.get(m, m) for m in df.metric]
    lo = float(min(df.engine_ms.min(), df.sim_ms.min())) * 0.8
    hi = float(max(df.engine_ms.max(), df.sim_ms.max())) * 1.25
    line = pd.DataFrame({"x": [lo, hi], "y": [lo, hi], "y_lo": [lo * 0.9, hi * 0.9], "y_hi": [lo * 1.1, hi * 1.1]})
    scale = alt.Scale(type="log", domain=[lo, hi])
    axis = log_axis([lo, hi])
    band = alt.Chart(line).mark_area(opacity=0.15, color="gray").encode(
        x=alt.X("x:Q", scale=scale, axis=axis, title="engine (ms, median of repeats)"),
        y=alt.Y("y_lo:Q", scale=scale, axis=axis), y2="y_hi:Q")
    diag = alt.Chart(line).mark_line(color="gray", strokeDash=[4, 4]).encode(x=alt.X("x:Q", scale=scale),
                                                                             y=alt.Y("y:Q", scale=scale))
    # in the empty upper-left corner (simulator above engine by the whole range)
    note = alt.Chart(pd.DataFrame({"x": [lo], "y": [hi], "t": ["dashed: simulator = engine; shaded: within 10%"]}))
    note = note.mark_text(align="left", baseline="top", dx=6, dy=6, fontSize=10, color="#555").encode(
        x=alt.X("x:Q", scale=scale), y=alt.Y("y:Q", scale=scale), text="t:N")
    pts = alt.Chart(df).mark_point(filled=True, size=70).encode(
        x=alt.X("engine_ms:Q", scale=scale), y=alt.Y("sim_ms:Q", scale=scale, title="simulator (ms)"),
        color=alt.Color("metric:N", title="metric"), shape=alt.Shape("policy:N", title="policy"),
        tooltip=["workload", "policy", "tenant", "metric", alt.Tooltip("engine_ms:Q", format=".2f"),
                 alt.Tooltip("sim_ms:Q", format=".2f"), alt.Tooltip("rel_error:Q", format=".1%"),
                 alt.Tooltip("noise:Q", format=".1%"), "passed"])
    return (band + diag + note + pts).properties(width=420, height=380, title=title)


def decode_periods_chart(samples: Dict[str, Dict[str, List[List[float]]]], title: str = ""):
    """Histograms of decode periods (ms), one row per validation file (``samples``: label ->
    :func:`mlxlab.studies.sim_validation.scoring.decode_periods`), engine and profile overlaid: two modes
    show as two humps."""
    rows = [{"validation": label, "side": side, "ms": 1e3 * x}
            for label, d in samples.items() for side in ("engine", "profile") for run in d.get(side, []) for x in run]
    df = pd.DataFrame(rows)
    return alt.Chart(df).mark_bar(opacity=0.6).encode(
        x=alt.X("ms:Q", bin=alt.Bin(step=0.5), title="decode step period (ms)"),
        y=alt.Y("count():Q", stack=None, title="steps"), color=alt.Color("side:N", title=None),
        row=alt.Row("validation:N", title=None, sort=list(samples),
                    header=alt.Header(labelAngle=0, labelAlign="left", labelFontSize=11))
    ).properties(width=420, height=90, title=title)


def _published_marks(xs, lo_key: str, hi_key: str, rows: List[dict], color: str = "black"):
    """The published figures on a curve panel: a shaded band per range, a cross per value, each
    labelled; ``rows``: chunk (x), x2, lo, hi, label."""
    df = pd.DataFrame(rows)
    band = alt.Chart(df[df.x2 > df.x]).mark_rect(opacity=0.12, color=color).encode(
        x=xs, x2="x2:Q", y=alt.Y(f"{lo_key}:Q"), y2=f"{hi_key}:Q")
    point = alt.Chart(df[df.x2 == df.x]).mark_point(shape="cross", size=120, color=color, filled=True).encode(
        x=xs, y=alt.Y(f"{lo_key}:Q"))
    text = alt.Chart(df).mark_text(align="left", dx=4, dy=-6, fontSize=9, color=color).encode(
        x=xs, y=alt.Y(f"{hi_key}:Q"), text="label:N")
    return band + point + text


def seed_scale_chart(result: dict):
    """TTFT vs chunk size, chat ITL vs chunk size (interleave), and the TTFT/ITL plane. The
    published figures sit on the curves: grey where the profile was fitted on them (the floor),
    black where the simulator predicts them (the premium band, the chat gaps)."""
    from mlxlab.sim.published import seed001_figures  # no MLX

    figs = {k: f["value"] for k, f in seed001_figures().items()}
    cur = pd.DataFrame(result["curves"])
    chunks = sorted(int(c) for c in cur.chunk_size.unique())  # ticked at the chunk sizes run
    xs = alt.X("x:Q", scale=alt.Scale(type="log", base=2), title="chunk size (tokens)", axis=alt.Axis(values=chunks))
    xc = alt.X("chunk_size:Q", scale=alt.Scale(type="log", base=2), title="chunk size (tokens)",
               axis=alt.Axis(values=chunks))
    floor = figs["floor_60k_s"]
    top = float(max(cur.long_ttft_s))
    ttft = alt.Chart(cur).mark_line(point=True).encode(x=xc, y=alt.Y(
        "long_ttft_s:Q", title="60k prompt TTFT (s)",
        scale=alt.Scale(domain=[floor - 0.08 * (top - floor), top + 0.04 * (top - floor)], nice=False)))
    # the floor: what the prompt costs prefilled alone, a published figure the profile is fitted on
    rule = alt.Chart(pd.DataFrame({"y": [floor], "x": [min(cur.chunk_size)],
                                   "label": [f"published floor {floor:g} s: a calibration input"]}))
    rule = rule.mark_rule(strokeDash=[4, 4], color="gray").encode(y="y:Q") + rule.mark_text(
        align="left", baseline="bottom", dx=2, dy=-3, fontSize=9, color="gray").encode(x=xs, y="y:Q", text="label:N")
    p_lo, p_hi = figs["premium_512_1024"]
    ttft_pub = _published_marks(xs, "lo", "hi", [{"x": 512, "x2": 1024, "lo": floor * (1 + p_lo),
                                                  "hi": floor * (1 + p_hi), "label": "published +15-30%"}])
    g_lo, g_hi = figs["chat_gap_512_1024_s"]
    itl_pub = _published_marks(xs, "lo", "hi", [
        {"x": 512, "x2": 1024, "lo": g_lo, "hi": g_hi, "label": "published 0.4-0.8 s"},
        {"x": 2048, "x2": 2048, "lo": figs["chat_gap_2048_s"], "hi": figs["chat_gap_2048_s"],
         "label": "published 1.5 s"}])
    stats = {"itl_p50_s": "p50", "itl_p99_s": "p99", "itl_mean_s": "mean"}
    itl = cur.melt(id_vars=["chunk_size"], value_vars=list(stats), var_name="stat", value_name="s")
    itl["stat"] = itl["stat"].map(stats)
    itlc = alt.Chart(itl).mark_line(point=True).encode(x=xc, y=alt.Y("s:Q", title="chat gap during prefill (s)"),
                                                       color=alt.Color("stat:N", title="chat gap", sort=list(stats.values())))
    return alt.hconcat((ttft + rule + ttft_pub).properties(width=260, height=220,
                                                           title="TTFT vs chunk (seed-001 profile)"),
                       (itlc + itl_pub).properties(width=260, height=220, title="chat ITL vs chunk"),
                       _plane(result["plane"]).properties(width=320, height=220,
                                                          title="TTFT / ITL plane (chat beside the 60k prompt)")
                       ).resolve_scale(color="independent")


def _plane(points: List[dict]):
    """Every policy's point on the TTFT / ITL p99 plane; interleave's joined in chunk order. Each
    point says its setting: interleave, the SLO policy and the gate with a window by their label
    (right of the point), stall_free by its token budget in its own colour (left of the point: its
    points sit just left of interleave's). The gate's points lie on interleave's (one long prompt)."""
    pl = pd.DataFrame([{**{k: v for k, v in r.items() if k != "options"},
                        "budget": (r.get("options") or {}).get("token_budget", r.get("chunk_size"))} for r in points])
    x, y = "long_ttft_s:Q", "itl_p99_s:Q"
    color = alt.Color("policy:N", title="policy")
    lo, hi = float(pl.long_ttft_s.min()), float(pl.long_ttft_s.max())
    pad = max(hi - lo, 1.0)
    dots = alt.Chart(pl).mark_point(filled=True, size=80).encode(  # room on the left for stall_free's labels
        x=alt.X(x, title="60k prompt TTFT (s)", scale=alt.Scale(domain=[lo - 0.1 * pad, hi + 0.05 * pad])),
        y=alt.Y(y, title="chat ITL p99 (s)"), color=color,
        tooltip=["label", "long_ttft_s", "itl_p50_s", "itl_p99_s"])
    line = alt.Chart(pl[pl.policy == "interleave"]).mark_line(color="gray", opacity=0.5).encode(
        x=x, y=y, order="chunk_size:Q")
    keep = pl.policy.isin(["interleave", "slo", "admission_gate_window"])
    labels = alt.Chart(pl[keep]).mark_text(dx=6, dy=-6, fontSize=9, align="left").encode(x=x, y=y, text="label:N")
    sf = pl[pl.policy == "stall_free"]
    budgets = alt.Chart(sf).mark_text(dx=-7, dy=3, fontSize=9, align="right").encode(
        x=x, y=y, text="budget:Q", color=color)
    return line + dots + labels + budgets


def heldout_chart(rows: List[dict], title: str = "simulator vs engine on held-out traces"):
    """The simulator's signed error on each held-out row (``(sim - engine) / engine``, one point
    per case and tenant), a panel per metric, beside the engine's own repeat spread (the grey bar:
    plus and minus its coefficient of variation over the repeats, the noise floor the scoring rule
    uses) and the 5% / 10% lines. Colour: the case's policy. The axis spans the errors (at least
    +-12%); a longer noise bar is cut at its edge."""
    df = pd.DataFrame([{"row": f"{r['workload'].replace('heldout-', '#')} {r['tenant']}", "policy": r["policy"],
                        "metric": METRIC_LABELS.get(r["metric"], r["metric"]),
                        "err": 100.0 * (r["sim"] - r["engine"]) / r["engine"],
                        "noise": 100.0 * float(r.get("noise") or 0.0),
                        "engine_ms": 1e3 * r["engine"], "sim_ms": 1e3 * r["sim"]} for r in rows])
    top = max(12.0, float(df.err.abs().max()) * 1.15)
    df["lo"], df["hi"] = (-df.noise).clip(lower=-top), df.noise.clip(upper=top)
    order = sorted(df.row.unique(), key=lambda s: (int(s.split()[0].split("-")[-1]), s))
    x = alt.X("row:N", sort=order, title="held-out case and tenant", axis=alt.Axis(labelAngle=-60))
    y = alt.Y("err:Q", title="simulator - engine (% of engine median)", scale=alt.Scale(domain=[-top, top]))
    base = alt.Chart(df)
    noise = base.mark_bar(size=9, color="#bbbbbb", opacity=0.8).encode(x=x, y=alt.Y("lo:Q"), y2="hi:Q")
    rules = [base.mark_rule(color="gray", opacity=0.7, strokeDash=[1, 0] if v == 0 else [4, 3] if abs(v) == 5
                            else [1, 3]).encode(y=alt.datum(v)) for v in (-10, -5, 0, 5, 10)]
    pts = base.mark_point(filled=True, size=60).encode(
        x=x, y=y, color=alt.Color("policy:N", title="policy"),
        tooltip=["row", "policy", alt.Tooltip("err:Q", format=".1f"), alt.Tooltip("noise:Q", format=".1f"),
                 alt.Tooltip("engine_ms:Q", format=".2f"), alt.Tooltip("sim_ms:Q", format=".2f")])
    return alt.layer(noise, *rules, pts).properties(width=300, height=240).facet(
        column=alt.Column("metric:N", title=None, sort=["TTFT p50", "ITL p50", "ITL p99"])
    ).properties(title=alt.TitleParams(title, subtitle=[
        "grey: +- the engine's coefficient of variation over its repeats (its noise floor; cut at the axis); "
        "lines at 0, +-5% (dashed), +-10% (dotted)"]))
