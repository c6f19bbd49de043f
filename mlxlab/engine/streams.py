"""The engine thread's mlx stream and the default sampler."""

from __future__ import annotations

import threading

import mlx.core as mx

_STREAMS = threading.local()


def thread_stream():
    """The calling thread's engine stream on the default device, made on first use and then
    kept for the life of the thread (mlx streams belong to the thread that made them). Every
    engine on a thread shares it, as every ``generate_step`` call shares mlx-lm's
    ``generation_stream``: with a fresh stream per engine, single-request prefill on the H200 ran
    well below mlx-lm's speed."""
    streams = getattr(_STREAMS, "by_device", None)
    if streams is None:
        streams = _STREAMS.by_device = {}
    dev = mx.default_device()
    if str(dev) not in streams:
        streams[str(dev)] = mx.new_stream(dev)
    return streams[str(dev)]


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)
