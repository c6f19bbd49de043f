"""What the prefix cache saves: restoring a prefix's KV against prefilling it, and a chat turn's
TTFT through the engine with and without a :class:`mlxlab.engine.prefix_cache.PrefixCache`."""

from __future__ import annotations

import tempfile
import time
from typing import List

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.core.presets import module_of
from mlxlab.engine.loop import Engine
from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.engine.warmup import random_prompt


def _timed_prefill(module, tokens: List[int], chunk_size: int):
    """(seconds, cache) to prefill ``tokens`` into a fresh cache in chunks of ``chunk_size``."""
    cache, t0 = make_prompt_cache(module), time.perf_counter()
    for i in range(0, len(tokens), chunk_size):
        module(mx.array([tokens[i:i + chunk_size]]), cache=cache)
        mx.eval([c.state for c in cache])
    return time.perf_counter() - t0, cache


def measure_restore(model, prefix_lengths=(256, 1024, 2048), repeats: int = 3,
                    chunk_size: int = 2048, disk_dir=None, seed: int = 0) -> List[dict]:
    """Per prefix length: median time to prefill the prefix (chunks of ``chunk_size``, after one
    warm-up run) vs median time to restore it from memory and from the disk tier (read + checksum
    + copy, in a temporary folder under ``disk_dir``; the file is probably still in the OS page
    cache, so this is a lower bound for a cold SSD read)."""
    module, rows = module_of(model), []
    for L in prefix_lengths:
        toks = random_prompt(L + 1, module.args.vocab_size, seed + L)
        prefill_s = []
        for _ in range(repeats + 1):
            t, cache = _timed_prefill(module, toks[:L], chunk_size)
            prefill_s.append(t)
        with tempfile.TemporaryDirectory(dir=disk_dir) as tmp:
            pc = PrefixCache(max_tokens=L, disk_dir=tmp)
            kv_bytes = pc.insert(toks[:L], cache).nbytes
            for max_tokens in (L, 0):  # from memory, then evicted to disk and from there
                pc.max_tokens = max_tokens
                pc.evict()
                for _ in range(repeats):
                    pc.lookup(toks, module)
        p, mem, disk = (float(np.median(x)) for x in
                        (prefill_s[1:], pc.stats.restore_s_memory, pc.stats.restore_s_disk))
        rows.append({"prefix_tokens": L, "kv_bytes": kv_bytes, "prefill_s": p,
                     "restore_memory_s": mem, "restore_disk_s": disk,
                     "speedup_memory": p / mem, "speedup_disk": p / disk})
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
