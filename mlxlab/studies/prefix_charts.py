"""The prefix-cache notebook's figures: restore against prefill (``prefix_restore_vs_prefill``),
sessions kept warm by capacity (``prefix_capacity``) and the disk restore's phases at the seed's
size (``prefix_disk_restore``). Medians with a min-max bar over the repeats."""

from __future__ import annotations

from typing import List

import altair as alt
import pandas as pd

from mlxlab.notebook.plots import PALETTE

_RESTORE = [("prefill", "prefill the prefix (cold turn)"), ("restore_memory", "restore from memory"),
            ("restore_disk", "restore from disk: read + verify + copy"), ("disk_read", "disk: read alone")]
_TURN = [("cold_ttft", "cold turn (prefill it all)"), ("warm_ttft", "warm turn (restore + new tokens)")]


def _long(rows: List[dict], series) -> pd.DataFrame:
    out = []
    for r in rows:
        for key, label in series:
            med = r[f"{key}_s"]
            out.append({"prefix_tokens": r["prefix_tokens"], "how": label, "seconds": med,
                        "lo": r.get(f"{key}_min_s", med), "hi": r.get(f"{key}_max_s", med)})
    return pd.DataFrame(out)


def _lines_with_bars(df: pd.DataFrame, title: str, y_title: str, order) -> alt.LayerChart:
    x = alt.X("prefix_tokens:Q", title="prefix tokens", scale=alt.Scale(type="log", base=2))
    color = alt.Color("how:N", title=None, sort=order, scale=alt.Scale(domain=order, range=PALETTE[:len(order)]),
                      legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0))
    base = alt.Chart(df, title=title)
    line = base.mark_line(point=True).encode(
        x=x, y=alt.Y("seconds:Q", title=y_title, scale=alt.Scale(type="log")), color=color,
        tooltip=["prefix_tokens", "how", alt.Tooltip("seconds:Q", format=".4f")])
    bars = base.mark_rule().encode(x=x, y="lo:Q", y2="hi:Q", color=color)
    return line + bars


def restore_chart(rows: List[dict]) -> alt.HConcatChart:
    """Left: prefilling a prefix against restoring it (memory, disk, disk read alone); right: the
    chat turn's TTFT cold and warm, by prefix length (log-log)."""
    left = _lines_with_bars(_long(rows, _RESTORE), "Prefill a prefix, or restore its KV", "seconds (median, min-max)",
                            [label for _, label in _RESTORE])
    right = _lines_with_bars(_long(rows, _TURN), "A chat turn's TTFT through the engine", "seconds (median, min-max)",
                             [label for _, label in _TURN])
    return alt.hconcat(left, right).resolve_scale(color="independent")


def capacity_chart(rows: List[dict], sessions: int) -> alt.HConcatChart:
    """Left: the later turns that restored a prefix and the share of the previous turn's tokens
    they restored, against the cache's capacity (a rule at ``sessions``); right: those turns' TTFT."""
    df = pd.DataFrame(rows)
    long = df.melt(id_vars=["capacity_sessions"], value_vars=["warm_turn_fraction", "restored_fraction"],
                   var_name="what", value_name="fraction")
    long["what"] = long["what"].map({"warm_turn_fraction": "turns that restored a prefix",
                                     "restored_fraction": "previous turn's tokens restored"})
    x = alt.X("capacity_sessions:Q", title="cache capacity (sessions' worth of prefix)",
              axis=alt.Axis(tickMinStep=1, format="d"))
    marks = alt.Chart(pd.DataFrame({"x": [sessions], "label": [f"{sessions} sessions"]}))
    rule = marks.mark_rule(color="#7f8c8d", strokeDash=[4, 3]).encode(x="x:Q") + marks.mark_text(
        align="right", dx=-4, dy=8, color="#7f8c8d", fontSize=10).encode(x="x:Q", y=alt.value(0), text="label:N")
    left = alt.Chart(long, title=f"{sessions} chat sessions: warm turns by cache capacity").mark_line(point=True).encode(
        x=x, y=alt.Y("fraction:Q", title="later turns (mean)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0)),
        strokeDash=alt.StrokeDash("what:N", legend=None), tooltip=["capacity_sessions", "what", "fraction"])
    right = alt.Chart(df, title="TTFT of the later turns").mark_line(point=True, color=PALETTE[1]).encode(
        x=x, y=alt.Y("ttft_p50_later_turns_s:Q", title="seconds (median)"),
        tooltip=["capacity_sessions", "ttft_p50_later_turns_s", "evictions"])
    return alt.hconcat(left + rule, right + rule)


def disk_chart(disk: dict, published_ms: float = 100.0, seed_tokens: int = 23_000) -> alt.LayerChart:
    """The disk restore's phases (median ms, min-max bars) for reads with the page cache dropped
    and reads it served, at the file's size; a rule at the seed's published read time for its
    ``seed_tokens``, scaled to this file's size (the same where the file is the seed's size)."""
    rows = []
    for mode, label in (("cold", "page cache dropped"), ("cached", "page cache served it")):
        for ph in ("read", "verify", "copy"):
            d = disk[mode]
            rows.append({"mode": label, "phase": ph, "ms": 1e3 * d[f"{ph}_s"],
                         "lo": 1e3 * d.get(f"{ph}_min_s", d[f"{ph}_s"]), "hi": 1e3 * d.get(f"{ph}_max_s", d[f"{ph}_s"])})
    df = pd.DataFrame(rows)
    mb = disk["file_bytes"] / 1e6
    y = alt.Y("phase:N", title=None, sort=["read", "verify", "copy"])
    title = alt.TitleParams(f"Restoring {disk['tokens']:,} tokens of seed-shaped KV ({mb:.0f} MB) from disk",
                            subtitle=f"read {disk['cold']['read_gb_s']:.2f} GB/s with the page cache dropped, "
                                     f"{disk['cached']['read_gb_s']:.2f} GB/s from it")
    base = alt.Chart(df, title=title)
    bars = base.mark_bar().encode(x=alt.X("ms:Q", title="milliseconds (median, min-max)"), y=y,
                                  color=alt.Color("mode:N", title=None, legend=alt.Legend(orient="bottom")),
                                  yOffset="mode:N", tooltip=["mode", "phase", alt.Tooltip("ms:Q", format=".1f")])
    err = base.mark_rule(color="black").encode(x="lo:Q", x2="hi:Q", y=y, yOffset="mode:N")
    at = published_ms * disk["tokens"] / seed_tokens
    label = (f"seed: read < {published_ms:g} ms" if disk["tokens"] >= seed_tokens else
             f"seed's rate at this size (< {published_ms:g} ms for {seed_tokens:,} tokens)")
    seed = alt.Chart(pd.DataFrame({"x": [at]})).mark_rule(color=PALETTE[4], strokeDash=[4, 3]).encode(x="x:Q")
    text = alt.Chart(pd.DataFrame({"x": [at], "t": [label]})).mark_text(
        align="left", dx=4, dy=-6, color=PALETTE[4], fontSize=10).encode(x="x:Q", y=alt.value(0), text="t:N")
    return bars + err + seed + text
