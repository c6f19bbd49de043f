"""The figure of ``mlxlab bench http`` (:mod:`mlxlab.studies.serving.against`): documents finished
per minute against the chat's ITL p99 beside them, one point per server (mlx_lm.server, and
``mlxlab serve`` under each policy), the bars spanning the repeats, and the chat's solo ITL p99 as
a dashed line with the 2x band of ``mlx-serve-chat-itl`` shaded. A server whose requests failed is
not drawn (its figures count only what finished before it broke); the subtitle names it and the
error. Lower right is better: more
documents, a calmer chat. The ITL axis is logarithmic: the servers' chats differ by orders of
magnitude."""

from __future__ import annotations

from typing import Mapping

import altair as alt
import pandas as pd

from mlxlab.notebook.plots import PALETTE, use_theme
from mlxlab.studies.serving.against import ITL_X, failed

use_theme()

COLORS = {"mlx_lm.server": "#7f8c8d"}


def _rows(doc: Mapping) -> pd.DataFrame:
    rows = []
    for label, s in (doc.get("servers") or {}).items():
        sm = s.get("summary") or {}
        d, i = sm.get("docs_per_min") or {}, sm.get("chat_itl_p99_ms") or {}
        if d.get("median") is None or i.get("median") is None or failed(s):
            continue
        rows.append({"server": label, "docs": d["median"], "docs_lo": d["min"], "docs_hi": d["max"],
                     "itl": i["median"], "itl_lo": i["min"], "itl_hi": i["max"],
                     "solo": (sm.get("solo_itl_p99_ms") or {}).get("median")})
    return pd.DataFrame(rows)


def http_chart(doc: Mapping, platform: str = "") -> alt.Chart:
    """The servers of one ``serve_http`` results document on the documents/min - chat ITL plane."""
    df = _rows(doc)
    if df.empty:
        raise ValueError("no server in these results has both documents/min and a chat ITL p99")
    c = doc.get("config") or {}
    names = list(df["server"])
    every = list(doc.get("servers") or {})  # a server keeps its colour when one before it is not drawn
    colors = [COLORS.get(n, PALETTE[every.index(n) % len(PALETTE)]) for n in names]
    # a legend, not labels beside the points: two servers close on the plane had their labels read as each other's
    color = alt.Color("server:N", scale=alt.Scale(domain=names, range=colors),
                      legend=alt.Legend(title=None, orient="top-right", labelFontSize=11))
    lo, hi = min(df["itl_lo"].min(), df["solo"].min()) / 2, max(df["itl_hi"].max(), ITL_X * df["solo"].max()) * 2
    y = alt.Y("itl:Q", scale=alt.Scale(type="log", domain=[lo, hi]), title="chat ITL p99 beside the documents (ms)")
    x = alt.X("docs:Q", scale=alt.Scale(domainMin=0, nice=True), title="documents finished per minute")
    base = alt.Chart(df)
    solo = float(df["solo"].median())
    band = alt.Chart(pd.DataFrame({"lo": [solo], "hi": [ITL_X * solo]})).mark_rect(opacity=0.12, color=PALETTE[2]).encode(
        y=alt.Y("lo:Q", scale=alt.Scale(type="log", domain=[lo, hi])), y2="hi:Q")
    rule = alt.Chart(pd.DataFrame({"solo": [solo]})).mark_rule(strokeDash=[4, 3], color="#555").encode(y="solo:Q")
    note = alt.Chart(pd.DataFrame({"solo": [ITL_X * solo], "t": [f"within {ITL_X:g}x the solo chat ITL p99"]})).mark_text(
        align="left", baseline="bottom", dx=4, dy=-2, fontSize=10, color="#2f6e4e").encode(
        y="solo:Q", x=alt.value(0), text="t:N")
    xbars = base.mark_rule(strokeWidth=1.5).encode(x=alt.X("docs_lo:Q"), x2="docs_hi:Q", y=y, color=color)
    ybars = base.mark_rule(strokeWidth=1.5).encode(x=x, y=alt.Y("itl_lo:Q"), y2="itl_hi:Q", color=color)
    dots = base.mark_point(filled=True, size=90).encode(
        x=x, y=y, color=color, tooltip=["server", alt.Tooltip("docs:Q", format=".1f"), alt.Tooltip("itl:Q", format=".0f")])
    where = f"{platform}, " if platform else ""
    sub = [f"{c.get('workers', '?')} document clients of {c.get('doc_chars', '?')} tokens beside a "
           f"{c.get('chat_chars', '?')}-token chat; median of {c.get('repeats', '?')} repeats, bars: min to max"]
    sub += [f"not drawn: {k}, its requests failed ({failed(v)[0][:70]})"
            for k, v in (doc.get("servers") or {}).items() if failed(v)]
    title = alt.TitleParams(f"Over HTTP: documents against the chat ({where}{c.get('model_dir', '?')})", subtitle=sub)
    return (band + rule + note + xbars + ybars + dots).properties(width=420, height=300, title=title)
