"""Step-time profiles: measured on this device, or derived from the seed-001 case study's figures.

A profile is a :class:`mlxlab.core.costmodel.StepCostModel` plus the evidence it came from, saved as
``data/profiles/<platform>-<model>.json``. The simulator (:mod:`mlxlab.sim`) charges each planned
step to it, and the ``slo`` policy can take it as its prior.

**Measured** (:func:`profile_device`): tiny controlled steps on the real engine's own code path
(``Engine.step`` with a scripted policy that dictates each plan):

* prefill-only steps: one chunk of ``n`` tokens after a context of ``c`` tokens, for every ``n``
  in ``prefill_tokens`` and ``c`` in ``contexts`` (plus the chunks that build the context);
* decode-only steps: ``b`` sequences at context ``c`` for every ``b`` in ``decode_batches`` and
  ``c`` in ``decode_contexts`` (the batch shrinks from the largest ``b`` as sequences reach their
  ``max_tokens``, so each context is prefilled once);
* mixed steps: a decode of that batch plus one chunk of each size of a long prompt, back to back
  ("mixed") and, for a model :mod:`mlxlab.engine.fused` can pack, as one packed forward ("packed": kept
  with the records, not fitted: no feature describes packing yet);
* batch changes ("rebatch"): the first decode of each batch size, which joins every row into one
  ``BatchKVCache`` (``join_tokens``) or drops the rows that finished (``drop_tokens``), timed on
  its own (nothing in flight before, its tokens read at once);
* the decode tail ("tail"): after a run of pipelined decode-only steps, the gap between the last
  two token reads of a stream, the last read by the next step's flush: how long a forward still
  runs after the engine's Python returned from queueing it (``StepCostModel.tail_s``);
* the host overhead ("overhead"): a short workload through :func:`mlxlab.core.runner.run_workload`
  under ``interleave``; the gaps between a step's end and the next step's start after steps
  that end inside ``Engine.step`` (run loop, scheduler state, policy: ``overhead_s``).

What is timed is what a step costs a stream, i.e. what the simulator must charge: the wall time
of ``Engine.step()`` for steps that finish inside it (prefill-only and mixed; any decode still in
flight is read first, untimed), and, for decode-only steps, which the engine pipelines, the gap
between consecutive token reads of one stream (the first two steps after a change of batch are
left out: one pays the change, timed separately, the next refills the pipeline). The model is
then fitted to minimise the *relative* error of every step (:func:`fit_cost_model`), so
millisecond decode steps count as much as second-long chunks.

**Published** (:func:`seed001_profile`): coefficients derived from seed 001's figures (M4 Max,
35B hybrid MoE), each number with its provenance; see that function.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from mlxlab.core.costmodel import (
    DECODE_FEATURES,
    FEATURES,
    PACKED_FEATURES,
    PREFILL_FEATURES,
    REBATCH_FEATURES,
    StepCostModel,
    _nnls,
    record_features,
)
from mlxlab.core.presets import model_limits

PROFILE_DEFAULTS = dict(prefill_tokens=(64, 256, 1024), contexts=(0, 1024, 4096),
                        decode_batches=(1, 2, 4, 8), decode_contexts=(64, 512, 2048), repeats=3)
QUICK_DEFAULTS = dict(prefill_tokens=(32, 128, 512), contexts=(0, 512), decode_batches=(1, 2, 4),
                      decode_contexts=(32, 512), repeats=2)


def profiles_dir() -> Path:
    """``data/profiles/`` (follows ``MLXLAB_DATA``)."""
    from mlxlab.core.paths import data_dir

    return data_dir() / "profiles"


# ---------------------------------------------------------------------------------- fitting
def _fit_rows(X: np.ndarray, y: np.ndarray, relative: bool) -> np.ndarray:
    if relative:
        X, y = X / y[:, None], np.ones_like(y)
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0
    return _nnls(X / scale, y, 1e-9) / scale


TIMING_KINDS = ("tail", "overhead")  # records of the two timing parameters, not of step costs
# left out of the staged fit's main stages: packed steps (measured and kept; their features are the
# mixed steps', less a forward), a row's first decode ("start") and a change of the decode rows in
# a step with chunks ("join_chunk"), of which the packed ones price packed_changes at the end
UNFITTED_KINDS = ("packed", "start", "join_chunk")
PACKED_CHANGE_KINDS = ("start", "join_chunk")  # fitted alone, packed ones only: packed_changes


def _timing(records: Sequence[dict], kind: str) -> Optional[float]:
    vals = [r["duration_s"] for r in records if r.get("kind") == kind and r.get("duration_s", 0) > 0]
    return float(np.median(vals)) if vals else None


def fit_cost_model(records: Iterable[dict], *, relative: bool = True, staged: bool = True,
                   source: str = "profile") -> StepCostModel:
    """A :class:`StepCostModel` fitted by non-negative least squares.

    ``relative``: minimise squared *relative* errors (each row divided by its measured time), so
    millisecond decode steps are fitted as well as second-long chunks.
    ``staged``: the decode coefficients (:data:`~mlxlab.core.costmodel.DECODE_FEATURES`) from
    decode-only steps alone (a batch's left padding gets its own price only if some of them had
    padding, else it is priced as context); then the join/drop coefficients from decode steps
    that changed the batch, less their predicted decode; then the prefill coefficients from
    prefill-only steps and from mixed steps less their predicted decode, which is how the
    simulator charges a step (decode first, then chunks); last ``packed_changes``, from packed
    steps whose decode rows changed (``start`` and ``join_chunk`` records) less everything else
    they are predicted. A joint fit instead lets a mixed step's shared per-step overhead pull the
    decode intercept.
    With ``relative=False, staged=False`` this is :meth:`StepCostModel.fit`.

    Records of kind ``tail`` and ``overhead`` (:func:`profile_device`) are not step costs: the
    medians of their ``duration_s`` become ``tail_s`` and ``overhead_s``."""
    allrecs = [r for r in records if r.get("duration_s", 0) > 0]
    recs = [r for r in allrecs if r.get("kind") not in TIMING_KINDS + UNFITTED_KINDS]
    timing = dict(tail_s=_timing(allrecs, "tail"), overhead_s=_timing(allrecs, "overhead") or 0.0)
    if not relative and not staged:
        cm = StepCostModel.fit(recs, source=source)
        cm.tail_s, cm.overhead_s = timing["tail_s"], timing["overhead_s"]
        return cm
    if not recs:
        return StepCostModel(source=source, **timing)
    X = np.stack([record_features(r) for r in recs])
    y = np.array([r["duration_s"] for r in recs], dtype=float)
    has_decode = X[:, FEATURES.index("decode_step")] > 0
    has_chunk = X[:, FEATURES.index("prefill_tokens")] > 0
    rebatch = (X[:, REBATCH_FEATURES] > 0).any(axis=1)
    decode_only = has_decode & ~has_chunk & ~rebatch
    if not staged or not decode_only.any():
        coef = _fit_rows(X, y, relative)
    else:
        coef = np.zeros(len(FEATURES))
        pad = FEATURES.index("decode_padding_tokens")
        ctx = FEATURES.index("decode_context_tokens")
        if (X[decode_only][:, pad] > 0).any():  # a short row decoded beside a long one: padding's own price
            coef[DECODE_FEATURES] = _fit_rows(X[decode_only][:, DECODE_FEATURES], y[decode_only], relative)
        else:  # no step tells padding from context: charge it as context
            cols = [i for i in DECODE_FEATURES if i != pad]
            Xd = X[decode_only][:, cols]
            Xd[:, cols.index(ctx)] += X[decode_only][:, pad]
            coef[cols] = _fit_rows(Xd, y[decode_only], relative)
            coef[pad] = coef[ctx]
        rb = rebatch & ~has_chunk
        if rb.any():
            yr = y[rb] - X[rb][:, DECODE_FEATURES] @ coef[DECODE_FEATURES]
            ok = yr > 0
            if ok.any():
                coef[REBATCH_FEATURES] = _fit_rows(X[rb][ok][:, REBATCH_FEATURES], yr[ok], relative)
        if has_chunk.any():
            known = DECODE_FEATURES + REBATCH_FEATURES
            yp = y[has_chunk] - X[has_chunk][:, known] @ coef[known]
            ok = yp > 0
            if ok.any():
                coef[PREFILL_FEATURES] = _fit_rows(X[has_chunk][ok][:, PREFILL_FEATURES], yp[ok], relative)
        # last, what a change of the decode rows adds to a packed step, beyond all of the above
        pk = [r for r in allrecs if r.get("kind") in PACKED_CHANGE_KINDS and r.get("fused")]
        if pk:
            Xp = np.stack([record_features(r) for r in pk])
            yk = np.array([r["duration_s"] for r in pk])
            yp = yk - Xp @ coef
            ok = (Xp[:, PACKED_FEATURES[0]] > 0) & (yp > 0)
            if ok.any():  # relative to the whole step, not to the part left to explain
                w = yk[ok] if relative else np.ones(int(ok.sum()))
                coef[PACKED_FEATURES] = _fit_rows(Xp[ok][:, PACKED_FEATURES] / w[:, None], yp[ok] / w, False)
    return StepCostModel(coef=coef, n_obs=len(recs), source=source, **timing)


def _cell(r: dict) -> tuple:
    """The grid cell of a profile record: its kind, decode batch, chunk size, and contexts
    rounded to 2 significant digits (a decode context grows by the batch every step)."""
    if r.get("cell"):
        return (r["cell"],)

    def r2(x):
        return float(f"{x:.2g}") if x else 0
    return (r.get("kind", r.get("phase")), r.get("decode_batch", 0), r2(r.get("decode_context_tokens", 0)),
            r.get("prefill_tokens", 0), r2(r.get("prefill_context_tokens", 0)))


def cell_medians(records: Iterable[dict]) -> List[dict]:
    """One record per grid cell (:func:`_cell`): the median duration and the median of each
    feature field, so a step slowed by a busy machine does not pull the fit."""
    groups: Dict[tuple, List[dict]] = {}
    for r in records:
        if r.get("duration_s", 0) > 0:
            groups.setdefault(_cell(r), []).append(r)
    out = []
    for key, rs in groups.items():
        d = dict(rs[0])
        for f in ("duration_s", "decode_context_tokens", "prefill_tokens", "prefill_context_tokens", "decode_batch",
                  "decode_kv_tokens", "join_tokens", "drop_tokens"):
            if f not in rs[0]:
                continue
            vals = [x.get(f, 0) for x in rs]
            d[f] = float(np.median(vals))
        d["n"] = len(rs)
        d["spread"] = float(np.std([x["duration_s"] for x in rs]) / np.mean([x["duration_s"] for x in rs])) if len(rs) > 1 else 0.0
        out.append(d)
    return out


def fit_report(model: StepCostModel, records: Iterable[dict]) -> dict:
    """Relative error of ``model`` on ``records``: median, p90 and max, overall and per kind."""
    recs = [r for r in records if r.get("duration_s", 0) > 0 and r.get("kind") not in TIMING_KINDS]
    out = {}
    kinds = sorted({r.get("kind", r.get("phase", "step")) for r in recs})
    for kind in ["all"] + kinds:
        sel = recs if kind == "all" else [r for r in recs if r.get("kind", r.get("phase", "step")) == kind]
        err = model.relative_error(sel)
        if err:
            out[kind] = {"n": len(err), "median": float(np.median(err)), "p90": float(np.percentile(err, 90)),
                         "max": float(max(err))}
    return out


def coefficients(model: StepCostModel) -> Dict[str, float]:
    """The coefficients by feature name (seconds per unit of each feature), and the two timing
    parameters ``overhead_s`` and ``tail_s``."""
    out = {f: float(c) for f, c in zip(FEATURES, model.coef)}
    out["overhead_s"] = float(getattr(model, "overhead_s", 0.0) or 0.0)
    tail = getattr(model, "tail_s", None)
    out["tail_s"] = None if tail is None else float(tail)
    return out


# ---------------------------------------------------------------------------------- measuring
def _script_policy():
    from mlxlab.core.plan import StepPlan
    from mlxlab.policies.base import Policy

    class Scripted(Policy):
        """Runs exactly the plan it is given for the next step (then nothing)."""

        name = "profile_script"

        def __init__(self):
            self.next = StepPlan()

        def schedule(self, state):
            plan, self.next = self.next, StepPlan()
            return plan

    return Scripted()


def profile_device(model, *, prefill_tokens: Sequence[int] = PROFILE_DEFAULTS["prefill_tokens"],
                   contexts: Sequence[int] = PROFILE_DEFAULTS["contexts"],
                   decode_batches: Sequence[int] = PROFILE_DEFAULTS["decode_batches"],
                   decode_contexts: Sequence[int] = PROFILE_DEFAULTS["decode_contexts"],
                   join_contexts: Optional[Sequence[int]] = None,
                   repeats: int = PROFILE_DEFAULTS["repeats"], fill_chunk: int = 2048, mixed: bool = True,
                   warmup: bool = True, seed: int = 0, relative: bool = True, measure_overhead: bool = True,
                   log: Optional[Callable[[str], None]] = None) -> dict:
    """Measure step times on the real engine and fit a cost model to them.

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel`.
        prefill_tokens: chunk sizes timed after each context.
        contexts: tokens already in the prompt's cache before the timed chunks.
        decode_batches: decode batch sizes.
        decode_contexts: prompt length of each decoding sequence.
        join_contexts: prompt lengths of the long rows that join a short row's decode
            (:func:`profile_device`'s join group; default: the longest decode context; ``()``
            for none).
        repeats: timed chunks per (size, context); decode steps per (batch, context) are
            ``max(8, 2 * repeats + 2)``, of which the first is dropped (see the module docstring).
        fill_chunk: chunk size that builds contexts (those steps are recorded too).
        mixed: also time decode + chunk steps.
        relative: fit relative errors (see :func:`fit_cost_model`).

    Returns a dict: ``records`` (step-record dicts whose ``duration_s`` is the measured cost,
    with ``kind`` fill / prefill / decode / mixed / packed / rebatch / start / join_chunk / tail /
    overhead and ``engine_duration_s`` the engine's own
    record time), ``cells`` (per grid cell: median time and features, :func:`cell_medians`),
    ``cost_model`` (a :class:`StepCostModel` fitted to the cells), ``coefficients``, ``fit`` and
    ``fit_raw`` (:func:`fit_report` on the cells and on every record), ``grid``, ``model``, ``wall_s``. Contexts that do not fit the model's
    context window are skipped (listed in ``skipped``).
    """
    from mlxlab.core.plan import StepPlan
    from mlxlab.engine.fused import can_fuse
    from mlxlab.engine.loop import Engine

    say = log or (lambda s: None)
    packed = bool(mixed and can_fuse(getattr(model, "module", model))[0])
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for name, vals in (("prefill_tokens", prefill_tokens), ("decode_batches", decode_batches),
                       ("decode_contexts", decode_contexts)):
        if not vals or any(int(v) < 1 for v in vals):
            raise ValueError(f"{name} must be positive integers, got {vals!r}")
    if any(int(c) < 0 for c in contexts):
        raise ValueError(f"contexts must be >= 0, got {contexts!r}")
    t_start = time.perf_counter()
    vocab, max_ctx = model_limits(model)
    rng = random.Random(seed)
    prefill_tokens = sorted({int(n) for n in prefill_tokens})
    records: List[dict] = []
    skipped: List[str] = []

    def tokens(n: int) -> List[int]:
        return [rng.randrange(1, vocab) for _ in range(n)]

    def new_engine():
        script = _script_policy()
        return Engine(model, policy=script, chunk_size=max(fill_chunk, max(prefill_tokens))), script

    def timed(eng, script, plan, kind: str, keep: bool = True, cell: str = "") -> Optional[dict]:
        eng.flush()  # a decode still in flight is read before the clock starts
        script.next = plan
        t0 = time.perf_counter()
        rec = eng.step()
        dt = time.perf_counter() - t0
        if rec is None:
            raise RuntimeError(f"profile step {plan} did not run")
        d = rec.as_dict()
        d.update(kind=kind, engine_duration_s=d["duration_s"], duration_s=dt, _t0=t0,
                 cell=cell or f"{kind} n{d['prefill_tokens']} c{d['prefill_context_tokens']}")
        if keep:
            records.append(d)
        return d

    def fill(eng, script, req, upto: int, keep: bool = True) -> None:
        seq_prefilled = 0
        while seq_prefilled < upto:
            n = min(fill_chunk, upto - seq_prefilled)
            timed(eng, script, StepPlan(prefill=[(req.id, n)]), "fill", keep).pop("_t0")
            seq_prefilled += n

    # ---------------------------------------------------------------- prefill-only chunks
    def prefill_group(c: int, keep: bool = True) -> None:
        sizes = [n for n in prefill_tokens if c + n + 2 <= max_ctx]
        total = c + sum(sizes)
        while sizes and total + 2 > max_ctx:
            total -= sizes.pop()
        if not sizes:
            skipped.append(f"prefill context {c}: no chunk fits the context of {max_ctx}")
            return
        eng, script = new_engine()
        req = eng.submit(tokens(total + 1), 1)
        fill(eng, script, req, c, keep)
        for n in sizes:
            timed(eng, script, StepPlan(prefill=[(req.id, n)]), "prefill", keep).pop("_t0")

    # ---------------------------------------------------------------- decode and mixed
    def decode_group(c: int, keep: bool = True, batches: Sequence[int] = decode_batches) -> None:
        """Decode phases at batch sizes from the largest down (rows leave as they reach their
        max_tokens), each phase followed by mixed steps. In a phase: the first decode, which
        changes the batch (the join of every row, then rows dropped), is timed on its own with
        nothing in flight ("rebatch"); the next decodes run pipelined as in the engine and the
        gaps between one stream's token reads are the decode records, leaving out the first
        (the pipeline refilling) and the last, which the next step's flush reads at once: that
        gap is how long a forward runs after the engine returned from queueing it ("tail")."""
        bs = sorted({int(b) for b in batches}, reverse=True)
        k_dec = max(10, 2 * repeats + 4)  # decode steps are cheap: more of them, and a median per cell
        mix_sizes = list(prefill_tokens) if mixed else []
        k = k_dec + len(mix_sizes) * (2 if packed else 1)
        if c + k * len(bs) + 2 > max_ctx:
            skipped.append(f"decode context {c}: does not fit the context of {max_ctx}")
            return
        eng, script = new_engine()
        reqs = []
        for i in range(bs[0]):
            m_i = sum(1 for b in bs if i < b)
            reqs.append(eng.submit(tokens(c), k * m_i))
        long_len = min(max_ctx - 2, sum(mix_sizes) * len(bs) * (2 if packed else 1) + 2) if mix_sizes else 0
        long_req = eng.submit(tokens(long_len), 1) if mix_sizes else None
        for r in reqs:
            if c > 1:
                fill(eng, script, r, c - 1, keep)
        long_done = 0
        decode_recs = []  # (record dict, kind, phase index, index in phase)
        prev_b = 0
        for p, b in enumerate(bs):
            ctx = c - 1 + p * k + 1  # each row's context at the phase's first decode (prompt + forwards)
            if prev_b == 0:  # every row joins at once (a lone row starts on its own cache: no copy)
                change = {"join_tokens": b * ctx if b > 1 else 0}
            else:  # rows leave: filter copies the kept rows at the old width, extract the one row left
                change = {"drop_tokens": b * ctx if b > 1 else ctx}
            d = timed(eng, script, StepPlan(decode=True), "rebatch" if any(change.values()) else "decode1",
                      keep=False, cell=f"rebatch b{prev_b}->{b} c{c}")
            eng.flush()
            d["duration_s"] = time.perf_counter() - d.pop("_t0")
            d.update(change, decode_kv_tokens=b * ctx)
            if keep and any(change.values()):
                records.append(d)
            decode_recs.append((d, "first", p, 0))
            for j in range(1, k_dec):
                script.next = StepPlan(decode=True)
                rec = eng.step()
                decode_recs.append((rec, f"decode b{b} c{c}", p, j))
            for n in mix_sizes:
                for kind in ("mixed", "packed") if packed else ("mixed",):
                    if long_done + n > long_len - 1:
                        continue
                    eng.fuse = kind == "packed"
                    d = timed(eng, script, StepPlan(decode=True, prefill=[(long_req.id, n)]), kind, keep,
                              cell=f"{kind} b{b} c{c} n{n} at{long_done}")
                    eng.fuse = False
                    d.pop("_t0", None)
                    d["decode_kv_tokens"] = b * (d["decode_context_tokens"] // b)
                    long_done += n
                    decode_recs.append((d, kind, p, -1))
            prev_b = b
        eng.flush()
        times = reqs[0].token_times_s
        if len(times) != len(decode_recs):
            raise RuntimeError(f"profile bookkeeping: {len(times)} token times for {len(decode_recs)} decode steps")
        for j, (rec, kind, p, i) in enumerate(decode_recs):
            if not kind.startswith("decode") or i < 2:
                continue
            d = rec.as_dict()
            last = j + 1 == len(decode_recs) or not decode_recs[j + 1][1].startswith("decode")
            d.update(kind="tail" if last else "decode", engine_duration_s=d["duration_s"],
                     duration_s=times[j] - times[j - 1], cell=("tail " if last else "") + kind,
                     decode_kv_tokens=d["decode_batch"] * (d["decode_context_tokens"] // max(1, d["decode_batch"])))
            if keep:
                records.append(d)

    # ---------------------------------------------------------- a long row joins a short one
    def join_case(c_long: int, case: str, keep: bool = True) -> None:
        """What happens when a prompt finishes prefilling in the workloads, in a decode-only step
        (``case`` "decode") or in a step with a chunk beside it ("packed", or "mixed" back to
        back): a short row's first decode, alone ("start": its prefilled cache becomes the decode
        cache); a long row (``c_long``) joining it ("join": the lone cache becomes a batch and is
        extended at the long row's width); the steps right after, where the short row reads the
        long row's width of left padding; the long row leaving ("drop": the short row is
        extracted back to a plain cache). Starts and changes are timed alone, as rebatch cells
        are; the decodes after the join are pipelined token gaps, as in :func:`decode_group`."""
        c0 = max(2, min(int(c) for c in decode_contexts))
        chunked = case != "decode"
        n_mix = min(prefill_tokens)
        k_dec = max(10, 2 * repeats + 4)
        k_after = k_dec if not chunked else 4
        if c_long + k_after + 4 > max_ctx or c0 + 3 * k_dec + 8 > max_ctx:
            skipped.append(f"join context {c_long}: does not fit the context of {max_ctx}")
            return
        eng, script = new_engine()
        short = eng.submit(tokens(c0), 3 * k_dec)
        long_row = eng.submit(tokens(c_long), k_after + 1)
        filler = (eng.submit(tokens(min(max_ctx - 2, n_mix * (k_after + 6) + 2)), 1) if chunked else None)
        tag = f"{case} c{c0}+{c_long}"

        def width() -> int:
            return max((s.prefill_tokens + s.issued for s in eng._decoding), default=0)

        def alone(kind: str, cell: str, record: bool = True, **fields) -> dict:
            plan = StepPlan(decode=True, prefill=[(filler.id, n_mix)] if chunked else [])
            eng.fuse = case == "packed"
            try:
                d = timed(eng, script, plan, kind, keep=False, cell=cell)
            finally:
                eng.fuse = False
            eng.flush()
            d["duration_s"] = time.perf_counter() - d.pop("_t0")
            b = d["decode_batch"]
            d.update(decode_kv_tokens=b * width() if b > 1 else d["decode_context_tokens"], **fields)
            if keep and record:
                records.append(d)
            return d

        fill(eng, script, short, c0 - 1, keep=False)
        alone("start", f"start {tag}")
        for _ in range(2):  # the short row settles in alone
            alone(case, "", record=False)
        fill(eng, script, long_row, c_long - 1, keep=False)
        # both rows are copied at the long row's width, its context at its first decode: c_long
        alone("join_chunk" if chunked else "rebatch", f"join {tag}", join_tokens=2 * c_long)
        if chunked:
            for j in range(k_after):
                alone(case, f"{case} after join {tag} #{j + 1}")
        else:
            i0 = len(short.token_times_s)
            widths = []
            for _ in range(k_after):
                script.next = StepPlan(decode=True)
                rec = eng.step()
                widths.append((rec, width()))
            eng.flush()
            times = short.token_times_s[i0:]
            if len(times) != len(widths):
                raise RuntimeError(f"profile bookkeeping: {len(times)} token times for {len(widths)} decode steps")
            for j in range(2, len(widths) - 1):  # the first refills the pipeline, the last is a tail
                rec, wj = widths[j]
                d = rec.as_dict()
                d.update(kind="decode", engine_duration_s=d["duration_s"], duration_s=times[j] - times[j - 1],
                         cell=f"decode b2 {tag}", decode_kv_tokens=d["decode_batch"] * wj)
                if keep:
                    records.append(d)
        alone("join_chunk" if chunked else "rebatch", f"drop {tag}",
              drop_tokens=short.prompt_tokens + len(short.output_tokens))

    def overhead_run(keep: bool = True) -> None:
        """Host time between steps that no record covers (run loop, scheduler state, policy):
        a short workload through :func:`mlxlab.core.runner.run_workload` under ``interleave``, the
        gaps between a step's end and the next one's start after steps that end inside
        ``Engine.step`` (prefill-only and mixed; a pipelined decode's record ends when its
        tokens are read, inside the next step)."""
        from mlxlab.core.runner import run_workload
        from mlxlab.core.workload import BatchTenant, ChatTenant, Workload

        n = min(4 * fill_chunk, max_ctx - 64)
        wl = Workload([ChatTenant(sessions=2, turns=1, first_prompt_tokens=32, output_tokens=12, think_time_s=0.0),
                       BatchTenant(workers=1, requests=1, prompt_tokens=n, output_tokens=2)],
                      vocab_size=vocab, seed=seed, max_context=max_ctx)
        res = run_workload(Engine(model, policy="interleave", chunk_size=fill_chunk), wl)
        st = res.executor.steps
        for a, b in zip(st, st[1:]):
            if a.phase != "decode" and b.start_s >= a.end_s:
                if keep:
                    records.append({"kind": "overhead", "cell": "overhead", "duration_s": b.start_s - a.end_s,
                                    "phase": a.phase, "decode_batch": 0, "prefill_tokens": 0})

    if warmup:  # unrecorded: first allocations, first use of each code path
        prefill_group(min(contexts), keep=False)
        decode_group(min(decode_contexts), keep=False, batches=(1, 2))
        overhead_run(keep=False)
        say(f"[profile] warm-up done ({time.perf_counter() - t_start:.1f} s)")
    for r in range(repeats):
        for c in sorted({int(c) for c in contexts}):
            t0 = time.perf_counter()
            prefill_group(c)
            say(f"[profile] prefill context {c} repeat {r + 1}/{repeats} ({time.perf_counter() - t0:.1f} s)")
    for c in sorted({int(c) for c in decode_contexts}):
        t0 = time.perf_counter()
        decode_group(c)
        say(f"[profile] decode context {c}, batches {sorted(set(decode_batches))} ({time.perf_counter() - t0:.1f} s)")
    joins = (max(int(c) for c in decode_contexts),) if join_contexts is None else tuple(join_contexts)
    cases = ["decode"] + (["packed" if packed else "mixed"] if mixed else [])
    for c in sorted({int(c) for c in joins}):
        t0 = time.perf_counter()
        for case in cases:
            join_case(c, case)
        say(f"[profile] joins at context {c}, {cases} ({time.perf_counter() - t0:.1f} s)")
    if measure_overhead:
        overhead_run()
    name = getattr(model, "name", None) or type(model).__name__
    cells = cell_medians(records)
    cm = fit_cost_model(cells, relative=relative, source=f"profile of {name} on this device (cell medians)")
    out = {
        "kind": "profile",
        "model": _model_info(model),
        "grid": {"prefill_tokens": list(prefill_tokens), "contexts": sorted({int(c) for c in contexts}),
                 "decode_batches": sorted({int(b) for b in decode_batches}),
                 "decode_contexts": sorted({int(c) for c in decode_contexts}),
                 "join_contexts": sorted({int(c) for c in joins}), "repeats": repeats,
                 "fill_chunk": fill_chunk, "mixed": mixed, "relative_fit": relative},
        "records": records,
        "cost_model": cm,
        "coefficients": coefficients(cm),
        "fit": fit_report(cm, cells),
        "fit_raw": fit_report(cm, records),
        "cells": cells,
        "skipped": skipped,
        "wall_s": time.perf_counter() - t_start,
    }
    say(f"[profile] {len(records)} steps in {out['wall_s']:.1f} s; fit median relative error "
        f"{out['fit'].get('all', {}).get('median', float('nan')):.3f}")
    return out


def _model_info(model) -> dict:
    info = {"name": getattr(model, "name", None)}
    for k in ("dtype", "bits", "group_size", "num_params"):
        v = getattr(model, k, None)
        info[k] = str(v) if k == "dtype" and v is not None else v
    return info


# ---------------------------------------------------------------------------------- files
def profile_path(platform: str, model_name: str) -> Path:
    """``data/profiles/<platform>-<model>.json`` (a model path keeps only its last part)."""
    stem = Path(str(model_name)).name or str(model_name)
    return profiles_dir() / f"{platform}-{stem}.json"


def _jsonable(profile: dict) -> dict:
    from mlxlab.core.results import _clean

    out = dict(profile)
    cm = out.get("cost_model")
    if isinstance(cm, StepCostModel):
        out["cost_model"] = cm.as_dict()
    return _clean(out)


def save_profile(profile: dict, platform: Optional[str] = None, model_name: Optional[str] = None,
                 path: Optional[Union[str, Path]] = None) -> Path:
    """Write ``profile`` (from :func:`profile_device` or :func:`seed001_profile`) as JSON with
    the environment attached, to ``path`` or ``data/profiles/<platform>-<model>.json``;
    returns the path."""
    import datetime as _dt

    if platform is None and (path is None or profile.get("kind") == "profile"):
        from mlxlab.core.environment import platform_name

        platform = platform_name()
    if path is None:
        if model_name is None:
            model_name = (profile.get("model") or {}).get("name") or "model"
        path = profile_path(platform, model_name)
    path = Path(path)
    doc = _jsonable(profile)
    if doc.get("kind") == "profile":
        from mlxlab.core.environment import device_summary
        from mlxlab.core.results import _git_commit

        doc["environment"] = {**device_summary(), "platform": platform, "git_commit": _git_commit(),
                              "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def cost_model_from_dict(doc: dict) -> StepCostModel:
    """The cost model of a profile document (or of a bare ``StepCostModel.as_dict()``)."""
    cm = doc.get("cost_model", doc)
    if isinstance(cm, StepCostModel):
        return cm
    return StepCostModel.from_dict(cm)


def load_profile(path_or_name: Union[str, Path]) -> StepCostModel:
    """The cost model saved in a profile: a path to a JSON file, or a name under
    ``data/profiles/`` (``"cpu-small"``, ``"seed001-m4max-35b"``)."""
    p = Path(path_or_name)
    if not p.is_file():
        cand = profiles_dir() / (p.name if p.suffix == ".json" else f"{p.name}.json")
        if not cand.is_file():
            have = sorted(q.stem for q in profiles_dir().glob("*.json")) if profiles_dir().is_dir() else []
            raise ValueError(f"no profile {str(path_or_name)!r}; saved profiles: {', '.join(have) or 'none'}")
        p = cand
    return cost_model_from_dict(json.loads(p.read_text()))


# ---------------------------------------------------------------------------------- seed 001
SEED001_NAME = "seed001-m4max-35b"
_SRC = "seeds/seed-001 (Apple Silicon serving case study)"


def _fig(value, unit: str, where: str, kind: str = "published") -> dict:
    return {"value": value, "unit": unit, "kind": kind,
            "provenance": f"{_SRC}, {where}" if kind == "published" else where}


def seed001_figures() -> Dict[str, dict]:
    """The published numbers the seed-001 profile is built from (value, unit, provenance), and
    the assumptions it needs where the case study says nothing (``kind`` "assumed")."""
    return {
        # --- published
        "bandwidth_gb_s": _fig(546, "GB/s", "'The setup': M4 Max, 128 GB unified memory at 546 GB/s"),
        "weight_gb_per_step": _fig(3.0, "GB", "'The setup': ~3B active params in mxfp8, about 3 GB touched per output token"),
        "kv_kb_per_token": _fig(20.0, "KB", "'Two jobs, two bottlenecks': ~20 KB per token overall (a quarter of layers full attention)"),
        "decode_tok_s": _fig(65.0, "tok/s", "opening and 'Two jobs': decodes at 65 tok/s with nothing else running (60-70 measured)"),
        "chat_context_tokens": _fig(23_000, "tokens", "'The setup': agent sessions hover around 23k tokens"),
        "chunk_2048_s": _fig([1.0, 2.0], "s", "'Prefill is compute-bound': 2,048-token chunks that each take one to two seconds at document scale"),
        "doc_context_tokens": _fig([10_000, 25_000], "tokens", "'The setup': benchmark prompts of 10-25k+ tokens (document scale)"),
        "long_prompt_tokens": _fig(60_000, "tokens", "'The core problem' and 'Trade-off': a single 60k-token prefill"),
        "floor_60k_s": _fig(44.0, "s", "'Trade-off': no chunk size takes it below the ~44 s prefill floor"),
        "premium_512_1024": _fig([0.15, 0.30], "fraction", "'Trade-off': at 512-1,024 tokens per chunk the 60k prompt pays a 15-30% TTFT premium over its floor"),
        "chat_gap_512_1024_s": _fig([0.4, 0.8], "s", "'Trade-off': concurrent chats keep their token gaps at roughly 0.4-0.8 s at 512-1,024"),
        "chat_gap_2048_s": _fig(1.5, "s", "'Trade-off': the 2,048 setting costs a worst-case 1.5 s (0.67 tok/s) gap"),
        "crawl_tok_s": _fig(0.67, "tok/s", "'The core problem': during a single 60k-token prefill a concurrent chat decoded at 0.67 tok/s"),
        "itl_solo_s": _fig(0.015, "s", "'Trade-off': ITL stretched from ~15 ms to ~1.5 s"),
        "gated_window_tok_s": _fig([60.0, 70.0], "tok/s", "'The two key optimizations': with the gate, chats stream at 60-70 tok/s between prefill chunks"),
        # --- assumed (not stated in the case study)
        "attention_flops_ratio": _fig(
            4 * 16 * 256 * 10 / (2 * 3e9), "per query-key pair / per token",
            "assumed architecture consistent with the seed's 20 KB/token (10 of 40 layers full attention, "
            "2 KV heads x head_dim 256 x bf16 = 20 KB/token; 16 query heads): attention costs 4*16*256*10 FLOPs per "
            "query-key pair against 2*3e9 FLOPs per token in the ~3B active weights, at the same achieved rate",
            kind="assumed"),
        "decode_per_seq_fraction": _fig(
            0.10, "of the weight-read time",
            "assumed: each extra sequence in a decode batch adds 10% of a step's weight-read time (MoE routes each "
            "token to its own experts: 'cheap but not free'); the seed gives no batched decode rate",
            kind="assumed"),
        "premium_point": _fig(
            [1024, 0.15], "(chunk tokens, premium)",
            "choice within the published band: a premium proportional to the number of chunk boundaries, 15% at "
            "1,024 and so 30% at 512, the two ends of the seed's band", kind="assumed"),
        "premium_with_chat": _fig(
            True, "bool",
            "choice: the premium is measured with a chat decoding beside the long prompt (one decode step per "
            "chunk, as mlx-vlm interleaves), the setting of the seed's TTFT/ITL curves", kind="assumed"),
    }


def seed001_profile() -> dict:
    """A cost model of seed 001's box (M4 Max, 35B hybrid MoE) derived from its published figures.

    Derivation (every input in :func:`seed001_figures`, with its provenance):

    * decode: one step at the chat's ~23k context takes 1/65 s. Its bytes are the ~3 GB of weights
      plus 23k x 20 KB of KV, so the achieved bandwidth is (3 GB + 0.46 GB) x 65 /s; the KV term
      ``decode_context_tokens`` costs 20 KB / that bandwidth per token, the weights cost the rest.
      Of the weight time, ``decode_per_seq_fraction`` (assumed) is charged per sequence
      (``decode_batch``) and the remainder once per step (``decode_step``).
    * prefill compute: the 60k prompt's floor F = e*N + f*N^2/2 = 44 s (N = 59,999 prefilled tokens:
      the last prompt token is decoded, not prefilled), with f = e x ``attention_flops_ratio``
      (assumed architecture); the floor has no per-chunk cost, so no chunk size goes below it.
    * per-chunk overhead ``prefill_chunks``: with a chat decoding beside it, each chunk boundary of
      the 60k prompt costs one chunk overhead plus one decode step; a premium of 15% at 1,024
      (59 chunks) gives overhead = 0.15 x 44 s / 59 - one decode step; the same overhead gives
      ~30% at 512, the other end of the seed's band.

    The published figures the result must reproduce (2,048-token chunk 1-2 s at 10-25k context,
    the 44 s floor, 65 tok/s near 23k, the 15-30% premium, chat gaps, 0.67 tok/s) are checked by
    :func:`mlxlab.studies.sim_validation.seed_scale_study`, not fitted one by one.
    """
    figs = seed001_figures()
    v = {k: f["value"] for k, f in figs.items()}
    w_bytes = v["weight_gb_per_step"] * 1e9
    kv_b = v["kv_kb_per_token"] * 1e3
    ctx = v["chat_context_tokens"]
    t_dec = 1.0 / v["decode_tok_s"]
    bw_eff = (w_bytes + ctx * kv_b) / t_dec
    per_ctx = kv_b / bw_eff
    w_time = w_bytes / bw_eff
    per_seq = v["decode_per_seq_fraction"] * w_time
    per_step = w_time - per_seq
    n = v["long_prompt_tokens"] - 1
    r = v["attention_flops_ratio"]
    per_token = v["floor_60k_s"] / (n + r * n * n / 2.0)
    per_pair = r * per_token
    chunk_at, premium = v["premium_point"]
    n_chunks = math.ceil(n / chunk_at)
    t_dec_beside = per_step + per_seq + per_ctx * (ctx + 1)  # the chat's decode between chunks
    per_chunk = premium * v["floor_60k_s"] / n_chunks - t_dec_beside
    cm = StepCostModel.from_coefficients(
        {"decode_step": per_step, "decode_batch": per_seq, "decode_context_tokens": per_ctx,
         "decode_padding_tokens": per_ctx, "prefill_chunks": per_chunk, "prefill_tokens": per_token,
         "prefill_attention": per_pair}, n_obs=1, source="seed-001 published figures (derived)")
    derivation = {
        "decode_step": f"weights read time ({w_time * 1e3:.2f} ms = 3 GB / achieved {bw_eff / 1e9:.0f} GB/s) "
                       f"less the per-sequence part: {per_step * 1e3:.2f} ms",
        "decode_batch": f"decode_per_seq_fraction x weights read time: {per_seq * 1e3:.2f} ms per sequence",
        "decode_context_tokens": f"20 KB / achieved bandwidth {bw_eff / 1e9:.0f} GB/s "
                                 f"(= (3 GB + 23k x 20 KB) x 65 /s): {per_ctx * 1e9:.1f} ns per context token",
        "decode_padding_tokens": "as decode_context_tokens: a batch's left padding is read like its context",
        "decode_batched, join_tokens, drop_tokens": "0: the seed gives no figure for them",
        "overhead_s, tail_s": "0 and None (not measured; tokens are stamped when their step ends)",
        "prefill_chunks": f"15% premium at 1,024 ({n_chunks} chunks) = 0.15 x 44 s / {n_chunks} less one chat "
                          f"decode step ({t_dec_beside * 1e3:.1f} ms): {per_chunk * 1e3:.1f} ms per chunk",
        "prefill_tokens": f"44 s floor = e*N + f*N^2/2 with N = {n} and f/e = {r:.3g}: e = {per_token * 1e6:.1f} us/token",
        "prefill_attention": f"f = e x {r:.3g} = {per_pair * 1e9:.2f} ns per query-key pair",
    }
    return {
        "kind": "published-profile",
        "name": SEED001_NAME,
        "model": {"name": "35B hybrid MoE (~3B active, mxfp8)", "device": "Apple M4 Max, 128 GB, 546 GB/s"},
        "figures": figs,
        "cost_model": cm,
        "coefficients": coefficients(cm),
        "derivation": derivation,
        "notes": ("Derived, not measured: every coefficient follows from the figures above; the 'assumed' "
                  "entries fill what the case study does not state. Units: seconds per feature unit "
                  "(see mlxlab.core.costmodel.FEATURES)."),
    }


def write_seed001_profile(path: Optional[Union[str, Path]] = None) -> Path:
    """Write :func:`seed001_profile` to ``data/profiles/seed001-m4max-35b.json``; returns the path."""
    return save_profile(seed001_profile(), path=path or profiles_dir() / f"{SEED001_NAME}.json")


def seed001_cost_model() -> StepCostModel:
    """The seed-001 cost model (from the saved file if present, else derived now)."""
    p = profiles_dir() / f"{SEED001_NAME}.json"
    if p.is_file():
        return load_profile(p)
    return seed001_profile()["cost_model"]


# ---------------------------------------------------------------------------------- CLI
def add_profile_arguments(parser) -> None:
    """Arguments of ``mlxlab profile`` (the lead wires this into :mod:`mlxlab.cli`)."""
    from mlxlab.cli.common import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("--prefill-tokens", type=int, nargs="+", default=None,
                        help=f"chunk sizes (default {list(PROFILE_DEFAULTS['prefill_tokens'])})")
    parser.add_argument("--contexts", type=int, nargs="+", default=None,
                        help=f"contexts before a chunk (default {list(PROFILE_DEFAULTS['contexts'])})")
    parser.add_argument("--decode-batches", type=int, nargs="+", default=None,
                        help=f"decode batch sizes (default {list(PROFILE_DEFAULTS['decode_batches'])})")
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=None,
                        help=f"decode contexts (default {list(PROFILE_DEFAULTS['decode_contexts'])})")
    parser.add_argument("--join-contexts", type=int, nargs="+", default=None,
                        help="prompt lengths of the long rows that join a short row's decode "
                             "(default: the longest decode context)")
    parser.add_argument("--repeats", type=int, default=None, help=f"default {PROFILE_DEFAULTS['repeats']}")
    parser.add_argument("--quick", action="store_true", help=f"a small grid: {QUICK_DEFAULTS}")
    parser.add_argument("--seed001", action="store_true",
                        help="write the seed-001 published profile (data/profiles/seed001-m4max-35b.json) and stop")
    parser.add_argument("--platform", default=None, help="profile file prefix (default: detected)")
    parser.add_argument("--quiet", action="store_true")


def cli_profile(args) -> int:
    """``mlxlab profile``: measure a grid on this device and save ``data/profiles/<platform>-<model>.json``
    (or, with ``--seed001``, write the published seed-001 profile)."""
    if getattr(args, "seed001", False):
        path = write_seed001_profile()
        for k, v in seed001_profile()["derivation"].items():
            print(f"  {k:22s} {v}")
        print(f"wrote {path}")
        return 0
    from mlxlab.engine.models import load_model

    base = QUICK_DEFAULTS if args.quick else PROFILE_DEFAULTS
    grid = {k: (getattr(args, k) or base[k]) for k in ("prefill_tokens", "contexts", "decode_batches",
                                                         "decode_contexts", "repeats")}
    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    print(f"[profile] {args.model}: {model.num_params / 1e6:.1f}M params, dtype={model.dtype}, bits={model.bits}; "
          f"grid {grid}", flush=True)
    prof = profile_device(model, **grid, join_contexts=getattr(args, "join_contexts", None),
                          log=None if args.quiet else (lambda s: print(s, flush=True)))
    for f, c in prof["coefficients"].items():
        print(f"  {f:24s} {c:.4g}" if c is not None else f"  {f:24s} n/a")
    for kind, e in prof["fit"].items():
        print(f"  fit {kind:8s} n={e['n']:4d} median rel err {e['median']:.3f}  p90 {e['p90']:.3f}")
    path = save_profile(prof, platform=args.platform, model_name=args.model)
    print(f"wrote {path}")
    return 0
