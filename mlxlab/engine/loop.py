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

Overlap mode (``Engine(..., overlap=True)``): decode steps and prefill chunks run concurrently on
two mlx streams from two threads, so decoding does not wait for a chunk to finish.

* The **main thread** (whichever thread calls :meth:`Engine.step` / :meth:`Engine.run`) asks the
  policy for a plan each step as usual and runs the decode inline on its own stream. The plan's
  prefill chunks are handed to the prefill worker only if the worker is idle; otherwise they are
  skipped this step (the worker is still busy with the previous plan's chunks).
* The **prefill worker** is a daemon thread with its own stream (``mx.new_stream`` created inside
  the thread: mlx streams belong to the thread that made them). It runs the chunks of one
  handed-over plan, evaluates the caches, fills in that plan's :class:`StepRecord` (phase
  "prefill", ``thread`` "prefill", its own start and end) and publishes the sequences whose
  prefill finished; the main thread collects them at its next step, and they join the decode
  batch at the next decode. When nothing else can run, the main thread waits on the worker
  (a condition variable) instead of spinning.
* **Cache ownership.** A sequence's own KV cache belongs to the worker from hand-over until the
  main thread collects the worker's result; the main thread does not touch it (nor the
  sequence's prefill progress) in between. The batch cache, the decode inputs and every queue
  belong to the main thread only. While the worker holds a sequence, the policy does not see it
  in ``prefill_queue`` (it is neither idle nor schedulable), so plans stay valid for
  :func:`mlxlab.policies.check_plan` (which :func:`mlxlab.policies.next_plan` applies).
* **Records.** ``engine.steps`` holds the records of both threads in the order they started
  (a prefill record is appended at hand-over; its ``start_s`` is when the worker began it);
  ``thread`` says which thread ran it. ``policy.observe`` is only ever called on the main
  thread: worker records are delivered when their results are collected.
* **Lifetime.** The worker starts at the first hand-over and stops at the end of :meth:`Engine.run`
  or on :meth:`Engine.close` (a later step starts a new one). It holds only a weak reference to
  its engine, so an engine dropped without ``close()`` does not keep it alive for long. (Each
  worker makes a new mlx stream; on the CPU every mlx stream keeps an idle thread for the life
  of the process.)
* **mlx back-pressure.** ``eval``/``async_eval`` on any thread block while more than 10 scheduler
  tasks are in flight in the whole process (``MAX_ACTIVE_TASKS``, one global count; on the CPU a
  task is 10 dispatched ops). A chunk's whole graph queued at once keeps that count at 10, and
  the decode thread can then only enqueue as fast as the chunk's tasks finish: decode waits for
  the chunk after all. So by default (``overlap_sync="layer"``) the worker evaluates each layer
  as its keys and values reach the cache, which keeps at most about one layer of prefill in
  flight; ``"pipelined"`` queues each layer and then waits for the one before it (about two
  layers in flight, no idle device between layers); ``"chunk"`` queues the whole chunk at once.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache

from mlxlab.core.plan import KEY_ALIGN, SchedulerState
from mlxlab.core.presets import model_limits, module_of
from mlxlab.core.request import (
    DECODING,
    DONE,
    PREFILLING,
    Request,
    StepRecord,
    _Seq,
    pad_tokens,
    validate_request,
)
from mlxlab.engine.fused import can_fuse, packed_forward
from mlxlab.engine.warmup import warmup as run_warmup
from mlxlab.policies import make_policy, next_plan, with_key_align
from mlxlab.policies.base import Policy

OVERLAP_SYNCS = ("layer", "pipelined", "chunk")
WORKER_POLL_S = 1.0  # an idle prefill worker checks this often whether its engine still exists


def _kv_bytes_per_token(model) -> int:
    """KV bytes one token takes across all layers, from a LoadedModel or the module's args."""
    f = getattr(model, "kv_bytes_per_token", None)
    if callable(f):
        return int(f())
    a = module_of(model).args
    heads = getattr(a, "num_key_value_heads", None) or a.num_attention_heads
    head_dim = getattr(a, "head_dim", None) or a.hidden_size // a.num_attention_heads
    dtype = next((p.dtype for _, p in tree_flatten(module_of(model).parameters())
                  if mx.issubdtype(p.dtype, mx.floating)), mx.float32)
    return 2 * a.num_hidden_layers * heads * head_dim * dtype.size


_STREAMS = threading.local()


def _thread_stream():
    """The calling thread's engine stream on the default device, made on first use and then
    kept for the life of the thread (mlx streams belong to the thread that made them). Every
    engine on a thread shares it, as every ``generate_step`` call shares mlx-lm's
    ``generation_stream``. With a fresh stream per engine, single-request prefill on the H200 fell
    to 0.68-0.72x of mlx-lm's; with one stream per thread it measured 1.13-1.20x (2026-11-29)."""
    dev = mx.default_device()
    streams = getattr(_STREAMS, "by_device", None)
    if streams is None:
        streams = _STREAMS.by_device = {}
    key = str(dev)
    if key not in streams:
        streams[key] = mx.new_stream(dev)
    return streams[key]


KEY_ALIGN = KEY_ALIGN  # one default for the engine, the simulator and the policies


def can_pad(module) -> bool:
    """Whether a prefill chunk of ``module`` can run padded and be trimmed back: every layer's
    cache is a plain ``KVCache`` (trim only moves its offset back). Caches that keep a state
    (SSM layers) or a window (``RotatingKVCache``) are never padded."""
    try:
        return _all_plain(make_prompt_cache(module))
    except Exception:  # a module mlx-lm cannot make a cache for: leave chunks as they are
        return False


def _presize(caches, tokens: Optional[int]) -> None:
    """Make each plain ``KVCache`` of a new prompt allocate room for ``tokens`` at its first
    write (None: back to mlx-lm's 256-token growth step). mlx-lm's cache grows by 256 tokens at a
    time: a chunk of 256 or more reallocates every layer's keys and values at a size never seen
    before and copies the whole context into them, so a 16k prompt in 512-token chunks rewrote its
    growing cache 32 times. Sizing it once made that prefill 1.024x faster on the H200 (1.011x in
    2,048-token chunks; ``scripts/presize_probe.py``, ``data/results/h200/presize_probe.json``);
    the +30 ms spikes some chunks show at the same contexts in every repeat stayed. Values are
    unchanged: the same writes land in a larger buffer."""
    for c in caches or ():
        if type(c) is KVCache:
            if tokens is None:
                c.__dict__.pop("step", None)
            elif c.keys is None:
                c.step = max(KVCache.step, -(-int(tokens) // KVCache.step) * KVCache.step)


def _all_plain(caches) -> bool:
    return all(type(c) is KVCache for c in caches)


def _evaluating(update_and_fetch, last: Optional[list]):
    """Wrap a cache's ``update_and_fetch`` so each layer's keys and values are evaluated as they
    are written: at once (``last`` None: at most about one layer of work in flight), or queued
    while waiting for the previous layer's (``last`` holds those, shared by the layers: the device
    has the next layer queued while Python builds the one after; about two layers in flight)."""
    def wrapped(*args, **kwargs):
        out = update_and_fetch(*args, **kwargs)
        if last is None:
            mx.eval(out)
            return out
        mx.async_eval(out)
        if last:
            mx.eval(last.pop())  # already queued: this only waits for it
        last.append(out)
        return out
    return wrapped


def _maybe_quantize(seq: "_Seq") -> None:
    """Turn a quantized-KV sequence's plain caches into mlx-lm ``QuantizedKVCache`` once they hold
    ``quantized_kv_start`` tokens (mlx-lm's own ``maybe_quantize_kv_cache``, same rule)."""
    if seq.kv is not None:
        bits, group, start = seq.kv
        maybe_quantize_kv_cache(seq.cache, quantized_kv_start=start, kv_group_size=group, kv_bits=bits)


def greedy(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


class Engine:
    """Continuous-batching engine over an mlx-lm model.

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel` or an mlx-lm ``nn.Module``.
        policy: a policy name (see :data:`mlxlab.policies.POLICIES`) or a :class:`Policy`.
        chunk_size: prefill tokens per chunk (a policy may choose smaller chunks).
        sampler: maps logits (B, vocab) to token ids (B,); greedy by default.
        stop_tokens: token ids that end any request (e.g. the tokenizer's EOS ids).
        overlap: run prefill chunks on a worker thread and stream, concurrently with decode
            steps (see the module docstring). Call :meth:`close` (or use the engine as a context
            manager) when stepping by hand; :meth:`run` stops the worker itself.
        overlap_sync: how the prefill worker evaluates a chunk: "layer" (default) layer by
            layer, waiting for each; "pipelined" layer by layer with one layer queued ahead (no
            idle gap between layers on a GPU, about two layers in flight); "chunk" all at once.
            See "mlx back-pressure" in the module docstring.
        prefix_cache: a :class:`mlxlab.engine.prefix_cache.PrefixCache`: each submitted prompt starts
            from the KV of its longest cached prefix (only the rest is prefilled), and each
            finished request's prompt + output go into the cache (a chat's next turn hits).
        warmup: "off", "token" (one short request after load, as the case study's "Hi") or
            "shapes" (also a prompt at ``chunk_size`` and decode at batch sizes 1 and 8), run
            before the engine's clock starts; the seconds spent are in ``warmup_s``.
        kv_budget_bytes: admission by KV memory: a request whose prompt + ``max_tokens`` of KV
            could never fit is refused at submit; one that does not fit beside the requests
            already started waits (the policy does not see it) until enough finish.
        cache_limit_bytes, memory_limit_bytes: mlx's allocator cache and memory limits
            (``mx.set_cache_limit`` / ``mx.set_memory_limit``; they are process-wide).
        fuse: run a step's decode and its prefill chunks in **one** packed forward pass
            (:mod:`mlxlab.engine.fused`: every token through the linear layers at once, attention per
            sequence) instead of back to back. None (default) follows the policy (``stall_free``
            fuses); True requires a model that can (llama/qwen2 families) and fuses every mixed
            step; False never. Not used in overlap mode (there decode and chunks run apart).
        key_align: run the final chunk of each prompt padded (with copies of its last token,
            after it, so no real token sees them) to a key length that is a multiple of this,
            then trim the pad back off the cache. On mlx's CUDA backend a chunk whose key length
            is off a multiple of 8 runs a slower attention path: at 8k context a 2047-token chunk
            took 140 ms against 92 for 2048 (``scripts/chunk_probe.py``), and every prompt of
            even length ends in such a chunk. 1 turns padding off; models whose caches cannot be
            trimmed (SSM or sliding-window layers) are never padded. Greedy output is unchanged.
            A policy given by name that takes ``key_align`` (``stall_free``, ``slo``) gets this
            value too unless ``policy_options`` set it: its chunks then end aligned as well.
        policy_options: keyword options for a policy given by name.

    The engine is not thread-safe: call its methods from one thread.
    """

    def __init__(self, model, *, policy: "str | Policy" = "interleave", chunk_size: int = 2048,
                 sampler: Optional[Callable[[mx.array], mx.array]] = None,
                 stop_tokens: Sequence[int] = (), clock: Callable[[], float] = time.perf_counter,
                 overlap: bool = False, overlap_sync: str = "layer", prefix_cache=None,
                 warmup: str = "off", kv_budget_bytes: Optional[int] = None,
                 cache_limit_bytes: Optional[int] = None, memory_limit_bytes: Optional[int] = None,
                 fuse: Optional[bool] = None, key_align: int = KEY_ALIGN, **policy_options):
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if not isinstance(overlap, bool):
            raise ValueError(f"overlap must be True or False, got {overlap!r}")
        if not isinstance(key_align, int) or key_align < 1:
            raise ValueError(f"key_align must be a positive integer (1 turns padding off), got {key_align!r}")
        if overlap_sync not in OVERLAP_SYNCS:
            raise ValueError(f"overlap_sync must be one of {OVERLAP_SYNCS}, got {overlap_sync!r}")
        for name, v in (("kv_budget_bytes", kv_budget_bytes), ("cache_limit_bytes", cache_limit_bytes),
                        ("memory_limit_bytes", memory_limit_bytes)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ValueError(f"{name} must be a non-negative integer number of bytes, got {v!r}")
        if cache_limit_bytes is not None:
            mx.set_cache_limit(cache_limit_bytes)
        if memory_limit_bytes is not None:
            mx.set_memory_limit(memory_limit_bytes)
        self.model = model
        self.prefix_cache = prefix_cache
        self.kv_budget_bytes = kv_budget_bytes
        self.module = module_of(model)
        self.kv_bytes_per_token = _kv_bytes_per_token(model)
        self.vocab_size, self.max_context = model_limits(model)
        self.policy = make_policy(policy, **with_key_align(policy, key_align, policy_options))
        if fuse not in (None, True, False):
            raise ValueError(f"fuse must be None, True or False, got {fuse!r}")
        fusable, why = can_fuse(self.module)
        if fuse is True and not fusable:
            raise ValueError(f"fuse=True but this model cannot run packed steps ({why}); use fuse=False")
        self.fuse = bool(fusable and not overlap and (fuse if fuse is not None else getattr(self.policy, "fuse", False)))
        self.chunk_size = chunk_size
        self.key_align = key_align if can_pad(self.module) else 1
        self.sampler = sampler or greedy
        self.stop_tokens = frozenset(int(t) for t in stop_tokens)
        self._clock = clock
        self._t0 = clock()
        self.requests: List[Request] = []
        self.steps: List[StepRecord] = []
        self._queue: List[_Seq] = []  # waiting or prefilling, arrival order
        self._ready: List[_Seq] = []  # prefill done, joining the decode batch at the next decode
        self._decoding: List[_Seq] = []  # rows of the batch cache, in order
        self._solo: List[_Seq] = []  # decoding with a quantized KV cache, each in its own forward
        self._batch_cache: Optional[list] = None
        self._inputs: Optional[mx.array] = None  # next decode input per row (may be in flight)
        self._pending = None  # ([(tokens, rows)], step record) of a decode whose tokens are unread
        self._seqs: Dict[int, _Seq] = {}
        # overlap mode. Guarded by _cv (shared with the worker): _job, _result, _stop.
        # Main thread only: the rest.
        self.overlap = overlap
        self.overlap_sync = overlap_sync
        self._cv = threading.Condition()
        self._job = None  # (record, [(seq, tokens)]) handed to the worker, not yet taken
        self._result = None  # (record, finished seqs, error) published by the worker
        self._stop = False
        self._worker: Optional[threading.Thread] = None
        self._busy = False  # a job is out and its result not yet collected
        self._held: set = set()  # ids of the sequences the worker holds
        self.warmup_s: Dict[str, float] = {}
        if warmup != "off":
            self.warmup_s = run_warmup(lambda c: Engine(model, chunk_size=c), self.vocab_size, warmup,
                                       chunk_sizes=(chunk_size,), batch_sizes=(1, 8))
            self._t0 = clock()

    # ------------------------------------------------------------------ public API
    def now(self) -> float:
        """Seconds since the engine started."""
        return self._clock() - self._t0

    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = (),
               kv_bits: Optional[int] = None, kv_group_size: int = 64, quantized_kv_start: int = 0) -> Request:
        """Queue a request and return it; its fields fill in as the engine runs.

        ``kv_bits`` (None, 8 or 4) keeps this request's KV cache quantized with mlx-lm's
        ``QuantizedKVCache`` once it holds ``quantized_kv_start`` tokens, converted at the same
        points as ``generate_step(kv_bits=...)`` does (after each prefill chunk and each decode
        forward). mlx-lm has no batched quantized cache, so such a request decodes in a forward
        of its own beside the batch (one extra forward per quantized request per step).

        Raises ``ValueError`` (and changes nothing) for an empty prompt, a token id outside the
        vocabulary, ``max_tokens <= 0``, a request longer than the model's context, or a KV
        quantization this backend cannot run (found by a probe at the model's shape, cached)."""
        prompt = self._validate(prompt_tokens, max_tokens)
        kv = None
        if kv_bits is not None:
            from mlxlab.engine.kvquant import check_kv_bits, kv_shape

            if not isinstance(quantized_kv_start, int) or quantized_kv_start < 0:
                raise ValueError(f"quantized_kv_start must be a non-negative integer, got {quantized_kv_start!r}")
            shape = kv_shape(self.model)
            check_kv_bits(kv_bits, kv_group_size, shape.pop("head_dim"), **shape)
            kv = (int(kv_bits), int(kv_group_size), int(quantized_kv_start))
        if self.kv_budget_bytes is not None:
            need = (len(prompt) + max_tokens) * self._bytes_per_token(kv)
            if need > self.kv_budget_bytes:
                raise ValueError(f"this request needs {need / 2**20:.1f} MiB of KV cache ({len(prompt)} prompt + "
                                 f"{max_tokens} output tokens) but the engine's KV budget is "
                                 f"{self.kv_budget_bytes / 2**20:.1f} MiB: it could never run; shorten it, lower "
                                 f"max_tokens or raise kv_budget_bytes")
        req = Request(id=len(self.requests), prompt=prompt, max_tokens=int(max_tokens),
                      tenant=str(tenant), arrival_s=self.now() if arrival_s is None else float(arrival_s),
                      stop_tokens=self.stop_tokens | frozenset(int(t) for t in stop_tokens))
        self.requests.append(req)
        seq = _Seq(req, kv)
        self._seqs[req.id] = seq
        if self.prefix_cache is not None:
            n, caches = self.prefix_cache.lookup(prompt, self.module)
            if n:
                seq.cache, seq.prefilled, req.cached_tokens = caches, n, n
        if seq.prefilled == seq.prefill_tokens:
            self._ready.append(seq)
        else:
            self._queue.append(seq)
        return req

    @property
    def has_work(self) -> bool:
        return bool(self._queue or self._ready or self._active_decoding() or self._pending or self._busy)

    def state(self) -> SchedulerState:
        """The scheduler's view of the queues now. In overlap mode, sequences the prefill worker
        holds are left out of ``prefill_queue`` until it hands them back."""
        return SchedulerState(
            now_s=self.now(), chunk_size=self.chunk_size,
            prefill_queue=[s.view() for s in self._admitted() if s.req.id not in self._held],
            decoding=[s.view() for s in self._ready + self._active_decoding()],
        )

    def step(self) -> Optional[StepRecord]:
        """Plan and execute one step; returns its record, or None if there was nothing to do.

        In overlap mode the returned record is the step's decode, else the prefill record of the
        chunks just handed to the worker (still running: ``end_s`` is 0 until it finishes). When
        neither can run but the worker is busy, the step waits for the worker and plans again."""
        # Our own stream, as generate_step uses its own generation stream.
        with mx.stream(self._main_stream()):
            return self._step_overlap() if self.overlap else self._step()

    def _step(self) -> Optional[StepRecord]:
        state = self.state()
        plan = next_plan(self.policy, state)
        if plan.empty:
            self._flush()
            return None
        rec = self._new_record("")
        deferred, fused = False, False
        if plan.decode:
            deferred, fused = self._decode(rec, defer=not plan.prefill, chunks=plan.prefill if self.fuse else ())
        else:
            self._flush()
        for seq_id, n in (() if fused else plan.prefill):
            seq = self._seqs[seq_id]
            if self._run_chunk(seq, n, rec):
                self._prefilled(seq)
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
            self.close()
            if bar is not None:
                bar.close()
        return self.requests

    def close(self) -> None:
        """Stop the prefill worker thread (overlap mode) once its current chunks are done, and
        collect their result. Idempotent; the engine stays usable (a later step starts a new
        worker)."""
        worker = self._worker
        if worker is None:
            return
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        worker.join()
        self._worker = None
        self._collect()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self._flush()
        self.close()

    # ------------------------------------------------------------------ validation
    def _validate(self, prompt_tokens, max_tokens) -> List[int]:
        return validate_request(prompt_tokens, max_tokens, self.vocab_size, self.max_context)

    # ------------------------------------------------------------------ execution
    def _bytes_per_token(self, kv: Optional[tuple]) -> int:
        """KV bytes per token of a request: quantized if ``kv`` says so and the model can tell
        (a LoadedModel), else the full-precision figure (an upper bound)."""
        f = getattr(self.model, "kv_bytes_per_token", None)
        if kv is not None and callable(f):
            return int(f(kv[0], kv[1]))
        return self.kv_bytes_per_token

    def _kv_need(self, s: _Seq) -> int:
        return (len(s.req.prompt) + s.req.max_tokens) * self._bytes_per_token(s.kv)

    def _admitted(self) -> List[_Seq]:
        """The prefill queue less the waiting requests whose KV would not fit beside the ones
        already started (first come, first admitted: later arrivals wait behind one that
        does not fit, so a long prompt is not starved by short ones)."""
        if self.kv_budget_bytes is None:
            return self._queue
        started = lambda s: s.cache is not None or s.prefilled > 0  # noqa: E731
        committed = sum(self._kv_need(s) for s in self._seqs.values() if not s.req.done and started(s))
        out = []
        for s in self._queue:
            if not started(s):
                if committed + self._kv_need(s) > self.kv_budget_bytes:
                    break
                committed += self._kv_need(s)
            out.append(s)
        return out

    def memory(self) -> Dict[str, int]:
        """mlx's active, cache and peak memory in bytes (peak since process start or the last
        ``mx.reset_peak_memory()``)."""
        return {"active_bytes": mx.get_active_memory(), "cache_bytes": mx.get_cache_memory(),
                "peak_bytes": mx.get_peak_memory()}

    def _active_decoding(self) -> List[_Seq]:
        """Decoding sequences that still need a forward pass (batch rows, then quantized-KV ones)."""
        return [s for s in self._decoding + self._solo
                if not s.req.done and not s.stopped and s.issued < s.req.max_tokens]

    def _new_record(self, phase: str, thread: str = "main") -> StepRecord:
        rec = StepRecord(len(self.steps), self.now(), 0.0, phase, [], [], thread=thread)
        self.steps.append(rec)
        return rec

    def _drop_record(self, rec: StepRecord) -> None:
        i = self.steps.index(rec)
        del self.steps[i]
        for j in range(i, len(self.steps)):
            self.steps[j].index = j

    def _run_chunk(self, seq: _Seq, n: int, rec: StepRecord, sync: str = "chunk") -> bool:
        """Prefill ``n`` more prompt tokens of ``seq`` into its own cache (evaluated) and note the
        chunk in ``rec``; returns True if the sequence's prefill is complete. Runs on the main
        thread, or on the prefill worker in overlap mode. ``sync``: see ``overlap_sync``."""
        req = seq.req
        start = self._begin_chunk(seq)
        patched, last = [], ([] if sync == "pipelined" else None)
        for c in seq.cache if sync != "chunk" else ():  # evaluate as each layer's keys and values land
            try:  # (caches without update_and_fetch, e.g. ArraysCache, are evaluated with the chunk)
                c.update_and_fetch = _evaluating(c.update_and_fetch, last)
                patched.append(c)
            except AttributeError:
                pass
        pad = pad_tokens(start, n, seq.prefill_tokens, self.key_align)
        try:
            self.module(mx.array(self._chunk_tokens(seq, start, n, pad))[None], cache=seq.cache)
            self._trim(seq, pad, rec)
            _maybe_quantize(seq)
            mx.eval([c.state for c in seq.cache])
        finally:
            for c in patched:
                del c.update_and_fetch
        return self._end_chunk(seq, n, start, rec)

    def _begin_chunk(self, seq: _Seq) -> int:
        """Give a sequence about to prefill its cache and start time; returns where it starts."""
        if seq.cache is None:
            seq.cache = make_prompt_cache(self.module)
            _presize(seq.cache, seq.prefill_tokens + self.key_align)
        if seq.req.prefill_start_s is None:
            seq.req.state = PREFILLING
            seq.req.prefill_start_s = self.now()
        return seq.prefilled

    @staticmethod
    def _chunk_tokens(seq: _Seq, start: int, n: int, pad: int) -> List[int]:
        """The chunk's prompt tokens, then ``pad`` copies of its last (see ``key_align``)."""
        return seq.req.prompt[start:start + n] + [seq.req.prompt[start + n - 1]] * pad

    @staticmethod
    def _trim(seq: _Seq, pad: int, rec: StepRecord) -> None:
        """Take a padded chunk's pad tokens back off the sequence's cache (lazy: only the offset
        moves; the next write lands over them)."""
        if pad:
            for c in seq.cache:
                c.trim(pad)
            rec.padding[seq.req.id] = pad

    def _end_chunk(self, seq: _Seq, n: int, start: int, rec: StepRecord) -> bool:
        seq.prefilled += n
        rec.prefill.append((seq.req.id, n, start))
        return seq.prefilled == seq.prefill_tokens

    def _prefilled(self, seq: _Seq) -> None:
        _presize(seq.cache, None)  # decoding grows the cache by mlx-lm's step again
        self._queue.remove(seq)
        self._ready.append(seq)

    # ------------------------------------------------------------------ overlap mode
    def _main_stream(self):
        return _thread_stream()

    def _step_overlap(self) -> Optional[StepRecord]:
        while True:
            self._collect()
            state = self.state()
            plan = next_plan(self.policy, state)
            handed = None
            if plan.prefill and not self._busy:  # a busy worker skips this step's chunks
                handed = self._hand_over(plan.prefill)
            rec = None
            if plan.decode:
                rec = self._new_record("decode")
                self._decode(rec, defer=True)  # its tokens are read during the next step
                if not rec.decode_seqs:
                    self._drop_record(rec)
                    rec = None
            else:
                self._flush()
            if rec is not None or handed is not None:
                return rec if rec is not None else handed
            if not self._busy:
                return None
            self._collect(wait=True)  # nothing could run: wait for the worker, then plan again

    def _hand_over(self, chunks) -> StepRecord:
        """Give the plan's chunks (and those sequences' caches) to the prefill worker."""
        if self._worker is None or not self._worker.is_alive():
            with self._cv:
                self._stop = False
            self._worker = threading.Thread(target=_prefill_worker, args=(weakref.ref(self), self._cv),
                                             name="mlxlab-prefill", daemon=True)
            self._worker.start()
        rec = self._new_record("prefill", thread="prefill")
        self._held = {seq_id for seq_id, _ in chunks}
        self._busy = True
        with self._cv:
            self._job = (rec, [(self._seqs[seq_id], n) for seq_id, n in chunks])
            self._cv.notify_all()
        return rec

    def _collect(self, wait: bool = False) -> None:
        """Take back the worker's finished job (waiting for it if ``wait``): its sequences return
        to the main thread, finished prefills become ready, its record goes to the policy."""
        if not self._busy:
            return
        with self._cv:
            while wait and self._result is None:
                if self._worker is None or not self._worker.is_alive():
                    raise RuntimeError("the prefill worker stopped without finishing its chunks")
                self._cv.wait(WORKER_POLL_S)
            result, self._result = self._result, None
        if result is None:
            return
        rec, finished, error = result
        self._busy = False
        self._held = set()
        if error is not None:
            raise RuntimeError(f"prefill worker failed: {error!r}; the caches of sequences it held may "
                               f"be partly written: build a new Engine") from error
        for seq in finished:
            self._prefilled(seq)
        self.policy.observe(rec.as_dict())

    def _join_ready(self) -> None:
        """Move sequences whose prefill is done into the batch cache and the decode inputs."""
        ready, self._ready = self._ready, []
        for s in ready:
            if s.cache is None:
                s.cache = make_prompt_cache(self.module)
            if s.req.prefill_start_s is None:
                s.req.prefill_start_s = self.now()
            s.req.state = DECODING
        for s in [s for s in ready if s.kv is not None]:  # quantized KV: decodes in its own forward
            s.solo_input = mx.array([s.req.prompt[-1]], dtype=mx.uint32)
            self._solo.append(s)
        ready = [s for s in ready if s.kv is None]
        if not ready:
            return
        caches = [s.cache for s in ready]
        inputs = mx.array([s.req.prompt[-1] for s in ready], dtype=mx.uint32)
        for s in ready:
            s.cache = None
        if self._batch_cache is None and len(caches) == 1 and _all_plain(caches[0]):
            # A lone stream decodes on its own KVCache, exactly as generate_step does: no copy,
            # no mask array, no per-layer offset arrays (worth ~20% of decode speed on a GPU).
            self._batch_cache, self._inputs = caches[0], inputs
        else:
            merged = [layer[0].merge(list(layer)) for layer in zip(*caches)]
            if self._batch_cache is None:
                self._batch_cache, self._inputs = merged, inputs
            else:
                if _all_plain(self._batch_cache):  # the lone stream becomes row 0 of a batch
                    self._batch_cache = [c.merge([c]) for c in self._batch_cache]
                for c, m in zip(self._batch_cache, merged):
                    c.extend(m)
                self._inputs = mx.concatenate([self._inputs.astype(mx.uint32), inputs])
        self._decoding.extend(ready)

    def _drop_rows(self, keep: List[int]) -> None:
        if not keep:
            self._batch_cache, self._inputs, self._decoding = None, None, []
            return
        if len(keep) == 1 and all(isinstance(c, BatchKVCache) for c in self._batch_cache):
            self._batch_cache = [c.extract(keep[0]) for c in self._batch_cache]  # back to a lone KVCache
        else:
            for c in self._batch_cache:
                c.filter(keep)
        self._inputs = self._inputs[mx.array(keep)]
        self._decoding = [self._decoding[i] for i in keep]

    def _decode(self, rec: StepRecord, defer: bool, chunks=()) -> tuple:
        """One batched decode forward; returns (tokens left in flight, chunks fused). With
        ``chunks`` (the plan's (seq id, tokens)) and batch rows to decode, the chunks run in the
        same packed forward (:func:`mlxlab.engine.fused.packed_forward`) and are done on return."""
        # Rows with no tokens left to produce (max_tokens issued, or a stop token read) leave
        # the batch before the forward, so no compute is spent on them.
        active = set(map(id, self._active_decoding()))
        keep = [i for i, s in enumerate(self._decoding) if id(s) in active]
        if len(keep) < len(self._decoding):
            for s in self._decoding:
                if id(s) not in active:
                    self._remember(s)
            rec.dropped = len(self._decoding) - len(keep)
            self._drop_rows(keep)
        self._solo = [s for s in self._solo if id(s) in active]
        if self._ready:
            n = len(self._decoding)
            self._join_ready()
            rec.joined = len(self._decoding) - n
        if not self._decoding and not self._solo:
            self._flush()
            return False, False
        groups = []  # (tokens, rows): the batch forward, then one per quantized-KV sequence
        packed = [(self._seqs[i], n) for i, n in chunks] if self._decoding else []
        if packed:
            starts = [self._begin_chunk(seq) for seq, _ in packed]
            pads = [pad_tokens(a, n, seq.prefill_tokens, self.key_align) for (seq, n), a in zip(packed, starts)]
            segs = [(mx.array(self._chunk_tokens(seq, a, n, p)), seq.cache)
                    for (seq, n), a, p in zip(packed, starts, pads)]
            logits = packed_forward(self.module, self._inputs, self._batch_cache, segs)
            rec.fused = True
            for (seq, _), p in zip(packed, pads):
                self._trim(seq, p, rec)
                _maybe_quantize(seq)
            groups.append((self.sampler(logits), list(self._decoding)))
        elif self._decoding:
            logits = self.module(self._inputs[:, None], cache=self._batch_cache)[:, -1, :]
            groups.append((self.sampler(logits), list(self._decoding)))
        for s in self._solo:
            logits = self.module(s.solo_input[:, None], cache=s.cache)[:, -1, :]
            _maybe_quantize(s)  # where generate_step quantizes: after the forward
            groups.append((self.sampler(logits), [s]))
        mx.async_eval([t for t, _ in groups] + [c.state for seq, _ in packed for c in seq.cache])
        rows = [s for _, g in groups for s in g]
        for s in rows:
            s.issued += 1
        rec.decode_seqs = [s.req.id for s in rows]
        rec.decode_context_tokens = sum(s.prefill_tokens + s.issued for s in rows)
        self._flush()  # read the previous step's tokens while this one computes
        for tokens, g in groups:
            if g[0].kv is None:
                self._inputs = tokens
            else:
                g[0].solo_input = tokens
        self._pending = (groups, rec)
        for (seq, n), a in zip(packed, starts if packed else ()):
            if self._end_chunk(seq, n, a, rec):
                self._prefilled(seq)
        if defer:
            return True, bool(packed)
        self._flush()
        if packed:  # the chunks are a scheduling point like any other: done before the next decision
            mx.eval([c.state for seq, _ in packed for c in seq.cache])
        return False, bool(packed)

    def flush(self) -> None:
        """Read any decode tokens still in flight (``run`` does this when it ends)."""
        self._flush()

    def _flush(self) -> None:
        """Read the in-flight decode tokens (if any) and hand them to their requests."""
        if self._pending is None:
            return
        groups, rec = self._pending
        self._pending = None
        values, rows = [], []
        for tokens, g in groups:
            values += tokens.tolist()
            rows += g
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

    def _remember(self, s: _Seq) -> None:
        """Put a finished row's prompt + read output and its KV into the prefix cache. The row
        holds the KV of every token fed so far (the last output token is never fed); the cache
        stores as many positions as the row has, keyed by those tokens."""
        if self.prefix_cache is None or s.remembered or s not in self._decoding:
            return
        s.remembered = True
        i = self._decoding.index(s)
        kv = self._batch_cache if _all_plain(self._batch_cache) else [c.extract(i) for c in self._batch_cache]
        self.prefix_cache.insert(s.req.prompt + s.req.output_tokens, kv)

    def _finish(self, req: Request, reason: str, t: float) -> None:
        self._remember(self._seqs[req.id])
        req.state = DONE
        req.finish_reason = reason
        req.finish_s = t


def _prefill_worker(engine_ref, cv: threading.Condition) -> None:
    """The overlap-mode prefill thread: runs one handed-over job at a time on its own stream.
    Holds its engine only while running a job, so a dropped engine lets it exit."""
    stream = mx.new_stream(mx.default_device())  # streams are per thread: make it here
    while True:
        with cv:
            while True:
                eng = engine_ref()
                if eng is None or (eng._job is None and eng._stop):
                    return
                if eng._job is not None:
                    job, eng._job = eng._job, None
                    break
                eng = None
                cv.wait(WORKER_POLL_S)
        rec, chunks = job
        finished, error = [], None
        try:
            with mx.stream(stream):
                rec.start_s = eng.now()
                for seq, n in chunks:
                    if eng._run_chunk(seq, n, rec, sync=eng.overlap_sync):
                        finished.append(seq)
        except BaseException as e:  # handed to the main thread, raised there
            error = e
        rec.end_s = eng.now()
        with cv:
            eng._result = (rec, finished, error)
            cv.notify_all()
        eng = job = rec = chunks = finished = error = None
