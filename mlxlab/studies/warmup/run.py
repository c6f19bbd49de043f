"""Warm-up and allocator limits (seed 000, iterations 1b and 4): the tables and the verdicts.

The measurements run in fresh processes (:mod:`mlxlab.studies.fresh_process`, started by
:func:`mlxlab.studies.prefill_step.run.fresh_process_run` and :func:`alloc_cache_run`); this module turns
their events into tables and decides the claims ``s000-warmup-first-request``,
``s000-warmup-removes``, ``s000-memory-throughput``, ``s000-memory-oom`` (not testable) and
``s000-alloc-cache-1gb``. Pure pandas: the tests feed it synthetic events.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import pandas as pd

from mlxlab.core.claims import claim, not_testable, verdict


def _mad(values) -> float:
    v = pd.Series(list(values), dtype=float).dropna()
    return float((v - v.median()).abs().median()) if len(v) else float("nan")


def alloc_cache_run(model_name: str, *, prompt_tokens: int = 480, chunk: int = 512, max_tokens: int = 8,
                    limits_mb: Sequence[Optional[float]] = (None, 512, 1024), memory_limit_mb: Optional[float] = None,
                    memory_with_cache_mb: float = 512, scaled: Sequence[float] = (0.6, 1.2), rounds: int = 2,
                    requests: int = 3, dtype: Optional[str] = None, bits: Optional[int] = None,
                    timeout_s: int = 900) -> Dict:
    """Request after request under each allocator setting, round-robin in one fresh process
    (:func:`mlxlab.studies.fresh_process.alloc_cache_child`): the cache limits ``limits_mb`` (None:
    mlx's default), a ``memory_with_cache_mb`` cache limit with a ``memory_limit_mb`` memory limit
    (when given), and cache limits of ``scaled`` times the request's own buffers (so a pair
    straddles them on a model whose buffers are far below the published 512 MB)."""
    from mlxlab.studies.prefill_step.run import run_child  # imports mlx

    settings = [["default" if c is None else f"{c:g} MB", c, None] for c in limits_mb]
    if memory_limit_mb:
        settings.append([f"{memory_with_cache_mb:g} MB, memory {memory_limit_mb:g} MB", memory_with_cache_mb,
                         memory_limit_mb])
    args = {"model": model_name, "prompt_tokens": prompt_tokens, "chunk": chunk, "max_tokens": max_tokens,
            "settings": settings, "scaled": list(scaled), "rounds": rounds, "requests": requests,
            "dtype": dtype, "bits": bits}
    out = run_child("alloc-cache", args, None, timeout_s, "allocator cache run")
    out.update({"model": model_name, "scaled": list(scaled)})
    return out


def alloc_table(run: Dict) -> pd.DataFrame:
    """One row per setting of an :func:`alloc_cache_run`, in run order: medians over its timed
    requests of TTFT (with its MAD), ITL and end-to-end latency (ms), the cache held between
    requests, the buffers the request holds across steps (its KV) and how much of them came out
    of the cache (MiB and %), fresh memory mapped by the OS (``faulted_mb``) and the peak."""
    rows = []
    df = pd.DataFrame(run["rows"])
    df["reused_mb"] = (df.cache_before_mb - df.cache_low_mb).clip(lower=0)
    for label, g in df.groupby("limit", sort=False):
        held, reused = float(g.held_mb.median()), float(g.reused_mb.median())
        rows.append({"limit": label, "limit_mb": float(g.limit_mb.iloc[0]),
                     "memory_limit_mb": float(g.memory_limit_mb.iloc[0]), "requests": len(g),
                     "ttft_p50_ms": 1e3 * float(g.ttft_s.median()), "ttft_mad_ms": 1e3 * _mad(g.ttft_s),
                     "itl_p50_ms": 1e3 * float(g.itl_s.median()), "itl_mad_ms": 1e3 * _mad(g.itl_s),
                     "e2e_p50_ms": 1e3 * float(g.e2e_s.median()), "cache_held_mb": float(g.cache_before_mb.median()),
                     "kv_mb": held, "reused_mb": reused,
                     "reused_pct": 100 * min(1.0, reused / held) if held > 0 else float("nan"),
                     "faulted_mb": float(g.faulted_mb.median()), "peak_mb": float(g.peak_mb.max())})
    return pd.DataFrame(rows)


def cold_table(events: pd.DataFrame) -> pd.DataFrame:
    """Per (model, warm-up mode): the first request's TTFT, the median and MAD of the warm
    repeats' TTFTs, and the first request's extra time over the warm median (ms); with a
    ``process`` column (several fresh processes per mode), the median over processes and
    ``first_minus_warm_mad_ms``, the spread of that extra time across them."""
    keys = ["model", "warmup"] + (["process"] if "process" in events else [])
    per = []  # one row per process; first_minus_warm_worst_ms keeps the worst of them beside the median
    for key, g in events.groupby(keys, sort=False):
        warm = g[g.event == "warm request"].ttft_s
        first = float(g[g.event == "first request"].ttft_s.iloc[0])
        per.append({**dict(zip(keys, key)), "first_ttft_s": first, "warm_ttft_s": float(warm.median()),
                    "warm_mad_s": _mad(warm), "first_minus_warm_ms": 1e3 * (first - float(warm.median()))})
    per = pd.DataFrame(per)
    out = per.groupby(["model", "warmup"], sort=False).agg(
        first_ttft_s=("first_ttft_s", "median"), warm_ttft_s=("warm_ttft_s", "median"),
        warm_mad_s=("warm_mad_s", "median"), first_minus_warm_ms=("first_minus_warm_ms", "median"),
        first_minus_warm_mad_ms=("first_minus_warm_ms", _mad), first_minus_warm_worst_ms=("first_minus_warm_ms", "max"),
        processes=("first_ttft_s", "size"))
    if "process" in per:  # which process was the worst (0: the run's first)
        worst = per.loc[per.groupby(["model", "warmup"], sort=False).first_minus_warm_ms.idxmax()]
        out = out.join(worst.set_index(["model", "warmup"]).process.rename("worst_process"))
    return out.reset_index()


def _band_ms(row) -> float:
    """3 x the larger of the warm repeats' MAD and the first-request extra time's MAD across processes."""
    return 3 * max(1e3 * float(row.warm_mad_s), float(row.first_minus_warm_mad_ms))


def first_use_table(events: pd.DataFrame) -> pd.DataFrame:
    """The first use of each later chunk or batch size against its immediate repeat, per (model,
    warm-up mode): first_use_ttft_s, repeat_ttft_s and the extra ms."""
    out = []
    keys = ["model", "warmup"] + (["process"] if "process" in events else [])
    for key, g in events.groupby(keys, sort=False):
        m, w = key[0], key[1]
        for label in g.event:
            if label.startswith("first use of "):
                what = label[len("first use of "):]
                t = float(g[g.event == label].ttft_s.iloc[0])
                again = float(g[g.event == f"again {what}"].ttft_s.iloc[0])
                out.append({"model": m, "warmup": w, "process": key[2] if len(key) > 2 else 0, "shape": what,
                            "first_use_ttft_s": t, "repeat_ttft_s": again, "extra_ms": 1e3 * (t - again)})
    return pd.DataFrame(out, columns=["model", "warmup", "process", "shape", "first_use_ttft_s", "repeat_ttft_s",
                                      "extra_ms"])


def limits_table(runs: Sequence[Dict]) -> pd.DataFrame:
    """One row per :func:`~mlxlab.studies.prefill_step.run.fresh_process_run` with allocator limits: the
    setting, the warm requests' TTFT p50 and MAD, ITL p50, peak memory and the cache after."""
    rows = []
    for r in runs:
        w = pd.DataFrame(r["events"])
        w = w[w.event == "warm request"]
        c, m = r.get("cache_limit_mb"), r.get("memory_limit_mb")
        label = "default" if c is None and m is None else \
            ", ".join(p for p in (f"cache {c} MB" if c is not None else "", f"memory {m} MB" if m is not None else "") if p)
        rows.append({"setting": label, "cache_limit_mb": c, "memory_limit_mb": m, "requests": len(w),
                     "ttft_p50_s": float(w.ttft_s.median()), "ttft_mad_s": _mad(w.ttft_s),
                     "itl_p50_s": float(w.itl_s.median()), "itl_mad_s": _mad(w.itl_s),
                     "peak_mb": float(w.peak_mb.max()), "cache_mb_after": float(w.cache_mb.iloc[-1])})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- verdicts


def _first_request(cold: pd.DataFrame, fairness: str) -> Dict:
    low = float(claim("s000-warmup-first-request").published["low"])
    off = cold[cold.warmup == "off"]
    bands = [_band_ms(r) for r in off.itertuples()]
    m = {"first_minus_warm_ms": float(off.first_minus_warm_ms.min()) if len(off) else None,
         "first_minus_warm_max_ms": float(off.first_minus_warm_ms.max()) if len(off) else None,
         "band_ms": max(bands) if bands else None, "models": len(off),
         "processes": int(off.processes.min()) if len(off) else 0}
    if len(off) and "first_minus_warm_worst_ms" in off:
        # the worst single process: on mlx's CUDA backend the run's first also compiles the kernels its
        # later processes read from the on-disk PTX cache, a cost the median over processes hides
        worst = off.loc[off.first_minus_warm_worst_ms.idxmax()]
        m["worst_process_ms"] = float(worst.first_minus_warm_worst_ms)
        m["worst_process_over_median_x"] = (float(worst.first_minus_warm_worst_ms / worst.first_minus_warm_ms)
                                            if worst.first_minus_warm_ms > 0 else None)
        if "worst_process" in off:
            m["worst_process"] = int(worst.worst_process)
    if m["first_minus_warm_ms"] is None:
        v = "not measured"
    else:
        big = all(r.first_minus_warm_ms >= low and r.first_minus_warm_ms > b for r, b in zip(off.itertuples(), bands))
        v = "reproduced" if big else "not reproduced"
    return verdict(
        "s000-warmup-first-request", v, measured=m,
        rule=f"In fresh processes without warm-up, the first request's TTFT minus the median of the warm repeats "
             f"(median over processes); reproduced when, for every model, it is at least the published {low:g} ms "
             f"and larger than band_ms = 3 x the larger of the warm repeats' MAD and its MAD across processes; "
             f"not reproduced otherwise. worst_process_ms is the largest single process's extra time, reported "
             f"beside the median, not part of the rule.",
        fairness=fairness + _worst_note(m))


def _worst_note(m: Dict) -> str:
    """A sentence when one process's first request cost over ten times the median's: the cold
    start a fresh machine pays once (a compile cache filled, later processes read it)."""
    x = m.get("worst_process_over_median_x")
    if not x or x < 10:
        return ""
    if m.get("worst_process") != 0:
        return f" One process paid {m['worst_process_ms'] / 1e3:.1f} s, {x:.0f} times the median."
    return (f" The run's first process paid {m['worst_process_ms'] / 1e3:.1f} s, {x:.0f} times the median: it compiled "
            f"kernels that later processes found in a compile cache on disk (mlx's CUDA backend keeps the PTX it "
            f"compiles there). A machine pays this once, so a run after another on the same machine may not see it.")


def _removes(cold: pd.DataFrame, fairness: str) -> Dict:
    off = cold[cold.warmup == "off"].set_index("model")
    tok = cold[cold.warmup == "token"].set_index("model")
    shp = cold[cold.warmup == "shapes"].set_index("model")
    models = [m for m in off.index if m in tok.index]
    band_off = {mo: _band_ms(off.loc[mo]) for mo in models}
    band_tok = {mo: _band_ms(tok.loc[mo]) for mo in models}
    pen = {mo: float(off.first_minus_warm_ms[mo]) for mo in models}
    left = {mo: float(tok.first_minus_warm_ms[mo]) for mo in models}
    paid = [mo for mo in models if pen[mo] > band_off[mo]]
    m = {"penalty_off_ms": min(pen.values()) if pen else None,
         "penalty_token_ms": max(left.values()) if left else None,
         "penalty_shapes_ms": float(shp.first_minus_warm_ms.max()) if len(shp) else None,
         "removed_pct": min(100 * (1 - left[mo] / pen[mo]) for mo in paid) if paid else None,
         "band_ms": max(band_tok.values()) if band_tok else None, "models": len(models)}
    rule = ("Per model, the first request's extra time over the warm median without warm-up (penalty_off_ms) and "
            "after a one-token warm-up (penalty_token_ms), each with its band (3 x the larger of the warm MAD and the "
            "MAD across processes). The claim is that the warm-up removes the penalty, so on every model that paid "
            "one: reproduced when what the warm-up leaves is within its band (no penalty left that the run can see) "
            "and that band is at most a quarter of the penalty (the run could have seen a quarter left); not "
            "reproduced when it leaves more than its band (removed_pct says how much it did remove); inconclusive "
            "when it leaves no more than a band wider than a quarter of the penalty. Not measurable when no model "
            "shows a penalty beyond its band without warm-up.")
    if not models:
        return verdict("s000-warmup-removes", "not measured", measured=m, rule=rule, fairness=fairness)
    if not paid:
        return verdict("s000-warmup-removes", "not measurable on this backend", measured=m, rule=rule,
                       fairness=fairness + " Without warm-up this backend showed no first-request penalty beyond "
                                           "noise, so there was nothing for a warm-up to remove.")
    residual = [mo for mo in paid if left[mo] > band_tok[mo]]  # a penalty left beyond the noise
    blind = [mo for mo in paid if band_tok[mo] > 0.25 * pen[mo]]  # noise too wide to see a quarter left
    m["within_noise"] = bool(blind) and not residual
    v = "not reproduced" if residual else ("inconclusive" if blind else "reproduced")
    return verdict("s000-warmup-removes", v, measured=m, rule=rule, fairness=fairness)


def _throughput(alloc: pd.DataFrame, fresh: Optional[pd.DataFrame], default_limit_mb: Optional[float]) -> Dict:
    rule = ("Request after request in one process, the settings round-robin: the change of TTFT p50 and ITL p50 under "
            "each explicit setting (cache limits, a cache with a memory limit; not 0 and not the scaled pair) against "
            "mlx's defaults, against band_pct = max(10, 3 x the default's MAD over its median, in %). Not "
            "reproduced when a change exceeds the band; reproduced when every change stays within it and the band "
            "is the claim's own 10% (the run could have seen a 10% change); inconclusive when the changes stay "
            "within a band wider than 10%, where a real change of 10% would hide in the noise.")
    base = alloc[alloc.limit == "default"]
    rest = alloc[(alloc.limit != "default") & ~alloc.limit.str.endswith("x buffers") & (alloc.limit_mb > 0)]
    zero = alloc[alloc.limit_mb == 0]
    if base.empty or rest.empty:
        return verdict("s000-memory-throughput", "not measured", measured=None, rule=rule,
                       fairness="no default or no explicit setting in this run")
    b = base.iloc[0]
    band = max(10.0, 300 * float(b.ttft_mad_ms / b.ttft_p50_ms), 300 * float(b.itl_mad_ms / b.itl_p50_ms))
    ttft = 100 * (rest.ttft_p50_ms / b.ttft_p50_ms - 1)
    itl = 100 * (rest.itl_p50_ms / b.itl_p50_ms - 1)
    fb = fresh[fresh.setting == "default"] if fresh is not None and len(fresh) else None
    fr = fresh[(fresh.setting != "default") & (fresh.cache_limit_mb.fillna(1) != 0)] if fb is not None else None
    m = {"ttft_change_max_pct": float(ttft.abs().max()), "itl_change_max_pct": float(itl.abs().max()),
         "band_pct": band, "settings": ";".join(rest.limit),
         "no_cache_ttft_change_pct": float(100 * (zero.ttft_p50_ms.iloc[0] / b.ttft_p50_ms - 1)) if len(zero) else None,
         "peak_mb_default": float(b.peak_mb), "peak_mb_max": float(rest.peak_mb.max()),
         "default_cache_limit_mb": default_limit_mb,
         "fresh_process_ttft_change_max_pct": float((100 * (fr.ttft_p50_s / fb.ttft_p50_s.iloc[0] - 1)).abs().max())
         if fb is not None and len(fb) and len(fr) else None}
    ok = m["ttft_change_max_pct"] <= band and m["itl_change_max_pct"] <= band
    m["within_noise"] = bool(ok and band > 10.0)
    v = "not reproduced" if not ok else ("inconclusive" if band > 10.0 else "reproduced")
    return verdict("s000-memory-throughput", v, measured=m, rule=rule,
                   fairness=f"Same process and model, {int(b.requests)} requests per setting, interleaved, cache "
                            f"cleared and one priming request before each series. The case study's limits were sized "
                            f"for a 24 GB Mac, where mlx's default cache limit equals its memory limit; here the "
                            f"default cache limit is {default_limit_mb or float('nan'):.0f} MiB. "
                            f"fresh_process_ttft_change_max_pct is the same comparison with one fresh process per "
                            f"setting, run one after another (drift between processes counts there), and does not "
                            f"decide. A cache limit of 0 (no cache) is shown for contrast.")


def _alloc(alloc: pd.DataFrame, scaled: Sequence[float], request_buffers_mb: float) -> Dict:
    lab = [f"{f:g}x buffers" for f in sorted(scaled)]
    sc = alloc.set_index("limit")
    rule = ("Request after request of one size: reused_pct = the share of the buffers a request holds across steps "
            "(its KV) that came out of the allocator's cache (cache before the request minus its lowest point during "
            "it). Reproduced when the higher of a pair of limits twice apart reuses at least 50% and the lower at "
            "least 25 points less; not reproduced when the higher reuses less than 50% or the lower about as much; "
            "not measurable when the allocator held nothing between requests.")
    fair = (f"One request's buffers are {request_buffers_mb:.1f} MiB here, not the published model's, so the pair "
            f"that decides is scaled to straddle them: {lab[0]} and {lab[-1]} of those buffers (twice apart, like "
            f"512 MB and 1 GB); the literal 512 MB and 1 GB limits are reported beside it. Same process and model, "
            f"limits round-robin, cache cleared and one priming request before each series.")
    if len(lab) < 2 or not all(x in sc.index for x in lab):
        return verdict("s000-alloc-cache-1gb", "not measured", measured=None, rule=rule, fairness=fair)
    lo, hi = sc.loc[lab[0]], sc.loc[lab[-1]]
    lit = {k: float(sc.loc[f"{k} MB"].reused_pct) if f"{k} MB" in sc.index else None for k in (512, 1024)}
    m = {"reused_low_pct": float(lo.reused_pct), "reused_high_pct": float(hi.reused_pct),
         "limit_low_mb": float(lo.limit_mb), "limit_high_mb": float(hi.limit_mb), "kv_mb": float(hi.kv_mb),
         "request_buffers_mb": float(request_buffers_mb), "cache_held_low_mb": float(lo.cache_held_mb),
         "cache_held_high_mb": float(hi.cache_held_mb), "ttft_low_ms": float(lo.ttft_p50_ms),
         "ttft_high_ms": float(hi.ttft_p50_ms), "e2e_change_pct": 100 * float(hi.e2e_p50_ms / lo.e2e_p50_ms - 1),
         "faulted_low_mb": float(lo.faulted_mb), "faulted_high_mb": float(hi.faulted_mb),
         "peak_low_mb": float(lo.peak_mb), "peak_high_mb": float(hi.peak_mb),
         "literal_reused_512_pct": lit[512], "literal_reused_1024_pct": lit[1024]}
    if not (alloc.cache_held_mb > 0).any():
        v = "not measurable on this backend"
    elif m["reused_high_pct"] >= 50 and m["reused_low_pct"] <= m["reused_high_pct"] - 25:
        v = "reproduced"
    else:
        v = "not reproduced"
    return verdict("s000-alloc-cache-1gb", v, measured=m, rule=rule, fairness=fair)


def verdicts(cold: pd.DataFrame, alloc: pd.DataFrame, *, scaled: Sequence[float], request_buffers_mb: float,
             default_limit_mb: Optional[float] = None, fresh_limits: Optional[pd.DataFrame] = None,
             model_note: str = "") -> List[Dict]:
    """The five verdicts of notebook 04 from :func:`cold_table` and :func:`alloc_table` (and, as
    context, :func:`limits_table` of the fresh-process runs). Measured keys. first-request:
    first_minus_warm_ms (smallest over models), first_minus_warm_max_ms, band_ms, models,
    processes. removes: penalty_off_ms, penalty_token_ms, penalty_shapes_ms, removed_pct,
    band_ms, models. memory-throughput: ttft_change_max_pct, itl_change_max_pct, band_pct,
    settings, no_cache_ttft_change_pct, peak_mb_default, peak_mb_max, default_cache_limit_mb,
    fresh_process_ttft_change_max_pct. alloc-cache-1gb: reused_low_pct, reused_high_pct,
    limit_low_mb, limit_high_mb, kv_mb, request_buffers_mb, cache_held_{low,high}_mb,
    ttft_{low,high}_ms, e2e_change_pct, faulted_{low,high}_mb, peak_{low,high}_mb,
    literal_reused_{512,1024}_pct."""
    fair = ("Every run is a fresh process, so nothing is compiled before it starts; first and warm requests have the "
            f"same shape. {model_note} The case study's penalty came from Metal shader compilation on an M4 Pro; "
            "other backends compile differently (the CPU hardly at all).").replace("  ", " ")
    return [_first_request(cold, fair), _removes(cold, fair), _throughput(alloc, fresh_limits, default_limit_mb),
            not_testable("s000-memory-oom"), _alloc(alloc, scaled, request_buffers_mb)]


def model_note(params: Dict) -> str:
    """The note notebook 04 passes to :func:`verdicts`, from its stored parameters."""
    bits = params.get("bits")
    return (f"Models {', '.join(params['models'])}{f' at {bits} bits' if bits else ''}, {params['prompt_tokens']}-token "
            f"prompts, {params['repeats']} warm repeats, {params['cold_repeats']} process(es) per warm-up mode.")


def decide_stored(doc: Dict, path=None) -> List[Dict]:
    """The verdicts of a saved notebook-04 result (``warmup_memory.json``) from its stored events
    and tables (:class:`~mlxlab.studies.base.Study`'s ``decide``); the cold table they read is
    stored again beside them."""
    missing = [k for k in ("events", "alloc_table", "alloc_cache", "cache_limits", "parameters") if k not in doc]
    if missing:
        raise ValueError(f"{path or 'this document'} is not a notebook-04 result (no {', '.join(missing)}): "
                         "rescore a warmup_memory.json")
    params, ac = doc["parameters"], doc["alloc_cache"]
    cold = cold_table(pd.DataFrame(doc["events"]))
    doc["cold"] = cold.to_dict("records")
    return verdicts(cold, pd.DataFrame(doc["alloc_table"]), scaled=params["alloc_scaled"],
                    request_buffers_mb=ac["request_buffers_mb"], default_limit_mb=ac.get("default_limit_mb"),
                    fresh_limits=pd.DataFrame(doc["cache_limits"]), model_note=model_note(params))
