"""A request, the record of one executed step, and the per-sequence state both executors keep.

Pure Python, no MLX: the engine and the simulator share these, and refuse bad input alike
through :func:`validate_request`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from mlxlab.core.plan import SeqView

WAITING, PREFILLING, DECODING, DONE = "waiting", "prefilling", "decoding", "done"


@dataclass
class Request:
    """One generation request and what happened to it. Times are seconds on the engine's
    clock (0 = engine start)."""

    id: int
    prompt: List[int]
    max_tokens: int
    tenant: str = "default"
    arrival_s: float = 0.0
    stop_tokens: frozenset = frozenset()
    output_tokens: List[int] = field(default_factory=list)
    token_times_s: List[float] = field(default_factory=list)
    prefill_start_s: Optional[float] = None
    finish_s: Optional[float] = None
    finish_reason: Optional[str] = None
    state: str = WAITING
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache instead of prefilled
    draft_proposed: int = 0  # speculative decoding (num_draft_tokens): draft tokens proposed
    draft_accepted: int = 0  # and of those, accepted by the target

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def ttft_s(self) -> Optional[float]:
        """Arrival to first output token, in seconds (None before the first token)."""
        return self.token_times_s[0] - self.arrival_s if self.token_times_s else None

    @property
    def itl_s(self) -> List[float]:
        """Gaps between consecutive output tokens, in seconds."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def e2e_s(self) -> Optional[float]:
        return self.finish_s - self.arrival_s if self.finish_s is not None else None


@dataclass
class StepRecord:
    """One executed step: when it ran, what it ran. ``phase`` is "decode", "prefill" or
    "mixed"; ``decode_seqs`` and ``prefill`` list request ids (and chunk tokens). ``thread`` is
    "main", or "prefill" for the prefill worker's chunks in overlap mode."""

    index: int
    start_s: float
    end_s: float
    phase: str
    decode_seqs: List[int]
    prefill: List[tuple]  # (request id, tokens, context tokens before the chunk)
    decode_context_tokens: int = 0  # sum of the decoding sequences' context lengths
    thread: str = "main"
    joined: int = 0  # rows that joined the decode batch at this step's decode
    dropped: int = 0  # rows that left it (finished) at this step's decode
    fused: bool = False  # the decode and the chunks ran as one packed forward
    padding: Dict[int, int] = field(default_factory=dict)  # request id -> pad tokens its final chunk ran with

    @property
    def tokens(self) -> int:
        return len(self.decode_seqs) + sum(p[1] for p in self.prefill)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def as_dict(self) -> dict:
        return {
            "step": self.index,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "duration_s": self.duration_s,
            "phase": self.phase,
            "decode_batch": len(self.decode_seqs),
            "decode_context_tokens": self.decode_context_tokens,
            "prefill_tokens": sum(p[1] for p in self.prefill),
            "prefill_context_tokens": sum(p[2] for p in self.prefill),
            "prefill_seqs": [p[0] for p in self.prefill],
            # [tokens, context] per chunk, and the pad tokens third for a padded final chunk
            "prefill_chunks": [[p[1], p[2]] + ([self.padding[p[0]]] if self.padding.get(p[0]) else [])
                               for p in self.prefill],
            "decode_seqs": list(self.decode_seqs),
            "tokens": self.tokens,
            "thread": self.thread,
            "joined": self.joined,
            "dropped": self.dropped,
            "fused": self.fused,
        }


class SequenceState:
    """An executor's state of one request: how far its prefill got, how many decode forwards were
    issued for it, whether a stop token ended it. ``cache`` is the executor's handle on its KV
    (the engine's own cache while prefilling, None while it is a row of the batch cache, always
    None in the simulator); ``kv``, ``solo_input`` and ``remembered`` are the engine's per-request
    KV quantization, quantized decode input and prefix-cache flag."""

    __slots__ = ("req", "cache", "prefilled", "issued", "stopped", "remembered", "kv", "solo_input", "sampler")

    def __init__(self, req: Request, kv: Optional[tuple] = None):
        self.req = req
        self.kv = kv  # (bits, group_size, quantized_kv_start) for a quantized KV cache, else None
        self.solo_input = None  # next decode input of a quantized-KV sequence (decodes alone)
        self.sampler = None  # the request's own sampler (mlxlab.engine.sampling), None: the engine's
        self.cache = None
        self.prefilled = 0  # prompt tokens already in the KV cache
        self.issued = 0  # decode forwards issued (tokens read or still in flight)
        self.stopped = False  # a stop token was read; any in-flight token is discarded
        self.remembered = False  # its KV went into the prefix cache

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens that go through prefill: all but the last, which is the first decode input."""
        return len(self.req.prompt) - 1

    @property
    def context_tokens(self) -> int:
        """KV positions the sequence's next (or in-flight) decode reads: its prefill plus the
        forwards issued."""
        return self.prefill_tokens + self.issued

    @property
    def active(self) -> bool:
        """Whether it still needs a decode forward (not done, not stopped, ``max_tokens`` not issued)."""
        return not self.req.done and not self.stopped and self.issued < self.req.max_tokens

    def chunk_tokens(self, n: int, pad: int = 0) -> List[int]:
        """The next ``n`` prompt tokens to prefill, then ``pad`` copies of the last of them (a
        padded final chunk: :func:`pad_tokens`)."""
        start = self.prefilled
        return self.req.prompt[start:start + n] + [self.req.prompt[start + n - 1]] * pad

    def view(self) -> SeqView:
        r = self.req
        return SeqView(r.id, r.tenant, r.arrival_s, self.prefill_tokens, self.prefilled,
                       len(r.output_tokens), r.max_tokens)


def pad_tokens(start: int, n: int, prefill_tokens: int, key_align: int) -> int:
    """Pad tokens for a chunk of ``n`` prompt tokens after ``start``: for the final chunk of a
    prompt (``start + n == prefill_tokens``) whose key length ``start + n`` is not a multiple of
    ``key_align``, enough to reach the next multiple; else 0. Shared by the engine and the
    simulator so both run (and charge) the same chunks."""
    end = start + n
    if key_align <= 1 or end != prefill_tokens or end % key_align == 0:
        return 0
    return -end % key_align


def validate_request(prompt_tokens, max_tokens, vocab_size: int, max_context: int) -> List[int]:
    """The prompt as a list of ints, or ``ValueError`` saying what is wrong and what to do: an
    empty prompt, a token id outside the vocabulary, ``max_tokens <= 0``, or a request longer
    than the model's context. Shared by every executor so they refuse the same input alike."""
    try:
        raw = list(prompt_tokens.tolist() if hasattr(prompt_tokens, "tolist") else prompt_tokens)
    except TypeError:
        raise ValueError("prompt_tokens must be a sequence of integer token ids") from None
    if raw and set(map(type, raw)) == {int}:  # the usual prompt, checked at C speed (a 30k-token prompt
        # checked one id at a time took 27 ms on the CPU: a stall in every chat decoding beside its arrival)
        try:
            ids = np.fromiter(raw, dtype=np.int64, count=len(raw))
        except OverflowError:  # an id beyond int64: the checks below name it
            ids = None
        if ids is not None and 0 <= int(ids.min()) and int(ids.max()) < vocab_size:
            _check_length(len(raw), max_tokens, max_context)
            return raw
    bad = next(((i, t) for i, t in enumerate(raw) if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    if bad is not None:
        raise ValueError(f"token ids must be integers: prompt_tokens[{bad[0]}] is {bad[1]!r} "
                         f"({type(bad[1]).__name__}); tokenize with this model's tokenizer")
    prompt = [int(t) for t in raw]
    if not prompt:
        raise ValueError("empty prompt: a request needs at least one prompt token")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size}); "
                         f"{len(bad)} such id(s) in the prompt. Tokenize with this model's tokenizer.")
    _check_length(len(prompt), max_tokens, max_context)
    return prompt


def _check_length(n: int, max_tokens, max_context: int) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if n + max_tokens > max_context:
        raise ValueError(f"prompt ({n} tokens) plus max_tokens ({max_tokens}) exceeds the "
                         f"model's context of {max_context} tokens; shorten the prompt or lower max_tokens")
