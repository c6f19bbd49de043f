"""Warm-up: throwaway requests before real traffic, so kernels compile before the clock starts.

Compiled kernels are process-wide in mlx, so warming through a throwaway engine warms every
later engine on the same model. The engine calls :func:`warmup` with a factory for such
throwaway engines (this module does not import the engine, which imports it).
"""

from __future__ import annotations

import random
import time
from typing import Callable, Dict, List, Optional, Sequence

from mlxlab.core.executor import Executor

WARMUP_MODES = ("off", "token", "shapes")


def random_prompt(n: int, vocab_size: int, seed: int) -> List[int]:
    """``n`` token ids in ``[1, vocab_size)`` from a seeded generator (throughput ignores values)."""
    rng = random.Random(seed)
    return [rng.randrange(1, vocab_size) for _ in range(n)]


def warmup(new_engine: Callable[[int], Executor], vocab_size: int, mode: str = "token", *,
           chunk_sizes: Sequence[int] = (2048,), batch_sizes: Sequence[int] = (1,),
           prompt_tokens: Optional[int] = None) -> Dict[str, float]:
    """Run throwaway requests on engines made by ``new_engine(chunk_size)``. ``mode``: "off";
    "token" (one short request, like the case study's 1-token "Hi"); "shapes" (also a prompt at
    each chunk size, and decode at each batch size). Returns seconds spent per part."""
    if mode not in WARMUP_MODES:
        raise ValueError(f"warm-up mode must be 'off', 'token' or 'shapes', got {mode!r}")
    spent: Dict[str, float] = {}
    if mode == "off":
        return spent
    t0 = time.perf_counter()
    eng = new_engine(max(chunk_sizes))
    eng.submit(random_prompt(4, vocab_size, 1), 2)
    eng.run()
    spent["token"] = time.perf_counter() - t0
    if mode == "shapes":
        for c in chunk_sizes:
            t0 = time.perf_counter()
            eng = new_engine(c)
            eng.submit(random_prompt(min(prompt_tokens or c, c) + 1, vocab_size, 2), 1)
            eng.run()
            spent[f"chunk_{c}"] = time.perf_counter() - t0
        for b in batch_sizes:
            t0 = time.perf_counter()
            eng = new_engine(max(chunk_sizes))
            for i in range(b):
                eng.submit(random_prompt(8, vocab_size, 3 + i), 3)
            eng.run()
            spent[f"batch_{b}"] = time.perf_counter() - t0
    return spent
