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

WARMUP_MODES = ("off", "token", "shapes", "policy")
POLICY_WARMUP_CHAT = 33  # prompt tokens of the policy warm-up's chat


def random_prompt(n: int, vocab_size: int, seed: int) -> List[int]:
    """``n`` token ids in ``[1, vocab_size)`` from a seeded generator (throughput ignores values)."""
    rng = random.Random(seed)
    return [rng.randrange(1, vocab_size) for _ in range(n)]


def warmup(new_engine: Callable[[int], Executor], vocab_size: int, mode: str = "token", *,
           chunk_sizes: Sequence[int] = (2048,), batch_sizes: Sequence[int] = (1,),
           prompt_tokens: Optional[int] = None) -> Dict[str, float]:
    """Run throwaway requests on engines made by ``new_engine(chunk_size)``. ``mode``: "off";
    "token" (one short request, like the case study's 1-token "Hi"); "shapes" (also a prompt at
    each chunk size, and decode at each batch size); "policy" (also :func:`policy_warmup` with
    ``prompt_tokens``; ``new_engine`` must then make engines configured like the real one).
    Returns seconds spent per part."""
    if mode not in WARMUP_MODES:
        raise ValueError(f"warm-up mode must be one of {', '.join(WARMUP_MODES)}, got {mode!r}")
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
    if mode == "policy":
        t0 = time.perf_counter()
        policy_warmup(new_engine(max(chunk_sizes)), vocab_size, prompt_tokens or 2 * max(chunk_sizes) + 3)
        spent["policy"] = time.perf_counter() - t0
    return spent


def policy_warmup(eng: Executor, vocab_size: int, prompt_tokens: int) -> None:
    """The scene a serving policy is tuned for, on a throwaway engine configured like the real one:
    a chat decodes, and a document of ``prompt_tokens`` arrives beside it after the chat's second
    token; the chat keeps decoding through the document's whole prefill (it is cancelled two
    tokens after the document's first). Every chunk size the policy chooses, packed or not, beside
    a decode or alone, and every context those chunks reach up to ``prompt_tokens``, then runs once
    before the clock starts: mlx's CUDA backend prepares kernels (and cuDNN attention graphs) per
    shape on first use, which made a first contention run's chat ITL p99 2.6-6.3x its second's.

    The chat used to stop after 8 tokens, so a policy that packs a chunk with the decode rows
    (``stall_free``) ran most of the warm-up's chunks alone, at other shapes than beside a chat,
    and its first contention run on the H200 still had 2.4-3.1x the second's chat ITL p99
    (``data/results/h200/contention.json``, ``first_over_warm_itl_p99``)."""
    limit = getattr(eng, "max_context", None) or (POLICY_WARMUP_CHAT + prompt_tokens + 9)
    chat_tokens = max(2, min(prompt_tokens + 8, limit - POLICY_WARMUP_CHAT - 1))
    chat = eng.submit(random_prompt(POLICY_WARMUP_CHAT, vocab_size, 11), chat_tokens)
    while len(chat.output_tokens) < 2 and eng.has_work:
        eng.step()
    doc = eng.submit(random_prompt(prompt_tokens, vocab_size, 12), 2)
    while eng.has_work and not doc.done:
        eng.step()
    after = len(chat.output_tokens) + 2  # the decode steps right after the document's join, too
    while eng.has_work and not chat.done and len(chat.output_tokens) < after:
        eng.step()
    eng.cancel(chat)
    eng.run()
