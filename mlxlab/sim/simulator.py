"""A discrete-event simulator of the engine: the same policies and queues on a virtual clock.

:class:`Simulator` has the interface of :class:`mlxlab.engine.Engine` (``submit``, ``step``,
``now``, ``has_work``, ``requests``, ``steps``, ``flush``, ``run``) plus ``advance_to(t)``, so
:func:`mlxlab.core.runner.run_workload` drives either one and returns the same per-request and timeline
tables. Where the engine runs a plan on a model, the simulator charges it to a cost model
(:class:`mlxlab.core.costmodel.StepCostModel`, or anything with the same ``predict``) and moves its
clock on; no model, no MLX computation.

What is mirrored from the engine (non-overlap mode), rule by rule:

* queues: the prefill queue in arrival order; a prompt's last token is not prefilled (it is the
  first decode input), so a one-token prompt is ready to decode at once; a finished prefill joins
  the decode batch at the next step that decodes (sequences waiting to join count as decoding
  for the policy);
* a decode step advances every decoding sequence by one token; a sequence leaves the batch once
  ``max_tokens`` forwards were issued; ``decode_context_tokens`` is the sum over the batch of
  (prefill tokens + forwards issued, this one included);
* the plan comes from ``policy.schedule(state)`` and is checked with
  :func:`mlxlab.policies.check_plan`; an empty plan does nothing;
* times: a step starts at the clock plus the model's ``overhead_s`` (the host time between two
  engine steps: run loop, scheduler state, ``policy.schedule``). Its decode part costs
  ``predict(batch, kv, join_tokens=J, drop_tokens=D)`` and its chunks the rest of
  ``predict(batch, kv, chunks)``, each chunk in plan order (a prompt's ``prefill_start_s`` is
  when its first chunk starts). ``kv`` is the sum of the rows' contexts; a batch of two or more
  also reads the left padding of the engine's ``BatchKVCache`` (batch x longest context less
  ``kv``), charged as ``decode_padding_tokens``. ``J``: when finished prefills join and the
  batch then has two or more rows, rows x longest context (the merge/extend copies every row at
  the longest width); ``D``: when rows leave and some remain, kept rows x the old longest context (``filter``), or the one
  row's context (``extract`` back to a plain cache);
* pipelining (with a measured ``tail_s``): decode forwards run one at a time; a forward started
  at ``max(step start, end of the previous forward)`` ends ``decode`` seconds later, and the
  engine's Python returns from queueing it ``tail_s`` before that end (at most ``decode``
  earlier). A decode-only step ends (for the clock) when Python returns; its tokens are read,
  and stamped, by the next step: after that step queued its own forward (a decode or mixed
  step), at its start (a prefill-only step, which waits for the forward), or when the run loop
  finds nothing to plan (the clock then waits for the forward). A mixed step reads its own
  tokens when its forward ends, then runs its chunks. So, as in the engine, a stream's tokens
  come one forward apart in a run of decode-only steps, ``tail_s`` apart before a mixed step or
  at the end of a run, and the first decode after a chunk costs ``tail_s`` less than the rest
  (nothing was in flight). With ``tail_s`` None (profiles without it) a step's tokens are
  stamped when its own decode part ends and the clock moves to that time;
* packed steps (``fuse``, on by default under ``stall_free`` as in the engine): a step with
  decodes and chunks is one forward charged ``predict(batch, kv, chunks)`` as a whole; its chunks
  start with it and its tokens are read at its end (the profile times unpacked steps, so this
  charges a packed step what the two parts cost back to back: an upper bound where packing
  saves time);
* deferred reads: a request finished by a decode-only step is marked done (and its tokens
  appended, which the policy sees as ``generated``) when they are read, one step later, as in
  the engine; ``policy.observe`` is called at the same moments.
* output tokens are a placeholder id (``output_token``, default 0); stop tokens work as in the
  engine (a stop id equal to ``output_token`` ends a request at its first token).

Not simulated: the engine's overlap mode (two streams), per-request warm-up or compile costs,
and anything the cost model does not see.

``noise``: the standard deviation of a lognormal multiplicative factor (mean 1:
``exp(noise * z - noise**2 / 2)``) drawn per step from ``numpy.random.default_rng(seed)``, for
sensitivity studies. With ``noise=0`` a run is deterministic.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from mlxlab.core.plan import KEY_ALIGN, SchedulerState
from mlxlab.core.presets import DEFAULT_MAX_CONTEXT
from mlxlab.core.request import (
    DECODING,
    DONE,
    PREFILLING,
    Request,
    StepRecord,
    pad_tokens,
    validate_request,
)
from mlxlab.core.request import _Seq as _EngineSeq
from mlxlab.policies import make_policy, next_plan, with_key_align
from mlxlab.policies.base import Policy

DEFAULT_VOCAB_SIZE = 2**31 - 1  # accept any non-negative 32-bit id unless told the model's


class _SimSeq(_EngineSeq):
    """The engine's sequence state; the simulator keeps no KV cache, so ``started`` stands in
    for the engine's "cache is not None"."""

    __slots__ = ("started",)

    def __init__(self, req: Request):
        super().__init__(req)
        self.started = False  # its first chunk ran


def _as_cost_model(cost_model):
    if isinstance(cost_model, (str, Path)):
        from mlxlab.sim.profiling import load_profile

        return load_profile(cost_model)
    if isinstance(cost_model, dict):
        from mlxlab.sim.profiling import cost_model_from_dict

        return cost_model_from_dict(cost_model)
    if not hasattr(cost_model, "predict"):
        raise ValueError(f"cost_model must have predict(decode_batch, decode_context_tokens, chunks) "
                         f"or be a profile path/name, got {cost_model!r}")
    return cost_model


class Simulator:
    """The engine's scheduler loop on a virtual clock (see the module docstring).

    Args:
        cost_model: a :class:`mlxlab.core.costmodel.StepCostModel` (or any object with
            ``predict(decode_batch, decode_context_tokens, chunks) -> seconds``), a profile dict,
            or a profile path/name for :func:`mlxlab.sim.profiling.load_profile`.
        policy, chunk_size, policy_options: as for :class:`mlxlab.engine.Engine` (``cost_model`` is
            positional only, so ``slo``'s own ``cost_model=`` option passes through).
        vocab_size, max_context: the limits :meth:`submit` checks (take them from the model being
            simulated: :meth:`for_model`).
        stop_tokens: token ids that end any request.
        noise: lognormal step-time noise (sigma); 0 for none.
        seed: seed of the noise generator.
        output_token: the id every generated token gets.
        padded_kv: charge a decode of two or more sequences for the left padding its
            ``BatchKVCache`` reads beside the rows' contexts (``batch x longest`` less their sum:
            the cost model's ``decode_padding_tokens``, or as context for a cost model without
            that term); False charges the contexts alone. The step record's
            ``decode_context_tokens`` is the sum either way, as in the engine.
        host_timing: use the cost model's ``overhead_s`` and ``tail_s`` (False: charge neither,
            stamp tokens when their step ends; for ablations).
        rebatch_costs: charge ``join_tokens`` / ``drop_tokens`` when the decode batch changes.
        fuse: as :class:`mlxlab.engine.Engine`'s: a step with decodes and chunks is one packed
            forward, charged ``predict(batch, kv, chunks)`` as a whole, its chunks starting with
            it and its tokens stamped at its end (None: follow the policy, as ``stall_free``).
        packed_charge: charge a packed step's decode without its fixed cost
            (``predict(..., packed=True)``: one forward, the chunks'); False charges the decode
            and the chunks back to back, an upper bound (the behaviour before 2026-11-29).
        key_align: as the engine's: the final chunk of a prompt is charged padded to a key length
            that is a multiple of this (:func:`mlxlab.engine.pad_tokens`); 1 for none.
            :meth:`for_model` sets 1 for a model the engine would not pad.
    """

    def __init__(self, cost_model, /, *, policy: "str | Policy" = "interleave", chunk_size: int = 2048,
                 vocab_size: int = DEFAULT_VOCAB_SIZE, max_context: int = DEFAULT_MAX_CONTEXT,
                 stop_tokens: Sequence[int] = (), noise: float = 0.0, seed: int = 0,
                 output_token: int = 0, padded_kv: bool = True, host_timing: bool = True,
                 rebatch_costs: bool = True, fuse: Optional[bool] = None, key_align: int = KEY_ALIGN,
                 packed_charge: bool = True, **policy_options):
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if not isinstance(key_align, int) or key_align < 1:
            raise ValueError(f"key_align must be a positive integer (1 turns padding off), got {key_align!r}")
        if not (isinstance(noise, (int, float)) and noise >= 0 and math.isfinite(noise)):
            raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if not isinstance(max_context, int) or max_context < 2:
            raise ValueError(f"max_context must be an integer >= 2, got {max_context!r}")
        if not 0 <= int(output_token) < vocab_size:
            raise ValueError(f"output_token {output_token} is outside the vocabulary [0, {vocab_size})")
        self.cost_model = _as_cost_model(cost_model)
        self.policy = make_policy(policy, **with_key_align(policy, key_align, policy_options))
        if fuse not in (None, True, False):
            raise ValueError(f"fuse must be None, True or False, got {fuse!r}")
        # as the engine: packed steps when the policy asks for them (the simulator has no model
        # to check; fuse=False simulates an engine whose model cannot pack)
        self.fuse = bool(fuse if fuse is not None else getattr(self.policy, "fuse", False))
        self.chunk_size = chunk_size
        self.key_align = key_align
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.stop_tokens = frozenset(int(t) for t in stop_tokens)
        self.noise = float(noise)
        self.seed = seed
        self.output_token = int(output_token)
        self.padded_kv = bool(padded_kv)
        self._rng = np.random.default_rng(seed)
        self._now = 0.0
        self.requests: List[Request] = []
        self.steps: List[StepRecord] = []
        self._queue: List[_SimSeq] = []
        self._ready: List[_SimSeq] = []
        self._decoding: List[_SimSeq] = []
        self._pending = None  # (rows, time its forward ends, record) of a decode-only step not yet read
        self._seqs: Dict[int, _SimSeq] = {}
        self._overhead = float(getattr(self.cost_model, "overhead_s", 0.0) or 0.0) if host_timing else 0.0
        tail = getattr(self.cost_model, "tail_s", None) if host_timing else None
        self._tail = None if tail is None else float(tail)
        self._rebatch = bool(rebatch_costs)
        self._busy_until = 0.0  # when the last decode forward ends
        # a packed decode rides on its chunks' forward (StepCostModel.predict(packed=True)); a
        # duck-typed cost model without that argument is charged back to back
        params = inspect.signature(self.cost_model.predict).parameters
        self._packed_kw = {"packed": True} if packed_charge and "packed" in params else {}
        # a batch's left padding is its own term (StepCostModel's decode_padding_tokens); a
        # duck-typed cost model without it is charged the padding as context
        self._padding_term = "decode_padding_tokens" in params
        # rows that began decoding (a lone row's first decode too): a packed step pays for them
        self._joined_term = "joined" in params

    @classmethod
    def for_model(cls, model, cost_model, /, **kwargs) -> "Simulator":
        """A simulator with the vocabulary and context limits of ``model``: a
        :class:`mlxlab.engine.models.LoadedModel`, a preset name, or a config dict."""
        if isinstance(model, str):
            from mlxlab.core.presets import preset_config

            model = preset_config(model)
        if isinstance(model, dict):
            vocab = int(model["vocab_size"])
            ctx = int(model.get("max_position_embeddings") or DEFAULT_MAX_CONTEXT)
        else:
            from mlxlab.core.presets import model_limits, module_of
            from mlxlab.engine.loop import can_pad

            vocab, ctx = model_limits(model)
            if not can_pad(module_of(model)):
                kwargs.setdefault("key_align", 1)
        kwargs.setdefault("vocab_size", vocab)
        kwargs.setdefault("max_context", ctx)
        return cls(cost_model, **kwargs)

    # ------------------------------------------------------------------ public API
    def now(self) -> float:
        """Seconds on the virtual clock (0 = simulator start)."""
        return self._now

    def advance_to(self, t: float) -> None:
        """Let the virtual clock reach ``t`` (it never goes back)."""
        if t > self._now:
            self._now = float(t)

    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = ()) -> Request:
        """Queue a request and return it (an :class:`mlxlab.engine.Request`). Raises
        ``ValueError`` with the engine's messages for an empty prompt, an id outside the
        vocabulary, ``max_tokens <= 0`` or a request longer than ``max_context``."""
        prompt = validate_request(prompt_tokens, max_tokens, self.vocab_size, self.max_context)
        req = Request(id=len(self.requests), prompt=prompt, max_tokens=int(max_tokens),
                      tenant=str(tenant), arrival_s=self.now() if arrival_s is None else float(arrival_s),
                      stop_tokens=self.stop_tokens | frozenset(int(t) for t in stop_tokens))
        self.requests.append(req)
        seq = _SimSeq(req)
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
        """The scheduler's view of the queues now (as :meth:`mlxlab.engine.Engine.state`)."""
        return SchedulerState(now_s=self.now(), chunk_size=self.chunk_size,
                              prefill_queue=[s.view() for s in self._queue],
                              decoding=[s.view() for s in self._ready + self._active_decoding()])

    def step(self) -> Optional[StepRecord]:
        """Plan and charge one step; returns its record, or None if there was nothing to do."""
        state = self.state()
        plan = next_plan(self.policy, state)
        if plan.empty:
            self._flush()
            return None
        t = self._now + self._overhead
        rec = StepRecord(len(self.steps), t, 0.0, "", [], [])
        self.steps.append(rec)
        factor = self._noise_factor()
        cm = self.cost_model
        rows: List[_SimSeq] = []
        decode_ctx = 0
        decode_kw: dict = {}  # the batch's left padding, when the cost model charges it apart
        deferred = False
        if plan.decode:
            active = set(map(id, self._active_decoding()))
            kept = [s for s in self._decoding if id(s) in active]
            drop_tokens = 0
            if 0 < len(kept) < len(self._decoding):  # rows leave a batch: filter, or extract the last one
                width = max(s.prefill_tokens + s.issued for s in self._decoding)
                drop_tokens = (len(kept) * width if len(kept) > 1
                               else kept[0].prefill_tokens + kept[0].issued)
            rec.dropped = len(self._decoding) - len(kept)
            self._decoding = kept
            join_tokens = 0
            if self._ready:
                n_before = len(self._decoding)
                self._join_ready(t)
                rec.joined = len(self._decoding) - n_before
                if len(self._decoding) > 1:  # merged into a BatchKVCache (a lone stream keeps its cache)
                    join_tokens = len(self._decoding) * max(s.prefill_tokens + s.issued for s in self._decoding)
            rows = list(self._decoding)
        fused = bool(rows and plan.prefill and self.fuse)
        rec.fused = fused
        if rows:
            for s in rows:
                s.issued += 1
            rec.decode_seqs = [s.req.id for s in rows]
            contexts = [s.prefill_tokens + s.issued for s in rows]
            rec.decode_context_tokens = sum(contexts)  # the engine's record: the sum
            # a batch of two or more is one BatchKVCache, left-padded to its longest row: the
            # forward also reads the padding, priced apart (or as context, see _padding_term)
            decode_ctx = sum(contexts)
            if self.padded_kv and len(rows) > 1:
                pad = len(rows) * max(contexts) - decode_ctx
                if self._padding_term:
                    decode_kw["decode_padding_tokens"] = pad
                else:
                    decode_ctx += pad
        if fused:  # one packed forward: the chunks start with it, the tokens come at its end
            chunks = [self._charged(self._seqs[i], n) for i, n in plan.prefill]
            total = max(0.0, cm.predict(len(rows), decode_ctx, chunks, **self._rebatch_kw(join_tokens, drop_tokens, rec),
                                        **self._packed_kw, **decode_kw, **self._joined_kw(rec)))
            start = t if self._tail is None else max(t, self._busy_until)
            self._flush(read_at=t)  # the previous decode-only step's tokens, read after queueing this one
            for seq_id, n in plan.prefill:
                self._chunk(self._seqs[seq_id], n, t, rec)
            t = start + total * factor
            self._busy_until = t
            self._pending = (rows, t, rec)
            self._flush(read_at=t)
        elif rows:
            decode_s = max(0.0, cm.predict(len(rows), decode_ctx, [], **self._rebatch_kw(join_tokens, drop_tokens, rec),
                                           **decode_kw))
            decode_s *= factor
            if self._tail is None:  # tokens stamped when their own step ends
                t += decode_s
                self._flush()  # the previous decode-only step's tokens are read during this one
                ready = t
            else:  # one forward at a time; Python returns from queueing it ``tail`` before it ends
                ready = max(t, self._busy_until) + decode_s
                self._busy_until = ready
                t = max(t, ready - min(self._tail, decode_s))
                self._flush(read_at=t)  # the previous decode-only step's tokens, read after queueing this one
            self._pending = (rows, ready, rec)
            if plan.prefill:
                t = max(t, ready)
                self._flush(read_at=t)  # a step with chunks reads its own tokens before running them
            else:
                deferred = True
        else:
            t = self._flush(read_at=t)  # waits for a forward still running
        if plan.prefill and not fused:
            chunks = [self._charged(self._seqs[seq_id], n) for seq_id, n in plan.prefill]
            total = (cm.predict(len(rows), decode_ctx, chunks, **decode_kw)
                     - (cm.predict(len(rows), decode_ctx, [], **decode_kw) if rows else 0.0))
            each = [max(0.0, cm.predict(0, 0, [c])) for c in chunks]
            scale = (max(0.0, total) / sum(each)) if sum(each) > 0 else 0.0
            for (seq_id, n), cost in zip(plan.prefill, each):
                self._chunk(self._seqs[seq_id], n, t, rec)
                t += cost * scale * factor
        if not rec.decode_seqs and not rec.prefill:  # as the engine: nothing ran
            self.steps.pop()
            return None
        self._now = max(self._now, t)
        rec.phase = "mixed" if (rec.decode_seqs and rec.prefill) else ("decode" if rec.decode_seqs else "prefill")
        if not deferred:
            rec.end_s = t
            self.policy.observe(rec.as_dict())
        return rec

    def run(self, progress: bool = False) -> List[Request]:
        """Step until every submitted request is done; returns all requests."""
        while self.has_work:
            if self.step() is None and not self.has_work:
                break
        self._flush()
        return self.requests

    def flush(self) -> None:
        """Read any decode tokens still pending (``run`` does this when it ends)."""
        self._flush()

    def close(self) -> None:
        """Nothing to release (the engine's interface)."""

    def __enter__(self) -> "Simulator":
        return self

    def __exit__(self, *exc) -> None:
        self._flush()

    def __repr__(self) -> str:
        return (f"Simulator(policy={self.policy!r}, chunk_size={self.chunk_size}, "
                f"cost_model={getattr(self.cost_model, 'source', type(self.cost_model).__name__)!r}, "
                f"noise={self.noise})")

    # ------------------------------------------------------------------ internals
    def _noise_factor(self) -> float:
        if not self.noise:
            return 1.0
        return float(math.exp(self.noise * self._rng.standard_normal() - self.noise ** 2 / 2))

    def _active_decoding(self) -> List[_SimSeq]:
        return [s for s in self._decoding
                if not s.req.done and not s.stopped and s.issued < s.req.max_tokens]

    def _charged(self, seq: _SimSeq, n: int) -> tuple:
        """The chunk as the cost model charges it: (tokens, context), and the pad tokens third
        when the engine would run it padded."""
        pad = pad_tokens(seq.prefilled, n, seq.prefill_tokens, self.key_align)
        return (n, seq.prefilled, pad) if pad else (n, seq.prefilled)

    def _chunk(self, seq: _SimSeq, n: int, t: float, rec: StepRecord) -> None:
        """Book a chunk of ``n`` prompt tokens starting at ``t``; a finished prefill becomes ready."""
        if not seq.started:
            seq.started = True
            seq.req.state = PREFILLING
            seq.req.prefill_start_s = t
        rec.prefill.append((seq.req.id, n, seq.prefilled))
        pad = pad_tokens(seq.prefilled, n, seq.prefill_tokens, self.key_align)
        if pad:
            rec.padding[seq.req.id] = pad
        seq.prefilled += n
        if seq.prefilled == seq.prefill_tokens:
            self._queue.remove(seq)
            self._ready.append(seq)

    def _join_ready(self, t: float) -> None:
        ready, self._ready = self._ready, []
        for s in ready:
            s.req.state = DECODING
            if s.req.prefill_start_s is None:
                s.req.prefill_start_s = t
        self._decoding.extend(ready)

    def _rebatch_kw(self, join_tokens: int, drop_tokens: int, rec: StepRecord) -> dict:
        """The batch-change terms of this step: the bytes copied and, as the engine's record
        counts them, the rows merged into a batch of two or more and whether the batch changed."""
        join_rows = rec.joined if len(rec.decode_seqs) >= 2 else 0
        if not (join_tokens or drop_tokens or join_rows or rec.dropped) or not self._rebatch:
            return {}
        return {"join_tokens": join_tokens, "drop_tokens": drop_tokens, "join_rows": join_rows,
                "batch_change": bool(join_rows or rec.dropped)}

    def _joined_kw(self, rec: StepRecord) -> dict:
        """The rows that began decoding at this step, for a cost model that charges them."""
        return {"joined": rec.joined} if (rec.joined and self._joined_term and self._rebatch) else {}

    def _flush(self, read_at: Optional[float] = None) -> float:
        """Read the pending decode-only step's tokens at ``read_at`` (default: the clock), or when
        its forward ends if that is later; returns the read time. Called without ``read_at`` (an
        empty plan, :meth:`flush`) the clock waits for the read, as the engine blocks on it."""
        at = self._now if read_at is None else read_at
        if self._pending is None:
            return at
        rows, ready, rec = self._pending
        self._pending = None
        t = ready if self._tail is None else max(ready, at)
        if read_at is None:
            self._now = max(self._now, t)
        if rec.end_s == 0.0 and rec.phase:  # a deferred decode-only step ends when its tokens are read
            rec.end_s = t
            self.policy.observe(rec.as_dict())
        for s in rows:
            req = s.req
            if req.done or s.stopped:
                continue
            tok = self.output_token
            req.output_tokens.append(tok)
            req.token_times_s.append(t)
            if tok in req.stop_tokens:
                s.stopped = True
                self._finish(req, "stop", t)
            elif len(req.output_tokens) >= req.max_tokens:
                self._finish(req, "length", t)
        return max(t, at)

    @staticmethod
    def _finish(req: Request, reason: str, t: float) -> None:
        req.state = DONE
        req.finish_reason = reason
        req.finish_s = t


def simulate(cost_model, workload, *, policy: "str | Policy" = "interleave", chunk_size: int = 2048,
             model=None, noise: float = 0.0, seed: int = 0, **policy_options):
    """Run ``workload`` on a fresh :class:`Simulator` with :func:`mlxlab.core.runner.run_workload`;
    returns its :class:`mlxlab.core.runner.RunResult`. ``model`` (preset name, config dict or loaded
    model) sets the vocabulary and context limits; else the workload's vocabulary is used."""
    from mlxlab.core.runner import run_workload

    kw = dict(policy=policy, chunk_size=chunk_size, noise=noise, seed=seed, **policy_options)
    if model is not None:
        sim = Simulator.for_model(model, cost_model, **kw)
    else:
        vocab = max(int(getattr(workload, "vocab_size", 0) or 0), 2)
        ctx = getattr(workload, "max_context", None) or DEFAULT_MAX_CONTEXT
        sim = Simulator(cost_model, vocab_size=vocab, max_context=int(ctx), **kw)
    return run_workload(sim, workload)
