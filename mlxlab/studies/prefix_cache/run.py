"""What the prefix cache saves: restoring a prefix's KV against prefilling it, a chat turn's TTFT
through the engine with and without a :class:`mlxlab.engine.prefix_cache.PrefixCache`, and how
many chat sessions a cache of a given capacity keeps warm.

The disk tier at the seed's scale is :mod:`mlxlab.studies.prefix_cache.disk`; a quantized KV cache
through the prefix cache is :mod:`mlxlab.studies.prefix_cache.kvquant`; the verdicts are
:mod:`mlxlab.studies.prefix_cache.verdict`.
"""

from __future__ import annotations

import tempfile
import time
from typing import List, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.core.plan import KEY_ALIGN
from mlxlab.core.presets import model_limits, module_of
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import ChatTenant, Workload
from mlxlab.engine.loop import Engine
from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.engine.warmup import random_prompt
from mlxlab.studies.prefix_cache.disk import drop_page_cache, resident_fraction, spread


def longest_prefix(model, turn_tokens: int, align: int = KEY_ALIGN) -> int:
    """The longest prefix (a multiple of ``align``) whose chat turn of ``turn_tokens`` more tokens
    and one output token fits the model's context."""
    return (model_limits(model)[1] - turn_tokens - 1) // align * align


def aligned_chunk(prefix_tokens: int, chunk_size: int, align: int = KEY_ALIGN) -> int:
    """The largest chunk size up to ``chunk_size`` that is a multiple of ``align`` and divides
    ``prefix_tokens`` (so a prefix ends on a chunk boundary and its prefill is whole chunks);
    ``chunk_size`` itself when there is none."""
    for c in range(min(chunk_size, prefix_tokens) // align * align, 0, -align):
        if prefix_tokens % c == 0:
            return c
    return chunk_size


def prefill_seconds(steps, request_id: int, upto: int) -> float:
    """Seconds the engine's prefill chunks of request ``request_id`` spent on its first ``upto``
    prompt tokens, from the step records (a chunk straddling ``upto`` counts pro rata; with
    :func:`aligned_chunk` none does). For a request running alone, one chunk per step."""
    total = 0.0
    for rec in steps:
        for rid, n, before in rec.prefill:
            if rid == request_id and n > 0 and before < upto:
                total += rec.duration_s * (min(before + n, upto) - before) / n
    return total


def restore_vs_prefill(model, prefix_lengths: Sequence[int], *, turn_tokens: int = 64, repeats: int = 5,
                       chunk_size: int = 2048, disk_dir=None, seed: int = 0) -> List[dict]:
    """Per prefix length L: a chat turn of L + ``turn_tokens`` tokens through the engine,
    ``repeats`` times each way, after one untimed cold turn at the smallest L.

    * cold: the engine's prefix cache is empty, so it prefills the whole turn: ``cold_ttft_s``;
      ``prefill_s``: the part of that prefill spent on the first L tokens (its chunks, from the
      step records; chunks of :func:`aligned_chunk` so the prefix ends on a boundary).
    * warm: the cache holds the L-token prefix (the cold turn's KV cut to L), so the turn restores
      it and prefills only the new tokens: ``warm_ttft_s``, ``restore_memory_s`` (the restore
      alone, from the cache's statistics), ``restored_tokens`` and ``same_first_token``.
    * disk: the same prefix evicted to a file under ``disk_dir`` and restored from it, its pages
      dropped from the OS page cache before each read (:func:`drop_page_cache`):
      ``disk_read_s``, ``disk_verify_s``, ``disk_copy_s``, ``restore_disk_s`` (their sum),
      ``disk_read_gb_s`` and ``page_cache_resident`` (the largest fraction of the file in the page
      cache just before a read; None where it cannot be read).

    Each timing comes with its p99, min, max, spread and raw values (:func:`spread`)."""
    module, rows = module_of(model), []
    vocab, max_context = model_limits(model)
    lengths = [int(L) for L in prefix_lengths]
    if max(lengths) + turn_tokens + 1 > max_context:
        raise ValueError(f"a prefix of {max(lengths)} + {turn_tokens} turn tokens + 1 output token exceeds the "
                         f"model's {max_context}-token context (see longest_prefix)")
    eng = Engine(model, chunk_size=chunk_size)  # warm-up: one untimed cold turn
    eng.submit(random_prompt(min(lengths) + turn_tokens, vocab, seed + 1), 1)
    eng.run()
    for L in lengths:
        chunk = aligned_chunk(L, chunk_size)
        toks = random_prompt(L + turn_tokens, vocab, seed + L)
        cold, prefill, caches = [], [], None
        for _ in range(repeats):
            pc = PrefixCache()
            eng = Engine(model, chunk_size=chunk, prefix_cache=pc)
            req = eng.submit(toks, 1)
            eng.run()
            cold.append(req)
            prefill.append(prefill_seconds(eng.steps, req.id, L))
            if caches is None:  # the turn's KV, cut to the prefix
                caches = pc.restore(pc.entries()[0], L, module)
        warm, restore_s, kv_bytes = [], [], 0
        for _ in range(repeats):
            pc = PrefixCache()
            kv_bytes = pc.insert(toks[:L], caches).nbytes
            eng = Engine(model, chunk_size=chunk, prefix_cache=pc)
            warm.append(eng.submit(toks, 1))
            eng.run()
            restore_s.append(pc.stats.restore_s_memory[-1])
        row = {"prefix_tokens": L, "turn_tokens": turn_tokens, "chunk_tokens": chunk, "repeats": repeats,
               "kv_bytes": int(kv_bytes), "kv_bytes_per_token": kv_bytes / L,
               "restored_tokens": int(min(w.cached_tokens for w in warm)),
               "same_first_token": all(w.output_tokens == cold[0].output_tokens for w in cold + warm)}
        row.update(spread([r.ttft_s for r in cold], "cold_ttft"))
        row.update(spread(prefill, "prefill"))
        row.update(spread([w.ttft_s for w in warm], "warm_ttft"))
        row.update(spread(restore_s, "restore_memory"))
        row.update(_disk_restore(toks, L, caches, module, repeats, disk_dir))
        row["speedup_memory"] = row["prefill_s"] / row["restore_memory_s"]
        row["speedup_disk"] = row["prefill_s"] / row["restore_disk_s"]
        row["ttft_speedup"] = row["cold_ttft_s"] / row["warm_ttft_s"]
        rows.append(row)
    return rows


def _disk_restore(toks: List[int], L: int, caches, module, repeats: int, disk_dir) -> dict:
    """Restore an L-token prefix from the disk tier ``repeats`` times, the page cache dropped
    before each read; the timed phases and the page-cache state."""
    with tempfile.TemporaryDirectory(dir=disk_dir) as tmp:
        pc = PrefixCache(max_tokens=0, disk_dir=tmp)  # every insert goes straight to disk
        pc.insert(toks[:L], caches)
        (entry,) = pc.entries("disk")
        resident, method = [], ""
        for _ in range(repeats):
            method = drop_page_cache(entry.path)
            resident.append(resident_fraction(entry.path))
            n, restored = pc.lookup(toks, module)
            assert n == L and restored is not None, "the disk entry must restore the whole prefix"
        s = pc.stats
    out = {**spread(s.disk_read_s, "disk_read"), **spread(s.disk_verify_s, "disk_verify"),
           **spread(s.disk_copy_s, "disk_copy"), **spread(s.restore_s_disk, "restore_disk")}
    out["disk_file_bytes"] = int(s.disk_read_bytes[-1])
    out["disk_read_gb_s"] = s.disk_read_bytes[-1] / out["disk_read_s"] / 1e9
    out["page_cache_resident"] = None if None in resident else max(resident)
    out["page_cache_method"] = method or "none (the OS offers no way here)"
    return out


def session_capacity(model, capacities_sessions: Sequence[float], *, sessions: int = 6, turns: int = 4,
                     first_prompt_tokens: int = 512, turn_tokens: int = 64, output_tokens: int = 16,
                     chunk_size: int = 512, seed: int = 0) -> List[dict]:
    """``sessions`` chat sessions of ``turns`` turns each, all at once with no think time, on an
    engine whose prefix cache holds ``capacity`` sessions' worth of tokens (one session's worth:
    its last turn's prompt), LRU; 0 means no prefix cache. Per capacity: ``warm_turn_fraction``
    (turns after the first that restored a prefix), ``restored_tokens_per_turn`` (their mean),
    ``restored_fraction`` (restored over what the session's previous turn left: its prompt and
    output, i.e. the turn's prompt less its new tokens), ``hit_rate`` and ``evictions`` of the
    cache, and the TTFT medians of first and later turns."""
    final_prefix = first_prompt_tokens + (turns - 1) * (turn_tokens + output_tokens)
    vocab = model_limits(model)[0]
    rows = []
    for cap in capacities_sessions:
        pc = PrefixCache(max_tokens=max(1, int(cap * final_prefix))) if cap > 0 else None
        wl = Workload([ChatTenant(sessions=sessions, turns=turns, first_prompt_tokens=first_prompt_tokens,
                                  turn_tokens=turn_tokens, output_tokens=output_tokens, think_time_s=0.0,
                                  stagger_s=0.0)], vocab_size=vocab, seed=seed)
        res = run_workload(Engine(model, chunk_size=chunk_size, prefix_cache=pc), wl)
        index = dict(zip(res.requests["id"], res.requests["index"]))
        first = [r for r in res.submitted if index[r.id] == 0]
        later = [r for r in res.submitted if index[r.id] > 0]
        restored = np.array([r.cached_tokens for r in later], dtype=float)
        reusable = np.array([r.prompt_tokens - turn_tokens for r in later], dtype=float)
        rows.append({"capacity_sessions": cap, "capacity_tokens": int(cap * final_prefix), "sessions": sessions,
                     "turns": turns, "later_turns": len(later),
                     "warm_turn_fraction": float(np.mean(restored > 0)) if len(later) else float("nan"),
                     "restored_tokens_per_turn": float(restored.mean()) if len(later) else float("nan"),
                     "restored_fraction": float((restored / reusable).mean()) if len(later) else float("nan"),
                     "hit_rate": pc.stats.hit_rate if pc else 0.0, "evictions": pc.stats.evictions if pc else 0,
                     "ttft_p50_first_turns_s": float(np.median([r.ttft_s for r in first])),
                     "ttft_p50_later_turns_s": float(np.median([r.ttft_s for r in later])) if later else float("nan")})
    return rows


# ---------------------------------------------------------------------- kept for the probes
def _timed_prefill(module, tokens: List[int], chunk_size: int):
    """(seconds, cache) to prefill ``tokens`` into a fresh cache in chunks of ``chunk_size``."""
    cache, t0 = make_prompt_cache(module), time.perf_counter()
    for i in range(0, len(tokens), chunk_size):
        module(mx.array([tokens[i:i + chunk_size]]), cache=cache)
        mx.eval([c.state for c in cache])
    return time.perf_counter() - t0, cache


def measure_restore(model, prefix_lengths=(256, 1024, 2048), repeats: int = 3,
                    chunk_size: int = 2048, disk_dir=None, seed: int = 0) -> List[dict]:
    """Per prefix length: median time to prefill the prefix with the model alone (chunks of
    ``chunk_size``, after one warm-up run) vs median time to restore it from memory and from the
    disk tier (read + verify + copy, the file's pages dropped from the page cache before each
    read where the OS allows). :func:`restore_vs_prefill` does the same through the engine."""
    module, rows = module_of(model), []
    for L in prefix_lengths:
        toks = random_prompt(L + 1, module.args.vocab_size, seed + L)
        prefill_s = []
        for _ in range(repeats + 1):
            t, cache = _timed_prefill(module, toks[:L], chunk_size)
            prefill_s.append(t)
        pc = PrefixCache(max_tokens=L)
        kv_bytes = pc.insert(toks[:L], cache).nbytes
        for _ in range(repeats):
            pc.lookup(toks, module)
        disk = _disk_restore(toks, L, cache, module, repeats, disk_dir)
        p, mem = float(np.median(prefill_s[1:])), float(np.median(pc.stats.restore_s_memory))
        rows.append({"prefix_tokens": L, "kv_bytes": kv_bytes, "prefill_s": p, "restore_memory_s": mem,
                     "restore_disk_s": disk["restore_disk_s"], "disk_read_s": disk["disk_read_s"],
                     "speedup_memory": p / mem, "speedup_disk": p / disk["restore_disk_s"]})
    return rows


def _cold_and_warm_turn(model, toks: List[int], prefix: int, chunk_size: int):
    """One round: the turn on an engine without a prefix cache (cold), then the prefix alone and
    the turn on an engine with one (warm). Returns both requests."""
    eng = Engine(model, chunk_size=chunk_size)
    cold = eng.submit(toks, 1)
    eng.run()
    eng = Engine(model, chunk_size=chunk_size, prefix_cache=PrefixCache(max_tokens=2 * len(toks)))
    eng.submit(toks[:prefix], 1)  # the earlier turn: its prompt's KV goes into the cache
    eng.run()
    warm = eng.submit(toks, 1)
    eng.run()
    return cold, warm


def warm_vs_cold_ttft(model, prefix_lengths=(256, 1024, 2048), *, turn_tokens: int = 64, repeats: int = 3,
                      chunk_size: int = 2048, seed: int = 0) -> List[dict]:
    """A chat turn's TTFT through the engine, cold and warm, per prefix length: the turn is
    ``prefix + turn_tokens`` new tokens. Cold: an engine without a prefix cache prefills it all.
    Warm: an earlier turn (the prefix alone) went through an engine with a :class:`PrefixCache`,
    so the turn restores the prefix and prefills only the new tokens. Medians over ``repeats``
    after one untimed round; also checks that both turns produced the same first token."""
    vocab, rows = module_of(model).args.vocab_size, []
    for L in prefix_lengths:
        toks = random_prompt(L + turn_tokens, vocab, seed + L)
        turns = [_cold_and_warm_turn(model, toks, L, chunk_size) for _ in range(repeats + 1)]
        cold_s = float(np.median([c.ttft_s for c, _ in turns[1:]]))
        warm_s = float(np.median([w.ttft_s for _, w in turns[1:]]))
        rows.append({"prefix_tokens": L, "turn_tokens": turn_tokens, "cold_ttft_s": cold_s, "warm_ttft_s": warm_s,
                     "speedup": cold_s / warm_s, "restored_tokens": int(min(w.cached_tokens for _, w in turns)),
                     "same_first_token": all(c.output_tokens == w.output_tokens for c, w in turns)})
    return rows
