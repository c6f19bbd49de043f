"""The figure of ``mlxlab bench soak`` (:mod:`mlxlab.studies.serving.soak`): over the run, the
server's memory (process RSS, MLX active memory, KV bytes held; sampled every few seconds, the
post-warm-up level and the end-of-run limits dashed) above the latency of the well-formed requests
per minute (TTFT and ITL p50/p99, log scale) and what became of each minute's requests."""

from __future__ import annotations

from typing import Mapping

import altair as alt
import pandas as pd

from mlxlab.notebook.plots import PALETTE, use_theme

use_theme()

MIB = 2 ** 20


def _memory(doc: Mapping) -> pd.DataFrame:
    rows = []
    for s in doc.get("samples") or []:
        for key, label in (("rss_bytes", "process RSS"), ("active_bytes", "MLX active"), ("kv_bytes", "KV held")):
            if s.get(key) is not None:
                rows.append({"minute": s["t_s"] / 60.0, "MiB": s[key] / MIB, "series": label})
    return pd.DataFrame(rows)


def _mid(doc: Mapping, row: Mapping) -> float:
    """The middle of a table row's interval, in minutes from the load's start."""
    return (row["minute"] - 0.5) * float((doc.get("config") or {}).get("interval_s") or 60.0) / 60.0


def _latency(doc: Mapping) -> pd.DataFrame:
    rows = []
    for r in doc.get("per_minute") or []:
        for key, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"), ("itl_p50_ms", "ITL p50"),
                           ("itl_p99_ms", "ITL p99")):
            if r.get(key):
                rows.append({"minute": _mid(doc, r), "ms": r[key], "series": label})
    return pd.DataFrame(rows)


def _outcomes(doc: Mapping) -> pd.DataFrame:
    rows = []
    for r in doc.get("per_minute") or []:
        for key in ("finished", "refused", "cancelled", "http_5xx", "stream_errors"):
            if r.get(key):
                rows.append({"minute": _mid(doc, r), "requests": r[key], "outcome": key.replace("_", " ")})
    return pd.DataFrame(rows)


def soak_chart(doc: Mapping, platform: str = "") -> alt.VConcatChart:
    """Memory over the run, then latency and outcomes per minute, from one ``serve_soak`` document."""
    mem, lat, out = _memory(doc), _latency(doc), _outcomes(doc)
    if mem.empty:
        raise ValueError("no samples of the server in this document")
    c, end = doc.get("config") or {}, doc.get("end") or {}
    interval = float(c.get("interval_s") or 60.0) / 60.0
    span = max(float(mem["minute"].max()), len(doc.get("per_minute") or []) * interval, 1 / 60)
    x = alt.X("minute:Q", scale=alt.Scale(domain=[0, span], nice=False), title="minutes into the load")
    names = ["process RSS", "MLX active", "KV held"]
    color = alt.Color("series:N", scale=alt.Scale(domain=names, range=PALETTE[:3]), title=None)
    memory = alt.Chart(mem).mark_line(strokeWidth=1.5).encode(x=x, y=alt.Y("MiB:Q", title="MiB"), color=color)
    marks = [(end.get("active_limit_bytes"), "MLX active limit"), (end.get("rss_limit_bytes"), "RSS limit")]
    lim = pd.DataFrame([{"MiB": v / MIB, "what": w} for v, w in marks if v])
    if not lim.empty:
        memory += alt.Chart(lim).mark_rule(strokeDash=[4, 3], color="#555").encode(y="MiB:Q", tooltip=["what"])
    memory = memory.properties(width=520, height=170, title="Server memory (sampled)")
    lnames = ["TTFT p50", "TTFT p99", "ITL p50", "ITL p99"]
    latency = alt.Chart(lat if not lat.empty else pd.DataFrame({"minute": [], "ms": [], "series": []})).mark_line(
        point=True).encode(x=x, y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="ms (log)"),
                           color=alt.Color("series:N", scale=alt.Scale(domain=lnames, range=PALETTE[3:7]), title=None),
                           strokeDash=alt.condition("indexof(datum.series, 'p99') >= 0", alt.value([1, 0]),
                                                    alt.value([4, 2]))).properties(
        width=520, height=150, title="Well-formed requests per interval: latency")
    onames = ["finished", "refused", "cancelled", "http 5xx", "stream errors"]
    outcomes = alt.Chart(out).mark_bar(size=max(4, int(400 * interval / span))).encode(
        x=x, y=alt.Y("requests:Q", title="requests"),
        color=alt.Color("outcome:N", scale=alt.Scale(domain=onames, range=["#4c78a8", "#f2a93b", "#9d9d9d", "#d62728",
                                                                          "#8c1c13"]), title=None)).properties(
        width=520, height=110, title="What became of the requests, per interval")
    where = f"{platform}, " if platform else ""
    title = alt.TitleParams(f"mlxlab serve under faults ({where}{c.get('model', '?')}, {c.get('minutes', '?')} min)",
                            subtitle=f"{c.get('workers', '?')} document clients beside a chat, a fault about every "
                                     f"{c.get('fault_gap_s', '?')} s; dashed: the end-of-run limits")
    return alt.vconcat(memory, latency, outcomes, title=title).resolve_scale(color="independent")
