"""The simulator studies' charts: a validation's simulated against measured values, decode-period
histograms, and seed 001 at its own scale. Altair with the one mlxlab theme
(:func:`mlxlab.notebook.plots.use_theme`); the studies save them with
:func:`mlxlab.notebook.plots.save_figure` into :data:`FIGURES`."""

from __future__ import annotations

from typing import Dict, List

import altair as alt
import pandas as pd

from mlxlab.core.paths import ROOT
from mlxlab.notebook.plots import use_theme

FIGURES = ROOT / "paper" / "figures"  # where the studies' figures go (save_figure's folder)

use_theme()


def validation_chart(rows: List[dict], title: str = "simulator vs engine"):
    """Simulated against measured, log-log, one point per (workload, policy, tenant, metric), with
    the y = x line and the 10% band."""
    df = pd.DataFrame([{k: v for k, v in r.items() if k not in ("engine_runs", "sim_runs")} for r in rows])
    df["engine_ms"], df["sim_ms"] = df.engine * 1e3, df.sim * 1e3
    lo = float(min(df.engine_ms.min(), df.sim_ms.min())) * 0.8
    hi = float(max(df.engine_ms.max(), df.sim_ms.max())) * 1.25
    line = pd.DataFrame({"x": [lo, hi], "y": [lo, hi], "y_lo": [lo * 0.9, hi * 0.9], "y_hi": [lo * 1.1, hi * 1.1]})
    scale = alt.Scale(type="log", domain=[lo, hi])
    band = alt.Chart(line).mark_area(opacity=0.15, color="gray").encode(
        x=alt.X("x:Q", scale=scale, title="engine (ms, median of repeats)"), y=alt.Y("y_lo:Q", scale=scale), y2="y_hi:Q")
    diag = alt.Chart(line).mark_line(color="gray", strokeDash=[4, 4]).encode(x=alt.X("x:Q", scale=scale),
                                                                             y=alt.Y("y:Q", scale=scale))
    pts = alt.Chart(df).mark_point(filled=True, size=70).encode(
        x=alt.X("engine_ms:Q", scale=scale), y=alt.Y("sim_ms:Q", scale=scale, title="simulator (ms)"),
        color=alt.Color("metric:N"), shape=alt.Shape("policy:N"),
        tooltip=["workload", "policy", "tenant", "metric", alt.Tooltip("engine_ms:Q", format=".2f"),
                 alt.Tooltip("sim_ms:Q", format=".2f"), alt.Tooltip("rel_error:Q", format=".1%"),
                 alt.Tooltip("noise:Q", format=".1%"), "passed"])
    return (band + diag + pts).properties(width=420, height=380, title=title)


def decode_periods_chart(samples: Dict[str, Dict[str, List[List[float]]]], title: str = ""):
    """Histograms of decode periods (ms), one row per validation file (``samples``: label ->
    :func:`mlxlab.studies.sim_scoring.decode_periods`), engine and profile overlaid: two modes
    show as two humps."""
    rows = [{"validation": label, "side": side, "ms": 1e3 * x}
            for label, d in samples.items() for side in ("engine", "profile") for run in d.get(side, []) for x in run]
    df = pd.DataFrame(rows)
    return alt.Chart(df).mark_bar(opacity=0.6).encode(
        x=alt.X("ms:Q", bin=alt.Bin(step=0.5), title="decode step period (ms)"),
        y=alt.Y("count():Q", stack=None, title="steps"), color=alt.Color("side:N"),
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
    xs = alt.X("x:Q", scale=alt.Scale(type="log", base=2), title="chunk size (tokens)")
    xc = alt.X("chunk_size:Q", scale=alt.Scale(type="log", base=2), title="chunk size (tokens)")
    ttft = alt.Chart(cur).mark_line(point=True).encode(x=xc, y=alt.Y("long_ttft_s:Q", title="60k prompt TTFT (s)",
                                                                     scale=alt.Scale(zero=False)))
    floor = figs["floor_60k_s"]
    rule = alt.Chart(pd.DataFrame({"y": [floor], "x": [min(cur.chunk_size)],
                                   "label": [f"floor {floor:g} s: calibration input"]}))
    rule = rule.mark_rule(strokeDash=[4, 4], color="gray").encode(y="y:Q") + rule.mark_text(
        align="left", dy=-6, fontSize=9, color="gray").encode(x=xs, y="y:Q", text="label:N")
    p_lo, p_hi = figs["premium_512_1024"]
    ttft_pub = _published_marks(xs, "lo", "hi", [{"x": 512, "x2": 1024, "lo": floor * (1 + p_lo),
                                                  "hi": floor * (1 + p_hi), "label": "published +15-30%"}])
    g_lo, g_hi = figs["chat_gap_512_1024_s"]
    itl_pub = _published_marks(xs, "lo", "hi", [
        {"x": 512, "x2": 1024, "lo": g_lo, "hi": g_hi, "label": "published 0.4-0.8 s"},
        {"x": 2048, "x2": 2048, "lo": figs["chat_gap_2048_s"], "hi": figs["chat_gap_2048_s"],
         "label": "published 1.5 s"}])
    itl = cur.melt(id_vars=["chunk_size"], value_vars=["itl_p50_s", "itl_p99_s", "itl_mean_s"], var_name="stat",
                   value_name="s")
    itlc = alt.Chart(itl).mark_line(point=True).encode(x=xc, y=alt.Y("s:Q", title="chat gap during prefill (s)"),
                                                       color="stat:N")
    return alt.hconcat((ttft + rule + ttft_pub).properties(width=260, height=220,
                                                           title="TTFT vs chunk (seed-001 profile)"),
                       (itlc + itl_pub).properties(width=260, height=220, title="chat ITL vs chunk"),
                       _plane(result["plane"]).properties(width=320, height=220,
                                                          title="TTFT / ITL plane (chat beside the 60k prompt)")
                       ).resolve_scale(color="independent")


def _plane(points: List[dict]):
    pl = pd.DataFrame([{k: v for k, v in r.items() if k != "options"} for r in points])
    dots = alt.Chart(pl).mark_point(filled=True, size=80).encode(
        x=alt.X("long_ttft_s:Q", title="60k prompt TTFT (s)", scale=alt.Scale(zero=False)),
        y=alt.Y("itl_p99_s:Q", title="chat ITL p99 (s)"), color="policy:N",
        tooltip=["label", "long_ttft_s", "itl_p50_s", "itl_p99_s"])
    line = alt.Chart(pl[pl.policy == "interleave"]).mark_line(color="gray", opacity=0.5).encode(
        x="long_ttft_s:Q", y="itl_p99_s:Q", order="chunk_size:Q")
    keep = pl.policy.isin(["interleave", "slo", "admission_gate_window"])
    labels = alt.Chart(pl[keep]).mark_text(dx=6, dy=-6, fontSize=9, align="left").encode(
        x="long_ttft_s:Q", y="itl_p99_s:Q", text="label:N")
    return line + dots + labels
