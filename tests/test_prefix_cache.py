"""PrefixCache: longest-prefix lookup, exact greedy outputs with a restored prefix, LRU eviction
by tokens and bytes, the disk tier and its integrity check, statistics."""

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache, make_prompt_cache

from mlxlab import load_model
from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.studies.prefix_cache import measure_restore, warm_vs_cold_ttft

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
    assert sorted(len(k) for k in pc._mem) == [28, 40]
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
        assert list(pc._mem) == [tuple(a), tuple(c)]
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
    assert list(pc3._disk) == [tuple(b)]


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


def test_only_kvcache_layers(module):
    pc = PrefixCache()
    with pytest.raises(ValueError, match="KVCache layers only"):
        pc.insert([1, 2, 3], [RotatingKVCache(max_size=8)])
    with pytest.raises(ValueError, match="KVCache layers only"):
        pc.insert([1, 2, 3], [QuantizedKVCache()])
    assert pc.insert([1, 2], make_prompt_cache(module)) is None  # empty caches: nothing to store
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
