"""The prefix-cache notebook's figures: restore against prefill (``prefix_restore_vs_prefill``),
sessions kept warm by capacity (``prefix_capacity``) and the disk restore's phases at the seed's
size (``prefix_disk_restore``). Medians with a min-max bar over the repeats."""

from __future__ import annotations

from typing import List

import altair as alt
import pandas as pd

from mlxlab.notebook.plots import PALETTE, log_axis, vrule

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
    lengths = sorted(int(v) for v in df.prefix_tokens.unique())
    x = alt.X("prefix_tokens:Q", title="prefix tokens", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=lengths, format=","))  # ticked at the lengths measured
    y_axis = log_axis(list(df.seconds) + list(df.lo) + list(df.hi))
    color = alt.Color("how:N", title=None, sort=order, scale=alt.Scale(domain=order, range=PALETTE[:len(order)]),
                      legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0))
    base = alt.Chart(df, title=title)
    line = base.mark_line(point=True).encode(
        x=x, y=alt.Y("seconds:Q", title=y_title, scale=alt.Scale(type="log"), axis=y_axis), color=color,
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
    they restored, against the cache's capacity; right: those turns' TTFT. The x axis is ticked
    at the capacities measured; a labelled rule marks ``sessions`` (the capacity that holds every
    session)."""
    df = pd.DataFrame(rows)
    series = {"warm_turn_fraction": "turns that restored a prefix", "restored_fraction": "previous turn's tokens restored"}
    long = df.melt(id_vars=["capacity_sessions"], value_vars=list(series), var_name="what", value_name="fraction")
    long["what"] = long["what"].map(series)
    order = list(series.values())
    x = alt.X("capacity_sessions:Q", title="cache capacity (sessions' worth of prefix)",
              scale=alt.Scale(domainMin=0), axis=alt.Axis(values=sorted(df.capacity_sessions.unique()), format="d"))
    rule = vrule(sessions, f"{sessions} sessions: all of them fit")
    # the two series often coincide: a wide pale line with open circles under a thin one with
    # small squares keeps both visible
    color = alt.Color("what:N", title=None, sort=order, scale=alt.Scale(domain=order, range=PALETTE[:2]),
                      legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0, symbolOpacity=1))
    shape = alt.Shape("what:N", title=None, sort=order, scale=alt.Scale(domain=order, range=["circle", "square"]))
    y = alt.Y("fraction:Q", title="later turns (mean)", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1]))
    tip = ["capacity_sessions", "what", alt.Tooltip("fraction:Q", format=".1%")]
    base = alt.Chart(long, title=f"{sessions} chat sessions: warm turns by cache capacity").encode(
        x=x, y=y, color=color, tooltip=tip)
    under, over = (base.transform_filter(alt.datum.what == w) for w in order)
    left = (under.mark_line(strokeWidth=5, opacity=0.4) + under.mark_point(size=110, filled=False, strokeWidth=2).encode(
        shape=shape) + over.mark_line(strokeWidth=1.5) + over.mark_point(size=35, filled=True, opacity=1).encode(shape=shape))
    right = alt.Chart(df, title="TTFT of the later turns").mark_line(
        color=PALETTE[2], point=alt.OverlayMarkDef(color=PALETTE[2])).encode(
        x=x, y=alt.Y("ttft_p50_later_turns_s:Q", title="TTFT (s, median)", scale=alt.Scale(zero=True)),
        tooltip=["capacity_sessions", alt.Tooltip("ttft_p50_later_turns_s:Q", format=".3f"), "evictions"])
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
    x = alt.X("ms:Q", title="milliseconds (median, min-max)", axis=alt.Axis(tickCount=6, labelFlush=False))
    bars = base.mark_bar().encode(x=x, y=y,
                                  color=alt.Color("mode:N", title=None, legend=alt.Legend(orient="bottom")),
                                  yOffset="mode:N", tooltip=["mode", "phase", alt.Tooltip("ms:Q", format=".1f")])
    err = base.mark_rule(color="black").encode(x="lo:Q", x2="hi:Q", y=y, yOffset="mode:N")
    at = published_ms * disk["tokens"] / seed_tokens
    label = (f"case study: SSD read < {published_ms:g} ms" if disk["tokens"] >= seed_tokens else
             f"case study's rate at this size (< {published_ms:g} ms for {seed_tokens:,} tokens)")
    seed = vrule(at, label, color=PALETTE[4], align="left")
    return bars + err + seed
