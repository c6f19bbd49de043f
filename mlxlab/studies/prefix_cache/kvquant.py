"""Does a quantized KV cache compose with the prefix cache in mlxlab's engine?

The seed (001) could not run both on its pinned mlx-vlm. Here a chat's first turn runs with
``kv_bits`` through an engine with a :class:`mlxlab.engine.prefix_cache.PrefixCache`, so its
quantized KV (mlx-lm ``QuantizedKVCache``) is stored; the second turn, also quantized, restores
that prefix and prefills only its new tokens. The oracle is exact: the same second turn on an
engine without a prefix cache must give the same greedy tokens. It can, bit for bit, because the
first turn's prefix ends on a chunk boundary (the chunk size divides it) and its last token is
one the second turn does not share, so every restored position was computed by the same prefill
chunks, quantized at the same points, as in the oracle. The same protocol runs with plain KV (the
control) and with the prefix evicted to the disk tier.
"""

from __future__ import annotations

import tempfile
from typing import List, Optional

from mlxlab.core.presets import model_limits
from mlxlab.engine.kvquant import probe_model
from mlxlab.engine.loop import Engine
from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.engine.warmup import random_prompt
from mlxlab.studies.prefix_cache.run import aligned_chunk


def _first_difference(a: List[int], b: List[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _turns(model, kv_bits, group_size, prompts, output_tokens, chunk, pc=None) -> list:
    """Run ``prompts`` one after another on one engine (optionally with prefix cache ``pc``)."""
    eng = Engine(model, chunk_size=chunk, prefix_cache=pc)
    out = []
    for p, n in prompts:
        out.append(eng.submit(p, n, kv_bits=kv_bits, kv_group_size=group_size))
        eng.run()
    return out


def compose_once(model, kv_bits: Optional[int], *, tier: str = "memory", group_size: int = 64,
                 prefix_tokens: int = 512, turn_tokens: int = 32, output_tokens: int = 8, sessions: int = 2,
                 chunk_size: int = 256, seed: int = 0) -> dict:
    """One run of the protocol (module docstring) for ``sessions`` chats one after another, the
    prefixes kept in ``tier`` ("memory" or "disk"). Returns ``stored_entries`` and their
    ``entry_kinds`` ("plain" or "q<bits>g<group>") and ``entry_kv_bytes``, ``restored_tokens``
    (fewest over the sessions) against ``expected_restored_tokens`` (the prefix), ``exact`` (every
    session's tokens equal the oracle's) and ``first_difference`` (the first differing token index
    of the first session that differs, or None)."""
    if tier not in ("memory", "disk"):
        raise ValueError(f"tier must be 'memory' or 'disk', got {tier!r}")
    vocab = model_limits(model)[0]
    chunk = aligned_chunk(prefix_tokens, chunk_size)
    prefixes = [random_prompt(prefix_tokens, vocab, seed + 10 * i) for i in range(sessions)]
    news = [random_prompt(turn_tokens, vocab, seed + 10 * i + 1) for i in range(sessions)]
    # the first turn ends in a token the second does not share, so the match is exactly the prefix
    first = [(p + [(n[0] % (vocab - 1)) + 1], 1) for p, n in zip(prefixes, news)]
    second = [(p + n, output_tokens) for p, n in zip(prefixes, news)]
    oracle = _turns(model, kv_bits, group_size, second, output_tokens, chunk)
    with tempfile.TemporaryDirectory() as tmp:
        pc = PrefixCache(max_tokens=0, disk_dir=tmp) if tier == "disk" else PrefixCache()
        _turns(model, kv_bits, group_size, first, 1, chunk, pc)
        entries = pc.entries("memory") + pc.entries("disk")
        kinds = sorted({"plain" if e.kind is None else f"q{e.kind[0]}g{e.kind[1]}" for e in entries})
        nbytes = sum(e.nbytes for e in pc.entries("memory")) or sum(e.nbytes for e in pc.entries("disk"))
        composed = _turns(model, kv_bits, group_size, second, output_tokens, chunk, pc)
    diffs = [_first_difference(o.output_tokens, c.output_tokens) for o, c in zip(oracle, composed)]
    return {"kv_bits": kv_bits, "tier": tier, "sessions": sessions, "prefix_tokens": prefix_tokens,
            "chunk_tokens": chunk, "output_tokens": output_tokens, "stored_entries": len(entries),
            "entry_kinds": kinds, "entry_kv_bytes": int(nbytes),
            "restored_tokens": int(min(c.cached_tokens for c in composed)),
            "expected_restored_tokens": prefix_tokens, "exact": all(d is None for d in diffs),
            "first_difference": next((d for d in diffs if d is not None), None)}


def kvquant_composition(model, kv_bits: int = 8, *, group_size: int = 64, **protocol) -> dict:
    """The composition test for ``kv_bits`` and the plain-KV control, from memory and from disk.
    ``measurable`` False (with ``why``: the probe's words) where this backend cannot run quantized
    attention (:func:`mlxlab.engine.kvquant.probe_model`); else ``runs``: one
    :func:`compose_once` result per (kv_bits, tier). ``protocol``: its keyword options."""
    ok, why = probe_model(model, kv_bits, group_size)
    out = {"kv_bits": kv_bits, "group_size": group_size, "measurable": bool(ok), "why": why or None}
    if ok:
        out["runs"] = [compose_once(model, bits, tier=tier, group_size=group_size, **protocol)
                       for bits in (None, kv_bits) for tier in ("memory", "disk")]
    return out
