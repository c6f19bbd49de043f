"""PrefixCache: longest-prefix lookup, exact greedy outputs with a restored prefix, LRU eviction
by tokens and bytes, the disk tier and its integrity check, statistics."""

import os
import random

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from mlxlab import load_model
from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.studies.prefix_cache.run import measure_restore, warm_vs_cold_ttft

GEN = 16


@pytest.fixture(scope="module")
def module():
    return load_model("tiny", dtype="float32").module


def toks(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(1024) for _ in range(n)]


def prefill(module, tokens):
    cache = make_prompt_cache(module)
    module(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def greedy(module, prompt, cache=None):
    """Greedy tokens of generate_step; with ``cache``, ``prompt`` is only the part after it."""
    gen = generate_step(mx.array(prompt), module, max_tokens=GEN, prompt_cache=cache)
    return [t for t, _ in gen]


def test_longest_prefix_lookup(module):
    t, u = toks(60, 1), toks(60, 2)
    pc = PrefixCache()
    pc.insert(t[:20], prefill(module, t[:20]))
    assert pc.match(t[:30])[0] == 20  # prompt extends the entry
    assert pc.match(t[:21])[0] == 20
    assert pc.match(t[:20])[0] == 19  # never the whole prompt: the last token is decode input
    assert pc.match(t[:10])[0] == 9  # prompt shorter than the entry: trimmed
    assert pc.match(t[:12] + u[:10])[0] == 12  # diverging prompt
    assert pc.match(u[:30]) == (0, None)  # u[0] != t[0]
    assert pc.match(t[:1]) == (0, None)  # one token: nothing to skip
    # a second entry sharing 8 tokens with the first; the longest common prefix wins
    b = t[:8] + u[:20]
    pc.insert(b, prefill(module, b))
    n, e = pc.match(t[:8] + u[:5] + t[:3])
    assert n == 13 and e.tokens == tuple(b)
    n, e = pc.match(t[:25])
    assert n == 20 and e.tokens == tuple(t[:20])
    # a prefix of a stored entry is not stored again; a longer entry replaces its prefixes
    pc.insert(t[:10], prefill(module, t[:10]))
    assert len(pc._mem) == 2
    pc.insert(t[:40], prefill(module, t[:40]))
    assert sorted(len(e.tokens) for e in pc.entries()) == [28, 40]
    assert pc.stats.memory_tokens == 68


def test_restore_copies_and_trims(module):
    t = toks(40, 3)
    cache = prefill(module, t)
    pc = PrefixCache()
    e = pc.insert(t, cache)
    ref = [(mx.array(k), mx.array(v)) for k, v in e.layers]
    for c in cache:  # overwrite the source cache in place: the entry must not change
        c.trim(20)
    module(mx.array([toks(20, 4)]), cache=cache)
    mx.eval([c.state for c in cache])
    restored = pc.restore(e, 30, module)
    for c, (k, v) in zip(restored, ref):
        assert c.offset == 30 and c.keys.shape[2] % c.step == 0
        assert mx.array_equal(c.keys[..., :30, :], k[..., :30, :])
        assert mx.array_equal(c.values[..., :30, :], v[..., :30, :])


def test_greedy_identical_with_restored_prefix(module):
    p = toks(48, 5)
    ref = greedy(module, p)
    pc = PrefixCache()
    # entries from other prompts: one diverging after 30 tokens, one longer than p
    other = p[:30] + toks(10, 6)
    pc.insert(other, prefill(module, other))
    n, caches = pc.lookup(p, module)
    assert n == 30 and greedy(module, p[n:], caches) == ref
    longer = p + toks(8, 7)
    pc.insert(longer, prefill(module, longer))
    n, caches = pc.lookup(p, module)
    assert n == len(p) - 1 and greedy(module, p[n:], caches) == ref
    assert pc.stats.hits == 2 and pc.stats.hit_tokens == 30 + 47


def test_chat_turn_restores_previous_turn(module):
    turn1 = toks(30, 8)
    cache = make_prompt_cache(module)
    out1 = [t for t, _ in generate_step(mx.array(turn1), module, max_tokens=GEN,
                                        prompt_cache=cache)]
    pc = PrefixCache()
    pc.insert(turn1 + out1, cache)  # generate_step's cache holds the prompt and every output
    turn2 = turn1 + out1 + toks(12, 9)
    n, caches = pc.lookup(turn2, module)
    assert n == len(turn1) + GEN
    assert greedy(module, turn2[n:], caches) == greedy(module, turn2)


def test_lru_eviction_by_tokens_and_bytes(module):
    a, b, c = toks(20, 10), toks(20, 11), toks(20, 12)
    per_token = 4 * 2 * 2 * 64 * 4  # layers * (K, V) * kv heads * head_dim * float32
    for pc in (PrefixCache(max_tokens=50), PrefixCache(max_bytes=50 * per_token)):
        pc.insert(a, prefill(module, a))
        pc.insert(b, prefill(module, b))
        assert pc.stats.memory_bytes == 40 * per_token
        assert pc.match(a + [1])[0] == 20  # a becomes most recent; b is now LRU
        pc.insert(c, prefill(module, c))
        assert [e.tokens for e in pc.entries()] == [tuple(a), tuple(c)]
        assert pc.stats.evictions == 1 and pc.stats.memory_tokens == 40
        assert pc.match(b + [1]) == (0, None)
    pc = PrefixCache(max_tokens=10)  # an entry larger than the capacity is not kept
    pc.insert(a, prefill(module, a))
    assert not pc._mem and pc.stats.evictions == 1 and pc.stats.memory_bytes == 0


def test_disk_round_trip(module, tmp_path):
    a, b = toks(24, 13), toks(24, 14)
    pc = PrefixCache(max_tokens=30, disk_dir=tmp_path)
    pc.insert(a, prefill(module, a))
    pc.insert(b, prefill(module, b))  # evicts a to disk
    assert pc.stats.disk_writes == 1 and len(list(tmp_path.glob("*.safetensors"))) == 1
    prompt = a + toks(10, 15)
    ref = greedy(module, prompt)
    n, caches = pc.lookup(prompt, module)
    assert n == 24 and pc.stats.disk_hits == 1 and len(pc.stats.restore_s_disk) == 1
    s = pc.stats  # the disk restore in its three phases, and the bytes read
    assert len(s.disk_read_s) == len(s.disk_verify_s) == len(s.disk_copy_s) == 1
    assert s.restore_s_disk[0] == pytest.approx(s.disk_read_s[0] + s.disk_verify_s[0] + s.disk_copy_s[0])
    assert s.disk_read_bytes == [pc.entries("disk")[0].path.stat().st_size]
    assert greedy(module, prompt[n:], caches) == ref
    # a new cache over the same directory finds the file again (survives a restart)
    pc2 = PrefixCache(disk_dir=tmp_path)
    n, caches = pc2.lookup(prompt, module)
    assert n == 24 and greedy(module, prompt[n:], caches) == ref
    # disk capacity: a second eviction pushes the older file out
    pc3 = PrefixCache(max_tokens=30, disk_dir=tmp_path / "d", disk_max_bytes=40 * 4096)
    for x in (a, b, toks(24, 16)):
        pc3.insert(x, prefill(module, x))
    assert pc3.stats.disk_writes == 2 and pc3.stats.disk_evictions == 1
    assert [e.tokens for e in pc3.entries("disk")] == [tuple(b)]


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_corrupt_disk_file_is_dropped(module, tmp_path, damage):
    a, b = toks(24, 17), toks(24, 18)
    pc = PrefixCache(max_tokens=30, disk_dir=tmp_path)
    pc.insert(a[:10], prefill(module, a[:10]))
    pc.insert(a, prefill(module, a))  # replaces a[:10]
    short = a[:6]
    pc.insert(b, prefill(module, b))  # a -> disk
    (path,) = tmp_path.glob("*.safetensors")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        for i in range(len(data) - 200, len(data) - 100):
            data[i] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[10:30] = b"\x00" * 20
    path.write_bytes(bytes(data))
    if damage == "header":  # also caught when re-indexing a directory
        assert PrefixCache(disk_dir=tmp_path).stats.disk_corrupt == 1
        assert not path.exists()
        path.write_bytes(bytes(data))
    pc.insert(short, prefill(module, short))  # a shorter memory entry to fall back to
    n, e = pc.match(a + [5])
    assert pc.stats.disk_corrupt == 1 and not path.exists() and not pc._disk
    assert n == 6 and e.tier == "memory" and e.tokens == tuple(short)
    assert pc.match(a + [5])[0] == 6 and pc.stats.disk_corrupt == 1  # never tried again
    assert pc.stats.disk_hits == 0


def test_only_plain_or_quantized_kvcache_layers(module):
    pc = PrefixCache()
    with pytest.raises(ValueError, match="QuantizedKVCache layers only"):
        pc.insert([1, 2, 3], [RotatingKVCache(max_size=8)])
    with pytest.raises(ValueError, match="one setting for all"):
        pc.insert([1, 2, 3], [QuantizedKVCache(bits=8), QuantizedKVCache(bits=4)])
    with pytest.raises(ValueError, match="QuantizedKVCache layers only"):
        pc.insert([1, 2, 3], [KVCache(), QuantizedKVCache()])
    assert pc.insert([1, 2], make_prompt_cache(module)) is None  # empty caches: nothing to store
    assert pc.insert([1, 2], [QuantizedKVCache() for _ in module.layers]) is None
    batch = make_prompt_cache(module)
    module(mx.zeros((2, 4), dtype=mx.int32), cache=batch)
    with pytest.raises(ValueError, match="batch size 1"):
        pc.insert([1, 2, 3], batch)


def test_stats(module):
    t = toks(30, 19)
    pc = PrefixCache()
    pc.match(t)
    pc.insert(t[:20], prefill(module, t[:20]))
    pc.lookup(t, module)
    pc.lookup(t[:5], module)
    pc.match(toks(9, 20))
    s = pc.stats
    assert (s.queries, s.hits, s.misses, s.hit_tokens) == (4, 2, 2, 24)
    assert s.query_tokens == 29 + 29 + 4 + 8 and s.inserts == 1
    assert len(s.restore_s_memory) == 2 and s.restore_s_disk == []
    assert s.hit_rate == 0.5 and s.memory_tokens == 20


def test_measure_restore(module):
    (row,) = measure_restore(module, prefix_lengths=(64,), repeats=1)
    assert row["prefix_tokens"] == 64 and row["kv_bytes"] == 64 * 4096
    assert row["prefill_s"] > 0 and row["restore_memory_s"] > 0 and row["restore_disk_s"] > 0


def test_warm_turn_restores_the_prefix_and_gives_the_cold_turns_token(tiny):
    rows = warm_vs_cold_ttft(tiny, (96,), turn_tokens=8, repeats=1, chunk_size=32)
    r = rows[0]
    assert r["restored_tokens"] == 96  # the whole earlier turn came back from the cache
    assert r["same_first_token"]
    assert r["cold_ttft_s"] > 0 and r["warm_ttft_s"] > 0


# ---------------------------------------------------------------------- quantized KV entries
def quantized(cache, bits=8, group=64):
    return [c.to_quantized(group_size=group, bits=bits) for c in cache]


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_quantized_entry_restores_exactly_and_only_for_its_kind(module, tier, tmp_path):
    t = toks(70, 21)
    cache = quantized(prefill(module, t[:40]))
    pc = PrefixCache(max_tokens=0 if tier == "disk" else None, disk_dir=tmp_path if tier == "disk" else None)
    pc.insert(t[:40], cache)
    (e,) = pc.entries(tier)
    assert e.kind == (8, 64)
    assert pc.match(t) == (0, None)  # a plain request never gets quantized KV
    assert pc.match(t, kv=(4, 64, 0)) == (0, None)  # nor another quantization
    assert pc.match(t, kv=(8, 64, 41)) == (0, None)  # below quantized_kv_start the request holds plain KV
    n, restored = pc.lookup(t, module, kv=(8, 64, 0))
    assert n == 40 and all(type(c) is QuantizedKVCache and c.offset == 40 and c.bits == 8 for c in restored)
    for c, src in zip(restored, cache):
        for a, b in zip(c.keys + c.values, src.keys + src.values):
            assert mx.array_equal(a[..., :40, :], b[..., :40, :])
    # the restored cache continues exactly as the cache it was stored from
    ref = [t for t, _ in generate_step(mx.array(t[40:]), module, max_tokens=GEN, prompt_cache=cache, kv_bits=8)]
    got = [t for t, _ in generate_step(mx.array(t[40:]), module, max_tokens=GEN, prompt_cache=restored, kv_bits=8)]
    assert got == ref
    if tier == "disk":  # and a new cache over the directory knows the file's kind
        assert PrefixCache(disk_dir=tmp_path).entries("disk")[0].kind == (8, 64)


def test_plain_and_quantized_entries_of_one_prompt_coexist(module):
    t = toks(30, 22)
    pc = PrefixCache()
    pc.insert(t, prefill(module, t))
    pc.insert(t, quantized(prefill(module, t)))
    assert sorted(str(e.kind) for e in pc.entries()) == ["(8, 64)", "None"]
    assert pc.match(t + [1])[1].kind is None and pc.match(t + [1], kv=(8, 64, 0))[1].kind == (8, 64)


def test_engine_stores_and_restores_quantized_requests_exactly(tiny):
    from mlxlab.studies.prefix_cache.kvquant import compose_once

    for bits in (None, 8):
        r = compose_once(tiny, bits, prefix_tokens=64, turn_tokens=8, output_tokens=6, sessions=2, chunk_size=32)
        assert r["exact"] and r["first_difference"] is None
        assert r["restored_tokens"] == r["expected_restored_tokens"] == 64
        assert r["entry_kinds"] == (["plain"] if bits is None else ["q8g64"]) and r["stored_entries"] == 2
    r = compose_once(tiny, 8, tier="disk", prefix_tokens=64, turn_tokens=8, output_tokens=6, sessions=1, chunk_size=32)
    assert r["exact"] and r["restored_tokens"] == 64


def test_quantized_request_does_not_restore_a_plain_prefix(tiny):
    from mlxlab.engine.loop import Engine

    t = toks(80, 23)
    pc = PrefixCache()
    eng = Engine(tiny, chunk_size=32, prefix_cache=pc)
    eng.submit(t[:60], 2)
    eng.run()
    q = eng.submit(t, 2, kv_bits=8)
    eng.run()
    assert q.cached_tokens == 0 and {e.kind for e in pc.entries()} == {None, (8, 64)}
    again = eng.submit(t + q.output_tokens + [5], 2, kv_bits=8)  # the quantized request's next turn
    eng.run()
    assert again.cached_tokens >= len(t) + 1  # its prompt and (at least) the first output it fed


# ---------------------------------------------------------------------- the study's pieces
def test_aligned_chunk_and_prefill_seconds():
    from types import SimpleNamespace

    from mlxlab.studies.prefix_cache.run import aligned_chunk, prefill_seconds

    assert aligned_chunk(8128, 2048) == 2032 and aligned_chunk(4096, 2048) == 2048
    assert aligned_chunk(8120, 2048) == 1624  # the longest prefix tiny's 8192-token context allows a 64-token turn
    assert aligned_chunk(1024, 2048) == 1024 and aligned_chunk(1001, 512) == 512  # no divisor: as given
    steps = [SimpleNamespace(prefill=[(0, 100, 0)], duration_s=1.0), SimpleNamespace(prefill=[(0, 100, 100)], duration_s=2.0),
             SimpleNamespace(prefill=[(1, 100, 0)], duration_s=9.0), SimpleNamespace(prefill=[], duration_s=5.0)]
    assert prefill_seconds(steps, 0, 200) == 3.0
    assert prefill_seconds(steps, 0, 150) == pytest.approx(2.0)  # half of the straddling chunk


def test_restore_vs_prefill(tiny, tmp_path):
    from mlxlab.studies.prefix_cache.run import longest_prefix, restore_vs_prefill

    (r,) = restore_vs_prefill(tiny, [64], turn_tokens=8, repeats=2, chunk_size=32, disk_dir=tmp_path)
    assert r["restored_tokens"] == 64 and r["same_first_token"] and r["chunk_tokens"] == 32
    assert r["kv_bytes"] == 64 * 4096 and len(r["cold_ttft_all_s"]) == 2
    assert 0 < r["prefill_s"] < r["cold_ttft_s"] and r["restore_memory_s"] > 0 and r["warm_ttft_s"] > 0
    assert r["restore_disk_s"] == pytest.approx(r["disk_read_s"] + r["disk_verify_s"] + r["disk_copy_s"], rel=0.5)
    assert r["page_cache_resident"] is None or 0 <= r["page_cache_resident"] <= 1
    assert longest_prefix(tiny, 64) == 8120
    with pytest.raises(ValueError, match="context"):
        restore_vs_prefill(tiny, [8184], turn_tokens=8, repeats=1)


def test_session_capacity_keeps_every_session_warm_only_when_big_enough(tiny):
    from mlxlab.studies.prefix_cache.run import session_capacity

    rows = session_capacity(tiny, [0, 1, 3], sessions=3, turns=3, first_prompt_tokens=32, turn_tokens=8,
                            output_tokens=4, chunk_size=64)
    none, small, full = rows
    assert none["warm_turn_fraction"] == 0 and none["hit_rate"] == 0
    assert full["warm_turn_fraction"] == 1 and full["restored_fraction"] > 0.9 and full["later_turns"] == 6
    assert small["evictions"] > 0 and small["restored_fraction"] < full["restored_fraction"]


def test_page_cache_helpers(tmp_path):
    from mlxlab.studies.prefix_cache.disk import drop_page_cache, resident_fraction

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * (1 << 20))
    path.read_bytes()
    before = resident_fraction(path)
    assert before is None or before == 1.0  # just written and read: all in the page cache
    method = drop_page_cache(path)
    after = resident_fraction(path)
    assert method == ("fsync + posix_fadvise(POSIX_FADV_DONTNEED)" if hasattr(os, "posix_fadvise") else "")
    assert after is None or 0 <= after <= 1


def test_seed_disk_read_small(tmp_path):
    from mlxlab.studies.prefix_cache.disk import SEED_BYTES_PER_TOKEN, seed_disk_read

    d = seed_disk_read(tokens=48, repeats=2, disk_dir=tmp_path)
    assert SEED_BYTES_PER_TOKEN == 20480 and d["kv_bytes"] == 48 * 20480 < d["file_bytes"]
    for mode in ("cold", "cached"):
        assert len(d[mode]["read_all_s"]) == 2 and d[mode]["read_gb_s"] > 0 and d[mode]["copy_s"] > 0
    assert d["cached_resident_min"] in (None, 1.0)
    assert not list(tmp_path.iterdir())  # the file was removed


# ---------------------------------------------------------------------- verdicts, every branch
def _restore_row(prefill=(20.0, 22.0), restore=(0.01, 0.02), cold=(21.0, 23.0), warm=(0.3, 0.5), restored=8128):
    row = {"prefix_tokens": 8128, "repeats": 5, "restored_tokens": restored, "same_first_token": True}
    for k, (lo, hi) in (("prefill", prefill), ("restore_memory", restore), ("cold_ttft", cold), ("warm_ttft", warm)):
        row.update({f"{k}_s": (lo + hi) / 2, f"{k}_min_s": lo, f"{k}_max_s": hi})
    return row


def test_restore_verdict_branches():
    from mlxlab.studies.prefix_cache.verdict import restore_verdict

    small = dict(_restore_row(), prefix_tokens=1024)
    v = restore_verdict([small, _restore_row()], max_context_tokens=8192, setting="tiny")
    assert v["verdict"] == "reproduced" and v["measured"]["prefix_tokens"] == 8128
    assert v["measured"]["speedup_worst_x"] == pytest.approx(1000)
    for bad in (_restore_row(prefill=(0.1, 0.3)),  # fastest prefill < 10x the slowest restore
                _restore_row(cold=(0.4, 23.0)),  # a cold turn faster than the slowest warm one
                _restore_row(restore=(0.5, 1.5)),  # a restore over a second
                _restore_row(restored=100)):  # the prefix was not restored whole
        assert restore_verdict([bad], max_context_tokens=8192, setting="tiny")["verdict"] == "not reproduced"


def _cap(c, warm, restored, evictions):
    return {"capacity_sessions": c, "turns": 4, "warm_turn_fraction": warm, "restored_fraction": restored,
            "restored_tokens_per_turn": 500 * restored, "evictions": evictions, "hit_rate": warm * 0.75,
            "ttft_p50_later_turns_s": 1.0 - warm / 2}


def test_sessions_verdict_branches():
    from mlxlab.studies.prefix_cache.verdict import sessions_verdict

    rows = [_cap(0, 0, 0, 0), _cap(4, 0.5, 0.5, 9), _cap(5, 0.8, 0.8, 3), _cap(6, 1.0, 0.99, 0), _cap(8, 1.0, 0.99, 0)]
    v = sessions_verdict(rows, sessions=6, setting="tiny")
    assert v["verdict"] == "reproduced"
    assert v["measured"]["capacity_sessions_full"] == 6 and v["measured"]["capacity_sessions_small"] == 5
    assert v["measured"]["ttft_p50_later_turns_no_cache_s"] == 1.0
    missing = [_cap(5, 0.8, 0.8, 3), _cap(6, 0.9, 0.9, 2)]  # the full-size cache misses turns
    assert sessions_verdict(missing, sessions=6, setting="tiny")["verdict"] == "not reproduced"
    same = [_cap(5, 1.0, 0.99, 1), _cap(6, 1.0, 0.99, 0)]  # the smaller cache keeps them warm too
    assert sessions_verdict(same, sessions=6, setting="tiny")["verdict"] == "not reproduced"
    assert sessions_verdict([_cap(6, 1.0, 1.0, 0)], sessions=6, setting="tiny")["verdict"] == "not measured"


def _disk(read_s, tokens=23000, resident=0.0, method="fsync + posix_fadvise(POSIX_FADV_DONTNEED)", cached_s=None):
    phase = {"read_s": read_s, "read_p99_s": read_s, "read_spread_s": 0.0, "verify_s": 0.2, "copy_s": 0.3,
             "restore_s": read_s + 0.5, "read_gb_s": tokens * 20480 / read_s / 1e9}
    return {"tokens": tokens, "bytes_per_token": 20480, "file_bytes": tokens * 20480, "repeats": 5,
            "cold": phase, "cached": dict(phase, read_s=read_s / 4 if cached_s is None else cached_s),
            "cold_resident_max": resident,
            "page_cache_method": method}


def test_ssd_verdict_branches():
    from mlxlab.studies.prefix_cache.verdict import ssd_verdict

    v = ssd_verdict(_disk(0.05), setting="tiny")
    assert v["verdict"] == "reproduced" and not v["measured"]["extrapolated"]
    assert v["measured"]["read_mb"] == pytest.approx(471.04) and v["measured"]["read_ms_at_seed_size"] == pytest.approx(50)
    assert ssd_verdict(_disk(0.5, cached_s=0.02), setting="tiny")["verdict"] == "not reproduced"  # the disk is slow
    # the page cache's own read already misses 100 ms: copying, not the disk, decides: nothing to say of the disk
    assert ssd_verdict(_disk(0.5, cached_s=0.15), setting="tiny")["verdict"] == "not measurable on this backend"
    q = ssd_verdict(_disk(0.05, tokens=2300, cached_s=0.002), setting="tiny")  # a tenth of the size: scaled up
    assert q["verdict"] == "not reproduced" and q["measured"]["extrapolated"]
    assert q["measured"]["read_ms_at_seed_size"] == pytest.approx(500)
    assert ssd_verdict(_disk(0.05, resident=0.5), setting="tiny")["verdict"] == "not measurable on this backend"
    assert ssd_verdict(_disk(0.05, resident=None, method=""), setting="tiny")["verdict"] == "not measurable on this backend"


def _runs(q_exact=True, p_exact=True, restored=256, kinds=("q8g64",)):
    out = []
    for bits in (None, 8):
        for tier in ("memory", "disk"):
            out.append({"kv_bits": bits, "tier": tier, "exact": q_exact if bits else p_exact,
                        "first_difference": None if (q_exact if bits else p_exact) else 3,
                        "restored_tokens": restored if bits else 256, "expected_restored_tokens": 256,
                        "stored_entries": 2 if kinds else 0, "entry_kinds": list(kinds) if bits else ["plain"],
                        "entry_kv_bytes": 1000 if bits else 4000})
    return {"kv_bits": 8, "measurable": True, "runs": out}


def test_kvquant_verdict_branches():
    from mlxlab.studies.prefix_cache.verdict import kvquant_verdict

    v = kvquant_verdict(_runs(), setting="tiny")
    assert v["verdict"] == "not reproduced" and v["measured"]["entry_kind"] == "q8g64"
    assert kvquant_verdict(_runs(q_exact=False), setting="tiny")["verdict"] == "reproduced"
    assert kvquant_verdict(_runs(restored=0, kinds=()), setting="tiny")["verdict"] == "reproduced"
    assert kvquant_verdict(_runs(p_exact=False), setting="tiny")["verdict"] == "not measured"
    off = kvquant_verdict({"kv_bits": 8, "measurable": False, "why": "no kernel"}, setting="cuda")
    assert off["verdict"] == "not measurable on this backend" and off["measured"]["probe_error"] == "no kernel"
