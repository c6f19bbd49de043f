"""The contention benchmark's figure (:mod:`mlxlab.studies.contention.run`): the frontier between the
chat's ITL and the document's TTFT, one panel per preset, every setting a labelled point, the
target region of ``mlx-contention-frontier`` shaded. Altair with the one mlxlab theme; the CLI
saves it with :func:`mlxlab.notebook.plots.save_figure` into ``paper/figures/``.

The labels are placed here, not by Vega (which has no collision avoidance for text): each panel's
scales have fixed domains, so a point's pixel position is known, and
:func:`mlxlab.notebook.labels.place_labels` puts each
label beside its point where it overlaps no other label or point, with a leader line when it had
to move up or down."""

from __future__ import annotations

import math
from typing import Mapping, Sequence, Tuple

import altair as alt
import pandas as pd

from mlxlab.notebook.labels import place_labels
from mlxlab.notebook.plots import PALETTE, use_theme
from mlxlab.studies.contention.verdict import ITL_X, TTFT_X

use_theme()

WIDTH, HEIGHT = 400, 300
FONT = 10
TARGET = f"target: ITL p99 ≤ {ITL_X:g}x solo, TTFT ≤ {TTFT_X:g}x alone"
FAMILIES = {"mlx_lm": ("mlx-lm", "#7f8c8d"), "interleave": ("interleave", PALETTE[0]),
            "stall_free": ("stall-free", PALETTE[1]), "overlap": ("overlap", PALETTE[2]), "slo": ("slo", PALETTE[3]),
            "admission_gate": ("admission gate", PALETTE[4])}


def _family(s: Mapping) -> str:
    if s.get("executor") == "mlx_lm":
        return "mlx_lm"
    if s.get("overlap"):
        return "overlap"
    return s.get("policy") if s.get("policy") in FAMILIES else "interleave"


def _domains(xs: Sequence[float], ys: Sequence[float]) -> Tuple[Tuple[float, float], Tuple[float, float]]:
    x_lo, x_hi = min(min(xs), 1.0) / 1.3, max(max(xs), ITL_X) * 1.4
    y_min, y_max = min(min(ys), 1.0), max(max(ys), TTFT_X)
    return (x_lo, x_hi), (y_min / 1.15, y_max * 1.25)  # both axes log: ratios near 1 stay apart


def _panel(preset: str, res: Mapping) -> alt.LayerChart:
    rows = []
    for label, s in res["settings"].items():
        x, y = float(s.get("chat_itl_p99_over_solo", math.nan)), float(s.get("doc_ttft_over_best_alone", math.nan))
        if math.isfinite(x) and math.isfinite(y) and x > 0:
            fam = _family(s)
            rows.append({"label": label, "name": s.get("name", label), "family": FAMILIES[fam][0], "x": x, "y": y,
                         "itl_p99_ms": s.get("chat_itl_p99_ms"), "doc_ttft_s": s.get("doc_ttft_s")})
    if not rows:
        return alt.Chart(pd.DataFrame({"t": ["no figures"]})).mark_text().encode(text="t:N").properties(
            width=WIDTH, height=HEIGHT, title=preset)
    (x_lo, x_hi), (y_lo, y_hi) = _domains([r["x"] for r in rows], [r["y"] for r in rows])
    lx, ly = math.log(x_lo), math.log(x_hi)
    by, ty_ = math.log(y_lo), math.log(y_hi)

    def px(x):
        return WIDTH * (math.log(x) - lx) / (ly - lx)

    def py(y):
        return HEIGHT * (ty_ - math.log(y)) / (ty_ - by)

    spots = place_labels([(px(r["x"]), py(r["y"])) for r in rows], [r["name"] for r in rows], WIDTH, HEIGHT)
    for r, s in zip(rows, spots):
        r["tx"] = math.exp(lx + s["x"] / WIDTH * (ly - lx))
        r["ty"] = math.exp(ty_ - s["y"] / HEIGHT * (ty_ - by))
        r["align"], r["moved"] = s["align"], s["moved"]
    df = pd.DataFrame(rows)
    xs = alt.Scale(type="log", domain=[x_lo, x_hi], nice=False)
    ys = alt.Scale(type="log", domain=[y_lo, y_hi], nice=False)
    x_ax = alt.X("x:Q", scale=xs, title="chat ITL p99 during the prefill / solo (log)")
    y_ax = alt.Y("y:Q", scale=ys, title="document TTFT / best alone TTFT (log)")
    region = pd.DataFrame({"x": [x_lo], "x2": [ITL_X], "y": [y_lo], "y2": [TTFT_X], "what": [TARGET]})
    shade = alt.Chart(region).mark_rect(opacity=0.25).encode(
        x=alt.X("x:Q", scale=xs), x2="x2:Q", y=alt.Y("y:Q", scale=ys), y2="y2:Q",
        fill=alt.Fill("what:N", scale=alt.Scale(range=["#2f9e6e"]),
                      legend=alt.Legend(title=None, orient="bottom", labelLimit=0)))
    rules = (alt.Chart(pd.DataFrame({"x": [ITL_X]})).mark_rule(color="#2f9e6e", strokeDash=[4, 3]).encode(
        x=alt.X("x:Q", scale=xs)) + alt.Chart(pd.DataFrame({"y": [TTFT_X]})).mark_rule(
        color="#2f9e6e", strokeDash=[4, 3]).encode(y=alt.Y("y:Q", scale=ys)))
    fams = [v[0] for v in FAMILIES.values()]
    color = alt.Color("family:N", scale=alt.Scale(domain=fams, range=[v[1] for v in FAMILIES.values()]), legend=None)
    tip = ["name", alt.Tooltip("x:Q", format=".2f", title="ITL p99 / solo"),
           alt.Tooltip("y:Q", format=".2f", title="TTFT / best alone"),
           alt.Tooltip("itl_p99_ms:Q", format=".1f"), alt.Tooltip("doc_ttft_s:Q", format=".3f")]
    pts = alt.Chart(df).mark_point(filled=True, size=60, opacity=1).encode(x=x_ax, y=y_ax, color=color, tooltip=tip)
    moved = df[df["moved"]]
    lead = pd.DataFrame([{"x": r.x, "y": r.y, "o": 0, "label": r.label} for r in moved.itertuples()]
                        + [{"x": r.tx, "y": r.ty, "o": 1, "label": r.label} for r in moved.itertuples()],
                        columns=["x", "y", "o", "label"])
    layers = [shade, rules, pts]
    if len(lead):
        layers.insert(2, alt.Chart(lead).mark_line(color="#999999", strokeWidth=0.8).encode(
            x=alt.X("x:Q", scale=xs), y=alt.Y("y:Q", scale=ys), detail="label:N", order="o:Q"))
    for align in ("left", "right"):
        d = df[df["align"] == align]
        if len(d):
            layers.append(alt.Chart(d).mark_text(align=align, baseline="middle", fontSize=FONT).encode(
                x=alt.X("tx:Q", scale=xs), y=alt.Y("ty:Q", scale=ys), text="name:N", color=color))
    cfg = res.get("config") or {}
    title = f"{preset}: document {cfg.get('doc_tokens', '?')} tokens, chat context {cfg.get('chat_context', '?')}"
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=title)


def frontier_chart(presets: Mapping[str, Mapping], platform: str = "") -> alt.HConcatChart:
    """The frontier, one panel per preset: x the chat's warm ITL p99 during the document's prefill
    over its solo p99 (log), y the document's warm TTFT over the best alone TTFT of any setting;
    the target region shaded, with dashed edges."""
    panels = [_panel(name, res) for name, res in presets.items()]
    where = f" ({platform})" if platform else ""
    return alt.hconcat(*panels, title=alt.Title(
        f"A chat decoding beside a long document's prefill: every setting, warm runs{where}",
        subtitle="lower left is better; shaded: " + TARGET)).resolve_scale(x="independent", y="independent")


def frontier_chart_of(doc: Mapping, platform: str = "") -> alt.HConcatChart:
    """:func:`frontier_chart` of a stored contention result."""
    return frontier_chart(doc["presets"], platform)
