"""A discrete-event simulator of the engine: the same policies and queues on a virtual clock.

:class:`Simulator` is an :class:`mlxlab.core.executor.Executor` built on the engine's own queues
and token bookkeeping (:class:`mlxlab.core.bookkeeping.PlanExecutor`), so
:func:`mlxlab.core.runner.run_workload` drives either one and returns the same per-request and
timeline tables. Where the engine runs a plan on a model, the simulator charges it to a cost model
(:class:`mlxlab.core.costmodel.StepCostModel`, or anything with the same ``predict``) and moves its
virtual clock on (``advance_to(t)`` jumps it); no model, no MLX computation.

What is shared with the engine (non-overlap mode) is the same code: the prefill queue in arrival
order, a prompt's last token as its first decode input, finished prefills joining the decode batch
at the next step that decodes, rows leaving it once ``max_tokens`` forwards were issued,
``decode_context_tokens`` (the sum over the batch of prefill tokens + forwards issued, this one
included), the policy's plan checked with :func:`mlxlab.core.plan.check_plan` (an empty plan does
nothing), padded final chunks, stop tokens, and deferred reads (a request finished by a
decode-only step is marked done, and its tokens appended, when they are read one step later;
``policy.observe`` is called at the same moments). What the simulator adds is the clock:

* times: a step starts at the clock plus the model's ``overhead_s`` (the host time between two
  engine steps: run loop, scheduler state, ``policy.schedule``). Its decode part costs
  ``predict(batch, kv, join_tokens=J, drop_tokens=D)`` and its chunks the rest of
  ``predict(batch, kv, chunks)``, each chunk in plan order (a prompt's ``prefill_start_s`` is
  when its first chunk starts). ``kv`` is the sum of the rows' contexts; a batch of two or more
  also reads the left padding of the engine's ``BatchKVCache`` (batch x longest context less
  ``kv``), charged as ``decode_padding_tokens`` (as context by a cost model without that term).
  ``J``: when finished prefills join and the batch then has two or more rows, rows x longest
  context (the merge/extend copies every row at the longest width); ``D``: when rows leave and
  some remain, kept rows x the old longest context (``filter``), or the one row's context
  (``extract`` back to a plain cache);
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
  decodes and chunks is one forward charged ``predict(batch, kv, chunks, packed=True)`` as a
  whole (the decode's fixed cost rides on the chunks' forward; a cost model without ``packed``
  charges the two back to back); its chunks start with it and its tokens are read at its end;
* first uses and ragged changes (with a cost model that has the terms): a chunk whose token count
  (pad included) no earlier chunk of the run had is charged ``cold_chunks`` (with a profile
  measured where attention is prepared per shape, mlx's CUDA backend with cuDNN attention on: a
  chunk whose token count and key length are not among the latest shapes run,
  :class:`mlxlab.core.costmodel.WarmShapes`), and a change of the
  decode batch that leaves two or more rows of different lengths (a left-padded batch)
  ``ragged_change_rows`` per row;
* output tokens are a placeholder id (``output_token``, default 0); a stop id equal to
  ``output_token`` ends a request at its first token.

Not simulated: the engine's overlap mode (two streams), per-request warm-up or compile costs,
and anything the cost model does not see.

``noise``: the standard deviation of a lognormal multiplicative factor (mean 1:
``exp(noise * z - noise**2 / 2)``) drawn per step from ``numpy.random.default_rng(seed)``, for
sensitivity studies. With ``noise=0`` a run is deterministic.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from mlxlab.core.bookkeeping import PlanExecutor
from mlxlab.core.costmodel import WarmShapes
from mlxlab.core.plan import KEY_ALIGN, StepPlan
from mlxlab.core.presets import (
    DEFAULT_MAX_CONTEXT,
    model_limits,
    module_of,
    preset_config,
)
from mlxlab.core.request import SequenceState, StepRecord
from mlxlab.core.runner import run_workload
from mlxlab.policies import make_policy, next_plan, with_key_align
from mlxlab.policies.base import Policy
from mlxlab.sim.profiles import cost_model_from_dict, load_profile

DEFAULT_VOCAB_SIZE = 2**31 - 1  # accept any non-negative 32-bit id unless told the model's


def _as_cost_model(cost_model):
    if isinstance(cost_model, (str, Path)):
        return load_profile(cost_model)
    if isinstance(cost_model, dict):
        return cost_model_from_dict(cost_model)
    if not hasattr(cost_model, "predict"):
        raise ValueError(f"cost_model must have predict(decode_batch, decode_context_tokens, chunks) "
                         f"or be a profile path/name, got {cost_model!r}")
    return cost_model


@dataclass
class _Decode:
    """What a step's decode rows are charged: how many, the KV they read (``kv``; the padding as
    its own term in ``padding``, or folded into ``kv``), the batch-change terms (``change``) and
    the rows that began decoding (``joined``), as keyword arguments of ``predict``."""

    rows: List[SequenceState] = field(default_factory=list)
    kv: int = 0
    padding: dict = field(default_factory=dict)
    change: dict = field(default_factory=dict)
    joined: dict = field(default_factory=dict)


class Simulator(PlanExecutor):
    """The engine's scheduler loop on a virtual clock (see the module docstring).

    Args:
        cost_model: a :class:`mlxlab.core.costmodel.StepCostModel` (or any object with
            ``predict(decode_batch, decode_context_tokens, chunks) -> seconds``), a profile dict,
            or a profile path/name for :func:`mlxlab.sim.profiles.load_profile`.
        policy, chunk_size, policy_options: as for :class:`mlxlab.engine.Engine` (``cost_model`` is
            positional only, so ``slo``'s own ``cost_model=`` option passes through).
        vocab_size, max_context: the limits :meth:`submit` checks (take them from the model being
            simulated: :meth:`for_model`).
        stop_tokens: token ids that end any request.
        noise: lognormal step-time noise (sigma); 0 for none.
        seed: seed of the noise generator.
        output_token: the id every generated token gets.
        fuse: as :class:`mlxlab.engine.Engine`'s: a step with decodes and chunks is one packed
            forward (None: follow the policy, as ``stall_free``; False simulates an engine whose
            model cannot pack).
        key_align: as the engine's: the final chunk of a prompt is charged padded to a key length
            that is a multiple of this (:func:`mlxlab.core.request.pad_tokens`); 1 for none.
            :meth:`for_model` sets 1 for a model the engine would not pad.
        warm: the chunk shapes already warm in the process (a
            :class:`mlxlab.core.costmodel.WarmShapes`, updated as this run goes): pass one object
            to runs that follow each other in one process; None: a fresh one, keyed as the cost
            model's profile counted its cold chunks (each run starting cold, as tune simulates).
    """

    virtual_clock = True

    def __init__(self, cost_model, /, *, policy: "str | Policy" = "interleave", chunk_size: int = 2048,
                 vocab_size: int = DEFAULT_VOCAB_SIZE, max_context: int = DEFAULT_MAX_CONTEXT,
                 stop_tokens: Sequence[int] = (), noise: float = 0.0, seed: int = 0,
                 output_token: int = 0, fuse: Optional[bool] = None, key_align: int = KEY_ALIGN,
                 warm: Optional[WarmShapes] = None, **policy_options):
        super().__init__(chunk_size=chunk_size, key_align=key_align, stop_tokens=stop_tokens,
                         vocab_size=vocab_size, max_context=max_context)
        _check_options(noise, vocab_size, max_context, output_token, fuse)
        self.cost_model = _as_cost_model(cost_model)
        self.policy = make_policy(policy, **with_key_align(policy, key_align, policy_options))
        self.fuse = bool(fuse if fuse is not None else getattr(self.policy, "fuse", False))
        self.noise = float(noise)
        self.seed = seed
        self.output_token = int(output_token)
        self._rng = np.random.default_rng(seed)
        self._now = 0.0
        self._busy_until = 0.0  # when the last decode forward ends
        self._overhead = float(getattr(self.cost_model, "overhead_s", 0.0) or 0.0)
        tail = getattr(self.cost_model, "tail_s", None)
        self._tail = None if tail is None else float(tail)
        # the terms a duck-typed cost model may lack: the packed decode riding on its chunks'
        # forward (else back to back), the batch's left padding (else charged as context), the
        # rows that began decoding in a packed step
        params = inspect.signature(self.cost_model.predict).parameters
        self._packed_kw = {"packed": True} if "packed" in params else {}
        self._padding_term = "decode_padding_tokens" in params
        self._joined_term = "joined" in params
        self._ragged_term = "ragged" in params
        self._cold_term = "cold_chunks" in params
        # the chunks run so far, keyed as the profile counted its cold ones (by token count, or by
        # attention shape where the device keeps a graph per shape: WarmShapes)
        self._warm = warm if warm is not None else (self.cost_model.warm_shapes()
                                                   if hasattr(self.cost_model, "warm_shapes") else WarmShapes())

    @classmethod
    def for_model(cls, model, cost_model, /, **kwargs) -> "Simulator":
        """A simulator with the vocabulary and context limits of ``model``: a
        :class:`mlxlab.engine.models.LoadedModel`, a preset name, or a config dict."""
        return cls(cost_model, **{**cls.limits_of(model), **kwargs})

    @staticmethod
    def limits_of(model) -> Dict[str, int]:
        """The keyword arguments :meth:`for_model` takes from ``model`` (``vocab_size``,
        ``max_context``, and ``key_align=1`` for a model the engine cannot pad), as plain numbers
        that a cluster's worker can be sent without the model."""
        if isinstance(model, str):
            model = preset_config(model)
        if isinstance(model, dict):
            return {"vocab_size": int(model["vocab_size"]),
                    "max_context": int(model.get("max_position_embeddings") or DEFAULT_MAX_CONTEXT)}
        # a loaded model is an MLX object: mlx is there, and only then is the engine's rule needed
        from mlxlab.engine.batch import can_pad

        vocab, ctx = model_limits(model)
        return {"vocab_size": vocab, "max_context": ctx, **({} if can_pad(module_of(model)) else {"key_align": 1})}

    # ------------------------------------------------------------------ public API
    def now(self) -> float:
        """Seconds on the virtual clock (0 = simulator start)."""
        return self._now

    def advance_to(self, t: float) -> None:
        """Let the virtual clock reach ``t`` (it never goes back)."""
        if t > self._now:
            self._now = float(t)

    def step(self) -> Optional[StepRecord]:
        """Plan and charge one step; returns its record, or None if there was nothing to do."""
        plan = next_plan(self.policy, self.state())
        if plan.empty:
            self._flush()
            return None
        t = self._now + self._overhead
        rec = self._new_record("", t)
        factor = self._noise_factor()
        d = self._prepare_decode(rec, t) if plan.decode else _Decode()
        rec.fused = bool(d.rows and plan.prefill and self.fuse)
        deferred = False
        if rec.fused:
            t = self._packed(plan, d, t, rec, factor)
        elif d.rows:
            t, deferred = self._decode(plan, d, t, rec, factor)
        else:
            t = self._flush(read_at=t)  # waits for a forward still running
        if plan.prefill and not rec.fused:
            t = self._chunks(plan, d, t, rec, factor)
        rec = self._close_record(rec, None if deferred else t)
        if rec is not None:
            self._now = max(self._now, t)
        return rec

    def __repr__(self) -> str:
        return (f"Simulator(policy={self.policy!r}, chunk_size={self.chunk_size}, "
                f"cost_model={getattr(self.cost_model, 'source', type(self.cost_model).__name__)!r}, "
                f"noise={self.noise})")

    # ------------------------------------------------------------------ a step's parts
    def _prepare_decode(self, rec: StepRecord, t: float) -> _Decode:
        """The batch changes before the decode (rows leave, ready ones join at ``t``), one forward
        issued per row, and what the decode is charged."""
        before = list(self._decoding)
        self._rebatch(rec, t)
        kept = self._decoding[:len(self._decoding) - rec.joined]
        drop_tokens = 0
        if rec.dropped and kept:  # rows leave a batch: filter, or extract the last one
            drop_tokens = len(kept) * max(s.context_tokens for s in before) if len(kept) > 1 else kept[0].context_tokens
        join_tokens = 0
        if rec.joined and len(self._decoding) > 1:  # merged into a BatchKVCache (a lone stream keeps its cache)
            join_tokens = len(self._decoding) * self.decode_width
        d = _Decode(rows=list(self._decoding))
        self._issue(d.rows, rec)
        contexts = [s.context_tokens for s in d.rows]
        d.kv = sum(contexts)
        if len(d.rows) > 1:  # one BatchKVCache, left-padded to its longest row: the padding is read too
            pad = len(d.rows) * max(contexts) - d.kv
            if self._padding_term:
                d.padding = {"decode_padding_tokens": pad}
            else:
                d.kv += pad
        d.change = self._change_kw(join_tokens, drop_tokens, rec)
        if d.change and self._ragged_term and len(contexts) > 1 and len(set(contexts)) > 1:
            d.change["ragged"] = True  # the batch after the change is a left-padded one
        if rec.joined and self._joined_term:
            d.joined = {"joined": rec.joined}
        return d

    def _packed(self, plan: StepPlan, d: _Decode, t: float, rec: StepRecord, factor: float) -> float:
        """One packed forward: the chunks start with it, the tokens come at its end."""
        chunks = [self._charged(self._seqs[i], n) for i, n in plan.prefill]
        cold = self._cold(chunks)
        total = max(0.0, self.cost_model.predict(len(d.rows), d.kv, chunks, **d.change, **self._packed_kw,
                                                 **d.padding, **d.joined, **self._cold_kw(sum(cold))))
        start = t if self._tail is None else max(t, self._busy_until)
        self._flush(read_at=t)  # the previous decode-only step's tokens, read after queueing this one
        for seq_id, n in plan.prefill:
            self._chunk(self._seqs[seq_id], n, t, rec)
        t = start + total * factor
        self._busy_until = t
        self._pending = (d.rows, t, rec)
        self._flush(read_at=t)
        return t

    def _decode(self, plan: StepPlan, d: _Decode, t: float, rec: StepRecord, factor: float) -> tuple:
        """The decode part of an unpacked step; returns (the clock after it, whether its tokens
        are read later: a decode-only step)."""
        decode_s = max(0.0, self.cost_model.predict(len(d.rows), d.kv, [], **d.change, **d.padding)) * factor
        if self._tail is None:  # tokens stamped when their own step ends
            t += decode_s
            self._flush()  # the previous decode-only step's tokens are read during this one
            ready = t
        else:  # one forward at a time; Python returns from queueing it ``tail`` before it ends
            ready = max(t, self._busy_until) + decode_s
            self._busy_until = ready
            t = max(t, ready - min(self._tail, decode_s))
            self._flush(read_at=t)  # the previous decode-only step's tokens, read after queueing this one
        self._pending = (d.rows, ready, rec)
        if not plan.prefill:
            return t, True
        t = max(t, ready)
        self._flush(read_at=t)  # a step with chunks reads its own tokens before running them
        return t, False

    def _chunks(self, plan: StepPlan, d: _Decode, t: float, rec: StepRecord, factor: float) -> float:
        """The chunks of an unpacked step, one after another: together they cost what the step's
        prediction adds to its decode, shared out as each would cost alone."""
        cm = self.cost_model
        chunks = [self._charged(self._seqs[seq_id], n) for seq_id, n in plan.prefill]
        cold = self._cold(chunks)
        total = (cm.predict(len(d.rows), d.kv, chunks, **d.padding, **self._cold_kw(sum(cold)))
                 - (cm.predict(len(d.rows), d.kv, [], **d.padding) if d.rows else 0.0))
        each = [max(0.0, cm.predict(0, 0, [c], **self._cold_kw(k))) for c, k in zip(chunks, cold)]
        scale = (max(0.0, total) / sum(each)) if sum(each) > 0 else 0.0
        for (seq_id, n), cost in zip(plan.prefill, each):
            self._chunk(self._seqs[seq_id], n, t, rec)
            t += cost * scale * factor
        return t

    # ------------------------------------------------------------------ helpers
    def _noise_factor(self) -> float:
        if not self.noise:
            return 1.0
        return float(math.exp(self.noise * self._rng.standard_normal() - self.noise ** 2 / 2))

    def _charged(self, seq: SequenceState, n: int) -> tuple:
        """The chunk as the cost model charges it: (tokens, context), and the pad tokens third
        when the engine would run it padded."""
        pad = self._pad(seq, n)
        return (n, seq.prefilled, pad) if pad else (n, seq.prefilled)

    def _cold(self, chunks: Sequence[tuple]) -> List[int]:
        """1 for each chunk no earlier chunk of this run matched (``cold_chunks``: the same token
        count, pad included, or on a shape-keyed profile also the same key length among the
        latest ``cold_capacity`` shapes), which from now on is warm."""
        return self._warm.cold(chunks)

    def _cold_kw(self, n: int) -> dict:
        return {"cold_chunks": n} if (n and self._cold_term) else {}

    def _chunk(self, seq: SequenceState, n: int, t: float, rec: StepRecord) -> None:
        """Book a chunk of ``n`` prompt tokens starting at ``t``; a finished prefill becomes ready."""
        self._begin_chunk(seq, t)
        if self._book_chunk(seq, n, rec):
            self._prefill_done(seq)

    def _change_kw(self, join_tokens: int, drop_tokens: int, rec: StepRecord) -> dict:
        """The batch-change terms of this step: the bytes copied and, as the engine's record
        counts them, the rows merged into a batch of two or more and whether the batch changed."""
        join_rows = rec.joined if len(rec.decode_seqs) >= 2 else 0
        if not (join_tokens or drop_tokens or join_rows or rec.dropped):
            return {}
        return {"join_tokens": join_tokens, "drop_tokens": drop_tokens, "join_rows": join_rows,
                "batch_change": bool(join_rows or rec.dropped)}

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
        self._deliver(rec, rows, [self.output_token] * len(rows), t)
        return max(t, at)


def _check_options(noise, vocab_size, max_context, output_token, fuse) -> None:
    if not (isinstance(noise, (int, float)) and noise >= 0 and math.isfinite(noise)):
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    if not isinstance(max_context, int) or max_context < 2:
        raise ValueError(f"max_context must be an integer >= 2, got {max_context!r}")
    if not 0 <= int(output_token) < vocab_size:
        raise ValueError(f"output_token {output_token} is outside the vocabulary [0, {vocab_size})")
    if fuse not in (None, True, False):
        raise ValueError(f"fuse must be None, True or False, got {fuse!r}")


def simulate(cost_model, workload, *, policy: "str | Policy" = "interleave", chunk_size: int = 2048,
             model=None, noise: float = 0.0, seed: int = 0, **policy_options):
    """Run ``workload`` on a fresh :class:`Simulator` with :func:`mlxlab.core.runner.run_workload`;
    returns its :class:`mlxlab.core.runner.RunResult`. ``model`` (preset name, config dict or loaded
    model) sets the vocabulary and context limits; else the workload's vocabulary is used."""
    kw = dict(policy=policy, chunk_size=chunk_size, noise=noise, seed=seed, **policy_options)
    if model is not None:
        sim = Simulator.for_model(model, cost_model, **kw)
    else:
        vocab = max(int(getattr(workload, "vocab_size", 0) or 0), 2)
        ctx = getattr(workload, "max_context", None) or DEFAULT_MAX_CONTEXT
        sim = Simulator(cost_model, vocab_size=vocab, max_context=int(ctx), **kw)
    return run_workload(sim, workload)
