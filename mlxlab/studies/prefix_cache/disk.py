"""The prefix cache's disk tier at the seed's scale: how long reading a 23k-token prefix's KV
(~460 MB) from a file takes, apart from verifying it and copying it into a request's cache.

The seed (001) puts the bare read of ~460 MB of KV from an SSD "well under 100 ms". Here the
restore is split in the phases :class:`mlxlab.engine.prefix_cache.PrefixCache` times: read (the
file's bytes into host memory), verify (token hash and checksum), copy (into mlx arrays and the
new caches). A read only measures the disk if the OS page cache does not serve it, so each cold
read is preceded by :func:`drop_page_cache` and the fraction of the file still cached is read
back with ``mincore`` (:func:`resident_fraction`) just before it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import tempfile
from types import SimpleNamespace
from typing import Dict, Optional, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.studies.prefix_cache.verdict import SEED_PREFIX_TOKENS

# The seed's model: a hybrid MoE whose full-attention layers (10 of 40) keep a KV cache of
# 2 KV heads x head_dim 256 in bf16: 10 x (K, V) x 2 x 256 x 2 bytes = 20,480 bytes per token,
# the seed's "~20 KB per token"; 23,000 tokens of it are 471 MB (the seed rounds to 460 MB).
SEED_LAYERS, SEED_KV_HEADS, SEED_HEAD_DIM = 10, 2, 256
SEED_BYTES_PER_TOKEN = SEED_LAYERS * 2 * SEED_KV_HEADS * SEED_HEAD_DIM * 2


def drop_page_cache(path) -> str:
    """Flush ``path`` to disk and ask the OS to drop its pages from the page cache (Linux:
    ``fsync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)``). Returns the method used, or "" where
    the OS has no such call (macOS: dropping needs ``purge``, as root)."""
    if not hasattr(os, "posix_fadvise"):
        return ""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return "fsync + posix_fadvise(POSIX_FADV_DONTNEED)"


def resident_fraction(path) -> Optional[float]:
    """Fraction of ``path``'s pages in the OS page cache now (``mincore`` on a read-only
    mapping; mapping a file reads nothing), or None where that cannot be asked."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                                  ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return float(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1)) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def spread(samples: Sequence[float], name: str) -> Dict[str, float]:
    """``{name}_s`` (median), ``{name}_p99_s``, ``{name}_min_s``, ``{name}_max_s`` and
    ``{name}_spread_s`` (max - min) of repeated timings, plus the raw ``{name}_all_s``."""
    v = np.asarray(samples, dtype=float)
    if not v.size:
        return {f"{name}_s": float("nan")}
    return {f"{name}_s": float(np.median(v)), f"{name}_p99_s": float(np.percentile(v, 99)),
            f"{name}_min_s": float(v.min()), f"{name}_max_s": float(v.max()),
            f"{name}_spread_s": float(v.max() - v.min()), f"{name}_all_s": [float(x) for x in v]}


def seed_shaped_caches(tokens: int, seed: int = 0) -> list:
    """Per-layer ``KVCache`` objects holding ``tokens`` positions of random bf16 KV in the seed
    model's layout (:data:`SEED_LAYERS` layers, :data:`SEED_KV_HEADS` KV heads, head_dim
    :data:`SEED_HEAD_DIM`): :data:`SEED_BYTES_PER_TOKEN` bytes per token. The values are random,
    so the file's bytes are as incompressible as real KV."""
    keys = mx.random.split(mx.random.key(seed), 2 * SEED_LAYERS)
    caches = []
    for i in range(SEED_LAYERS):
        c = KVCache()
        k1, k2 = keys[2 * i], keys[2 * i + 1]
        shape = (1, SEED_KV_HEADS, tokens, SEED_HEAD_DIM)
        c.keys = mx.random.normal(shape, key=k1).astype(mx.bfloat16)
        c.values = mx.random.normal(shape, key=k2).astype(mx.bfloat16)
        c.offset = tokens
        mx.eval(c.keys, c.values)
        caches.append(c)
    return caches


def _phases(stats, lo: int, hi: int) -> dict:
    out = {}
    for name, xs in (("read", stats.disk_read_s), ("verify", stats.disk_verify_s), ("copy", stats.disk_copy_s),
                     ("restore", stats.restore_s_disk)):
        out.update(spread(xs[lo:hi], name))
    return out


def seed_disk_read(tokens: int = SEED_PREFIX_TOKENS, repeats: int = 5, disk_dir=None, seed: int = 0) -> dict:
    """Write a ``tokens``-token prefix of seed-shaped KV (:func:`seed_shaped_caches`) to the prefix
    cache's disk tier, then restore it ``repeats`` times with its pages dropped from the page cache
    before each read ("cold") and ``repeats`` times straight after a read ("page cache"). Returns
    ``kv_bytes`` and ``file_bytes``, the page-cache method and the resident fraction before the
    cold reads (``cold_resident_max``; None where it cannot be asked) and the warm ones
    (``cached_resident_min``), and per mode the phase timings (``cold``/``cached``: ``read_s``,
    ``verify_s``, ``copy_s``, ``restore_s`` with p99, spread and raw values) and ``read_gb_s``.
    ``disk_dir`` (default: the system's temporary folder) must hold the file."""
    module = SimpleNamespace(layers=[None] * SEED_LAYERS)  # restore only needs the layer count
    prompt = [int(t) for t in np.random.default_rng(seed).integers(1, 1 << 20, size=tokens + 1)]
    with tempfile.TemporaryDirectory(dir=disk_dir) as tmp:
        pc = PrefixCache(max_tokens=0, disk_dir=tmp)  # the insert goes straight to disk
        caches = seed_shaped_caches(tokens, seed)
        kv_bytes = sum(c.keys.nbytes + c.values.nbytes for c in caches)
        pc.insert(prompt[:tokens], caches)
        del caches
        (entry,) = pc.entries("disk")
        file_bytes = entry.path.stat().st_size
        out = {"tokens": tokens, "bytes_per_token": SEED_BYTES_PER_TOKEN, "kv_bytes": int(kv_bytes),
               "file_bytes": int(file_bytes), "repeats": repeats}
        method, resident = "", []
        for _ in range(repeats):
            method = drop_page_cache(entry.path)
            resident.append(resident_fraction(entry.path))
            n, restored = pc.lookup(prompt, module)
            assert n == tokens and restored is not None, "the disk entry must restore the whole prefix"
            del restored
        cached = []
        for _ in range(repeats):  # the previous read left the file in the page cache
            cached.append(resident_fraction(entry.path))
            pc.lookup(prompt, module)
        out["page_cache_method"] = method or "none (the OS offers no way here)"
        out["cold_resident_max"] = None if None in resident else max(resident)
        out["cached_resident_min"] = None if None in cached else min(cached)
        out["cold"] = _phases(pc.stats, 0, repeats)
        out["cached"] = _phases(pc.stats, repeats, 2 * repeats)
        for mode in ("cold", "cached"):
            out[mode]["read_gb_s"] = file_bytes / out[mode]["read_s"] / 1e9
    return out
