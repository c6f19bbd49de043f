"""Charts of the admission-gate experiment (:mod:`mlxlab.studies.admission_gate.run`): the chunk-size trade-off
per worker count, the TTFT/ITL plane, the chat's rates beside its solo rate, and one run's token
timeline. Altair with the one mlxlab theme; each takes the result's ``table`` (a list of rows or a
DataFrame) and ``references``."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import altair as alt
import pandas as pd

from mlxlab.notebook.plots import PALETTE, log_axis, use_theme

use_theme()

ORDER = ("interleave", "admission_gate", "stall_free", "admission_gate_window")


def _frame(table) -> pd.DataFrame:
    df = pd.DataFrame(table).copy()
    if "kind" in df:
        df = df[df.kind == "cell"]
    if "prompt_tokens" in df and len(df):  # the stall's longer prompt is no point on the curves
        df = df[df.prompt_tokens == df.prompt_tokens.mode().iloc[0]]
    for k, ms in (("chat_itl_p99_pooled_s", "chat_itl_p99_pooled_ms"), ("chat_itl_p99_s_lo", "chat_itl_p99_ms_lo"),
                  ("chat_itl_p99_s_hi", "chat_itl_p99_ms_hi"), ("chat_worst_gap_s", "chat_worst_gap_ms")):
        if k in df:
            df[ms] = df[k] * 1e3
    return df


def _chunk_axis(chunks, ref_chunk: int) -> alt.X:
    chunks = sorted(int(c) for c in chunks)
    return alt.X("chunk_size:Q", scale=alt.Scale(type="log", base=2, domain=[chunks[0] / 1.3, chunks[-1] * 1.3]),
                 axis=alt.Axis(values=chunks), title=f"chunk size (tokens; {ref_chunk} = the seed's 2,048)")


def _colors(policies) -> alt.Scale:
    keep = [p for p in ORDER if p in set(policies)]
    return alt.Scale(domain=keep, range=[PALETTE[ORDER.index(p)] for p in keep])


def tradeoff_chart(table, *, ref_chunk: int, workers: Optional[Sequence[int]] = None,
                   policies: Sequence[str] = ORDER[:3]) -> alt.VConcatChart:
    """One row per worker count: the long prompts' TTFT premium over the floor (W alone floors)
    and the chat's ITL p99 (pooled over repeats; bars: the repeats' own p99 from lowest to highest)
    against the chunk size, one line per policy. The green band, labelled, is the counterpart of
    the seed's 512-1,024-token sweet spot (``ref_chunk`` / 4 to / 2); the grey band on the premium,
    labelled, is the seed's published 15-30%."""
    df = _frame(table)
    df = df[df.policy.isin(policies)]
    band = pd.DataFrame({"lo": [ref_chunk / 4], "hi": [ref_chunk / 2],
                         "label": [f"seed's 512-1,024 sweet spot, scaled: {ref_chunk // 4}-{ref_chunk // 2}"]})
    color = alt.Color("policy:N", scale=_colors(df.policy), title="policy")
    itl_cols = [c for c in ("chat_itl_p99_pooled_ms", "chat_itl_p99_ms_lo", "chat_itl_p99_ms_hi") if c in df]
    itl_axis = log_axis(df[itl_cols].to_numpy().ravel()) if len(df) else alt.Axis()
    rows = []
    for w in workers or sorted(df.workers.unique()):
        d = df[df.workers == w]
        if not len(d):
            continue
        x = _chunk_axis(d.chunk_size.unique(), ref_chunk)
        shade = alt.Chart(band).mark_rect(opacity=0.12, color="#2f9e6e").encode(x="lo:Q", x2="hi:Q")
        shade_label = alt.Chart(band).mark_text(color="#2f9e6e", fontSize=9, dy=-4, baseline="bottom").encode(
            x=alt.X("mid:Q"), y=alt.value(0), text="label:N").transform_calculate(
            mid="sqrt(datum.lo * datum.hi)")  # the middle of the band on the log axis
        seed = alt.Chart(pd.DataFrame({"y": [15], "y2": [30], "label": ["seed's published +15-30%"]}))
        seed = seed.mark_rect(opacity=0.15, color="gray").encode(y="y:Q", y2="y2:Q") + seed.mark_text(
            color="#555", fontSize=9, align="right", baseline="top", dx=-3, dy=3).encode(
            y="y2:Q", x=alt.value(300), text="label:N")
        base = alt.Chart(d).encode(x=x, color=color)
        prem_t = "long-prompt TTFT over the floor (%)"
        prem_y = alt.Y("ttft_over_floor_pct:Q", title=prem_t)
        prem = (shade + shade_label + seed + base.mark_line(point=True).encode(
            y=prem_y, tooltip=["policy", "chunk_size", "workers", alt.Tooltip("long_ttft_s:Q", format=".3f"),
                               alt.Tooltip("ttft_over_floor_pct:Q", format=".1f")])
                + base.mark_errorbar().encode(y=alt.Y("ttft_over_floor_pct_lo:Q", title=prem_t),
                                              y2="ttft_over_floor_pct_hi:Q"))
        itl_t = "chat ITL p99 (ms)"
        itl_y = alt.Y("chat_itl_p99_pooled_ms:Q", scale=alt.Scale(type="log"), title=itl_t, axis=itl_axis)
        itl = (shade + shade_label + base.mark_line(point=True).encode(
            y=itl_y, tooltip=["policy", "chunk_size", "workers", alt.Tooltip("chat_itl_p99_pooled_ms:Q", format=".1f"),
                              alt.Tooltip("chat_worst_gap_ms:Q", format=".1f")])
               + base.mark_errorbar().encode(y=alt.Y("chat_itl_p99_ms_lo:Q", scale=alt.Scale(type="log"),
                                                     title=itl_t, axis=itl_axis), y2="chat_itl_p99_ms_hi:Q"))
        title = f"{w} long prompt{'s' if w > 1 else ''} beside the chat"
        rows.append(alt.hconcat(prem.properties(width=300, height=200),
                                itl.properties(width=300, height=200), title=title))
    return alt.vconcat(*rows).resolve_scale(color="shared")


def plane_chart(table) -> alt.HConcatChart:
    """The long prompts' TTFT premium over the floor against the chat's ITL p99, one panel per
    worker count; each policy's points joined in chunk order and labelled with the chunk size
    (the subtitle says so)."""
    df = _frame(table)
    panels = []
    for w in sorted(df.workers.unique()):
        d = df[df.workers == w].sort_values("chunk_size")
        base = alt.Chart(d).encode(
            x=alt.X("chat_itl_p99_pooled_ms:Q", scale=alt.Scale(type="log"), title="chat ITL p99 (ms)",
                    axis=log_axis(df.chat_itl_p99_pooled_ms)),
            y=alt.Y("ttft_over_floor_pct:Q", title="TTFT premium over the floor (%)"),
            color=alt.Color("policy:N", scale=_colors(df.policy)), order="chunk_size:Q")
        pts = base.mark_point(filled=True, size=60).encode(
            tooltip=["policy", "chunk_size", "workers", alt.Tooltip("chat_itl_p99_pooled_ms:Q", format=".1f"),
                     alt.Tooltip("long_ttft_s:Q", format=".3f"), alt.Tooltip("ttft_over_floor_pct:Q", format=".1f")])
        text = base.mark_text(dx=8, dy=-6, fontSize=9).encode(text="chunk_size:Q")
        panels.append((base.mark_line(opacity=0.5) + pts + text).properties(
            width=260, height=240, title=f"{w} long prompt{'s' if w > 1 else ''}"))
    title = alt.TitleParams("TTFT against chat ITL: every chunk size and policy",
                            subtitle="the number beside each point is its chunk size (tokens); "
                                     "lines join one policy's points in chunk order")
    return alt.hconcat(*panels, title=title).resolve_scale(y="shared")


def rate_chart(table, references: Dict, *, ref_chunk: int) -> alt.HConcatChart:
    """The chat's tokens/s over the prefill window (filled, lines) and over the decode windows
    between chunks (open circles: only the gate with a window has them) against the chunk size, one
    panel per worker count, beside its solo rate (dashed); bars: min-max over repeats."""
    df = _frame(table)
    rows = []
    for r in df.itertuples():
        rows.append({"policy": r.policy, "workers": r.workers, "chunk_size": r.chunk_size, "rate": r.chat_prefill_tok_s,
                     "lo": r.chat_prefill_tok_s_lo, "hi": r.chat_prefill_tok_s_hi, "over": "prefill window"})
        if r.window_gaps and pd.notna(r.chat_window_tok_s):
            rows.append({"policy": r.policy, "workers": r.workers, "chunk_size": r.chunk_size,
                         "rate": r.chat_window_tok_s, "lo": r.chat_window_tok_s_lo, "hi": r.chat_window_tok_s_hi,
                         "over": "decode windows"})
    d = pd.DataFrame(rows)
    solo = float(references.get("solo_tok_s") or float("nan"))
    y_t = "chat tokens/s"
    y = alt.Y("rate:Q", scale=alt.Scale(type="log"), title=y_t,
              axis=log_axis(list(d.rate) + list(d.lo) + list(d.hi) + [solo]))
    color = alt.Color("policy:N", scale=_colors(d.policy))
    panels = []
    for w in sorted(d.workers.unique()):
        dw = d[d.workers == w]
        base = alt.Chart(dw).encode(x=_chunk_axis(dw.chunk_size.unique(), ref_chunk), color=color)
        pre = base.transform_filter(alt.datum.over == "prefill window")
        win = base.transform_filter(alt.datum.over == "decode windows")
        rule = alt.Chart(pd.DataFrame({"y": [solo]})).mark_rule(color="#7f8c8d", strokeDash=[4, 3]).encode(y="y:Q")
        label = alt.Chart(pd.DataFrame({"y": [solo], "t": [f"the chat alone: {solo:.0f} tok/s"]})).mark_text(
            align="left", dx=4, dy=-6, color="#7f8c8d", fontSize=10).encode(y="y:Q", text="t:N", x=alt.value(0))
        tip = ["policy", "chunk_size", "workers", "over", alt.Tooltip("rate:Q", format=".2f")]
        layers = (pre.mark_line(point=True).encode(y=y, tooltip=tip) + pre.mark_errorbar().encode(
            y=alt.Y("lo:Q", title=y_t), y2="hi:Q") + win.mark_point(size=70, filled=False, strokeWidth=2).encode(
            y=y, tooltip=tip) + rule + label)
        panels.append(layers.properties(width=240, height=220, title=f"{w} long prompt{'s' if w > 1 else ''}"))
    title = "The chat's rate while long prompts prefill (lines: over the prefill window; circles: over the decode " \
            "windows between chunks)"
    return alt.hconcat(*panels, title=title).resolve_scale(y="shared")


def timeline_chart(rows, *, title: str) -> alt.Chart:
    """One run's chat tokens and its long prompts' arrivals and first tokens as ticks in time."""
    d = pd.DataFrame(rows)
    return alt.Chart(d, title=title).mark_tick(thickness=1.5, size=14).encode(
        x=alt.X("t_s:Q", title="time from the first arrival (s)"), y=alt.Y("stream:N", title=None),
        color=alt.Color("stream:N", legend=None)).properties(width=640, height=90)


def chunk_explorer_chart(table, *, ref_chunk: int, policies: Sequence[str] = ORDER[:3]) -> alt.HConcatChart:
    """The chunk-size trade-off with a chunk-size menu and a worker-count choice that work without
    a kernel (Vega-Lite parameters over the measured table, so the static HTML of the notebook and
    of the paper moves too): the long prompts' TTFT premium over the floor and the chat's ITL p99
    against the chunk size for the chosen worker count, one line per policy; the chosen chunk
    size is a rule, its points are ringed and its figures listed in the panel's corner."""
    df = _frame(table)
    df = df[df.policy.isin(policies)][["policy", "chunk_size", "workers", "ttft_over_floor_pct",
                                       "chat_itl_p99_pooled_ms"]].dropna()
    if df.empty:
        raise ValueError("no measured cell to explore: the table holds no chunk-size sweep")
    chunks, workers = sorted(int(c) for c in df.chunk_size.unique()), sorted(int(w) for w in df.workers.unique())
    start = min(chunks, key=lambda c: abs(c - ref_chunk / 4))  # the scaled sweet spot's lower end
    chunk = alt.param(name="chunk", value=start, bind=alt.binding_select(options=chunks, name="chunk size "))
    wk = alt.param(name="workers", value=workers[0], bind=alt.binding_radio(options=workers, name="long prompts "))
    color = alt.Color("policy:N", scale=_colors(df.policy), title="policy")
    x = _chunk_axis(chunks, ref_chunk)

    def panel(field: str, title: str, fmt: str, log: bool) -> alt.LayerChart:
        y = alt.Y(f"{field}:Q", title=title, scale=alt.Scale(type="log") if log else alt.Scale(zero=False))
        base = alt.Chart(df).transform_filter("datum.workers == workers").encode(x=x, y=y, color=color)
        lines = base.mark_line(point=True).encode(tooltip=["policy", "chunk_size", alt.Tooltip(f"{field}:Q", format=fmt)])
        at = base.transform_filter("datum.chunk_size == chunk")
        ring = at.mark_point(size=260, strokeWidth=2, filled=False)
        order = [p for p in ORDER if p in set(df.policy)]
        # the chosen size's figures as a legend-like list in the corner (points may coincide)
        label = at.transform_calculate(
            ypix=f"12 + 15 * indexof({order!r}, datum.policy)",
            txt=f"datum.policy + ': ' + format(datum['{field}'], '{fmt}')").mark_text(
            align="right", fontSize=11, fontWeight="bold").encode(
            x=alt.value(296), y=alt.Y("ypix:Q", scale=None), text="txt:N")
        rule = alt.Chart(pd.DataFrame({"z": [0]})).transform_calculate(c="chunk").mark_rule(
            strokeDash=[4, 3], color="#2f6e4e").encode(x="c:Q")
        return alt.layer(lines, rule, ring, label).properties(width=300, height=220)

    prem = panel("ttft_over_floor_pct", "long-prompt TTFT over the floor (%)", ".0f", False)
    itl = panel("chat_itl_p99_pooled_ms", "chat ITL p99 (ms)", ".0f", True)
    return alt.hconcat(prem, itl).add_params(chunk, wk).properties(title=alt.TitleParams(
        "Pick a chunk size: what the long prompts pay (left) and what the chat pays (right)",
        subtitle="measured on the engine; ringed, and listed in each corner: the chosen chunk size, per policy")).resolve_scale(
        color="shared")


def chunk_explorer_from_doc(doc: Dict, platform: str = "") -> alt.HConcatChart:
    """:func:`chunk_explorer_chart` of a stored ``admission_gate`` results document."""
    return chunk_explorer_chart(doc["table"], ref_chunk=int(doc["config"]["ref_chunk"]))
