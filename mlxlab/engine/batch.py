"""The engine's KV caches: the decode batch (rows joining and leaving), a prompt's own cache
(sized up front, padded chunks trimmed back, quantized on mlx-lm's rule) and the wrapper that
evaluates a chunk layer by layer.

Decode rows share mlx-lm caches: a lone row decodes on its own plain ``KVCache`` per layer,
exactly as ``generate_step`` does (no copy, no mask array, no per-layer offset arrays: worth
about a fifth of decode speed on a GPU); two or more rows are one left-padded ``BatchKVCache``
per layer, merged, extended, filtered and extracted with mlx-lm's own methods.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import List, Optional

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


class DecodeBatch:
    """The decode rows' KV cache (per layer) and their next decode inputs (see the module
    docstring); rows are in the order of the engine's decode rows."""

    def __init__(self):
        self.cache: Optional[list] = None
        self.inputs: Optional[mx.array] = None  # next decode input per row (may be in flight)

    def join(self, caches: List[list], inputs: mx.array) -> None:
        """Append rows: ``caches`` (each a prompt's per-layer caches) and their first inputs."""
        if self.cache is None and len(caches) == 1 and all_plain(caches[0]):
            self.cache, self.inputs = caches[0], inputs  # a lone stream keeps its own cache
            return
        merged = [layer[0].merge(list(layer)) for layer in zip(*caches)]
        if self.cache is None:
            self.cache, self.inputs = merged, inputs
            return
        if all_plain(self.cache):  # the lone stream becomes row 0 of a batch
            self.cache = [c.merge([c]) for c in self.cache]
        for c, m in zip(self.cache, merged):
            c.extend(m)
        self.inputs = mx.concatenate([self.inputs.astype(mx.uint32), inputs])

    def drop(self, keep: List[int]) -> None:
        """Keep only the rows at the indices ``keep``; one row left goes back to plain caches."""
        if not keep:
            self.cache, self.inputs = None, None
            return
        if len(keep) == 1 and all(isinstance(c, BatchKVCache) for c in self.cache):
            self.cache = [c.extract(keep[0]) for c in self.cache]
        else:
            for c in self.cache:
                c.filter(keep)
        self.inputs = self.inputs[mx.array(keep)]

    def row(self, i: int) -> list:
        """Row ``i``'s per-layer KV (every position it holds) as plain caches."""
        return self.cache if all_plain(self.cache) else [c.extract(i) for c in self.cache]
