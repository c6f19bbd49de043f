"""Interactive explorers for the notebooks: ipywidgets controls driving ``altair.JupyterChart``.

Charts are ``JupyterChart`` widgets with ``enable_offline()``, so they render in JupyterLab with
no internet (vega is loaded from vl-convert instead of a CDN). Every explorer is the same idea:
controls, and one or more charts rebuilt by a function of the controls' values.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence

import altair as alt
import ipywidgets as W

_offline = False


def offline() -> None:
    """Make every chart render with no internet: JupyterChart loads its JavaScript from
    vl-convert, and plain charts display through JupyterChart too (the default renderer would
    fetch vega from a CDN). Idempotent."""
    global _offline
    if not _offline:
        from mlxlab.notebook.plots import can_render

        if not can_render():
            # no vl-convert (the H200 machine's headless runs): nobody views these charts live; they
            # keep the default renderer and the figures are saved as specs (plots.save_figure)
            _offline = True
            return
        alt.JupyterChart.enable_offline()
        alt.renderers.enable("jupyter", offline=True)
        _offline = True


def explorer(build: Callable[..., "alt.TopLevelMixin | Sequence[alt.TopLevelMixin]"],
             controls: Dict[str, W.ValueWidget], *, title: str = "") -> W.VBox:
    """Controls above charts; ``build(**values)`` returns a chart or a list of charts, and is
    called again whenever a control changes. The returned box has ``.charts`` (the
    JupyterChart widgets) and ``.controls`` for tests and scripting."""
    offline()
    values = lambda: {k: c.value for k, c in controls.items()}  # noqa: E731
    first = build(**values())
    first = list(first) if isinstance(first, (list, tuple)) else [first]
    charts = [alt.JupyterChart(c) for c in first]

    def update(_change=None):
        new = build(**values())
        new = list(new) if isinstance(new, (list, tuple)) else [new]
        for jc, c in zip(charts, new):
            jc.chart = c

    for c in controls.values():
        c.observe(update, names="value")
    header = [W.HTML(f"<b>{title}</b>")] if title else []
    box = W.VBox(header + [W.HBox(list(controls.values()))] + charts)
    box.charts, box.controls, box.update = charts, controls, update
    return box


def choice_slider(options: Sequence, value=None, description: str = "") -> W.SelectionSlider:
    """A slider over a fixed list of measured settings (e.g. the chunk sizes of a sweep)."""
    options = list(options)
    return W.SelectionSlider(options=options, value=value if value is not None else options[len(options) // 2],
                             description=description, continuous_update=False,
                             style={"description_width": "initial"}, layout=W.Layout(width="420px"))


def float_slider(value: float, lo: float, hi: float, step: float, description: str = "") -> W.FloatSlider:
    return W.FloatSlider(value=value, min=lo, max=hi, step=step, description=description,
                         continuous_update=False, style={"description_width": "initial"},
                         layout=W.Layout(width="360px"))

