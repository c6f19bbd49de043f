"""Per-request sampling: a request's temperature, top-p, top-k, min-p and seed, on mlx-lm's
logits filters, beside the engine's batch sampler.

The engine samples a decode batch with one sampler (greedy by default). A request that asks for
something else carries its own :class:`RequestSampler`; the engine samples that request's row
with it and keeps the batch sampler's tokens for the other rows (:func:`sample_rows`). The filters
are mlx-lm's (``apply_top_p``, ``apply_top_k``, ``apply_min_p`` of ``mlx_lm.sample_utils``); the
draw is ``mx.random.categorical`` with the request's own key, split at every token, so a seeded
request gives the same tokens however it is batched (mlx-lm's ``make_sampler`` draws from the
global key, which every request of a process shares).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p


class RequestSampler:
    """One request's sampler: ``temperature`` > 0 (0 is greedy: use no sampler), ``top_p`` in
    (0, 1] (1: off), ``top_k`` >= 0 (0: off), ``min_p`` in [0, 1) (0: off), ``seed`` (None: a
    key from the global generator). Call it on logits of shape (1, vocab)."""

    def __init__(self, temperature: float, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                 seed: Optional[int] = None):
        for name, v, ok, what in (("temperature", temperature, lambda x: x > 0, "> 0"),
                                  ("top_p", top_p, lambda x: 0 < x <= 1, "in (0, 1]"),
                                  ("min_p", min_p, lambda x: 0 <= x < 1, "in [0, 1)")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise ValueError(f"{name} must be a number {what}, got {v!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer, got {top_k!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.temperature, self.top_p, self.top_k, self.min_p = float(temperature), float(top_p), top_k, float(min_p)
        self._key = mx.random.key(seed) if seed is not None else mx.random.key(int(mx.random.randint(0, 2**31 - 1)))

    def __call__(self, logits: mx.array) -> mx.array:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if self.top_k:
            logprobs = apply_top_k(logprobs, self.top_k)
        if self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p:
            logprobs = apply_min_p(logprobs, self.min_p)
        self._key, key = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1 / self.temperature), key=key)


def make_request_sampler(temperature: Optional[float] = None, top_p: Optional[float] = None, top_k: Optional[int] = None,
                         min_p: Optional[float] = None, seed: Optional[int] = None) -> Optional[RequestSampler]:
    """The sampler for a request's options, or None for greedy decoding (no temperature, or 0:
    the engine's own sampler). Raises ValueError on an option out of range."""
    if temperature is None or temperature == 0:
        if isinstance(temperature, bool) or (temperature is not None and not isinstance(temperature, (int, float))):
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
        return None
    return RequestSampler(temperature, 1.0 if top_p is None else top_p, top_k or 0, min_p or 0.0, seed)


def sample_rows(batch_sampler: Callable[[mx.array], mx.array], logits: mx.array, samplers: Sequence) -> mx.array:
    """Tokens for a batch's logits (rows, vocab): ``batch_sampler``'s, except for the rows whose
    entry of ``samplers`` is a request sampler, which it samples alone."""
    tokens = batch_sampler(logits)
    own = [(i, s) for i, s in enumerate(samplers) if s is not None]
    if not own:
        return tokens
    picks = mx.concatenate([s(logits[i:i + 1]) for i, s in own]).astype(tokens.dtype)
    tokens[mx.array([i for i, _ in own])] = picks
    return tokens
