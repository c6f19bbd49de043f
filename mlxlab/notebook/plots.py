"""Altair chart builders with one theme, and saving figures as SVG and PNG (vl-convert, no browser)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple

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


SPEC_SUFFIX = ".vl.json"  # a figure saved as its Vega-Lite spec, to be rendered where vl-convert is


def can_render() -> bool:
    """Whether this Python can turn a chart into SVG/PNG (vl-convert-python is installed). The
    H200 machine's image has no vl-convert (32 MiB, too much to carry beside the mlx bundle)."""
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        return False
    return True


def save_figure(chart: alt.TopLevelMixin, name: str, folder: "str | Path",
                formats: Sequence[str] = ("svg", "png"), scale: float = 2.0) -> list:
    """Write ``chart`` as ``<folder>/<name>.svg`` and ``.png``; returns the paths. Without
    vl-convert (:func:`can_render`) it writes the chart's Vega-Lite spec with its data inline,
    ``<folder>/<name>.vl.json``, which :func:`render_pending` turns into the same files later on
    a machine that has vl-convert (same spec, same renderer: the figure is the one a local run
    would have drawn)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not can_render():
        p = folder / f"{name}{SPEC_SUFFIX}"
        p.write_text(chart.to_json(indent=None), encoding="utf-8")
        return [p]
    paths = []
    for fmt in formats:
        p = folder / f"{name}.{fmt}"
        if fmt == "png":
            chart.save(str(p), scale_factor=scale)
        else:
            chart.save(str(p))
        paths.append(p)
    return paths


def save_explorer(chart: alt.TopLevelMixin, path: "str | Path") -> Path:
    """Write ``chart`` as one self-contained HTML file (Vega, Vega-Lite and vega-embed inlined, the
    SVG renderer): it opens offline, and its Vega-Lite parameters (sliders, menus) move without a
    kernel: the explorers of notebooks 05 and 09, and the paper's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chart.save(str(path), format="html", inline=True, embed_options={"renderer": "svg", "actions": False})
    return path


def render_pending(folder: "str | Path", scale: float = 2.0, keep_spec: bool = False) -> list:
    """Render every ``*.vl.json`` spec under ``folder`` (written by :func:`save_figure` where
    vl-convert was missing) to SVG and PNG beside it, and remove the spec unless ``keep_spec``;
    returns the written paths. Raises RuntimeError when this Python cannot render either."""
    if not can_render():
        raise RuntimeError("rendering figures needs vl-convert-python: pip install vl-convert-python")
    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert

    vl = vl_version_for_vl_convert()  # the Vega-Lite version chart.save would pass
    written = []
    for spec in sorted(Path(folder).rglob(f"*{SPEC_SUFFIX}")):
        text = spec.read_text(encoding="utf-8")  # the spec as altair wrote it (any chart: layers, concat)
        stem = spec.parent / spec.name[: -len(SPEC_SUFFIX)]
        Path(f"{stem}.svg").write_text(vlc.vegalite_to_svg(text, vl_version=vl), encoding="utf-8")
        Path(f"{stem}.png").write_bytes(vlc.vegalite_to_png(text, vl_version=vl, scale=scale))
        written += [Path(f"{stem}.svg"), Path(f"{stem}.png")]
        if not keep_spec:
            spec.unlink()
    return written


def log_ticks(lo: float, hi: float) -> list:
    """Tick values for a log axis covering ``lo``..``hi`` widened to whole decades (the domain
    vega's ``nice`` log scale draws): the powers of ten when that spans more than three decades,
    1-2-5 in each decade up to three, 1-2-3-5-7 within one. Vega's own log ticks (1, 2, 3, 4, ...
    every decade) print on top of each other on a short axis."""
    if not (lo > 0 and hi > 0) or not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"a log axis needs finite positive bounds, got {lo}..{hi}")
    lo, hi = min(lo, hi), max(lo, hi)
    d0, d1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    d1 = max(d1, d0 + 1)
    span = d1 - d0
    steps = (1,) if span > 3 else (1, 2, 5) if span > 1 else (1, 2, 3, 5, 7)
    return [float(f"{m * 10.0 ** d:.12g}") for d in range(d0, d1) for m in steps] + [float(f"{10.0 ** d1:.12g}")]


def log_axis(values: Iterable[float], **axis) -> alt.Axis:
    """An axis for a log scale whose ticks (:func:`log_ticks`) span the finite positive
    ``values`` (the data, with any error bars); other ``alt.Axis`` options pass through."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v)) and float(v) > 0]
    if not vals:
        raise ValueError("a log axis needs at least one positive value")
    return alt.Axis(values=log_ticks(min(vals), max(vals)), **axis)


def lines(df: pd.DataFrame, x: str, y: str, color: Optional[str] = None, *, title: str = "",
          x_title: Optional[str] = None, y_title: Optional[str] = None, color_title: Optional[str] = None,
          color_sort: Optional[Sequence] = None, log_x: bool = False, log_y: bool = False, points: bool = True,
          tooltip: Optional[Iterable[str]] = None) -> alt.Chart:
    """A line chart (one line per ``color`` value) with points. Pass readable axis and legend
    titles (``x_title``, ``y_title``, ``color_title``, with units): the column names are the
    defaults; ``color_sort`` orders the legend. A log x axis is ticked at the values it holds
    (the sweep's settings)."""
    xs = alt.Scale(type="log", base=2) if log_x else alt.Scale(zero=False)
    ys = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    x_axis = alt.Axis(values=sorted(float(v) for v in df[x].unique())) if log_x else alt.Axis()
    y_axis = log_axis(df[y]) if log_y else alt.Axis()
    enc = {
        "x": alt.X(f"{x}:Q", title=x_title or x, scale=xs, axis=x_axis),
        "y": alt.Y(f"{y}:Q", title=y_title or y, scale=ys, axis=y_axis),
        "tooltip": list(tooltip or [c for c in (x, y, color) if c]),
    }
    if color:
        enc["color"] = alt.Color(f"{color}:N", title=color_title or color,
                                 sort=list(color_sort) if color_sort is not None else "ascending")
    return alt.Chart(df, title=title).mark_line(point=points).encode(**enc)


def vrule(x_value: float, label: str = "", *, color: str = "#7f8c8d", dash: Sequence[int] = (4, 3),
          width: float = 1.0, align: str = "center") -> alt.LayerChart:
    """A vertical reference line at ``x_value``; ``label`` (what the line is) is written above
    the plot area, where it cannot cover the data (``align="left"`` starts it at the line, for a
    line near the left edge)."""
    base = alt.Chart(pd.DataFrame({"x": [x_value], "label": [label]}))
    rule = base.mark_rule(color=color, strokeDash=list(dash), strokeWidth=width).encode(x="x:Q")
    if not label:
        return rule
    return rule + base.mark_text(color=color, fontSize=10, dy=-4, baseline="bottom", align=align,
                                 dx=2 if align == "left" else 0).encode(x="x:Q", y=alt.value(0), text="label:N")


def marker(x_value: float, label: str = "", *, color: str = "#c0392b") -> alt.Chart:
    """A vertical rule at ``x_value`` (the slider's current setting), labelled above the plot
    with ``label`` (e.g. "slider: 1,024 tokens")."""
    return vrule(x_value, label, color=color, dash=(4, 3), width=2)


def hline(y_value: float, label: str = "", *, color: str = "#7f8c8d", align: str = "left") -> alt.Chart:
    """A horizontal reference line with an optional label (what the line is) just above it, at
    the left of the plot (``align="right"``: at the right, where the data leave room)."""
    if align not in ("left", "right"):
        raise ValueError(f"hline align must be 'left' or 'right', got {align!r}")
    base = alt.Chart(pd.DataFrame({"y": [y_value], "label": [label]}))
    rule = base.mark_rule(color=color, strokeDash=[2, 2]).encode(y="y:Q")
    if not label:
        return rule
    at = alt.value(0) if align == "left" else alt.value("width")
    return rule + base.mark_text(align=align, dx=4 if align == "left" else -4, dy=-6, color=color, fontSize=10).encode(
        y="y:Q", text="label:N", x=at)


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
               title: "str | alt.TitleParams" = "", reference: float = 1.0,
               spread: Optional[Tuple[str, str]] = None) -> alt.Chart:
    """Horizontal bars of a ratio (mlxlab / mlx-lm) with a labelled rule at ``reference`` (equal
    to mlx-lm); ``color`` names the column whose values the legend shows, as given (pass readable
    values, not field names); ``spread`` names two columns (low, high: e.g. the median less and plus
    its noise band) drawn as a black rule across each bar."""
    enc = {"y": alt.Y(f"{category}:N", title=None),
           "x": alt.X(f"{ratio}:Q", title="ratio mlxlab / mlx-lm", axis=alt.Axis(tickCount=6)),
           "tooltip": list(df.columns)}
    if color:
        enc["color"] = alt.Color(f"{color}:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=0))
        enc["yOffset"] = alt.YOffset(f"{color}:N")
    bars = alt.Chart(df, title=title).mark_bar().encode(**enc)
    if spread:
        lo, hi = spread
        whisk = {"y": enc["y"], "x": alt.X(f"{lo}:Q"), "x2": f"{hi}:Q", "tooltip": enc["tooltip"]}
        if color:
            whisk["yOffset"] = enc["yOffset"]
        bars = bars + alt.Chart(df).mark_rule(color="black", strokeWidth=1.5).encode(**whisk)
    ref = alt.Chart(pd.DataFrame({"x": [reference], "label": [f"{reference:g} = as fast as mlx-lm"]}))
    rule = ref.mark_rule(color="#c0392b").encode(x="x:Q")
    text = ref.mark_text(color="#c0392b", align="left", dx=4, dy=-6, baseline="bottom").encode(
        x="x:Q", y=alt.value(0), text="label:N")
    return bars + rule + text
