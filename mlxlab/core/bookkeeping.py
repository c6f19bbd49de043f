"""The queues and token bookkeeping that the engine and the simulator share.

:class:`PlanExecutor` is an :class:`mlxlab.core.executor.Executor` that asks a policy for a plan at
every step. It keeps the queues (the prefill queue in arrival order, the sequences whose prefill
finished and that join the decode batch at its next decode, the decode rows), and does what both
executors do alike: submit (validate, make the request and its :class:`SequenceState`, queue it or
mark it ready), the policy's view of the queues, the rows leaving and joining the decode batch,
a chunk's bookkeeping (progress, the record's chunk and padding), reading tokens into requests
(stop tokens, ``max_tokens``), finishing, and the step records.

A prompt's last token is not prefilled: it is the sequence's first decode input, as in mlx-lm's
``generate_step``, so a one-token prompt is ready to decode at once.

What differs is left to hooks: :meth:`PlanExecutor._restore` (the engine's prefix cache),
:meth:`PlanExecutor._schedulable` (its KV-budget admission and the overlap worker's sequences),
:meth:`PlanExecutor._drop_rows` / :meth:`PlanExecutor._add_rows` (its batch cache),
:meth:`PlanExecutor._on_finish` (the prefix cache remembering a finished row). How a step runs
and what its clock reads are the subclass's: the engine runs the plan on a model, the simulator
charges it to a cost model on a virtual clock.

Pure Python, no MLX.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Dict, List, Optional, Sequence

from mlxlab.core.executor import Executor
from mlxlab.core.plan import SchedulerState
from mlxlab.core.request import (
    DECODING,
    DONE,
    PREFILLING,
    Request,
    SequenceState,
    StepRecord,
    pad_tokens,
    validate_request,
)


class PlanExecutor(Executor):
    """An executor that runs a policy's plans over the shared queues (see the module docstring).

    A subclass sets ``policy`` (a :class:`mlxlab.policies.base.Policy`) and implements
    :meth:`step`, :meth:`now` and :meth:`_flush` (reading the tokens still in flight, handing them
    to :meth:`_deliver`)."""

    def __init__(self, *, chunk_size: int, key_align: int, stop_tokens: Sequence[int], vocab_size: int,
                 max_context: int, history_limit: Optional[int] = None):
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if not isinstance(key_align, int) or key_align < 1:
            raise ValueError(f"key_align must be a positive integer (1 turns padding off), got {key_align!r}")
        if history_limit is not None and (isinstance(history_limit, bool) or not isinstance(history_limit, int)
                                          or history_limit < 1):
            raise ValueError(f"history_limit must be a positive integer (or None: keep everything), got {history_limit!r}")
        self.policy = None
        self.history_limit = history_limit
        self._next_request = self._next_step = 0  # ids keep counting when old records are dropped
        self.chunk_size = chunk_size
        self.key_align = key_align
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.stop_tokens = frozenset(int(t) for t in stop_tokens)
        self.requests: List[Request] = []
        self.steps: List[StepRecord] = []
        self._seqs: Dict[int, SequenceState] = {}
        self._queue: List[SequenceState] = []  # waiting or prefilling, arrival order
        self._ready: List[SequenceState] = []  # prefill done, joining the decode batch at the next decode
        self._decoding: List[SequenceState] = []  # the decode batch's rows, in order
        self._pending = None  # a decode step whose tokens are not read yet (the subclass's form)

    # ------------------------------------------------------------------ the executor interface
    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = ()) -> Request:
        """Queue a request and return it. Raises ``ValueError`` (changing nothing) for an empty
        prompt, a token id outside the vocabulary, ``max_tokens <= 0`` or a request longer than
        the context (:func:`mlxlab.core.request.validate_request`)."""
        prompt = self._validate(prompt_tokens, max_tokens)
        return self._enqueue(prompt, max_tokens, tenant=tenant, arrival_s=arrival_s, stop_tokens=stop_tokens)

    @property
    def has_work(self) -> bool:
        return bool(self._queue or self._ready or self._pending is not None or self._active_decoding())

    def state(self) -> SchedulerState:
        """The policy's view of the queues now: the schedulable prefills in arrival order, and
        the decoding sequences (those waiting to join the batch count as decoding)."""
        return SchedulerState(now_s=self.now(), chunk_size=self.chunk_size,
                              prefill_queue=[s.view() for s in self._schedulable()],
                              decoding=[s.view() for s in self._ready + self._active_decoding()],
                              side_prefill=bool(getattr(self, "overlap", False)))

    def flush(self) -> None:
        """Read any decode tokens still in flight (``run`` does this when it ends)."""
        self._flush()

    @property
    def decode_width(self) -> int:
        """The longest context among the decode batch's rows (what each row of a left-padded
        batch cache reads); 0 without rows."""
        return max((s.context_tokens for s in self._decoding), default=0)

    # ------------------------------------------------------------------ hooks
    def _restore(self, seq: SequenceState) -> None:
        """Give a new sequence whatever part of its prompt is already cached (none here)."""

    def _schedulable(self) -> List[SequenceState]:
        """The prefill queue the policy may plan chunks for (all of it here)."""
        return self._queue

    def _decode_rows(self) -> List[SequenceState]:
        """Every decoding sequence (the batch's rows here)."""
        return self._decoding

    def _drop_rows(self, keep: List[int]) -> None:
        """Keep only the decode rows at the indices ``keep``."""
        self._decoding = [self._decoding[i] for i in keep]

    def _add_rows(self, ready: List[SequenceState]) -> None:
        """Sequences whose prefill finished become decode rows."""
        self._decoding.extend(ready)

    def _on_finish(self, seq: SequenceState) -> None:
        """A request just finished (nothing to release here)."""

    @abstractmethod
    def _flush(self) -> None:
        """Read the tokens of a decode still in flight and :meth:`_deliver` them."""

    # ------------------------------------------------------------------ submit
    def _validate(self, prompt_tokens, max_tokens) -> List[int]:
        return validate_request(prompt_tokens, max_tokens, self.vocab_size, self.max_context)

    def _enqueue(self, prompt: List[int], max_tokens: int, *, tenant: str, arrival_s: Optional[float],
                 stop_tokens: Sequence[int], kv: Optional[tuple] = None) -> Request:
        """Make the request and its sequence state for a validated prompt; queue it for prefill,
        or mark it ready when nothing is left to prefill."""
        req = Request(id=self._next_request, prompt=prompt, max_tokens=int(max_tokens),
                      tenant=str(tenant), arrival_s=self.now() if arrival_s is None else float(arrival_s),
                      stop_tokens=self.stop_tokens | frozenset(int(t) for t in stop_tokens))
        self._next_request += 1
        self.requests.append(req)
        seq = SequenceState(req, kv)
        self._seqs[req.id] = seq
        self._restore(seq)
        if seq.prefilled == seq.prefill_tokens:
            self._ready.append(seq)
        else:
            self._queue.append(seq)
        return req

    def cancel(self, req: Request) -> bool:
        """End ``req`` now (finish reason "cancelled": a client went away). A waiting or
        prefilling request leaves the queue and its KV is released; a decoding row leaves the
        batch at the next decode (no compute is spent on it after this); one the executor cannot
        take back yet (overlap mode's prefill thread holds it) is dropped when it comes back.
        Returns False if it had already finished."""
        seq = self._seqs.get(req.id)
        if seq is None or req.done:
            return False
        self._finish(seq, "cancelled", self.now())
        if seq in self._ready:
            self._ready.remove(seq)
        if seq in self._queue and not self._holds(seq):
            self._queue.remove(seq)
            seq.cache = None
        return True

    def _holds(self, seq: SequenceState) -> bool:
        """Whether another thread holds ``seq`` now (none here)."""
        return False

    def kv_tokens_in_use(self) -> int:
        """KV positions held by requests that have started and not finished (their prompts
        prefilled so far plus the tokens decoded)."""
        return sum(s.prefilled + s.issued for s in self._queue + self._ready + self._decode_rows() if not s.req.done)

    # ------------------------------------------------------------------ prefill chunks
    def _pad(self, seq: SequenceState, n: int) -> int:
        """Pad tokens of ``seq``'s next chunk of ``n`` tokens (see ``key_align``)."""
        return pad_tokens(seq.prefilled, n, seq.prefill_tokens, self.key_align)

    def _begin_chunk(self, seq: SequenceState, t: float) -> None:
        """A chunk of ``seq`` starts at ``t``: its first one starts its prefill."""
        if seq.req.prefill_start_s is None:
            if not seq.req.done:  # cancelled while overlap mode's prefill thread held it
                seq.req.state = PREFILLING
            seq.req.prefill_start_s = t

    def _book_chunk(self, seq: SequenceState, n: int, rec: StepRecord) -> bool:
        """Note a chunk of ``n`` tokens that ran for ``seq`` in ``rec`` (and its padding); returns
        True if the sequence's prefill is complete. Moves no queue (the engine's prefill worker
        calls it): :meth:`_prefill_done` does."""
        pad = self._pad(seq, n)
        rec.prefill.append((seq.req.id, n, seq.prefilled))
        if pad:
            rec.padding[seq.req.id] = pad
        seq.prefilled += n
        return seq.prefilled == seq.prefill_tokens

    def _prefill_done(self, seq: SequenceState) -> None:
        """``seq``'s prefill is complete: it joins the decode batch at the next decode."""
        self._queue.remove(seq)
        self._ready.append(seq)

    # ------------------------------------------------------------------ the decode batch
    def _active_decoding(self) -> List[SequenceState]:
        """Decoding sequences that still need a forward."""
        return [s for s in self._decode_rows() if s.active]

    def _rebatch(self, rec: StepRecord, t: float) -> None:
        """Before a decode: rows with no tokens left to produce leave the batch (no compute is spent
        on them), then the ready sequences join it (at ``t``). ``rec`` counts both."""
        keep = [i for i, s in enumerate(self._decoding) if s.active]
        if len(keep) < len(self._decoding):
            rec.dropped = len(self._decoding) - len(keep)
            self._drop_rows(keep)
        if self._ready:
            before = len(self._decoding)
            ready, self._ready = self._ready, []
            for s in ready:
                if s.req.prefill_start_s is None:  # nothing was prefilled (a one-token prompt)
                    s.req.prefill_start_s = t
                if not s.req.done:
                    s.req.state = DECODING
            self._add_rows(ready)
            rec.joined = len(self._decoding) - before

    def _issue(self, rows: List[SequenceState], rec: StepRecord) -> None:
        """One decode forward is issued for each of ``rows``; ``rec`` lists them and their contexts."""
        for s in rows:
            s.issued += 1
        rec.decode_seqs = [s.req.id for s in rows]
        rec.decode_context_tokens = sum(s.context_tokens for s in rows)

    def _deliver(self, rec: StepRecord, rows: List[SequenceState], tokens: List[int], t: float) -> None:
        """Tokens of ``rec``'s decode are read at ``t``, one per row: each goes to its request
        (unless it already ended), which a stop token or ``max_tokens`` finishes. A deferred step
        (its phase set, no end yet) ends now and goes to the policy."""
        if rec.end_s == 0.0 and rec.phase:
            rec.end_s = t
            self._observe(rec)
        for s, tok in zip(rows, tokens):
            req = s.req
            if req.done or s.stopped:
                continue
            req.output_tokens.append(tok)
            req.token_times_s.append(t)
            if tok in req.stop_tokens:
                s.stopped = True
                self._finish(s, "stop", t)
            elif len(req.output_tokens) >= req.max_tokens:
                self._finish(s, "length", t)

    def _finish(self, seq: SequenceState, reason: str, t: float) -> None:
        self._on_finish(seq)
        seq.req.state = DONE
        seq.req.finish_reason = reason
        seq.req.finish_s = t

    # ------------------------------------------------------------------ step records
    def _new_record(self, phase: str, start_s: float, thread: str = "main") -> StepRecord:
        rec = StepRecord(self._next_step, start_s, 0.0, phase, [], [], thread=thread)
        self._next_step += 1
        self.steps.append(rec)
        return rec

    def _drop_record(self, rec: StepRecord) -> None:
        i = self.steps.index(rec)
        del self.steps[i]
        self._next_step -= 1
        for j in range(i, len(self.steps)):
            self.steps[j].index -= 1

    def _trim_history(self) -> None:
        """With ``history_limit``, keep only that many of the newest step records and finished
        requests (a long-running server's books stay bounded; whoever streams a request holds it
        still). Unfinished requests are always kept; ids go on counting."""
        n = self.history_limit
        if n is None:
            return
        if len(self.steps) > n:
            del self.steps[:len(self.steps) - n]
        finished = [r for r in self.requests if r.done]
        if len(finished) > n:
            gone = {r.id for r in finished[:len(finished) - n]}
            self.requests = [r for r in self.requests if r.id not in gone]
            for i in gone:
                self._seqs.pop(i, None)

    def _close_record(self, rec: StepRecord, end_s: Optional[float]) -> Optional[StepRecord]:
        """Name the step's phase; with ``end_s`` (not deferred) end it and hand it to the policy.
        A step where nothing ran (every planned row had already finished) is dropped: None."""
        if not rec.decode_seqs and not rec.prefill:
            self._drop_record(rec)
            return None
        rec.phase = "mixed" if (rec.decode_seqs and rec.prefill) else ("decode" if rec.decode_seqs else "prefill")
        if end_s is not None:
            rec.end_s = end_s
            self._observe(rec)
        return rec

    def _observe(self, rec: StepRecord) -> None:
        """Hand a finished step's record to the policy, as a dict, if the policy reads records
        (``Policy.observes``; an object without the flag gets them all)."""
        if getattr(self.policy, "observes", True):
            self.policy.observe(rec.as_dict())
