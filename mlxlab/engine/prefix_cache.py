"""Prefix cache: restore the KV of a prompt's longest cached prefix instead of prefilling it.

One cache per model. On submit an engine calls ``n, caches = pc.lookup(prompt, module)`` (n is at
most len(prompt) - 1: the last prompt token is the first decode input) and prefills only
``prompt[n:-1]``; afterwards ``pc.insert(tokens, caches)`` stores the KV of ``tokens``. An entry
for T serves a prompt up to their longest common prefix (extending T, a strict prefix of T, or
diverging from T); ties go to memory over disk, then to the most recent entry. Entries are copied
on insert and on restore, so in-place cache writes never corrupt them; an entry that is a prefix
of a new one is dropped. Memory is LRU-bounded by ``max_tokens`` / ``max_bytes``; with
``disk_dir`` evicted entries become safetensors files carrying a token hash and a checksum (crc32
or sha256) of all array bytes: a file that fails to load or verify is deleted, counted in
``stats.disk_corrupt`` and treated as a miss. Only plain ``KVCache`` layers; not thread-safe.
"""

from __future__ import annotations

import hashlib
import os
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

FORMAT = "mlxlab-prefix-v1"


@dataclass
class PrefixCacheStats:
    queries: int = 0
    query_tokens: int = 0  # tokens that could have been matched (len(prompt) - 1 per query)
    hits: int = 0
    hit_tokens: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0  # memory -> out (to disk if configured)
    disk_writes: int = 0
    disk_hits: int = 0
    disk_corrupt: int = 0
    disk_evictions: int = 0
    restore_s_memory: List[float] = field(default_factory=list)
    restore_s_disk: List[float] = field(default_factory=list)  # file read + verify + copy
    memory_tokens: int = 0
    memory_bytes: int = 0
    disk_tokens: int = 0
    disk_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class PrefixEntry:
    tokens: Tuple[int, ...]
    layers: Optional[List[Tuple[mx.array, mx.array]]]  # None for a disk entry not yet loaded
    nbytes: int
    tier: str = "memory"  # "memory" or "disk"
    path: Optional[Path] = None
    load_s: float = 0.0  # time spent reading and verifying the file (disk entries)

    def __post_init__(self):
        self.np_tokens = np.asarray(self.tokens, dtype=np.int64)


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _checksum(arrays: Sequence[mx.array], alg: str) -> str:
    h, crc = hashlib.sha256(), 0
    for a in arrays:
        if alg == "sha256":
            h.update(memoryview(mx.contiguous(a)))
        else:
            crc = zlib.crc32(memoryview(mx.contiguous(a)), crc)
    return h.hexdigest() if alg == "sha256" else f"{crc:08x}"


def _tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()


class PrefixCache:
    """Longest-prefix KV cache with LRU eviction by tokens and bytes and an optional disk tier."""

    def __init__(self, max_tokens: Optional[int] = None, max_bytes: Optional[int] = None,
                 disk_dir=None, disk_max_bytes: Optional[int] = None, checksum: str = "crc32"):
        if checksum not in ("crc32", "sha256"):
            raise ValueError(f"checksum must be 'crc32' or 'sha256', got {checksum!r}")
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self.disk_max_bytes, self.checksum = disk_max_bytes, checksum
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.stats = PrefixCacheStats()
        self._mem: "OrderedDict[tuple, PrefixEntry]" = OrderedDict()  # LRU first
        self._disk: "OrderedDict[tuple, PrefixEntry]" = OrderedDict()
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self._scan_disk()

    def match(self, tokens: Sequence[int]) -> Tuple[int, Optional[PrefixEntry]]:
        """(matched length, entry) of the longest cached prefix of ``tokens`` or (0, None). A disk
        entry is read and verified here; a corrupt file is dropped and the next best tried."""
        p = np.asarray(tokens, dtype=np.int64)
        limit = len(p) - 1
        self.stats.queries += 1
        self.stats.query_tokens += max(limit, 0)
        while limit > 0:  # rank: matched tokens, then memory over disk, then recency
            best, tier, _, e = max(((min(_lcp(e.np_tokens, p), limit), tier, i, e)
                                    for tier, table in ((1, self._mem), (0, self._disk))
                                    for i, e in enumerate(table.values())),
                                   key=lambda c: c[:3], default=(0, 0, 0, None))
            if best == 0:
                break
            if tier == 1:
                self._mem.move_to_end(e.tokens)
            else:
                e = self._load(e)
                if e is None:
                    continue  # corrupt: dropped, try the next best
                self.stats.disk_hits += 1
            self.stats.hits += 1
            self.stats.hit_tokens += best
            return best, e
        self.stats.misses += 1
        return 0, None

    def restore(self, entry: PrefixEntry, length: int, module) -> list:
        """Fresh per-layer ``KVCache`` objects holding copies of the entry's first ``length``
        positions (buffers padded to ``KVCache.step`` like a prefilled cache), evaluated."""
        t0 = time.perf_counter()
        if not 0 < length <= len(entry.tokens):
            raise ValueError(f"length must be in 1..{len(entry.tokens)}, got {length}")
        caches = make_prompt_cache(getattr(module, "module", module))
        if len(caches) != len(entry.layers) or not all(type(c) is KVCache for c in caches):
            raise ValueError("entry does not fit this model (layer count or cache type differs)")
        pad = KVCache.step - length % KVCache.step  # >= 1, so the copy is always real
        grow = lambda x: mx.concatenate(  # noqa: E731
            [x[..., :length, :], mx.zeros(x.shape[:2] + (pad, x.shape[3]), x.dtype)], axis=2)
        for c, (k, v) in zip(caches, entry.layers):
            c.keys, c.values, c.offset = grow(k), grow(v), length
        mx.eval([(c.keys, c.values) for c in caches])
        times = self.stats.restore_s_memory if entry.tier == "memory" else self.stats.restore_s_disk
        times.append(time.perf_counter() - t0 + entry.load_s)  # load_s: file read + verify
        return caches

    def lookup(self, tokens: Sequence[int], module) -> Tuple[int, Optional[list]]:
        """match + restore: (matched length, caches or None)."""
        n, e = self.match(tokens)
        return (n, self.restore(e, n, module)) if e is not None else (0, None)

    def insert(self, tokens: Sequence[int], caches: Sequence) -> Optional[PrefixEntry]:
        """Store the KV of ``tokens`` (the first min(len(tokens), cache offset) positions)."""
        bad = [type(c).__name__ for c in caches if type(c) is not KVCache]
        if bad:
            raise ValueError(f"prefix caching supports KVCache layers only; got {sorted(set(bad))}")
        if any(c.keys is not None and c.keys.shape[0] != 1 for c in caches):
            raise ValueError("prefix caching stores one sequence: caches must have batch size 1")
        n = min([len(tokens)] + [c.offset for c in caches])
        if n <= 0:
            return None
        key = tuple(int(t) for t in tokens[:n])
        self.stats.inserts += 1
        for k in self._mem:
            if len(k) >= n and k[:n] == key:  # already covered by a memory entry
                self._mem.move_to_end(k)
                return self._mem[k]
        for tier, table in (("memory", self._mem), ("disk", self._disk)):
            for k in [k for k in table if len(k) <= n and key[:len(k)] == k]:
                self._drop(tier, k)  # subsumed by the new entry
        layers = [(mx.contiguous(c.keys[..., :n, :]), mx.contiguous(c.values[..., :n, :]))
                  for c in caches]
        mx.eval(layers)
        e = PrefixEntry(key, layers, sum(k.nbytes + v.nbytes for k, v in layers))
        self._add(e)
        self.evict()
        return e

    def evict(self) -> None:
        """Drop least recently used memory entries (to the disk tier, if there is one) until
        memory is within ``max_tokens`` / ``max_bytes``; insert calls it, and so may a caller
        that lowered a limit."""
        s = self.stats
        while self._mem and ((self.max_tokens is not None and s.memory_tokens > self.max_tokens)
                             or (self.max_bytes is not None and s.memory_bytes > self.max_bytes)):
            e = self._drop("memory", next(iter(self._mem)))
            s.evictions += 1
            if self.disk_dir is not None and e.tokens not in self._disk:
                self._write(e)

    def _add(self, e: PrefixEntry, sign: int = 1):
        if sign > 0:
            (self._mem if e.tier == "memory" else self._disk)[e.tokens] = e
        s, t = self.stats, e.tier
        setattr(s, f"{t}_tokens", getattr(s, f"{t}_tokens") + sign * len(e.tokens))
        setattr(s, f"{t}_bytes", getattr(s, f"{t}_bytes") + sign * e.nbytes)

    def _drop(self, tier: str, key) -> PrefixEntry:
        e = (self._mem if tier == "memory" else self._disk).pop(key)
        self._add(e, -1)
        if tier == "disk":
            e.path.unlink(missing_ok=True)
        return e

    def _write(self, e: PrefixEntry):
        arrays = {"tokens": mx.array(np.asarray(e.tokens, dtype=np.int32))}
        for i, (k, v) in enumerate(e.layers):
            arrays[f"k.{i}"], arrays[f"v.{i}"] = k, v
        meta = {"format": FORMAT, "n_tokens": str(len(e.tokens)), "n_layers": str(len(e.layers)),
                "tokens_sha256": _tokens_hash(e.tokens), "checksum_alg": self.checksum,
                "checksum": _checksum(list(arrays.values()), self.checksum)}
        name = _tokens_hash(e.tokens)[:32]
        path, tmp = self.disk_dir / f"{name}.safetensors", self.disk_dir / f"{name}.tmp.safetensors"
        mx.save_safetensors(str(tmp), arrays, meta)
        os.replace(tmp, path)  # never leave a half-written file under the final name
        self._add(PrefixEntry(e.tokens, None, path.stat().st_size, "disk", path))
        self.stats.disk_writes += 1
        while self.disk_max_bytes is not None and self.stats.disk_bytes > self.disk_max_bytes:
            self._drop("disk", next(iter(self._disk)))
            self.stats.disk_evictions += 1

    @staticmethod
    def _read(path: Path, tokens: Optional[tuple] = None, verify: bool = True):
        """(tokens, layers) of a file; raises on any mismatch. ``verify=False`` checks only the
        header and the token list (used to re-index a directory)."""
        arrays, meta = mx.load(str(path), return_metadata=True)
        n, L = int(meta["n_tokens"]), int(meta["n_layers"])
        names = ["tokens"] + [f"{kv}.{i}" for i in range(L) for kv in "kv"]
        toks = tuple(arrays["tokens"].tolist())
        layers = [(arrays.get(f"k.{i}"), arrays.get(f"v.{i}")) for i in range(L)]
        if (meta.get("format") != FORMAT or set(arrays) != set(names) or len(toks) != n
                or _tokens_hash(toks) != meta["tokens_sha256"] or tokens not in (None, toks)
                or any(k.shape[2] != n or v.shape[2] != n for k, v in layers)):
            raise ValueError(f"{path}: not the expected prefix-cache file")
        if verify:
            mx.eval(list(arrays.values()))
            if _checksum([arrays[x] for x in names], meta["checksum_alg"]) != meta["checksum"]:
                raise ValueError(f"{path}: checksum mismatch")
        return toks, layers

    def _load(self, e: PrefixEntry) -> Optional[PrefixEntry]:
        t0 = time.perf_counter()
        try:
            _, layers = self._read(e.path, e.tokens)
        except Exception:
            self._drop("disk", e.tokens)
            self.stats.disk_corrupt += 1
            return None
        self._disk.move_to_end(e.tokens)
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        return PrefixEntry(e.tokens, layers, nbytes, "disk", e.path, time.perf_counter() - t0)

    def _scan_disk(self):
        for path in sorted(self.disk_dir.glob("*.safetensors"), key=lambda p: p.stat().st_mtime):
            try:  # header and tokens only; the data is verified when the entry is used
                if path.name.endswith(".tmp.safetensors"):
                    raise ValueError("unfinished write")
                toks = self._read(path, verify=False)[0]
                self._add(PrefixEntry(toks, None, path.stat().st_size, "disk", path))
            except Exception:
                path.unlink(missing_ok=True)
                self.stats.disk_corrupt += 1
