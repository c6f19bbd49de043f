"""A compiled decode step (``Engine(compile_decode=True)``).

mlx-lm never compiles its decode step: its ``KVCache`` hands attention the keys sliced to the
tokens written so far and RoPE the position as a Python int, so every token is a graph of new
shapes and constants, and ``mx.compile`` would trace it again each time. Here the step sees the
cache's whole buffer instead (mlx-lm grows it 256 positions at a time), the position as an array,
and a mask that hides the buffer past it, so a step has the same shapes and constants for 256
tokens in a row and ``mx.compile`` traces it once per buffer size and batch size. Python then
builds no graph per token (the host-bound part of a small model's decode step), and mlx fuses the
step's elementwise work.

It runs only on an *even* decode batch (:class:`mlxlab.engine.batch.DecodeBatch`: one plain
``KVCache`` per layer, every row at one offset: a lone stream, or rows that joined at one length),
which is what ``generate_step`` decodes on; the caches stay plain ``KVCache`` objects between steps
(the step writes the new token's keys and values where mlx-lm would and moves the offset on), so
rows join, leave and are read out exactly as without it. Masked positions add exact zeros to the
softmax, so the greedy tokens equal the uncompiled step's (``tests/test_compiled_decode.py`` holds
it to ``generate_step``'s on the float32 oracle).
"""

from __future__ import annotations

import threading
from typing import List

import mlx.core as mx
from mlx_lm.models.cache import KVCache


class _BufferView:
    """One layer's cache as the compiled step sees it: the whole key/value buffer and the offset
    as an array (``state``: [keys, values, offset], the arrays ``mx.compile`` captures)."""

    def __init__(self, state: list):
        self.state = state

    @property
    def offset(self) -> mx.array:
        return self.state[2]

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        off = self.state[2]
        self.state[0] = mx.slice_update(self.state[0], keys, off[None], axes=(2,))
        self.state[1] = mx.slice_update(self.state[1], values, off[None], axes=(2,))
        self.state[2] = off + keys.shape[2]
        return self.state[0], self.state[1]

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        if window_size is not None:
            raise ValueError("a compiled decode step does not support sliding-window attention")
        # after this step's write, positions [0, offset + n) hold keys; the rest of the buffer is hidden
        return (mx.arange(self.state[0].shape[2]) < self.state[2] + n)[None, None, None, :]


class CompiledDecode:
    """The compiled decode forward of one module: ``step(inputs, caches)`` -> logits (B, vocab),
    on an even batch's plain ``KVCache`` list, advanced in place as ``module(inputs[:, None],
    cache=caches)`` would advance it."""

    def __init__(self, module):
        self.module = module
        self._states: List[list] = []  # per layer [keys, values, offset]: what the compiled step captures
        self._fn = None
        self.traces = 0  # how many times the step was traced (once per buffer and batch size)
        self._lock = threading.Lock()  # the captured states are this object's: one step at a time

    def _build(self, layers: int) -> None:
        self._states = [[None, None, None] for _ in range(layers)]
        views = [_BufferView(s) for s in self._states]

        def step(inputs: mx.array) -> mx.array:
            self.traces += 1  # runs only while tracing
            return self.module(inputs[:, None], cache=views)[:, -1, :]

        self._fn = mx.compile(step, inputs=self._states, outputs=self._states)

    @staticmethod
    def fits(batch) -> bool:
        """Whether the compiled step can run on ``batch`` (a DecodeBatch): even, every layer
        written (a one-token prompt's first step has no buffer yet, and runs uncompiled)."""
        return batch.even and all(c.keys is not None for c in batch.cache)

    @staticmethod
    def _room(c: KVCache, n: int = 1) -> None:
        """Grow a plain cache's buffer by mlx-lm's step when the next ``n`` positions do not fit,
        as ``KVCache.update_and_fetch`` would before writing them."""
        if c.offset + n > c.keys.shape[2]:
            step = getattr(c, "step", KVCache.step)
            grow = (step + n - 1) // step * step
            shape = (*c.keys.shape[:2], grow, c.keys.shape[3])
            vshape = (*c.values.shape[:2], grow, c.values.shape[3])
            c.keys = mx.concatenate([c.keys[..., :c.offset, :], mx.zeros(shape, c.keys.dtype)], axis=2)
            c.values = mx.concatenate([c.values[..., :c.offset, :], mx.zeros(vshape, c.values.dtype)], axis=2)

    def step(self, inputs: mx.array, caches: List[KVCache]) -> mx.array:
        with self._lock:
            if self._fn is None or len(self._states) != len(caches):
                self._build(len(caches))
            for c, s in zip(caches, self._states):
                self._room(c)
                s[0], s[1], s[2] = c.keys, c.values, mx.array(c.offset, dtype=mx.int32)
            logits = self._fn(inputs)
            for c, s in zip(caches, self._states):
                c.keys, c.values = s[0], s[1]
                c.offset += 1
                s[0] = s[1] = s[2] = None  # the cache holds the buffers now; drop the extra references
            return logits


_SHARED_LOCK = threading.Lock()


def compiled_decode(module) -> CompiledDecode:
    """The module's compiled decode step, shared by every engine on it (kept on the module), so an
    engine built after another (a warm-up's throwaway engines, a benchmark's fresh engine per
    repeat, a server's) finds the step already traced."""
    with _SHARED_LOCK:
        found = getattr(module, "_mlxlab_compiled_decode", None)
        if found is None:
            found = CompiledDecode(module)
            object.__setattr__(module, "_mlxlab_compiled_decode", found)
        return found
