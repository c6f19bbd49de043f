"""Long prompts tokenized in a process of their own, so the engine thread keeps stepping.

A model directory's tokenizer (Hugging Face ``tokenizers`` under mlx-lm's wrapper) holds Python's
GIL for the whole of an encode: a 16,000-character document takes several milliseconds, during
which the engine thread cannot start its next step, so every document a client posts puts one
gap of that length into each streaming chat. :class:`Encoder` sends prompts of at least
``long_chars`` characters to ``processes`` worker processes (spawned, each with the same
tokenizer) and awaits them on the event loop; shorter ones, and a preset's byte tokenizer (whose
encode is one ``bytes`` call), stay in this process. ``processes=0`` keeps everything here.
``probes/encode_gil_probe.py`` measures what it changes: on the H200's 16-core host one worker
process cut a chat's ITL p99 beside 4 posted 16,000-character documents a second from 20.0 to
14.2 ms (7.2-7.4 ms alone; h200/encode_gil_probe.json), on two cores it gave nothing
(cpu/encode_gil_probe.json), hence :func:`auto_processes`, ``mlxlab serve``'s default. Importing
this module loads no MLX.
"""

from __future__ import annotations

import asyncio
import os
from typing import List, Mapping, Optional, Sequence

LONG_CHARS = 2048  # prompts at least this long go to the worker processes
AUTO_MIN_CORES = 4  # mlxlab serve starts one worker process where the host has at least this many cores

_TOKENIZER = None  # the worker process's tokenizer (set by _init)


def _init(path: str) -> None:
    global _TOKENIZER
    from mlxlab.serve.text import HFTokenizer

    _TOKENIZER = HFTokenizer(path)


def _encode(text: str) -> List[int]:
    return _TOKENIZER.encode(text)


def _chat_prompt(messages: List[dict]) -> List[int]:
    return _TOKENIZER.chat_prompt(messages)


def auto_processes(cores: Optional[int] = None) -> int:
    """``mlxlab serve --tokenizer-processes``'s default for a host with ``cores`` cores (default:
    this one's): 1 from :data:`AUTO_MIN_CORES` up (the engine thread, the event loop and the worker
    each get a core), else 0 (on two cores the encode's time comes out of the engine's wherever
    it runs)."""
    if cores is None:  # the cores this process may run on (a container's share, not the host's count)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 1 if (cores or 1) >= AUTO_MIN_CORES else 0


class Encoder:
    """Tokenize on the event loop's behalf (see the module docstring)."""

    def __init__(self, tokenizer, processes: int = 0, long_chars: int = LONG_CHARS):
        from mlxlab.serve.text import HFTokenizer

        if processes < 0:
            raise ValueError(f"tokenizer processes must be 0 or more, got {processes}")
        self.tokenizer = tokenizer
        self.long_chars = int(long_chars)
        self.processes = processes if isinstance(tokenizer, HFTokenizer) else 0
        self._pool = None

    def start(self) -> None:
        """Spawn the worker processes and wait until each has its tokenizer (blocking)."""
        if self.processes and self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init, initargs=(self.tokenizer.name,))
            for f in [self._pool.submit(_encode, "x") for _ in range(self.processes)]:
                f.result()

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    async def _run(self, size: int, fn, local, arg):
        if self._pool is None or size < self.long_chars:
            return local(arg)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, arg)

    async def encode(self, text: str) -> List[int]:
        return await self._run(len(text), _encode, self.tokenizer.encode, text)

    async def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> List[int]:
        msgs = [dict(m) for m in messages]
        return await self._run(sum(len(m["content"]) for m in msgs), _chat_prompt, self.tokenizer.chat_prompt, msgs)
