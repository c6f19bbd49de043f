"""Fitting a step-time cost model to profile records, and how well it fits.

A profile's records (:func:`mlxlab.sim.measure.profile_device`) are reduced to one median per
grid cell (:func:`cell_medians`), then fitted by non-negative least squares in stages
(:func:`fit_cost_model`), so the decode terms come from decode-only steps and a step's other
terms from what is left once its decode is predicted: the way the simulator charges a step.
No MLX: a saved profile's records can be fitted again anywhere.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from mlxlab.core.costmodel import (
    DECODE_FEATURES,
    FEATURES,
    PACKED_FEATURES,
    PREFILL_FEATURES,
    REBATCH_FEATURES,
    StepCostModel,
    record_features,
    solve_nnls,
)

TIMING_KINDS = ("tail", "overhead")  # records of the two timing parameters, not of step costs
# left out of the staged fit's main stages: packed steps (measured and kept; their features are the
# mixed steps', less a forward), a row's first decode ("start") and a change of the decode rows in
# a step with chunks ("join_chunk"), of which the packed ones price packed_changes at the end
UNFITTED_KINDS = ("packed", "start", "join_chunk")
PACKED_CHANGE_KINDS = ("start", "join_chunk")  # fitted alone, packed ones only: packed_changes
MEDIAN_FIELDS = ("duration_s", "decode_context_tokens", "prefill_tokens", "prefill_context_tokens", "decode_batch",
                 "decode_kv_tokens", "join_tokens", "drop_tokens")


def _fit_rows(X: np.ndarray, y: np.ndarray, relative: bool) -> np.ndarray:
    if relative:
        X, y = X / y[:, None], np.ones_like(y)
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0
    return solve_nnls(X / scale, y, 1e-9) / scale


def _cold_keying(records: Sequence[dict]) -> dict:
    """How the records counted their cold chunks (``cold_key``, ``cold_capacity``), from the first
    that says; ``{}`` (by token count) where none does."""
    for r in records:
        if r.get("cold_key"):
            return {"cold_key": r["cold_key"], "cold_capacity": r.get("cold_capacity")}
    return {}


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

    Records of kind ``tail`` and ``overhead`` are not step costs: the medians of their
    ``duration_s`` become ``tail_s`` and ``overhead_s``. The model counts cold chunks as the
    records did (their ``cold_key`` and ``cold_capacity``, stamped by the profile's rig; by token
    count where they carry none: :class:`~mlxlab.core.costmodel.WarmShapes`)."""
    allrecs = [r for r in records if r.get("duration_s", 0) > 0]
    recs = [r for r in allrecs if r.get("kind") not in TIMING_KINDS + UNFITTED_KINDS]
    timing = dict(tail_s=_timing(allrecs, "tail"), overhead_s=_timing(allrecs, "overhead") or 0.0,
                  **_cold_keying(allrecs))
    if not relative and not staged:
        cm = StepCostModel.fit(recs, source=source)
        for k, v in timing.items():
            setattr(cm, k, v)
        return cm
    if not recs:
        return StepCostModel(source=source, **timing)
    X = np.stack([record_features(r) for r in recs])
    y = np.array([r["duration_s"] for r in recs], dtype=float)
    coef = _staged_fit(X, y, relative) if staged else None
    if coef is None:  # joint, or no decode-only step to start the stages from
        coef = _fit_rows(X, y, relative)
    else:
        _fit_packed_changes(coef, allrecs, relative)
    return StepCostModel(coef=coef, n_obs=len(recs), source=source, **timing)


def _staged_fit(X: np.ndarray, y: np.ndarray, relative: bool) -> Optional[np.ndarray]:
    """Decode terms, then batch changes, then prefill terms (see :func:`fit_cost_model`); None
    without a decode-only step."""
    has_decode = X[:, FEATURES.index("decode_step")] > 0
    has_chunk = X[:, FEATURES.index("prefill_tokens")] > 0
    rebatch = (X[:, REBATCH_FEATURES] > 0).any(axis=1)
    decode_only = has_decode & ~has_chunk & ~rebatch
    if not decode_only.any():
        return None
    coef = np.zeros(len(FEATURES))
    _fit_decode(coef, X[decode_only], y[decode_only], relative)
    rb = rebatch & ~has_chunk
    _fit_remainder(coef, X[rb], y[rb], DECODE_FEATURES, REBATCH_FEATURES, relative)
    _fit_remainder(coef, X[has_chunk], y[has_chunk], DECODE_FEATURES + REBATCH_FEATURES, PREFILL_FEATURES, relative)
    return coef


def _fit_decode(coef: np.ndarray, X: np.ndarray, y: np.ndarray, relative: bool) -> None:
    """The decode coefficients from decode-only steps; padding priced as context unless some
    step had padding (a short row decoded beside a long one)."""
    pad = FEATURES.index("decode_padding_tokens")
    ctx = FEATURES.index("decode_context_tokens")
    if (X[:, pad] > 0).any():
        coef[DECODE_FEATURES] = _fit_rows(X[:, DECODE_FEATURES], y, relative)
        return
    cols = [i for i in DECODE_FEATURES if i != pad]
    Xd = X[:, cols]
    Xd[:, cols.index(ctx)] += X[:, pad]
    coef[cols] = _fit_rows(Xd, y, relative)
    coef[pad] = coef[ctx]


def _fit_remainder(coef: np.ndarray, X: np.ndarray, y: np.ndarray, known: List[int], cols: List[int],
                   relative: bool) -> None:
    """``coef[cols]`` from what the steps took beyond their prediction by ``coef[known]``."""
    if not len(y):
        return
    rest = y - X[:, known] @ coef[known]
    ok = rest > 0
    if ok.any():
        coef[cols] = _fit_rows(X[ok][:, cols], rest[ok], relative)


def _fit_packed_changes(coef: np.ndarray, records: Sequence[dict], relative: bool) -> None:
    """Last, what a change of the decode rows adds to a packed step beyond all the other terms."""
    pk = [r for r in records if r.get("kind") in PACKED_CHANGE_KINDS and r.get("fused")]
    if not pk:
        return
    Xp = np.stack([record_features(r) for r in pk])
    yk = np.array([r["duration_s"] for r in pk])
    rest = yk - Xp @ coef
    ok = (Xp[:, PACKED_FEATURES[0]] > 0) & (rest > 0)
    if ok.any():  # relative to the whole step, not to the part left to explain
        w = yk[ok] if relative else np.ones(int(ok.sum()))
        coef[PACKED_FEATURES] = _fit_rows(Xp[ok][:, PACKED_FEATURES] / w[:, None], rest[ok] / w, False)


def _cell(r: dict) -> tuple:
    """The grid cell of a profile record: its kind, decode batch, chunk size, and contexts
    rounded to 2 significant digits (a decode context grows by the batch every step); a step with
    cold chunks is a cell of its own beside its warm twins."""
    if r.get("cell"):
        return (r["cell"], int(r.get("cold_chunks") or 0))

    def r2(x):
        return float(f"{x:.2g}") if x else 0
    return (r.get("kind", r.get("phase")), r.get("decode_batch", 0), r2(r.get("decode_context_tokens", 0)),
            r.get("prefill_tokens", 0), r2(r.get("prefill_context_tokens", 0)))


def mark_cold_chunks(records: Sequence[dict], warm: bool) -> List[dict]:
    """A profile share's records (in the order they were measured) with ``cold_chunks`` counted
    where a profile saved before that field lacks it: the chunks of a token count no earlier
    record of the share ran, unless ``warm`` (the share came right after the profile's warm-up,
    which ran the grid's sizes: the first share of a validation). Records that carry the field are
    kept as they are."""
    if any("cold_chunks" in r for r in records):
        return list(records)
    seen, out = set(), []
    for r in records:
        sizes = [int(c[0]) + (int(c[2]) if len(c) > 2 else 0) for c in r.get("prefill_chunks") or []]
        if not sizes and r.get("prefill_tokens"):
            sizes = [int(r["prefill_tokens"])]
        cold = 0 if warm else sum(1 for n in sizes if n not in seen)
        seen |= set(sizes)
        out.append(dict(r, cold_chunks=cold) if cold else r)
    return out


def cell_medians(records: Iterable[dict]) -> List[dict]:
    """One record per grid cell (:func:`_cell`): the median duration and the median of each
    feature field, so a step slowed by a busy machine does not pull the fit."""
    groups: Dict[tuple, List[dict]] = {}
    for r in records:
        if r.get("duration_s", 0) > 0:
            groups.setdefault(_cell(r), []).append(r)
    out = []
    for rs in groups.values():
        d = dict(rs[0])
        for f in MEDIAN_FIELDS:
            if f in rs[0]:
                d[f] = float(np.median([x.get(f, 0) for x in rs]))
        durations = [x["duration_s"] for x in rs]
        d["n"] = len(rs)
        d["spread"] = float(np.std(durations) / np.mean(durations)) if len(rs) > 1 else 0.0
        out.append(d)
    return out


def pass_drift(records: Iterable[dict], kinds: Sequence[str] = ("decode", "prefill", "mixed", "rebatch")) -> dict:
    """How each pass over a profile's grid ran against the profile as a whole: per kind, the
    median over that pass's records of (record time / its cell's median over all passes); 1.0 is
    the profile's own pace. A pass of a shared machine's slow spell reads above 1 on every kind;
    ``spread`` is the largest max/min - 1 over the kinds. Records without a ``pass`` field (a
    profile measured before passes) give ``passes`` 0."""
    recs = [r for r in records if r.get("duration_s", 0) > 0 and "pass" in r]
    by_cell: Dict[tuple, List[float]] = {}
    for r in recs:
        by_cell.setdefault(_cell(r), []).append(r["duration_s"])
    med = {k: float(np.median(v)) for k, v in by_cell.items()}
    passes = sorted({int(r["pass"]) for r in recs})
    by_kind: Dict[str, List[float]] = {}
    for kind in kinds:
        row = []
        for p in passes:
            ratios = [r["duration_s"] / med[_cell(r)] for r in recs
                      if r.get("kind") == kind and int(r["pass"]) == p and med.get(_cell(r))]
            row.append(float(np.median(ratios)) if ratios else float("nan"))
        if any(np.isfinite(row)):
            by_kind[kind] = row
    spread = max((np.nanmax(v) / np.nanmin(v) - 1 for v in by_kind.values() if np.nanmin(v) > 0), default=0.0)
    return {"passes": len(passes), "by_kind": by_kind, "spread": float(spread)}


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
