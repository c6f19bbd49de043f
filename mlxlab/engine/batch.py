"""The engine's KV caches: the decode batch (rows joining and leaving), a prompt's own cache
(sized up front, padded chunks trimmed back, quantized on mlx-lm's rule) and the wrapper that
evaluates a chunk layer by layer.

Decode rows share mlx-lm caches. While every row holds the same number of positions (a lone
row; rows whose prompts were as long and joined together) they are one plain ``KVCache`` per
layer with a batch dimension, exactly what ``generate_step`` decodes on: no copy per step, no mask
array, no per-row offset arrays. A lone stream on its own cache ran about a fifth faster than on a
one-row ``BatchKVCache`` on the H200, and on mlx's CUDA backend any mask array sends decode
attention off the fused vector kernel. Rows of different lengths are one left-padded
``BatchKVCache`` per layer, merged, extended, filtered and extracted with mlx-lm's own methods;
when the rows left over are even again (no padding), they go back to a plain cache.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

from mlxlab.core.request import SequenceState


def all_plain(caches) -> bool:
    """Whether every layer's cache is a plain ``KVCache``."""
    return all(type(c) is KVCache for c in caches)


def can_pad(module) -> bool:
    """Whether a prefill chunk of ``module`` can run padded and be trimmed back: every layer's
    cache is a plain ``KVCache`` (trim only moves its offset back). Caches that keep a state
    (SSM layers) or a window (``RotatingKVCache``) are never padded."""
    try:
        return all_plain(make_prompt_cache(module))
    except Exception:  # a module mlx-lm cannot make a cache for: leave chunks as they are
        return False


def presize(caches, tokens: Optional[int]) -> None:
    """Make each plain ``KVCache`` of a new prompt allocate room for ``tokens`` at its first
    write (None: back to mlx-lm's 256-token growth step). mlx-lm's cache grows by 256 tokens at a
    time, so a chunk of 256 or more reallocates every layer's keys and values at a size never
    seen before and copies the whole context into them; sized once, a long prompt's cache is
    written in place (``probes/presize_probe.py`` measures the difference). Values are unchanged:
    the same writes land in a larger buffer."""
    for c in caches or ():
        if type(c) is KVCache:
            if tokens is None:
                c.__dict__.pop("step", None)
            elif c.keys is None:
                c.step = max(KVCache.step, -(-int(tokens) // KVCache.step) * KVCache.step)


def trim(caches, pad: int) -> None:
    """Take a padded chunk's ``pad`` tokens back off the caches (lazy: only the offset moves; the
    next write lands over them)."""
    if pad:
        for c in caches:
            c.trim(pad)


def maybe_quantize(seq: SequenceState) -> None:
    """Turn a quantized-KV sequence's plain caches into mlx-lm ``QuantizedKVCache`` once they hold
    ``quantized_kv_start`` tokens (mlx-lm's own ``maybe_quantize_kv_cache``, same rule)."""
    if seq.kv is not None:
        bits, group, start = seq.kv
        maybe_quantize_kv_cache(seq.cache, quantized_kv_start=start, kv_group_size=group, kv_bits=bits)


def _evaluating(update_and_fetch, last: Optional[list]):
    """Wrap a cache's ``update_and_fetch`` so each layer's keys and values are evaluated as they
    are written: at once (``last`` None: at most about one layer of work in flight), or queued
    while waiting for the previous layer's (``last`` holds those, shared by the layers: the device
    has the next layer queued while Python builds the one after; about two layers in flight)."""
    def wrapped(*args, **kwargs):
        out = update_and_fetch(*args, **kwargs)
        if last is None:
            mx.eval(out)
            return out
        mx.async_eval(out)
        if last:
            mx.eval(last.pop())  # already queued: this only waits for it
        last.append(out)
        return out
    return wrapped


@contextmanager
def evaluating_layers(caches, sync: str):
    """While the block runs, a chunk written to ``caches`` is evaluated layer by layer: ``sync``
    "layer" waits for each layer, "pipelined" keeps one queued ahead, "chunk" leaves the chunk's
    graph whole (see "mlx back-pressure" in :mod:`mlxlab.engine.overlap`)."""
    patched, last = [], ([] if sync == "pipelined" else None)
    for c in caches if sync != "chunk" else ():
        try:  # caches without update_and_fetch (e.g. ArraysCache) are evaluated with the chunk
            c.update_and_fetch = _evaluating(c.update_and_fetch, last)
            patched.append(c)
        except AttributeError:
            pass
    try:
        yield
    finally:
        for c in patched:
            del c.update_and_fetch


def _stack(layer: Sequence[KVCache]) -> KVCache:
    """One plain ``KVCache`` holding the rows of ``layer`` (plain caches at one offset) along the
    batch axis."""
    out = KVCache()
    if any(c.keys is None for c in layer):  # nothing written yet (every offset is then 0)
        return out
    n = layer[0].offset
    out.keys = mx.concatenate([c.keys[..., :n, :] for c in layer], axis=0)
    out.values = mx.concatenate([c.values[..., :n, :] for c in layer], axis=0)
    out.offset = n
    return out


def _padded(c: KVCache) -> BatchKVCache:
    """A plain cache of B rows at one offset as a ``BatchKVCache`` without padding (no copy)."""
    rows = 1 if c.keys is None else int(c.keys.shape[0])
    b = BatchKVCache([0] * rows)
    if c.keys is not None:
        n = c.offset
        b.keys, b.values = c.keys[..., :n, :], c.values[..., :n, :]
        b.offset, b._idx = mx.array([n] * rows), n
    return b


def _unpadded(b: BatchKVCache) -> KVCache:
    """A ``BatchKVCache`` whose rows carry no left padding as one plain cache (no copy)."""
    out = KVCache()
    if b.keys is not None:
        out.keys, out.values, out.offset = b.keys[..., :b._idx, :], b.values[..., :b._idx, :], b._idx
    return out


class DecodeBatch:
    """The decode rows' KV cache (per layer) and their next decode inputs (see the module
    docstring); rows are in the order of the engine's decode rows. ``even`` says whether the
    rows are one plain cache at one offset (no padding, no mask)."""

    def __init__(self):
        self.cache: Optional[list] = None
        self.inputs: Optional[mx.array] = None  # next decode input per row (may be in flight)

    @property
    def even(self) -> bool:
        return self.cache is not None and all_plain(self.cache)

    @property
    def length(self) -> int:
        """Positions each row's attention spans now: the longest row's (left padding included), 0
        without rows."""
        if self.cache is None:
            return 0
        c = self.cache[0]
        return int(c._idx) if isinstance(c, BatchKVCache) else int(getattr(c, "offset", 0) or 0)

    def join(self, caches: List[list], inputs: mx.array) -> None:
        """Append rows: ``caches`` (each a prompt's per-layer caches) and their first inputs."""
        parts = ([self.cache] if self.cache is not None else []) + list(caches)
        if all(all_plain(p) for p in parts) and len({p[0].offset for p in parts}) == 1:
            # every row at one length: one plain cache, as generate_step decodes
            self.cache = parts[0] if len(parts) == 1 else [_stack(layer) for layer in zip(*parts)]
            self.inputs = inputs if self.inputs is None else mx.concatenate([self.inputs.astype(mx.uint32), inputs])
            return
        merged = [layer[0].merge(list(layer)) for layer in zip(*caches)]
        if self.cache is None:
            self.cache, self.inputs = merged, inputs
            return
        if all_plain(self.cache):  # the even rows become the first rows of a padded batch
            self.cache = [_padded(c) for c in self.cache]
        for c, m in zip(self.cache, merged):
            c.extend(m)
        self.inputs = mx.concatenate([self.inputs.astype(mx.uint32), inputs])

    def drop(self, keep: List[int]) -> None:
        """Keep only the rows at the indices ``keep``; rows left without padding go back to a
        plain cache."""
        if not keep:
            self.cache, self.inputs = None, None
            return
        idx = mx.array(keep)
        if all_plain(self.cache):
            for c in self.cache:
                if c.keys is not None:
                    c.keys, c.values = c.keys[idx], c.values[idx]
        elif len(keep) == 1 and all(isinstance(c, BatchKVCache) for c in self.cache):
            self.cache = [c.extract(keep[0]) for c in self.cache]
        else:
            for c in self.cache:
                c.filter(keep)  # mlx-lm's: also shifts the rows left by their least padding
            if all(type(c) is BatchKVCache for c in self.cache) and not any(self.cache[0].left_padding.tolist()):
                self.cache = [_unpadded(c) for c in self.cache]
        self.inputs = self.inputs[idx]

    def row(self, i: int) -> list:
        """Row ``i``'s per-layer KV (every position it holds) as plain caches."""
        if not all_plain(self.cache):
            return [c.extract(i) for c in self.cache]
        if self.cache[0].keys is None or self.cache[0].keys.shape[0] == 1:
            return self.cache
        out = []
        for c in self.cache:
            r = KVCache()
            r.keys = mx.contiguous(c.keys[i:i + 1, :, :c.offset])
            r.values = mx.contiguous(c.values[i:i + 1, :, :c.offset])
            r.offset = c.offset
            out.append(r)
        return out


def decodes_apart(lengths: Sequence[int], batch_length: Optional[int], apart: Optional[int]) -> List[bool]:
    """For rows ready to decode, holding ``lengths`` positions each: whether each decodes in its own
    forward instead of joining the decode batch, which holds ``batch_length`` positions (None: no
    rows). A join left-pads every row to the longest, so a 16,000-token document's few decode tokens
    beside a 1,500-token chat copy the chat's KV into a padded batch and send its attention through a
    mask over every position until the document leaves. With ``apart`` (positions), a row more than
    ``apart`` longer or shorter than the batch (with no batch: than the shortest ready row, which
    starts it) decodes alone; None keeps every row in the batch, as mlx-lm's ``BatchGenerator``."""
    if apart is None or not lengths:
        return [False] * len(lengths)
    ref = min(lengths) if batch_length is None else batch_length
    return [abs(n - ref) > apart for n in lengths]


def checked_apart(apart):
    """``apart`` (Engine's ``decode_apart``) if it is None or a whole number of positions >= 0."""
    if apart is not None and (isinstance(apart, bool) or not isinstance(apart, int) or apart < 0):
        raise ValueError(f"decode_apart must be a whole number of positions >= 0 (or None), got {apart!r}")
    return apart
