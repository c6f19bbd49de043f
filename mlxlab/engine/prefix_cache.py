"""Prefix cache: restore the KV of a prompt's longest cached prefix instead of prefilling it.

One cache per model. On submit an engine calls ``n, caches = pc.lookup(prompt, module, kv=...)``
(n is at most len(prompt) - 1: the last prompt token is the first decode input) and prefills only
``prompt[n:-1]``; afterwards ``pc.insert(tokens, caches)`` stores the KV of ``tokens``. An entry
for T serves a prompt up to their longest common prefix (extending T, a strict prefix of T, or
diverging from T); ties go to memory over disk, then to the most recent entry. Entries are copied
on insert and on restore, so in-place cache writes never corrupt them; an entry that is a prefix
of a new one is dropped. Memory is LRU-bounded by ``max_tokens`` / ``max_bytes``; with
``disk_dir`` evicted entries become safetensors files carrying a token hash and a checksum (crc32
or sha256) of all array bytes: a file that fails to load or verify is deleted, counted in
``stats.disk_corrupt`` and treated as a miss. Not thread-safe.

Kinds of entry: plain ``KVCache`` layers (kind None) or mlx-lm ``QuantizedKVCache`` layers (kind
``(bits, group_size)``, each key and value a (data, scales, biases) triple). A lookup names the
request's KV quantization (``kv=(bits, group_size, quantized_kv_start)`` as the engine keeps it,
or None) and only matches entries of that kind: full-precision KV restored into a quantized
request (or the other way round) is not the state that request would have built. A quantized
entry serves at least ``quantized_kv_start`` tokens only, since below that a quantized request
still holds plain KV (mlx-lm quantizes a cache once its offset reaches that start). Other cache types (rotating windows, SSM state) are refused.

Restoring from disk is timed in three phases, per disk hit, in ``stats``: ``disk_read_s`` (the
file's bytes into host memory: one buffered-off read of the whole file), ``disk_verify_s``
(the header, the token hash and the checksum over those bytes) and ``disk_copy_s`` (the bytes
into mlx arrays, then into the request's new caches). ``restore_s_disk`` is their sum. Whether
the OS page cache served a read is the caller's to control (see :mod:`mlxlab.studies.prefix_cache.disk`).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

FORMAT = "mlxlab-prefix-v1"
_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I32": np.int32,
       "I64": np.int64, "U8": np.uint8}  # safetensors dtype -> numpy dtype of its bytes (bf16 as raw)


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
    restore_s_disk: List[float] = field(default_factory=list)  # read + verify + copy
    disk_read_s: List[float] = field(default_factory=list)
    disk_verify_s: List[float] = field(default_factory=list)
    disk_copy_s: List[float] = field(default_factory=list)
    disk_read_bytes: List[int] = field(default_factory=list)
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
    layers: Optional[list]  # per layer (keys, values), each an array or a quantized triple; None on disk
    nbytes: int
    tier: str = "memory"  # "memory" or "disk"
    path: Optional[Path] = None
    kind: Optional[Tuple[int, int]] = None  # None: plain KV; (bits, group_size): quantized
    phases: Dict[str, float] = field(default_factory=dict)  # read_s, verify_s, copy_s of a loaded file

    def __post_init__(self):
        self.np_tokens = np.asarray(self.tokens, dtype=np.int64)

    @property
    def key(self) -> tuple:
        return (self.kind, self.tokens)


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _each(f, x):
    """``f`` over an array, or over each array of a quantized (data, scales, biases) triple."""
    return tuple(f(a) for a in x) if isinstance(x, (tuple, list)) else f(x)


def _flat(layers) -> List[mx.array]:
    """Every array of ``layers`` in file order: per layer keys then values."""
    return [a for kv in layers for x in kv for a in (x if isinstance(x, (tuple, list)) else (x,))]


def _names(n_layers: int, kind) -> List[str]:
    parts = [""] if kind is None else [".0", ".1", ".2"]
    return ["tokens"] + [f"{kv}.{i}{p}" for i in range(n_layers) for kv in "kv" for p in parts]


def _kind_text(kind) -> str:
    return "plain" if kind is None else f"q{kind[0]}g{kind[1]}"


def _kind_of_text(text: str):
    if text == "plain":
        return None
    bits, group = text[1:].split("g")
    return int(bits), int(group)


def kind_of(caches) -> Optional[Tuple[int, int]]:
    """The entry kind of a request's per-layer caches; raises ValueError on other cache types."""
    types = {type(c) for c in caches}
    if types == {KVCache}:
        return None
    settings = {(c.bits, c.group_size) for c in caches if type(c) is QuantizedKVCache}
    if types == {QuantizedKVCache} and len(settings) == 1:
        return settings.pop()
    raise ValueError("prefix caching supports KVCache or QuantizedKVCache layers only (one setting for all "
                     f"layers); got {sorted(t.__name__ for t in types)}")


def _buffer(a: mx.array):
    return memoryview(mx.contiguous(a))


def _checksum(buffers, alg: str) -> str:
    h, crc = hashlib.sha256(), 0
    for b in buffers:
        if alg == "sha256":
            h.update(b)
        else:
            crc = zlib.crc32(b, crc)
    return h.hexdigest() if alg == "sha256" else f"{crc:08x}"


def _tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()


class PrefixCache:
    """Longest-prefix KV cache with LRU eviction by tokens and bytes and an optional disk tier."""

    def __init__(self, max_tokens: Optional[int] = None, max_bytes: Optional[int] = None,
                 disk_dir=None, disk_max_bytes: Optional[int] = None, checksum: str = "crc32"):
        if checksum not in ("crc32", "sha256"):
            raise ValueError(f"checksum must be 'crc32' or 'sha256', got {checksum!r}")
        for name, v in (("max_tokens", max_tokens), ("max_bytes", max_bytes), ("disk_max_bytes", disk_max_bytes)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{name} must be a non-negative whole number (or None: no limit), got {v!r}")
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self.disk_max_bytes, self.checksum = disk_max_bytes, checksum
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.stats = PrefixCacheStats()
        self._mem: "OrderedDict[tuple, PrefixEntry]" = OrderedDict()  # by (kind, tokens), LRU first
        self._disk: "OrderedDict[tuple, PrefixEntry]" = OrderedDict()
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self._scan_disk()

    def entries(self, tier: str = "memory") -> List[PrefixEntry]:
        """The entries of a tier, least recently used first."""
        return list((self._mem if tier == "memory" else self._disk).values())

    def match(self, tokens: Sequence[int], kv: Optional[tuple] = None) -> Tuple[int, Optional[PrefixEntry]]:
        """(matched length, entry) of the longest cached prefix of ``tokens`` among the entries of
        ``kv``'s kind, or (0, None). A disk entry is read and verified here; a corrupt file is
        dropped and the next best tried."""
        kind = None if kv is None else (int(kv[0]), int(kv[1]))
        start = 0 if kv is None or len(kv) < 3 else int(kv[2])
        p = np.asarray(tokens, dtype=np.int64)
        limit = len(p) - 1
        self.stats.queries += 1
        self.stats.query_tokens += max(limit, 0)
        while limit > 0:  # rank: matched tokens, then memory over disk, then recency
            best, tier, _, e = max(((min(_lcp(e.np_tokens, p), limit), tier, i, e)
                                    for tier, table in ((1, self._mem), (0, self._disk))
                                    for i, e in enumerate(table.values()) if e.kind == kind),
                                   key=lambda c: c[:3], default=(0, 0, 0, None))
            if best == 0 or best < start:
                break
            if tier == 1:
                self._mem.move_to_end(e.key)
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
        """Fresh per-layer caches (``KVCache``, or ``QuantizedKVCache`` for a quantized entry)
        holding copies of the entry's first ``length`` positions (buffers padded to the cache's
        step like a prefilled cache), evaluated. A whole entry just read from disk is used as
        read, without a second copy (its arrays are the caches' own)."""
        t0 = time.perf_counter()
        if not 0 < length <= len(entry.tokens):
            raise ValueError(f"length must be in 1..{len(entry.tokens)}, got {length}")
        caches = make_prompt_cache(getattr(module, "module", module))
        if len(caches) != len(entry.layers) or not all(type(c) is KVCache for c in caches):
            raise ValueError("entry does not fit this model (layer count or cache type differs)")
        if entry.kind is not None:
            caches = [QuantizedKVCache(group_size=entry.kind[1], bits=entry.kind[0]) for _ in caches]
        pad = caches[0].step - length % caches[0].step  # >= 1, so the copy is always real
        grow = lambda x: mx.concatenate(  # noqa: E731
            [x[..., :length, :], mx.zeros(x.shape[:2] + (pad, x.shape[3]), x.dtype)], axis=2)
        if entry.tier == "disk" and length == len(entry.tokens):
            grow = lambda x: x  # noqa: E731  (arrays just read from the file belong to nobody else)
        for c, (k, v) in zip(caches, entry.layers):
            c.keys, c.values, c.offset = _each(grow, k), _each(grow, v), length
        mx.eval([(c.keys, c.values) for c in caches])
        dt, s = time.perf_counter() - t0, self.stats
        if entry.tier == "memory":
            s.restore_s_memory.append(dt)
        else:
            ph = entry.phases
            s.disk_read_s.append(ph["read_s"])
            s.disk_verify_s.append(ph["verify_s"])
            s.disk_copy_s.append(ph["copy_s"] + dt)
            s.disk_read_bytes.append(int(ph["bytes"]))
            s.restore_s_disk.append(ph["read_s"] + ph["verify_s"] + ph["copy_s"] + dt)
        return caches

    def lookup(self, tokens: Sequence[int], module, kv: Optional[tuple] = None) -> Tuple[int, Optional[list]]:
        """match + restore: (matched length, caches or None)."""
        n, e = self.match(tokens, kv)
        return (n, self.restore(e, n, module)) if e is not None else (0, None)

    def insert(self, tokens: Sequence[int], caches: Sequence) -> Optional[PrefixEntry]:
        """Store the KV of ``tokens`` (the first min(len(tokens), cache offset) positions)."""
        kind = kind_of(caches)
        if any(c.keys is not None and _each(lambda a: a.shape[0], c.keys) not in (1, (1, 1, 1)) for c in caches):
            raise ValueError("prefix caching stores one sequence: caches must have batch size 1")
        n = min([len(tokens)] + [c.offset for c in caches])
        if n <= 0:
            return None
        toks = tuple(int(t) for t in tokens[:n])
        self.stats.inserts += 1
        for e in self._mem.values():
            if e.kind == kind and len(e.tokens) >= n and e.tokens[:n] == toks:  # already covered
                self._mem.move_to_end(e.key)
                return e
        for tier, table in (("memory", self._mem), ("disk", self._disk)):
            for e in [e for e in table.values()
                      if e.kind == kind and len(e.tokens) <= n and toks[:len(e.tokens)] == e.tokens]:
                self._drop(tier, e.key)  # subsumed by the new entry
        cut = lambda a: mx.contiguous(a[..., :n, :])  # noqa: E731
        layers = [(_each(cut, c.keys), _each(cut, c.values)) for c in caches]
        mx.eval(_flat(layers))
        e = PrefixEntry(toks, layers, sum(a.nbytes for a in _flat(layers)), kind=kind)
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
            if self.disk_dir is not None and e.key not in self._disk:
                self._write(e)

    def _add(self, e: PrefixEntry, sign: int = 1):
        if sign > 0:
            (self._mem if e.tier == "memory" else self._disk)[e.key] = e
        s, t = self.stats, e.tier
        setattr(s, f"{t}_tokens", getattr(s, f"{t}_tokens") + sign * len(e.tokens))
        setattr(s, f"{t}_bytes", getattr(s, f"{t}_bytes") + sign * e.nbytes)

    def _drop(self, tier: str, key) -> PrefixEntry:
        e = (self._mem if tier == "memory" else self._disk).pop(key)
        self._add(e, -1)
        if tier == "disk":
            e.path.unlink(missing_ok=True)
        return e

    # ------------------------------------------------------------------ the disk tier
    def _write(self, e: PrefixEntry):
        names = _names(len(e.layers), e.kind)
        arrays = dict(zip(names, [mx.array(np.asarray(e.tokens, dtype=np.int32))] + _flat(e.layers)))
        meta = {"format": FORMAT, "n_tokens": str(len(e.tokens)), "n_layers": str(len(e.layers)),
                "kv_kind": _kind_text(e.kind), "tokens_sha256": _tokens_hash(e.tokens), "checksum_alg": self.checksum,
                "checksum": _checksum([_buffer(arrays[x]) for x in names], self.checksum)}
        name = hashlib.sha256(_kind_text(e.kind).encode() + np.asarray(e.tokens, np.int32).tobytes()).hexdigest()[:32]
        path, tmp = self.disk_dir / f"{name}.safetensors", self.disk_dir / f"{name}.tmp.safetensors"
        mx.save_safetensors(str(tmp), arrays, meta)
        os.replace(tmp, path)  # never leave a half-written file under the final name
        self._add(PrefixEntry(e.tokens, None, path.stat().st_size, "disk", path, kind=e.kind))
        self.stats.disk_writes += 1
        while self.disk_max_bytes is not None and self.stats.disk_bytes > self.disk_max_bytes:
            self._drop("disk", next(iter(self._disk)))
            self.stats.disk_evictions += 1

    def _load(self, e: PrefixEntry) -> Optional[PrefixEntry]:
        try:
            toks, kind, layers, phases = read_file(e.path, e.tokens)
            if kind != e.kind:
                raise ValueError(f"{e.path}: holds {_kind_text(kind)} KV, indexed as {_kind_text(e.kind)}")
        except Exception:
            self._drop("disk", e.key)
            self.stats.disk_corrupt += 1
            return None
        self._disk.move_to_end(e.key)
        return PrefixEntry(e.tokens, layers, sum(a.nbytes for a in _flat(layers)), "disk", e.path,
                           kind=kind, phases=phases)

    def _scan_disk(self):
        for path in sorted(self.disk_dir.glob("*.safetensors"), key=lambda p: p.stat().st_mtime):
            try:  # header and tokens only; the data is verified when the entry is used
                if path.name.endswith(".tmp.safetensors"):
                    raise ValueError("unfinished write")
                toks, kind = read_tokens(path)
                self._add(PrefixEntry(toks, None, path.stat().st_size, "disk", path, kind=kind))
            except Exception:
                path.unlink(missing_ok=True)
                self.stats.disk_corrupt += 1


# ---------------------------------------------------------------------- the file format
def _header(raw: bytes, size: int) -> Tuple[dict, dict, int]:
    """(tensor table, metadata, data offset) of a safetensors file's first bytes; raises on a
    header that is not one of ours or that does not fit the file's ``size``."""
    (n,) = struct.unpack("<Q", raw[:8])
    if not 0 < n <= size - 8 or len(raw) < 8 + n:
        raise ValueError("bad safetensors header length")
    table = json.loads(bytes(raw[8:8 + n]))
    meta = table.pop("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise ValueError("not a prefix-cache file")
    ntok, nlay, kind = int(meta["n_tokens"]), int(meta["n_layers"]), _kind_of_text(meta.get("kv_kind", "plain"))
    names = _names(nlay, kind)
    if set(table) != set(names) or max(t["data_offsets"][1] for t in table.values()) != size - 8 - n:
        raise ValueError("the file's tensors are not the expected ones (or it was truncated)")
    if table["tokens"]["shape"] != [ntok] or any(table[x]["shape"][2] != ntok for x in names[1:]):
        raise ValueError("tensor shapes do not match the token count")
    return table, meta, 8 + n


def _slice(buf, base: int, t: dict):
    s, e = t["data_offsets"]
    return buf[base + s: base + e]


def _tokens(buf, base: int, t: dict) -> Tuple[int, ...]:
    return tuple(np.frombuffer(_slice(buf, base, t), dtype=np.int32).tolist())


def read_tokens(path) -> Tuple[Tuple[int, ...], Optional[Tuple[int, int]]]:
    """(tokens, kind) of a prefix-cache file from its header and token list only (no data read)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        head += f.read(struct.unpack("<Q", head)[0] if len(head) == 8 else 0)
        table, meta, base = _header(head, size)
        t = table["tokens"]
        f.seek(base + t["data_offsets"][0])
        raw = f.read(t["data_offsets"][1] - t["data_offsets"][0])
    toks = tuple(np.frombuffer(raw, dtype=np.int32).tolist())
    if _tokens_hash(toks) != meta["tokens_sha256"]:
        raise ValueError(f"{path}: token hash mismatch")
    return toks, _kind_of_text(meta.get("kv_kind", "plain"))


def read_file(path, tokens: Optional[tuple] = None):
    """(tokens, kind, layers, phases) of a prefix-cache file, in three timed phases (seconds in
    ``phases``): ``read_s`` the whole file into a host buffer (one unbuffered read), ``verify_s``
    header, token hash and checksum over that buffer, ``copy_s`` the buffer into mlx arrays.
    Raises ValueError on any mismatch (or if the tokens are not ``tokens``)."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = np.empty(size, dtype=np.uint8)
        view, got = memoryview(buf), 0
        while got < size:
            r = f.readinto(view[got:])
            if not r:
                break
            got += r
    t1 = time.perf_counter()
    table, meta, base = _header(view, got)
    names = _names(int(meta["n_layers"]), _kind_of_text(meta.get("kv_kind", "plain")))
    toks = _tokens(view, base, table["tokens"])
    if _tokens_hash(toks) != meta["tokens_sha256"] or tokens not in (None, toks):
        raise ValueError(f"{path}: not the expected prefix (token hash)")
    if _checksum([_slice(view, base, table[x]) for x in names], meta["checksum_alg"]) != meta["checksum"]:
        raise ValueError(f"{path}: checksum mismatch")
    t2 = time.perf_counter()
    arrays = []
    for x in names[1:]:
        t = table[x]
        a = mx.array(np.frombuffer(_slice(view, base, t), dtype=_NP[t["dtype"]]).reshape(t["shape"]))
        arrays.append(a.view(mx.bfloat16) if t["dtype"] == "BF16" else a)
    mx.eval(arrays)
    t3 = time.perf_counter()
    kind, it = _kind_of_text(meta.get("kv_kind", "plain")), iter(arrays)
    take = (lambda: next(it)) if kind is None else (lambda: (next(it), next(it), next(it)))
    layers = [(take(), take()) for _ in range(int(meta["n_layers"]))]
    return toks, kind, layers, {"read_s": t1 - t0, "verify_s": t2 - t1, "copy_s": t3 - t2, "bytes": got}
