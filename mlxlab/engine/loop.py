"""The inference engine: continuous batching, chunked prefill and batched decode on mlx-lm models.

One step of the engine is ``plan = policy.schedule(state)`` then ``execute(plan)``:

* decode: every decoding sequence advances by one token in **one** forward pass over the decode
  batch's caches (:class:`mlxlab.engine.batch.DecodeBatch`: ragged lengths are left-padded, as
  in mlx-lm);
* prefill: each planned chunk runs through the model on the sequence's own KV cache and is
  evaluated before the next decision, so every chunk is a real scheduling point.

The queues, the token reads and the step records are the simulator's too
(:class:`mlxlab.core.bookkeeping.PlanExecutor`). A prompt's last token is not prefilled: it is the
sequence's first decode input, exactly as in mlx-lm's ``generate_step`` and ``BatchGenerator``,
so the engine's greedy tokens can be compared with theirs token for token.

Decode steps that are followed by another decode step are pipelined the way ``generate_step``
pipelines: step k's graph is built and queued before step k-1's tokens are read, so Python's
graph-building overlaps the device's work. Token timestamps are taken when a token is read,
right after the device produced it. Overlap mode (prefill on a second thread and stream) is
described in :mod:`mlxlab.engine.overlap`.
"""

from __future__ import annotations

import copy
import time
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.core.bookkeeping import PlanExecutor
from mlxlab.core.plan import KEY_ALIGN
from mlxlab.core.presets import model_limits, module_of
from mlxlab.engine.models import materialize
from mlxlab.core.request import Request, SequenceState, StepRecord
from mlxlab.engine.admission import KVBudget, kv_quantization
from mlxlab.engine.streams import greedy, thread_stream  # noqa: F401 (re-exported)
from mlxlab.engine.batch import (
    DecodeBatch,
    can_pad,
    checked_apart,
    decodes_apart,
    evaluating_layers,
    maybe_quantize,
    presize,
    trim,
)
from mlxlab.engine.compiled import compiled_decode
from mlxlab.engine.fused import can_fuse, packed_forward
from mlxlab.engine.overlap import OVERLAP_SYNCS, DecodePacer, PrefillWorker, resolve_overlap
from mlxlab.engine.overlap_steps import OverlapSteps
from mlxlab.engine.sampling import make_request_sampler, sample_rows
from mlxlab.engine.speculative import DraftLane, check_draft, draft_tokens, speculate
from mlxlab.engine.warmup import warmup as run_warmup
from mlxlab.policies import make_policy, next_plan, with_key_align
from mlxlab.policies.base import Policy

def _check_options(overlap, overlap_sync, fuse, byte_limits: Dict[str, Optional[int]]) -> None:
    if overlap is not None and not isinstance(overlap, bool):
        raise ValueError(f"overlap must be True, False or None (the policy's choice), got {overlap!r}")
    if overlap_sync not in OVERLAP_SYNCS:
        raise ValueError(f"overlap_sync must be one of {OVERLAP_SYNCS}, got {overlap_sync!r}")
    for name, v in byte_limits.items():
        if v is not None and (not isinstance(v, int) or v < 0):
            raise ValueError(f"{name} must be a non-negative integer number of bytes, got {v!r}")
    if fuse not in (None, True, False):
        raise ValueError(f"fuse must be None, True or False, got {fuse!r}")


class Engine(OverlapSteps, PlanExecutor):
    """Continuous-batching engine over an mlx-lm model.

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel` or an mlx-lm ``nn.Module``.
        policy: a policy name (see :data:`mlxlab.policies.POLICIES`) or a :class:`Policy`.
        chunk_size: prefill tokens per chunk (a policy may choose smaller chunks).
        sampler: maps logits (B, vocab) to token ids (B,); greedy by default.
        stop_tokens: token ids that end any request (e.g. the tokenizer's EOS ids).
        clock: the engine's clock (seconds); ``now()`` is its reading less the one at start.
        overlap: run prefill chunks on a worker thread and stream, concurrently with decode
            steps (:mod:`mlxlab.engine.overlap`). Call :meth:`close` (or use the engine as a
            context manager) when stepping by hand; :meth:`run` stops the worker itself. None
            (default): the policy's choice: on a GPU, a policy with ``side_prefill`` options
            (``slo``) runs in overlap mode with them; otherwise off
            (:func:`mlxlab.engine.overlap.resolve_overlap`).
        overlap_sync: how the prefill worker evaluates a chunk: "layer" (the default unless the
            policy asks otherwise) layer by
            layer, waiting for each; "pipelined" layer by layer with one layer queued ahead (no
            idle gap between layers on a GPU, about two layers in flight); "chunk" all at once.
            See "mlx back-pressure" in :mod:`mlxlab.engine.overlap`.
        overlap_pace_x: in overlap mode, while a prefill job runs, start decode steps no sooner
            than this multiple of the decode-only gap the engine measured
            (:class:`mlxlab.engine.overlap.DecodePacer`): the chat's latency budget spent on the
            document's prefill. None (default): decode as fast as it can.
        overlap_job_chunks: in overlap mode, how many chunks of a prompt one hand-over to the
            prefill thread holds: the plan's chunk and up to this many less one more of
            ``chunk_size`` (1, the default unless the policy asks otherwise: the policy plans
            every chunk).
        prefix_cache: a :class:`mlxlab.engine.prefix_cache.PrefixCache`: each submitted prompt starts
            from the KV of its longest cached prefix (only the rest is prefilled), and each
            finished request's prompt + output go into the cache (a chat's next turn hits).
            A ``kv_bits`` request stores and restores quantized KV, matching only entries of
            its own quantization.
        warmup: "off", "token" (one short request after load, as the case study's "Hi"),
            "shapes" (also a prompt at ``chunk_size`` and decode at batch sizes 1 and 8) or
            "policy" (also a throwaway engine configured like this one runs a chat with a
            ``warmup_tokens`` document arriving beside it: every chunk shape and context the
            policy will use; :func:`mlxlab.engine.warmup.policy_warmup`), run before the engine's
            clock starts; the seconds spent are in ``warmup_s``.
        warmup_tokens: the "policy" warm-up's document length (default: twice ``chunk_size``
            and three tokens, within the model's context); set it to the longest prompt you
            expect for a first run as fast as the second.
        kv_budget_bytes: admission by KV memory (:mod:`mlxlab.engine.admission`): a request whose
            prompt + ``max_tokens`` of KV could never fit is refused at submit; one that does not
            fit beside the requests already started waits (the policy does not see it).
        cache_limit_bytes, memory_limit_bytes: mlx's allocator cache and memory limits
            (``mx.set_cache_limit`` / ``mx.set_memory_limit``; they are process-wide).
        fuse: run a step's decode and its prefill chunks in **one** packed forward pass
            (:mod:`mlxlab.engine.fused`: every token through the linear layers at once, attention
            per sequence) instead of back to back. None (default) follows the policy
            (``stall_free`` fuses); True requires a model that can (llama/qwen2 families) and
            fuses every mixed step; False never. Not used in overlap mode.
        key_align: run the final chunk of each prompt padded (with copies of its last token,
            after it, so no real token sees them) to a key length that is a multiple of this,
            then trim the pad back off the cache. On mlx's CUDA backend a chunk whose key length
            is off a multiple of 8 runs a slower attention path (``probes/chunk_probe.py``), and
            every prompt of even length ends in such a chunk. 1 turns padding off; models whose
            caches cannot be trimmed (SSM or sliding-window layers) are never padded. Greedy
            output is unchanged. A policy given by name that takes ``key_align`` (``stall_free``,
            ``slo``) gets this value too unless ``policy_options`` set it.
        draft_model: a draft model (a LoadedModel or mlx-lm module sharing the target's vocabulary)
            for requests submitted with ``num_draft_tokens``: each decodes speculatively in its own
            lane beside the batch (:class:`mlxlab.engine.speculative.DraftLane`).
        history_limit: keep only this many of the newest step records and finished requests in
            ``steps`` and ``requests`` (a server that runs for days; :mod:`mlxlab.serve` sets one).
            None (default) keeps everything, as the studies need.
        compile_decode: run the decode step of an even batch (a lone stream, or rows at one
            length) as one ``mx.compile`` graph (:mod:`mlxlab.engine.compiled`): no Python graph
            building per token, traced once per KV buffer size and shared by the model's engines.
            Greedy output is unchanged.
        decode_apart: a row ready to decode whose context is more than this many positions longer or
            shorter than the decode batch's decodes in its own forward (batch 1, as ``generate_step``)
            instead of joining it (left-padded, masked: :func:`mlxlab.engine.batch.decodes_apart`).
            None (default): every row joins. Greedy output is unchanged.
        policy_options: keyword options for a policy given by name.

    The engine is not thread-safe: call its methods from one thread.
    """

    def __init__(self, model, *, policy: "str | Policy" = "interleave", chunk_size: int = 2048,
                 sampler: Optional[Callable[[mx.array], mx.array]] = None,
                 stop_tokens: Sequence[int] = (), clock: Callable[[], float] = time.perf_counter,
                 overlap: Optional[bool] = None, overlap_sync: Optional[str] = None, prefix_cache=None,
                 warmup: str = "off", kv_budget_bytes: Optional[int] = None,
                 cache_limit_bytes: Optional[int] = None, memory_limit_bytes: Optional[int] = None,
                 fuse: Optional[bool] = None, key_align: int = KEY_ALIGN,
                 warmup_tokens: Optional[int] = None, overlap_pace_x: Optional[float] = None,
                 overlap_job_chunks: Optional[int] = None, history_limit: Optional[int] = None,
                 draft_model=None, compile_decode: bool = False, decode_apart: Optional[int] = None,
                 **policy_options):
        vocab_size, max_context = model_limits(model)
        super().__init__(chunk_size=chunk_size, key_align=key_align, stop_tokens=stop_tokens,
                         vocab_size=vocab_size, max_context=max_context, history_limit=history_limit)
        self.policy = make_policy(policy, **with_key_align(policy, key_align, policy_options))
        overlap, overlap_sync, overlap_job_chunks = resolve_overlap(self.policy, overlap, overlap_sync,
                                                                    overlap_job_chunks)
        _check_options(overlap, overlap_sync, fuse, {"kv_budget_bytes": kv_budget_bytes,
                                                     "cache_limit_bytes": cache_limit_bytes,
                                                     "memory_limit_bytes": memory_limit_bytes})
        if cache_limit_bytes is not None:
            mx.set_cache_limit(cache_limit_bytes)
        if memory_limit_bytes is not None:
            mx.set_memory_limit(memory_limit_bytes)
        self.model = model
        self.module = module_of(model)
        if overlap:
            materialize(self.module)  # a module built by hand may hold lazy arrays (see materialize)
        self.prefix_cache = prefix_cache
        self.kv_budget_bytes = kv_budget_bytes
        self._budget = KVBudget(model, kv_budget_bytes)
        self.kv_bytes_per_token = self._budget.full_bytes_per_token
        self.fuse = self._fuses(fuse, overlap)
        self.key_align = key_align if can_pad(self.module) else 1
        self.sampler = sampler or greedy
        self.overlap = overlap
        self.overlap_sync = overlap_sync
        self.decode_apart = checked_apart(decode_apart)
        self._solo: List[SequenceState] = []  # each in its own forward: quantized KV, or decode_apart
        self._spec: List[SequenceState] = []  # decoding speculatively, each in its own lane
        self._lanes: Dict[int, DraftLane] = {}  # request id -> its lane, from submit to finish
        self.draft, self._draft_context = check_draft(model, draft_model)
        self._batch = DecodeBatch()
        if compile_decode not in (True, False):
            raise ValueError(f"compile_decode must be True or False, got {compile_decode!r}")
        self._compiled = compiled_decode(self.module) if compile_decode else None
        self._prefill = PrefillWorker(self._prefill_job)  # overlap mode's worker thread
        self._pacer = DecodePacer(overlap_pace_x)
        #: called (no arguments, on the stepping thread) when a step in overlap mode is about to
        #: block (waiting for the prefill thread, or pacing) after reading tokens: where a server
        #: hands them out (:class:`mlxlab.serve.worker.EngineWorker`), or they wait for the prefill
        self.before_wait: Optional[Callable[[], None]] = None
        if isinstance(overlap_job_chunks, bool) or not isinstance(overlap_job_chunks, int) or overlap_job_chunks < 1:
            raise ValueError(f"overlap_job_chunks must be a positive integer, got {overlap_job_chunks!r}")
        self.overlap_job_chunks = overlap_job_chunks
        self._clock = clock
        self.warmup_s: Dict[str, float] = {}
        if warmup_tokens is not None and (not isinstance(warmup_tokens, int) or warmup_tokens < 1):
            raise ValueError(f"warmup_tokens must be a positive number of tokens (or None), got {warmup_tokens!r}")
        if warmup != "off":
            made: List[Engine] = []  # the warm-up's engines, whose steps may prime the policy
            same = dict(policy=copy.deepcopy(policy) if isinstance(policy, Policy) else policy, overlap=overlap,
                        overlap_sync=overlap_sync, fuse=fuse, key_align=key_align, overlap_pace_x=overlap_pace_x,
                        overlap_job_chunks=overlap_job_chunks, **policy_options)

            def throwaway(c: int) -> Engine:
                eng = Engine(model, chunk_size=c, **same) if warmup == "policy" else Engine(model, chunk_size=c)
                made.append(eng)
                return eng

            tokens = min(warmup_tokens or 2 * chunk_size + 3, self.max_context - 16) if warmup == "policy" else None
            self.warmup_s = run_warmup(throwaway, self.vocab_size, warmup, chunk_sizes=(chunk_size,),
                                       batch_sizes=(1, 8), prompt_tokens=tokens)
            if warmup == "policy":
                self._prime(made)
        self._t0 = clock()

    def _prime(self, engines: List["Engine"]) -> None:
        """Show a policy that learns from step records (``slo``) the warm-up's steps, so it starts
        with a cost model measured on this device instead of crawling up from its smallest chunk.
        A step of a shape not seen before in the warm-up is left out: it carries first-use costs
        (kernel preparation) that later steps of that shape do not pay."""
        if not getattr(self.policy, "observes", False):
            return
        seen = set()
        for eng in engines:
            for rec in eng.steps:
                shape = (rec.phase, rec.fused, len(rec.decode_seqs), tuple(p[1] for p in rec.prefill))
                if shape in seen:
                    self.policy.observe(rec.as_dict())
                seen.add(shape)

    def _fuses(self, fuse: Optional[bool], overlap: bool) -> bool:
        fusable, why = can_fuse(self.module)
        if fuse is True and not fusable:
            raise ValueError(f"fuse=True but this model cannot run packed steps ({why}); use fuse=False")
        return bool(fusable and not overlap and (fuse if fuse is not None else getattr(self.policy, "fuse", False)))

    # ------------------------------------------------------------------ public API
    def now(self) -> float:
        """Seconds since the engine started."""
        return self._clock() - self._t0

    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = (),
               kv_bits: Optional[int] = None, kv_group_size: int = 64, quantized_kv_start: int = 0,
               temperature: Optional[float] = None, top_p: Optional[float] = None, top_k: Optional[int] = None,
               min_p: Optional[float] = None, seed: Optional[int] = None,
               num_draft_tokens: Optional[int] = None) -> Request:
        """Queue a request and return it; its fields fill in as the engine runs.

        ``kv_bits`` (None, 8 or 4) keeps this request's KV cache quantized with mlx-lm's
        ``QuantizedKVCache`` once it holds ``quantized_kv_start`` tokens, converted at the same
        points as ``generate_step(kv_bits=...)`` does (after each prefill chunk and each decode
        forward). mlx-lm has no batched quantized cache, so such a request decodes in a forward
        of its own beside the batch (one extra forward per quantized request per step).

        Raises ``ValueError`` (and changes nothing) for an empty prompt, a token id outside the
        vocabulary, ``max_tokens <= 0``, a request longer than the model's context, one that could
        never fit the KV budget, or a KV quantization this backend cannot run (found by a probe
        at the model's shape, cached), or a sampling option out of range.

        ``temperature`` (> 0), ``top_p``, ``top_k``, ``min_p`` and ``seed`` sample this request
        with its own sampler (:mod:`mlxlab.engine.sampling`, on mlx-lm's filters, its own random
        key); without a temperature (or 0) it decodes with the engine's sampler.

        ``num_draft_tokens`` (1 to 32; None or 0: off) decodes it speculatively with the engine's
        ``draft_model`` in a lane of its own (:mod:`mlxlab.engine.speculative`); not with ``kv_bits``."""
        prompt = self._validate(prompt_tokens, max_tokens)
        sampler = make_request_sampler(temperature, top_p, top_k, min_p, seed)
        kv = kv_quantization(self.model, kv_bits, kv_group_size, quantized_kv_start)
        k = draft_tokens(num_draft_tokens, self.draft, kv, self._draft_context, len(prompt) + max_tokens)
        self._budget.check(len(prompt), max_tokens, kv)
        req = self._enqueue(prompt, max_tokens, tenant=tenant, arrival_s=arrival_s, stop_tokens=stop_tokens, kv=kv)
        self._seqs[req.id].sampler = sampler
        if k is not None:
            self._lanes[req.id] = DraftLane(k)
        return req

    @property
    def has_work(self) -> bool:
        return super().has_work or self._prefill.busy

    def step(self) -> Optional[StepRecord]:
        """Plan and execute one step; returns its record, or None if there was nothing to do.

        In overlap mode the returned record is the step's decode, else the prefill record of the
        chunks just handed to the worker (still running: ``end_s`` is 0 until it finishes). When
        neither can run but the worker is busy, the step waits for the worker and plans again."""
        with mx.stream(thread_stream()):  # our own stream, as generate_step uses its own
            rec = self._step_overlap() if self.overlap else self._step()
        self._trim_history()
        return rec

    def close(self) -> None:
        """Stop the prefill worker thread (overlap mode) once its current chunks are done, and
        collect their result. Idempotent; the engine stays usable (a later step starts a new
        worker)."""
        if self._prefill.stop():
            self._collect()

    def memory(self) -> Dict[str, int]:
        """mlx's active, cache and peak memory in bytes (peak since process start or the last
        ``mx.reset_peak_memory()``)."""
        return {"active_bytes": mx.get_active_memory(), "cache_bytes": mx.get_cache_memory(),
                "peak_bytes": mx.get_peak_memory()}

    # ------------------------------------------------------------------ the queues' hooks
    def _restore(self, seq: SequenceState) -> None:
        """Start a new prompt from the KV of its longest prefix in the prefix cache."""
        if self.prefix_cache is not None:
            n, caches = self.prefix_cache.lookup(seq.req.prompt, self.module, kv=seq.kv)
            if n:
                seq.cache, seq.prefilled, seq.req.cached_tokens = caches, n, n

    def _schedulable(self) -> List[SequenceState]:
        """The admitted prefill queue, less the sequences the prefill worker holds."""
        held = self._prefill.held
        return [s for s in self._budget.admitted(self._queue, self._seqs.values()) if s.req.id not in held]

    def _decode_rows(self) -> List[SequenceState]:
        return self._decoding + self._solo + self._spec

    def _drop_rows(self, keep: List[int]) -> None:
        kept = set(keep)
        for i, s in enumerate(self._decoding):
            if i not in kept:
                self._remember(s)  # while its row is still in the batch cache
        self._batch.drop(keep)
        super()._drop_rows(keep)

    def _add_rows(self, ready: List[SequenceState]) -> None:
        """Ready sequences' caches join the batch (a quantized-KV, speculative or ``decode_apart`` one
        decodes alone); each next input: the last prompt token, or the first output (overlap mode)."""
        for s in ready:
            if s.cache is None:  # nothing was prefilled
                s.cache = make_prompt_cache(self.module)
        spec = [s for s in ready if s.kv is None and s.req.id in self._lanes]
        plain = [s for s in ready if s.kv is None and s.req.id not in self._lanes]
        far = decodes_apart([getattr(s.cache[0], "offset", 0) for s in plain],
                            self._batch.length if self._decoding else None, self.decode_apart)
        solo = [s for s in ready if s.kv is not None] + [s for s, f in zip(plain, far) if f]
        plain = [s for s, f in zip(plain, far) if not f]
        for s in solo:
            s.solo_input = mx.array([s.req.output_tokens[-1] if s.issued else s.req.prompt[-1]], dtype=mx.uint32)
        self._solo += solo
        for s in spec:
            self._lanes[s.req.id].start(self.draft, s.req.prompt, s.req.output_tokens, self.chunk_size)
        self._spec += spec
        if plain:
            inputs = [s.req.output_tokens[-1] if s.issued else s.req.prompt[-1] for s in plain]
            self._batch.join([s.cache for s in plain], mx.array(inputs, dtype=mx.uint32))
            for s in plain:
                s.cache = None
            self._decoding.extend(plain)

    def _rebatch(self, rec: StepRecord, t: float) -> None:
        for s in self._solo + self._spec:
            if not s.active:
                if s in self._spec:
                    self._remember(s)  # its last tokens may still be in flight
                s.cache = None  # its own KV: freed as it leaves (the finished request stays in the books)
        self._solo = [s for s in self._solo if s.active]
        self._spec = [s for s in self._spec if s.active]
        super()._rebatch(rec, t)

    def _on_finish(self, seq: SequenceState) -> None:
        self._remember(seq)
        if self._lanes.pop(seq.req.id, None) is not None and seq in self._spec:
            seq.cache = None  # a speculative row's KV is its own: freed now, not at the next decode

    def _remember(self, s: SequenceState) -> None:
        """Put a finished row's prompt + read output and its KV into the prefix cache. The row
        holds the KV of every token fed so far (the last output token is never fed); the cache
        stores as many positions as the row has, keyed by those tokens."""
        if self.prefix_cache is None or s.remembered or not (s in self._decoding or s in self._solo or s in self._spec):
            return
        s.remembered = True  # a quantized-KV row (solo) keeps its own cache
        row = self._batch.row(self._decoding.index(s)) if s in self._decoding else s.cache
        self.prefix_cache.insert(s.req.prompt + s.req.output_tokens, row)

    # ------------------------------------------------------------------ one step
    def _step(self) -> Optional[StepRecord]:
        plan = next_plan(self.policy, self.state())
        if plan.empty:
            self._flush()
            return None
        rec = self._new_record("", self.now())
        deferred, fused = False, False
        if plan.decode:
            deferred, fused = self._decode(rec, defer=not plan.prefill, chunks=plan.prefill if self.fuse else ())
        else:
            self._flush()
        for seq_id, n in (() if fused else plan.prefill):
            seq = self._seqs[seq_id]
            if self._run_chunk(seq, n, rec):
                self._prefill_done(seq)
        return self._close_record(rec, None if deferred else self.now())

    def _decode(self, rec: StepRecord, defer: bool, chunks=()) -> tuple:
        """One batched decode forward; returns (tokens left in flight, chunks fused). With
        ``chunks`` (the plan's (seq id, tokens)) and batch rows to decode, the chunks run in the
        same packed forward (:func:`mlxlab.engine.fused.packed_forward`) and are done on return."""
        self._rebatch(rec, self.now())
        if not self._decoding and not self._solo and not self._spec:
            self._flush()
            return False, False
        packed = [(self._seqs[i], n) for i, n in chunks] if self._decoding else []
        groups = self._forward(packed, rec)
        self._issue([s for _, rows in groups for s in rows], rec)
        self._flush()  # read the previous step's tokens while this one computes
        for tokens, rows in groups:
            if any(rows[0] is s for s in self._solo):  # a row of its own (quantized KV, decode_apart)
                rows[0].solo_input = tokens
            else:
                self._batch.inputs = tokens
        self._pending = (groups + speculate(self._spec, self._lanes, self.module, self.draft, rec, self._sample), rec)
        for seq, n in packed:
            if self._book_chunk(seq, n, rec):
                self._prefill_done(seq)
        if defer:
            return True, bool(packed)
        self._flush()
        if packed:  # the chunks are a scheduling point like any other: done before the next decision
            mx.eval([c.state for seq, _ in packed for c in seq.cache])
        return False, bool(packed)

    def _forward(self, packed, rec: StepRecord) -> list:
        """Queue this step's decode forwards: ``[(tokens, rows)]``, the batch's first (with the
        ``packed`` chunks in the same pass), then one per quantized-KV row."""
        groups = []
        if packed:
            for seq, _ in packed:
                self._begin_chunk(seq, self.now())
            pads = [self._pad(seq, n) for seq, n in packed]
            segs = [(mx.array(seq.chunk_tokens(n, p)), seq.cache) for (seq, n), p in zip(packed, pads)]
            logits = packed_forward(self.module, self._batch.inputs, self._batch.cache, segs)
            rec.fused = True
            for (seq, _), p in zip(packed, pads):
                trim(seq.cache, p)
                maybe_quantize(seq)
            groups.append((self._sample(logits, self._decoding), list(self._decoding)))
        elif self._decoding:
            logits = (self._compiled.step(self._batch.inputs, self._batch.cache)
                      if self._compiled is not None and self._compiled.fits(self._batch) else
                      self.module(self._batch.inputs[:, None], cache=self._batch.cache)[:, -1, :])
            groups.append((self._sample(logits, self._decoding), list(self._decoding)))
        for s in self._solo:
            logits = self.module(s.solo_input[:, None], cache=s.cache)[:, -1, :]
            maybe_quantize(s)  # where generate_step quantizes: after the forward
            groups.append((self._sample(logits, [s]), [s]))
        mx.async_eval([t for t, _ in groups] + [c.state for seq, _ in packed for c in seq.cache])
        return groups

    def _sample(self, logits: mx.array, rows: List[SequenceState]) -> mx.array:
        """Tokens for ``rows``' logits: the engine's sampler, a request's own where it has one."""
        return sample_rows(self.sampler, logits, [s.sampler for s in rows])

    def _flush(self) -> None:
        """Read the in-flight decode tokens (if any) and hand them to their requests."""
        if self._pending is None:
            return
        groups, rec = self._pending
        self._pending = None
        values = [v for tokens, _ in groups for v in tokens.tolist()]
        self._deliver(rec, [s for _, rows in groups for s in rows], values, self.now())

    # ------------------------------------------------------------------ prefill chunks
    def _begin_chunk(self, seq: SequenceState, t: float) -> None:
        if seq.cache is None:
            seq.cache = make_prompt_cache(self.module)
            presize(seq.cache, seq.prefill_tokens + self.key_align)
        super()._begin_chunk(seq, t)

    def _run_chunk(self, seq: SequenceState, n: int, rec: StepRecord, sync: str = "chunk") -> bool:
        """Prefill ``n`` more prompt tokens of ``seq`` into its own cache (evaluated) and note the
        chunk in ``rec``; returns True if the sequence's prefill is complete. Runs on the main
        thread, or on the prefill worker in overlap mode. ``sync``: see ``overlap_sync``."""
        self._begin_chunk(seq, self.now())
        pad = self._pad(seq, n)
        with evaluating_layers(seq.cache, sync):
            self.module(mx.array(seq.chunk_tokens(n, pad))[None], cache=seq.cache)
            trim(seq.cache, pad)
            maybe_quantize(seq)
            mx.eval([c.state for c in seq.cache])
        return self._book_chunk(seq, n, rec)

    def _prefill_done(self, seq: SequenceState) -> None:
        presize(seq.cache, None)  # decoding grows the cache by mlx-lm's step again
        super()._prefill_done(seq)
