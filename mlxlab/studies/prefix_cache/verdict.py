"""The prefix-cache notebook's verdicts (seed 001: ``s001-prefix-restore``,
``s001-prefix-sessions``, ``s001-ssd-restore``, ``s001-kvquant-apc``), from the rows that
:mod:`mlxlab.studies.prefix_cache.run`, :mod:`~mlxlab.studies.prefix_cache.disk` and
:mod:`~mlxlab.studies.prefix_cache.kvquant` return. No MLX here: the tests feed synthetic rows.
"""

from __future__ import annotations

import math
from typing import List

from mlxlab.core.claims import verdict

RESTORE_MAX_S = 1.0  # the seed: the restore takes "under a second"
RESTORE_MIN_SPEEDUP = 10.0  # ... "instead of tens of seconds" of prefill: at least 10x
WARM_MIN_FRACTION = 0.99  # "keeps them all warm": every later turn restored a prefix
RESTORED_MIN_FRACTION = 0.9  # ... and most of what the previous turn left
EVICT_MIN_DROP = 0.05  # a smaller cache "evicts": 5 points fewer warm turns or restored tokens
SEED_READ_MS = 100.0  # the seed: ~460 MB of KV read from SSD "well under 100 ms"
COLD_MAX_RESIDENT = 0.01  # a read counts as from disk when at most 1 % of the file was cached
SEED_PREFIX_TOKENS = 23_000  # the seed's chat prefix


def _clean(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def restore_verdict(rows: List[dict], *, max_context_tokens: int, setting: str) -> dict:
    """``s001-prefix-restore`` from :func:`~mlxlab.studies.prefix_cache.run.restore_vs_prefill` rows,
    at the longest prefix. Noise-aware by pairing the extremes of the repeats: the slowest
    restore against the fastest prefill, the fastest cold turn against the slowest warm one.
    ``measured``: prefix_tokens, max_context_tokens, repeats, prefill_s, prefill_min_s,
    prefill_spread_s, restore_memory_s, restore_memory_max_s, restore_memory_spread_s, speedup_x
    (medians), speedup_worst_x (fastest prefill / slowest restore), cold_ttft_s, cold_ttft_min_s,
    warm_ttft_s, warm_ttft_max_s, ttft_speedup_x, restored_tokens, same_first_token."""
    r = max(rows, key=lambda x: x["prefix_tokens"])
    longest = (int(max_context_tokens) - int(r.get("turn_tokens", 0)) - 1) // 8 * 8  # as longest_prefix
    lo = lambda k: r.get(f"{k}_min_s", r[f"{k}_s"])  # noqa: E731
    hi = lambda k: r.get(f"{k}_max_s", r[f"{k}_s"])  # noqa: E731
    m = _clean({"prefix_tokens": int(r["prefix_tokens"]), "max_context_tokens": int(max_context_tokens),
                "repeats": int(r["repeats"]), "prefill_s": r["prefill_s"], "prefill_min_s": lo("prefill"),
                "prefill_spread_s": hi("prefill") - lo("prefill"), "restore_memory_s": r["restore_memory_s"],
                "restore_memory_max_s": hi("restore_memory"),
                "restore_memory_spread_s": hi("restore_memory") - lo("restore_memory"),
                "speedup_x": r["prefill_s"] / r["restore_memory_s"],
                "speedup_worst_x": lo("prefill") / hi("restore_memory"),
                "cold_ttft_s": r["cold_ttft_s"], "cold_ttft_min_s": lo("cold_ttft"), "warm_ttft_s": r["warm_ttft_s"],
                "warm_ttft_max_s": hi("warm_ttft"), "ttft_speedup_x": r["cold_ttft_s"] / r["warm_ttft_s"],
                "restored_tokens": int(r["restored_tokens"]), "same_first_token": bool(r["same_first_token"])})
    ok = (m["restore_memory_max_s"] < RESTORE_MAX_S and m["speedup_worst_x"] >= RESTORE_MIN_SPEEDUP
          and m["cold_ttft_min_s"] > m["warm_ttft_max_s"]
          and m["restored_tokens"] == m["prefix_tokens"] and m["same_first_token"])
    return verdict(
        "s001-prefix-restore", "reproduced" if ok else "not reproduced", measured=m,
        rule=(f"reproduced if, at the longest prefix, every memory restore took under {RESTORE_MAX_S:g} s, the fastest "
              f"prefill of the prefix was still at least {RESTORE_MIN_SPEEDUP:g}x the slowest restore, every cold turn's "
              "TTFT exceeded every warm turn's, and the warm turn restored the whole prefix and produced the cold "
              "turn's first token; otherwise not reproduced."),
        fairness=(f"{setting}; the prefix is {m['prefix_tokens']} tokens, "
                  + ("the longest" if m["prefix_tokens"] >= longest else f"shorter than the {longest}")
                  + f" this model's {m['max_context_tokens']}-token context allows with the turn's new tokens (the "
                  "seed: 23k on a 35B MoE). Prefill and restore come from the same engine, model object and prompt, "
                  f"{m['repeats']} repeats each after one untimed cold turn; prefill_s is the cold turn's chunks over "
                  "the prefix (the chunk size divides it), so both sides cover the same tokens. The scaled terms "
                  "are the ratio; seconds of prefill depend on the machine."),
        evidence="restore_vs_prefill rows (restore)")


def _pick(rows: List[dict], cond) -> List[dict]:
    return [r for r in rows if cond(r["capacity_sessions"])]


def sessions_verdict(rows: List[dict], *, sessions: int, setting: str) -> dict:
    """``s001-prefix-sessions`` from :func:`~mlxlab.studies.prefix_cache.run.session_capacity` rows:
    the smallest capacity of at least ``sessions`` sessions ("full") against the largest smaller
    non-zero one ("small"). ``measured``: sessions, turns, capacity_sessions_full,
    warm_turn_fraction_full, restored_fraction_full, restored_tokens_per_turn_full,
    evictions_full, hit_rate_full, ttft_p50_later_turns_full_s, capacity_sessions_small,
    warm_turn_fraction_small, restored_fraction_small, restored_tokens_per_turn_small,
    evictions_small, ttft_p50_later_turns_small_s, ttft_p50_later_turns_no_cache_s."""
    full = min(_pick(rows, lambda c: c >= sessions), key=lambda r: r["capacity_sessions"], default=None)
    small = max(_pick(rows, lambda c: 0 < c < sessions), key=lambda r: r["capacity_sessions"], default=None)
    none = next(iter(_pick(rows, lambda c: c == 0)), None)
    m = {"sessions": sessions, "turns": int(rows[0]["turns"]) if rows else None}
    for tag, r in (("full", full), ("small", small)):
        for k in ("capacity_sessions", "warm_turn_fraction", "restored_fraction", "restored_tokens_per_turn",
                  "evictions", "hit_rate"):
            if tag == "small" and k == "hit_rate":
                continue
            m[f"{k}_{tag}"] = None if r is None else r[k]
        m[f"ttft_p50_later_turns_{tag}_s"] = None if r is None else r["ttft_p50_later_turns_s"]
    m["ttft_p50_later_turns_no_cache_s"] = None if none is None else none["ttft_p50_later_turns_s"]
    m = _clean(m)
    rule = (f"reproduced if a cache of {sessions} sessions' worth keeps at least {WARM_MIN_FRACTION:.0%} of the later "
            f"turns warm with at least {RESTORED_MIN_FRACTION:.0%} of the previous turn's tokens restored, while the "
            f"largest smaller cache measured evicts and leaves at least {EVICT_MIN_DROP:.0%} fewer turns warm or "
            "tokens restored; not reproduced if the full-size cache misses turns or the smaller one does as well; "
            "not measured without both sizes.")
    fair = (f"{setting}; {sessions} chat sessions (the seed's six) of {m['turns']} turns each, all at once with no "
            "think time, one engine and model per capacity, the same seeded prompts; capacity is in tokens (a "
            "session's worth: its last turn's prompt), LRU. Conversations are far shorter than the seed's 23k tokens, "
            "so this tests the cache's capacity logic, not memory pressure.")
    if full is None or small is None:
        return verdict("s001-prefix-sessions", "not measured", measured=m, rule=rule,
                       fairness=fair + " This run lacked a capacity of at least, or one below, the session count.")
    kept = m["warm_turn_fraction_full"] >= WARM_MIN_FRACTION and m["restored_fraction_full"] >= RESTORED_MIN_FRACTION
    evicts = m["evictions_small"] > 0 and (
        m["warm_turn_fraction_full"] - m["warm_turn_fraction_small"] >= EVICT_MIN_DROP
        or m["restored_fraction_full"] - m["restored_fraction_small"] >= EVICT_MIN_DROP)
    return verdict("s001-prefix-sessions", "reproduced" if kept and evicts else "not reproduced", measured=m,
                   rule=rule, fairness=fair, evidence="session_capacity rows (capacity)")


def ssd_verdict(disk: dict, *, setting: str, seed_tokens: int = SEED_PREFIX_TOKENS) -> dict:
    """``s001-ssd-restore`` from :func:`~mlxlab.studies.prefix_cache.disk.seed_disk_read`. The read of
    a file of the seed's size (``seed_tokens`` at the file's bytes per token, the seed's) decides; a smaller file (quick mode) is scaled to it by its measured GB/s and flagged.
    ``measured``: read_mb, tokens, extrapolated, read_ms (cold median), read_p99_ms,
    read_spread_ms, read_gb_s, read_ms_at_seed_size, verify_ms, copy_ms, restore_ms (the three),
    cached_read_ms, cached_read_gb_s, resident_before_cold_read, page_cache_method."""
    cold, cached = disk["cold"], disk["cached"]
    seed_bytes = seed_tokens * disk["bytes_per_token"]
    scale = seed_bytes / disk["file_bytes"]
    extrapolated = disk["tokens"] < seed_tokens
    m = _clean({"read_mb": disk["file_bytes"] / 1e6, "tokens": int(disk["tokens"]), "extrapolated": extrapolated,
                "read_ms": 1e3 * cold["read_s"], "read_p99_ms": 1e3 * cold.get("read_p99_s", cold["read_s"]),
                "read_spread_ms": 1e3 * cold.get("read_spread_s", 0.0), "read_gb_s": cold["read_gb_s"],
                "read_ms_at_seed_size": 1e3 * cold["read_s"] * (scale if extrapolated else 1.0),
                "verify_ms": 1e3 * cold["verify_s"], "copy_ms": 1e3 * cold["copy_s"],
                "restore_ms": 1e3 * cold["restore_s"], "cached_read_ms": 1e3 * cached["read_s"],
                "cached_read_gb_s": cached["read_gb_s"], "resident_before_cold_read": disk.get("cold_resident_max"),
                "page_cache_method": disk.get("page_cache_method", "")})
    rule = (f"reproduced if the median read of the seed-sized file ({seed_bytes / 1e6:.0f} MB), its pages dropped from "
            f"the OS page cache first (at most {COLD_MAX_RESIDENT:.0%} resident, checked with mincore), takes under "
            f"{SEED_READ_MS:g} ms; not reproduced if it takes longer; not measurable where the page cache cannot be "
            "dropped or checked, since then the read may come from memory. Verify and copy are reported apart.")
    fair = (f"{setting}; seed-shaped KV (10 layers x K,V x 2 heads x 256 x bf16 = 20,480 bytes per token, random "
            f"values) in the prefix cache's own safetensors file, read whole into fresh host memory, "
            f"{disk['repeats']} cold and {disk['repeats']} page-cache reads; page cache: "
            f"{m['page_cache_method'] or 'not dropped'}. The disk is this machine's (a cloud VM's virtual disk may also "
            "be cached by its host, outside the guest's reach), not the seed's Apple NVMe SSD."
            + (" A read the page cache served took about as long, so copying into fresh memory, not the disk, "
               "bounds the read on this machine." if m["cached_read_ms"] > 0.5 * m["read_ms"] else "")
            + (f" This run read {m['read_mb']:.0f} MB and scaled it to the seed's size by its GB/s (extrapolated)."
               if extrapolated else " The file is the seed's size: measured, not extrapolated."))
    cold_ok = m["resident_before_cold_read"] is not None and m["resident_before_cold_read"] <= COLD_MAX_RESIDENT
    if not m["page_cache_method"] or not cold_ok:
        return verdict("s001-ssd-restore", "not measurable on this backend", measured=m, rule=rule,
                       fairness=fair + " The page cache could not be dropped or checked here.")
    cached_at_seed = m["cached_read_ms"] * (scale if extrapolated else 1.0)
    if cached_at_seed >= SEED_READ_MS:  # copying into memory alone misses the bound: the disk is never tested
        return verdict("s001-ssd-restore", "not measurable on this backend", measured=m, rule=rule + (
            f" Not measurable where a read the page cache serves (no disk) already takes {SEED_READ_MS:g} ms or "
            "more at the seed's size: then this machine's memory copy, not its disk, decides."),
            fairness=fair, evidence="seed_disk_read (ssd)")
    return verdict("s001-ssd-restore", "reproduced" if m["read_ms_at_seed_size"] < SEED_READ_MS else "not reproduced",
                   measured=m, rule=rule, fairness=fair, evidence="seed_disk_read (ssd)")


def kvquant_verdict(comp: dict, *, setting: str) -> dict:
    """``s001-kvquant-apc`` from :func:`~mlxlab.studies.prefix_cache.kvquant.kvquant_composition`.
    ``measured``: kv_bits, probe_error (where not measurable), else quantized_memory_exact,
    quantized_disk_exact, plain_memory_exact, plain_disk_exact, entry_kind, restored_tokens,
    expected_restored_tokens, quantized_entry_kv_bytes, plain_entry_kv_bytes, first_difference."""
    rule = ("The claim is that the two do not compose. Reproduced if mlxlab cannot store a quantized request's KV as a "
            "prefix, restores less than the whole prefix into a quantized request, or the restored greedy continuation "
            "differs from the oracle (the same turn without a prefix cache) while the plain-KV control matches; not "
            "reproduced if the quantized prefix is stored quantized, restored whole and continues exactly as the "
            "oracle from memory and from disk; not measured if the plain control itself differs (the oracle is then "
            "not exact); not measurable where the backend has no quantized attention.")
    fair = (f"{setting}; mlxlab's engine over mlx-lm's QuantizedKVCache, not the seed's pinned mlx-vlm: there a "
            "concurrent multi-row path is what did not compose; in mlxlab a quantized request decodes in a forward "
            "of its own beside the batch (mlx-lm has no batched quantized cache), so composition is tested per "
            "request, sessions one after another. The oracle is exact because the prefix ends on a chunk boundary.")
    if not comp.get("measurable"):
        return verdict("s001-kvquant-apc", "not measurable on this backend",
                       measured={"kv_bits": comp["kv_bits"], "probe_error": comp.get("why")}, rule=rule,
                       fairness=fair + " The quantized-attention probe failed on this device.")
    runs = {(r["kv_bits"] is not None, r["tier"]): r for r in comp["runs"]}
    q, p = runs[(True, "memory")], runs[(False, "memory")]
    m = {"kv_bits": comp["kv_bits"], "quantized_memory_exact": q["exact"], "quantized_disk_exact": runs[(True, "disk")]["exact"],
         "plain_memory_exact": p["exact"], "plain_disk_exact": runs[(False, "disk")]["exact"],
         "entry_kind": ",".join(q["entry_kinds"]) or "none stored",
         "restored_tokens": min(runs[(True, t)]["restored_tokens"] for t in ("memory", "disk")),
         "expected_restored_tokens": q["expected_restored_tokens"], "quantized_entry_kv_bytes": q["entry_kv_bytes"],
         "plain_entry_kv_bytes": p["entry_kv_bytes"],
         "first_difference": next((runs[(True, t)]["first_difference"] for t in ("memory", "disk")
                                   if runs[(True, t)]["first_difference"] is not None), None)}
    if not (m["plain_memory_exact"] and m["plain_disk_exact"]):
        return verdict("s001-kvquant-apc", "not measured", measured=m, rule=rule,
                       fairness=fair + " The plain-KV control differed from its oracle, so the test is void.")
    composes = (m["quantized_memory_exact"] and m["quantized_disk_exact"] and q["stored_entries"] > 0
                and m["entry_kind"].startswith("q") and m["restored_tokens"] == m["expected_restored_tokens"])
    return verdict("s001-kvquant-apc", "not reproduced" if composes else "reproduced", measured=m, rule=rule,
                   fairness=fair, evidence="kvquant_composition runs (kvquant)")


def _stored_setting(doc: dict) -> str:
    """The ``setting`` the notebook passed: it opens every stored verdict's fairness text (the model's
    layers and dtype are stored nowhere else), else rebuilt from the stored model, bits and environment."""
    for v in doc.get("verdicts") or []:
        if "; " in (v.get("fairness") or ""):
            return v["fairness"].partition("; ")[0]
    env = doc.get("environment") or {}
    return (f"model {doc.get('model')} (bits={doc.get('bits')}) on {env.get('device')} ({env.get('device_name')}), "
            f"mlx {env.get('mlx')}" + (" (quick mode)" if (doc.get("parameters") or {}).get("quick") else ""))


def decide_stored(doc: dict, path=None) -> List[dict]:
    """The verdicts of a saved notebook-06 result (``prefix_cache.json``) from its stored rows
    (:class:`~mlxlab.studies.base.Study`'s ``decide``), each rule called as the notebook called it:
    the session count from its ``parameters``, the setting from :func:`_stored_setting`."""
    needs = ("restore", "capacity", "disk", "kvquant", "max_context_tokens", "parameters")
    missing = [k for k in needs if k not in doc]
    if missing:
        raise ValueError(f"{path or 'this document'} is not a notebook-06 prefix-cache result "
                         f"(no {', '.join(missing)}): rescore a prefix_cache.json")
    setting = _stored_setting(doc)
    return [restore_verdict(doc["restore"], max_context_tokens=doc["max_context_tokens"], setting=setting),
            sessions_verdict(doc["capacity"], sessions=doc["parameters"]["sessions"], setting=setting),
            ssd_verdict(doc["disk"], setting=setting),
            kvquant_verdict(doc["kvquant"], setting=setting)]
