"""The disaggregation study's figure (:mod:`mlxlab.studies.disagg.run`): one engine against a prefill
worker and a decode worker, measured, and the case study's scene at its own scale, simulated.

Top row, from a ``disagg.json`` document's runs: the chat's ITL p50 and p99 over the document's
prefill (every repeat a dot, the median a tick), the document's TTFT, and each prompt's KV bytes
against its transfer time with the line the simulator uses. Bottom row, from the stored
``s001-own-compute`` verdict (:mod:`mlxlab.studies.disagg.verdict`): per seed-scale setting the
chat's ITL p99 against its solo ITL, and the warm turn's and the batch's time to first token.
Altair with the one mlxlab theme; the notebook and ``bench disagg --rescore`` save it with
:func:`mlxlab.notebook.plots.save_figure`.
"""

from __future__ import annotations

from typing import List, Mapping, Optional

import altair as alt
import pandas as pd

from mlxlab.notebook.plots import PALETTE, log_ticks, use_theme

use_theme()

LABELS = {"single": "one engine", "disagg": "prefill + decode workers", "disagg-busywait": "workers, ring busy-polling",
          "split": "two engines, split by tenant"}
W, H = 230, 120
LABEL_LIMIT = 260  # pixels: the seed settings' names in full


def _log_axis(values) -> alt.Axis:
    """A log axis ticked at 1 and 5 of each decade the values span (a narrow panel has no room
    for :func:`mlxlab.notebook.plots.log_ticks`' 2s)."""
    vals = [float(v) for v in values if v and float(v) > 0]
    return alt.Axis(values=[t for t in log_ticks(min(vals), max(vals)) if f"{t:g}"[0] in "15"])


def measured_frame(doc: Mapping) -> pd.DataFrame:
    """One row per setting, repeat and figure: ``setting`` (its label), ``repeat``, ``figure``
    (chat ITL p50 / p99 in ms, document TTFT in s) and ``value``."""
    rows = []
    for name, runs in (doc.get("runs") or {}).items():
        for i, r in enumerate(runs):
            for key, fig in (("chat_itl_p50_ms", "chat ITL p50"), ("chat_itl_p99_ms", "chat ITL p99"),
                             ("doc_ttft_s", "document TTFT")):
                if r.get(key) is not None:
                    rows.append({"setting": LABELS.get(name, name), "repeat": i, "figure": fig, "value": float(r[key])})
    return pd.DataFrame(rows, columns=["setting", "repeat", "figure", "value"])


def transfer_frame(doc: Mapping) -> pd.DataFrame:
    """Every measured KV send: ``setting``, ``prompt`` (chat or document), ``mib`` and ``ms``."""
    rows = []
    for name, runs in (doc.get("runs") or {}).items():
        for r in runs:
            for idx, t in (r.get("transfers") or {}).items():
                if t.get("transfer_s") is not None and t.get("kv_bytes"):
                    rows.append({"setting": LABELS.get(name, name), "prompt": "chat" if str(idx) == "0" else "document",
                                 "mib": t["kv_bytes"] / 2**20, "ms": 1e3 * t["transfer_s"]})
    return pd.DataFrame(rows, columns=["setting", "prompt", "mib", "ms"])


def seed_frame(measured: Mapping) -> pd.DataFrame:
    """The seed-scale settings of an ``s001-own-compute`` verdict's ``measured``: ``setting``,
    ``chat_itl_p99_ms``, ``warm_turn_ttft_s``, ``batch_last_first_token_s``."""
    return pd.DataFrame([{"setting": k, **v} for k, v in (measured.get("settings") or {}).items()])


def _verdict(doc: Mapping, claim: str) -> Optional[Mapping]:
    return next((v for v in doc.get("verdicts") or [] if v.get("claim") == claim), None)


def _order(doc: Mapping) -> List[str]:
    return [LABELS.get(k, k) for k in (doc.get("runs") or {})]


def _dots(df: pd.DataFrame, x_title: str, order: List[str], color: str, log: bool = True) -> alt.Chart:
    if log:
        x = alt.X("value:Q", title=x_title, scale=alt.Scale(type="log"), axis=_log_axis(df.value))
    else:
        x = alt.X("value:Q", title=x_title, scale=alt.Scale(zero=True))
    y = alt.Y("setting:N", title=None, sort=order, axis=alt.Axis(labelLimit=LABEL_LIMIT))
    base = alt.Chart(df)
    dots = base.mark_point(filled=True, size=45, opacity=0.7).encode(
        x=x, y=y, color=alt.Color("figure:N", title=None, scale=alt.Scale(range=[PALETTE[0], PALETTE[1]]))
        if color == "figure" else alt.value(color), tooltip=["setting", "figure", "repeat", alt.Tooltip("value:Q", format=".4g")])
    med = base.mark_tick(thickness=2, size=18, color="black").encode(
        x=alt.X("median(value):Q"), y=y, detail="figure:N")
    return (dots + med).properties(width=W + 90 if log else W, height=H)


def measured_chart(doc: Mapping) -> alt.HConcatChart:
    """The top row: chat ITL, document TTFT, KV transfers (module docstring)."""
    df, order = measured_frame(doc), _order(doc)
    itl = _dots(df[df.figure != "document TTFT"], "chat ITL during the document's prefill (ms, log)", order,
                "figure").properties(title="chat ITL p50 / p99 (dots: repeats; tick: median)")
    ttft = _dots(df[df.figure == "document TTFT"], "document TTFT (s)", order, PALETTE[2], log=False).properties(
        title="document TTFT")
    tf = transfer_frame(doc)
    panels = [itl, ttft]
    if len(tf):
        fit = ((_verdict(doc, "mlx-disagg-sim") or {}).get("measured") or {}).get("transfer_fit")
        pts = alt.Chart(tf).mark_point(filled=True, size=45).encode(
            x=alt.X("mib:Q", title="KV sent (MiB)", axis=alt.Axis(tickCount=5)), y=alt.Y("ms:Q", title="transfer (ms)"),
            color=alt.Color("prompt:N", title="prompt", scale=alt.Scale(range=[PALETTE[3], PALETTE[4]])),
            shape=alt.Shape("setting:N", title=None), tooltip=["setting", "prompt", alt.Tooltip("mib:Q", format=".2f"),
                                                                alt.Tooltip("ms:Q", format=".1f")])
        layers = [pts]
        if fit:
            hi = float(tf.mib.max())
            line = pd.DataFrame({"mib": [0.0, hi], "ms": [1e3 * (fit["latency_s"] + b * 2**20 * fit["s_per_byte"])
                                                          for b in (0.0, hi)]})
            layers.append(alt.Chart(line).mark_line(color="gray", strokeDash=[4, 3]).encode(x="mib:Q", y="ms:Q"))
        panels.append(alt.layer(*layers).properties(width=W, height=H, title="KV transfer (line: the fit simulated)"))
    return alt.hconcat(*panels).resolve_scale(color="independent", shape="independent")


def seed_chart(measured: Mapping) -> alt.HConcatChart:
    """The bottom row: each seed-scale setting's chat ITL p99 against the solo ITL, and its warm
    turn's and batch's time to first token."""
    df = seed_frame(measured)
    order = list(df.setting)
    y = alt.Y("setting:N", title=None, sort=order, axis=alt.Axis(labelLimit=LABEL_LIMIT))
    solo = float(measured["solo_itl_ms"])
    df["from_ms"] = solo / 2  # a log axis has no zero: the bars start at half the solo ITL
    bars = alt.Chart(df).mark_bar(color=PALETTE[0], height=12).encode(
        x=alt.X("chat_itl_p99_ms:Q", title="chat ITL p99 during the batch's prefill (ms, log)",
                scale=alt.Scale(type="log"), axis=_log_axis(list(df.chat_itl_p99_ms) + [solo / 2])),
        x2="from_ms:Q", y=y,
        tooltip=["setting", alt.Tooltip("chat_itl_p99_ms:Q", format=".1f"), alt.Tooltip("chat_worst_gap_ms:Q", format=".1f")])
    rule = alt.Chart(pd.DataFrame({"x": [solo]})).mark_rule(color="gray", strokeDash=[4, 3]).encode(x="x:Q")
    itl = (bars + rule).properties(width=W + 60, height=H, title="seed scale (simulated, the 35B MoE's profile): the chat; dashed: solo ITL")
    t = df.melt(id_vars=["setting"], value_vars=["warm_turn_ttft_s", "batch_last_first_token_s"], var_name="who",
                value_name="s")
    t["who"] = t.who.map({"warm_turn_ttft_s": "warm session's next turn", "batch_last_first_token_s": "last batch prompt"})
    ttft = alt.Chart(t).mark_point(filled=True, size=60).encode(
        x=alt.X("s:Q", title="time to first token (s)"), y=y,
        color=alt.Color("who:N", title=None, scale=alt.Scale(range=[PALETTE[2], PALETTE[5]])),
        tooltip=["setting", "who", alt.Tooltip("s:Q", format=".2f")])
    return alt.hconcat(itl, ttft.properties(width=W + 60, height=H, title="seed scale: first tokens")
                       ).resolve_scale(color="independent")


def disagg_chart(doc: Mapping, platform: str = "") -> alt.VConcatChart:
    """The study's figure for a ``disagg.json`` document (module docstring); without a seed-scale
    verdict, the measured row only."""
    cfg = doc.get("config") or {}
    title = (f"one engine vs a prefill and a decode worker ({platform + ', ' if platform else ''}{cfg.get('model', '?')}, "
             f"{cfg.get('doc_tokens', '?')}-token document beside a {cfg.get('chat_context', '?')}-token chat)")
    rows = [measured_chart(doc).properties(title=title)]
    seed = _verdict(doc, "s001-own-compute")
    if seed and seed.get("measured"):
        rows.append(seed_chart(seed["measured"]))
    return alt.vconcat(*rows).resolve_scale(color="independent", shape="independent")
