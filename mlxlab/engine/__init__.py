"""The inference engine on mlx-lm models: the step loop and what it runs (batched decode over
mlx-lm's caches, chunked prefill, packed steps, overlap, warm-up, quantized KV, prefix cache),
model loading, and mlx-lm's own ``BatchGenerator`` behind the same executor interface."""

from mlxlab.engine.loop import Engine

__all__ = ["Engine"]
