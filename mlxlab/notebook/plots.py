"""Altair chart builders with one theme, and saving figures as SVG and PNG (vl-convert, no browser)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence

import altair as alt
import pandas as pd

PALETTE = ["#1f5fa8", "#d9622b", "#2f9e6e", "#8a4fbf", "#c0392b", "#7f8c8d", "#b8860b", "#17becf"]
WIDTH, HEIGHT = 420, 260


def _theme():
    return {"config": {
        "view": {"continuousWidth": WIDTH, "continuousHeight": HEIGHT, "stroke": None},
        "range": {"category": PALETTE},
        "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True, "gridOpacity": 0.4},
        "legend": {"labelFontSize": 11, "titleFontSize": 11, "orient": "right"},
        "title": {"fontSize": 13, "anchor": "start"},
        "font": "DejaVu Sans",
    }}


def use_theme() -> None:
    """Register and enable the mlxlab theme (idempotent)."""
    try:  # altair >= 5.5
        alt.theme.register("mlxlab", enable=True)(_theme)
    except AttributeError:  # pragma: no cover - older altair
        alt.themes.register("mlxlab", _theme)
        alt.themes.enable("mlxlab")


use_theme()


def save_figure(chart: alt.TopLevelMixin, name: str, folder: "str | Path",
                formats: Sequence[str] = ("svg", "png"), scale: float = 2.0) -> list:
    """Write ``chart`` as ``<folder>/<name>.svg`` and ``.png``; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = folder / f"{name}.{fmt}"
        if fmt == "png":
            chart.save(str(p), scale_factor=scale)
        else:
            chart.save(str(p))
        paths.append(p)
    return paths


def lines(df: pd.DataFrame, x: str, y: str, color: Optional[str] = None, *, title: str = "",
          x_title: Optional[str] = None, y_title: Optional[str] = None, log_x: bool = False,
          log_y: bool = False, points: bool = True, tooltip: Optional[Iterable[str]] = None) -> alt.Chart:
    """A line chart (one line per ``color`` value) with points."""
    xs = alt.Scale(type="log", base=2) if log_x else alt.Scale(zero=False)
    ys = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    enc = {
        "x": alt.X(f"{x}:Q", title=x_title or x, scale=xs),
        "y": alt.Y(f"{y}:Q", title=y_title or y, scale=ys),
        "tooltip": list(tooltip or [c for c in (x, y, color) if c]),
    }
    if color:
        enc["color"] = alt.Color(f"{color}:N", title=color)
    return alt.Chart(df, title=title).mark_line(point=points).encode(**enc)


def marker(x_value: float, *, color: str = "#c0392b") -> alt.Chart:
    """A vertical rule at ``x_value`` (the slider's current setting)."""
    return alt.Chart(pd.DataFrame({"x": [x_value]})).mark_rule(color=color, strokeWidth=2, strokeDash=[4, 3]).encode(x="x:Q")


def hline(y_value: float, label: str = "", *, color: str = "#7f8c8d") -> alt.Chart:
    """A horizontal reference line with an optional label."""
    base = alt.Chart(pd.DataFrame({"y": [y_value], "label": [label]}))
    rule = base.mark_rule(color=color, strokeDash=[2, 2]).encode(y="y:Q")
    if not label:
        return rule
    return rule + base.mark_text(align="left", dx=4, dy=-6, color=color, fontSize=10).encode(y="y:Q", text="label:N", x=alt.value(0))


def token_timeline(token_times: pd.DataFrame, *, title: str = "Token timeline", gap_threshold_s: Optional[float] = None) -> alt.Chart:
    """Each output token as a tick at its time, one row per stream; ``token_times`` has
    columns stream, t_s (and optional gap_s). Gaps above ``gap_threshold_s`` are drawn red."""
    df = token_times.copy()
    if "gap_s" not in df:
        df["gap_s"] = df.groupby("stream")["t_s"].diff().fillna(0.0)
    df["stall"] = df["gap_s"] > (gap_threshold_s if gap_threshold_s is not None else float("inf"))
    return alt.Chart(df, title=title).mark_tick(thickness=1.5, size=14).encode(
        x=alt.X("t_s:Q", title="time (s)"),
        y=alt.Y("stream:N", title=None),
        color=alt.Color("stall:N", scale=alt.Scale(domain=[False, True], range=["#1f5fa8", "#c0392b"]),
                        legend=alt.Legend(title="gap above threshold")),
        tooltip=["stream", "t_s", "gap_s"],
    ).properties(height=max(60, 28 * df["stream"].nunique()))


def ratio_bars(df: pd.DataFrame, category: str, ratio: str, *, color: Optional[str] = None,
               title: str = "", reference: float = 1.0) -> alt.Chart:
    """Horizontal bars of a ratio (mlxlab / mlx-lm) with a labelled rule at ``reference`` (equal
    to mlx-lm); ``color`` names the column whose values the legend shows, as given (pass readable
    values, not field names)."""
    enc = {"y": alt.Y(f"{category}:N", title=None),
           "x": alt.X(f"{ratio}:Q", title="ratio mlxlab / mlx-lm", axis=alt.Axis(tickCount=6)),
           "tooltip": list(df.columns)}
    if color:
        enc["color"] = alt.Color(f"{color}:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=0))
        enc["yOffset"] = alt.YOffset(f"{color}:N")
    bars = alt.Chart(df, title=title).mark_bar().encode(**enc)
    ref = alt.Chart(pd.DataFrame({"x": [reference], "label": [f"{reference:g} = as fast as mlx-lm"]}))
    rule = ref.mark_rule(color="#c0392b").encode(x="x:Q")
    text = ref.mark_text(color="#c0392b", align="left", dx=4, dy=-6, baseline="bottom").encode(
        x="x:Q", y=alt.value(0), text="label:N")
    return bars + rule + text
