"""The inference engine: continuous batching, chunked prefill and batched decode on mlx-lm models.

One step of the engine is ``plan = policy.schedule(state)`` then ``execute(plan)``:

* decode: every decoding sequence advances by one token in **one** forward pass over a
  :class:`mlx_lm.models.cache.BatchKVCache` (ragged lengths are left-padded, as in mlx-lm);
* prefill: each planned chunk runs through the model on the sequence's own KV cache and is
  evaluated before the next decision, so every chunk is a real scheduling point.

A prompt's last token is not prefilled: it is the sequence's first decode input, exactly as in
mlx-lm's ``generate_step`` and ``BatchGenerator``, so the engine's greedy tokens can be compared
with theirs token for token.

Decode steps that are followed by another decode step are pipelined the way ``generate_step``
pipelines: step k's graph is built and queued before step k-1's tokens are read, so Python's
graph-building overlaps the device's work. Token timestamps are taken when a token is read,
right after the device produced it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from .scheduler import Policy, SchedulerState, SeqView, StepPlan, check_plan, make_policy

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
    "mixed"; ``decode_seqs`` and ``prefill`` list request ids (and chunk tokens)."""

    index: int
    start_s: float
    end_s: float
    phase: str
    decode_seqs: List[int]
    prefill: List[tuple]  # (request id, tokens, context tokens before the chunk)
    decode_context_tokens: int = 0  # sum of the decoding sequences' context lengths

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
            "decode_seqs": list(self.decode_seqs),
            "tokens": self.tokens,
        }


class _Seq:
    """Engine-side state of a request: its own KV cache while prefilling, a row of the batch
    cache while decoding."""

    __slots__ = ("req", "cache", "prefilled", "issued", "stopped")

    def __init__(self, req: Request):
        self.req = req
        self.cache = None
        self.prefilled = 0  # prompt tokens already in the KV cache
        self.issued = 0  # decode forwards issued (tokens read or still in flight)
        self.stopped = False  # a stop token was read; any in-flight token is discarded

    @property
    def prefill_tokens(self) -> int:
        return len(self.req.prompt) - 1

    def view(self) -> SeqView:
        r = self.req
        return SeqView(r.id, r.tenant, r.arrival_s, self.prefill_tokens, self.prefilled,
                       len(r.output_tokens), r.max_tokens)


def _module(model):
    return getattr(model, "module", model)


def _model_limits(model) -> tuple:
    module = _module(model)
    vocab = getattr(model, "vocab_size", None) or module.args.vocab_size
    ctx = getattr(model, "max_context", None)
    if ctx is None:
        ctx = getattr(module.args, "max_position_embeddings", None) or 131072
    return int(vocab), int(ctx)


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


class Engine:
    """Continuous-batching engine over an mlx-lm model.

    Args:
        model: a :class:`mlxlab.models.LoadedModel` or an mlx-lm ``nn.Module``.
        policy: a policy name (see :data:`mlxlab.scheduler.POLICIES`) or a :class:`Policy`.
        chunk_size: prefill tokens per chunk (a policy may choose smaller chunks).
        sampler: maps logits (B, vocab) to token ids (B,); greedy by default.
        stop_tokens: token ids that end any request (e.g. the tokenizer's EOS ids).
        policy_options: keyword options for a policy given by name.
    """

    def __init__(self, model, *, policy: "str | Policy" = "interleave", chunk_size: int = 2048,
                 sampler: Optional[Callable[[mx.array], mx.array]] = None,
                 stop_tokens: Sequence[int] = (), clock: Callable[[], float] = time.perf_counter,
                 **policy_options):
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        self.model = model
        self.module = _module(model)
        self.vocab_size, self.max_context = _model_limits(model)
        self.policy = make_policy(policy, **policy_options)
        self.chunk_size = chunk_size
        self.sampler = sampler or greedy
        self.stop_tokens = frozenset(int(t) for t in stop_tokens)
        self._clock = clock
        self._t0 = clock()
        self.requests: List[Request] = []
        self.steps: List[StepRecord] = []
        self._queue: List[_Seq] = []  # waiting or prefilling, arrival order
        self._ready: List[_Seq] = []  # prefill done, joining the decode batch at the next decode
        self._decoding: List[_Seq] = []  # rows of the batch cache, in order
        self._batch_cache: Optional[list] = None
        self._inputs: Optional[mx.array] = None  # next decode input per row (may be in flight)
        self._pending = None  # (tokens, seqs, step record) of a decode whose tokens are unread
        self._seqs: Dict[int, _Seq] = {}

    # ------------------------------------------------------------------ public API
    def now(self) -> float:
        """Seconds since the engine started."""
        return self._clock() - self._t0

    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = ()) -> Request:
        """Queue a request and return it; its fields fill in as the engine runs.

        Raises ``ValueError`` (and changes nothing) for an empty prompt, a token id outside the
        vocabulary, ``max_tokens <= 0`` or a request longer than the model's context."""
        prompt = self._validate(prompt_tokens, max_tokens)
        req = Request(id=len(self.requests), prompt=prompt, max_tokens=int(max_tokens),
                      tenant=str(tenant), arrival_s=self.now() if arrival_s is None else float(arrival_s),
                      stop_tokens=self.stop_tokens | frozenset(int(t) for t in stop_tokens))
        self.requests.append(req)
        seq = _Seq(req)
        self._seqs[req.id] = seq
        if seq.prefill_tokens == 0:
            self._ready.append(seq)
        else:
            self._queue.append(seq)
        return req

    @property
    def has_work(self) -> bool:
        return bool(self._queue or self._ready or self._active_decoding() or self._pending)

    def state(self) -> SchedulerState:
        """The scheduler's view of the queues now."""
        return SchedulerState(
            now_s=self.now(), chunk_size=self.chunk_size,
            prefill_queue=[s.view() for s in self._queue],
            decoding=[s.view() for s in self._ready + self._active_decoding()],
        )

    def step(self) -> Optional[StepRecord]:
        """Plan and execute one step; returns its record, or None if there was nothing to do."""
        state = self.state()
        plan = self.policy.schedule(state) if (state.prefill_queue or state.decoding) else StepPlan()
        check_plan(plan, state)
        if plan.empty:
            self._flush()
            return None
        rec = StepRecord(len(self.steps), self.now(), 0.0, "", [], [])
        self.steps.append(rec)
        deferred = False
        if plan.decode:
            deferred = self._decode(rec, defer=not plan.prefill)
        else:
            self._flush()
        for seq_id, n in plan.prefill:
            self._prefill_chunk(self._seqs[seq_id], n, rec)
        if not rec.decode_seqs and not rec.prefill:  # every planned row had already finished
            self.steps.pop()
            return None
        rec.phase = "mixed" if (rec.decode_seqs and rec.prefill) else ("decode" if rec.decode_seqs else "prefill")
        if not deferred:
            rec.end_s = self.now()
            self.policy.observe(rec.as_dict())
        return rec

    def run(self, progress: bool = False) -> List[Request]:
        """Step until every submitted request is done; returns all requests."""
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(self.requests), desc="requests", leave=False)
        try:
            while self.has_work:
                if self.step() is None and not self.has_work:
                    break
                if bar is not None:
                    bar.n = sum(r.done for r in self.requests)
                    bar.refresh()
        finally:
            self._flush()
            if bar is not None:
                bar.close()
        return self.requests

    # ------------------------------------------------------------------ validation
    def _validate(self, prompt_tokens, max_tokens) -> List[int]:
        try:
            prompt = [int(t) for t in (prompt_tokens.tolist() if hasattr(prompt_tokens, "tolist") else prompt_tokens)]
        except (TypeError, ValueError):
            raise ValueError("prompt_tokens must be a sequence of integer token ids") from None
        if not prompt:
            raise ValueError("empty prompt: a request needs at least one prompt token")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size}); "
                             f"{len(bad)} such id(s) in the prompt. Tokenize with this model's tokenizer.")
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if len(prompt) + max_tokens > self.max_context:
            raise ValueError(f"prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                             f"model's context of {self.max_context} tokens; shorten the prompt or lower max_tokens")
        return prompt

    # ------------------------------------------------------------------ execution
    def _active_decoding(self) -> List[_Seq]:
        """Decoding sequences that still need a forward pass."""
        return [s for s in self._decoding
                if not s.req.done and not s.stopped and s.issued < s.req.max_tokens]

    def _prefill_chunk(self, seq: _Seq, n: int, rec: StepRecord) -> None:
        req = seq.req
        if seq.cache is None:
            seq.cache = make_prompt_cache(self.module)
            req.state = PREFILLING
            req.prefill_start_s = self.now()
        start = seq.prefilled
        self.module(mx.array(req.prompt[start:start + n])[None], cache=seq.cache)
        mx.eval([c.state for c in seq.cache])
        seq.prefilled += n
        rec.prefill.append((req.id, n, start))
        if seq.prefilled == seq.prefill_tokens:
            self._queue.remove(seq)
            self._ready.append(seq)

    def _join_ready(self) -> None:
        """Move sequences whose prefill is done into the batch cache and the decode inputs."""
        ready, self._ready = self._ready, []
        caches = [s.cache if s.cache is not None else make_prompt_cache(self.module) for s in ready]
        merged = [layer[0].merge(list(layer)) for layer in zip(*caches)]
        inputs = mx.array([s.req.prompt[-1] for s in ready], dtype=mx.uint32)
        for s in ready:
            s.cache = None
            s.req.state = DECODING
            if s.req.prefill_start_s is None:
                s.req.prefill_start_s = self.now()
        if self._batch_cache is None:
            self._batch_cache, self._inputs = merged, inputs
        else:
            for c, m in zip(self._batch_cache, merged):
                c.extend(m)
            self._inputs = mx.concatenate([self._inputs.astype(mx.uint32), inputs])
        self._decoding.extend(ready)

    def _drop_rows(self, keep: List[int]) -> None:
        if not keep:
            self._batch_cache, self._inputs, self._decoding = None, None, []
            return
        for c in self._batch_cache:
            c.filter(keep)
        self._inputs = self._inputs[mx.array(keep)]
        self._decoding = [self._decoding[i] for i in keep]

    def _decode(self, rec: StepRecord, defer: bool) -> bool:
        """One batched decode forward; returns True if its tokens were left in flight."""
        # Rows with no tokens left to produce (max_tokens issued, or a stop token read) leave
        # the batch before the forward, so no compute is spent on them.
        active = set(map(id, self._active_decoding()))
        keep = [i for i, s in enumerate(self._decoding) if id(s) in active]
        if len(keep) < len(self._decoding):
            self._drop_rows(keep)
        if self._ready:
            self._join_ready()
        if not self._decoding:
            self._flush()
            return False
        rows = list(self._decoding)
        logits = self.module(self._inputs[:, None], cache=self._batch_cache)[:, -1, :]
        tokens = self.sampler(logits)
        mx.async_eval(tokens)
        for s in rows:
            s.issued += 1
        rec.decode_seqs = [s.req.id for s in rows]
        rec.decode_context_tokens = sum(s.prefill_tokens + s.issued for s in rows)
        self._flush()  # read the previous step's tokens while this one computes
        self._inputs = tokens
        self._pending = (tokens, rows, rec)
        if defer:
            return True
        self._flush()
        return False

    def flush(self) -> None:
        """Read any decode tokens still in flight (``run`` does this when it ends)."""
        self._flush()

    def _flush(self) -> None:
        """Read the in-flight decode tokens (if any) and hand them to their requests."""
        if self._pending is None:
            return
        tokens, rows, rec = self._pending
        self._pending = None
        values = tokens.tolist()
        t = self.now()
        if rec.end_s == 0.0 and rec.phase:  # a deferred decode step ends when its tokens are read
            rec.end_s = t
            self.policy.observe(rec.as_dict())
        for s, tok in zip(rows, values):
            req = s.req
            if req.done or s.stopped:
                continue
            req.output_tokens.append(tok)
            req.token_times_s.append(t)
            if tok in req.stop_tokens:
                s.stopped = True
                self._finish(req, "stop", t)
            elif len(req.output_tokens) >= req.max_tokens:
                self._finish(req, "length", t)

    def _finish(self, req: Request, reason: str, t: float) -> None:
        req.state = DONE
        req.finish_reason = reason
        req.finish_s = t
