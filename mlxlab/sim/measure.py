"""Measuring a step-time profile on this device (MLX).

:func:`profile_device` times tiny controlled steps on the real engine's own code path
(``Engine.step`` with a scripted policy that dictates each plan, :mod:`mlxlab.sim.rig`), one
group of grid cells at a time (:mod:`mlxlab.sim.cells`):

* prefill-only steps: one chunk of ``n`` tokens after a context of ``c`` tokens, for every ``n``
  in ``prefill_tokens`` and ``c`` in ``contexts`` (plus the chunks that build the context);
* decode-only steps: ``b`` sequences at context ``c`` for every ``b`` in ``decode_batches`` and
  ``c`` in ``decode_contexts`` (the batch shrinks from the largest ``b`` as sequences reach their
  ``max_tokens``, so each context is prefilled once);
* mixed steps: a decode of that batch plus one chunk of each size of a long prompt, back to back
  ("mixed") and, for a model :mod:`mlxlab.engine.fused` can pack, as one packed forward ("packed":
  kept with the records, not fitted: no feature describes packing yet);
* batch changes ("rebatch"): the first decode of each batch size, which joins every row into one
  ``BatchKVCache`` (``join_tokens``) or drops the rows that finished (``drop_tokens``), timed on
  its own (nothing in flight before, its tokens read at once); and a long row joining a short
  row's decode and leaving it, in a decode-only step and beside a chunk ("start", "join_chunk");
* the decode tail ("tail"): after a run of pipelined decode-only steps, the gap between the last
  two token reads of a stream, the last read by the next step's flush: how long a forward still
  runs after the engine's Python returned from queueing it (``StepCostModel.tail_s``);
* ragged batch changes ("rebatch", cells ``ragged join/drop bN``: :class:`mlxlab.sim.cells.RaggedCase`)
  and first uses of a chunk size (``cold_chunks``: every record counts the chunks of a token count
  the profile had not run before, warm-up included; :func:`mlxlab.sim.cells.cold_group` adds sizes
  nothing else runs, each twice);
* the host overhead ("overhead"): a short workload through :func:`mlxlab.core.runner.run_workload`
  under ``interleave``; the gaps between a step's end and the next step's start after steps
  that end inside ``Engine.step`` (run loop, scheduler state, policy: ``overhead_s``).

What is timed is what a step costs a stream, i.e. what the simulator must charge: the wall time
of ``Engine.step()`` for steps that finish inside it (prefill-only and mixed; any decode still in
flight is read first, untimed), and, for decode-only steps, which the engine pipelines, the gap
between consecutive token reads of one stream (the first two steps after a change of batch are
left out: one pays the change, timed separately, the next refills the pipeline). The model is
then fitted to the cells' medians, minimising the *relative* error of every step
(:func:`mlxlab.sim.fit.fit_cost_model`), so millisecond decode steps count as much as second-long
chunks.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from mlxlab.sim.cells import JoinCase, RaggedCase, cold_group, decode_group, overhead_run, prefill_group
from mlxlab.sim.fit import cell_medians, coefficients, fit_cost_model, fit_report, pass_drift
from mlxlab.sim.profiles import PROFILE_DEFAULTS
from mlxlab.sim.rig import Bench


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
            (:class:`mlxlab.sim.cells.JoinCase`; default: the longest decode context; ``()``
            for none).
        repeats: passes over the grid. Each pass runs every group once (prefill chunks, decode
            phases with their mixed steps, join cases, ragged batches), so a slow spell of a shared
            machine lands on every kind of step instead of on one group measured in a block; a
            pass's decode phase has ``max(10, 2 * repeats + 4)`` steps per (batch, context), of
            which the first two are dropped (see the module docstring). ``drift`` in the result
            says how much each pass ran slower or faster than the profile as a whole.
        fill_chunk: chunk size that builds contexts (those steps are recorded too).
        mixed: also time decode + chunk steps.
        relative: fit relative errors (see :func:`mlxlab.sim.fit.fit_cost_model`).

    Returns a dict: ``records`` (step-record dicts whose ``duration_s`` is the measured cost,
    with ``kind`` fill / prefill / decode / mixed / packed / rebatch / start / join_chunk / tail /
    overhead and ``engine_duration_s`` the engine's own record time), ``cells`` (per grid cell:
    median time and features, :func:`mlxlab.sim.fit.cell_medians`), ``cost_model`` (a
    :class:`~mlxlab.core.costmodel.StepCostModel` fitted to the cells), ``drift``
    (:func:`mlxlab.sim.fit.pass_drift`), ``coefficients``, ``fit``
    and ``fit_raw`` (:func:`mlxlab.sim.fit.fit_report` on the cells and on every record), ``grid``,
    ``model``, ``wall_s``. Contexts that do not fit the model's context window are skipped (listed
    in ``skipped``).
    """
    _check_grid(prefill_tokens, contexts, decode_batches, decode_contexts, repeats)
    say = log or (lambda s: None)
    t_start = time.perf_counter()
    bench = Bench(model, prefill_tokens=prefill_tokens, decode_contexts=decode_contexts, repeats=repeats,
                  fill_chunk=fill_chunk, mixed=mixed, seed=seed)
    contexts = sorted({int(c) for c in contexts})
    joins = sorted({int(c) for c in ((max(bench.decode_contexts),) if join_contexts is None else join_contexts)})
    if warmup:
        _warm_up(bench, contexts, decode_batches, seed)
        say(f"[profile] warm-up done ({time.perf_counter() - t_start:.1f} s)")
    cases = ["decode"] + (["packed" if bench.packed else "mixed"] if mixed else [])
    for r in range(repeats):  # every group once per pass, so a slow spell of the machine lands on every kind
        bench.pass_index = r
        t0 = time.perf_counter()
        for c in contexts:
            prefill_group(bench, c)
        for c in bench.decode_contexts:
            decode_group(bench, c, decode_batches)
        for c in joins:  # a join case's cells are single steps: one per pass, so each cell is a median
            for case in cases:
                JoinCase(bench, c, case).run()
        RaggedCase(bench, max(joins) if joins else max(bench.decode_contexts)).run()  # 2-4 ragged rows
        say(f"[profile] pass {r + 1}/{repeats}: prefill, decode, joins, ragged batches "
            f"({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    cold_group(bench, min(contexts))  # last: a shape first met after all the others
    say(f"[profile] cold chunks ({time.perf_counter() - t0:.1f} s)")
    if measure_overhead:
        overhead_run(bench, seed)
    grid = {"prefill_tokens": list(bench.prefill_tokens), "contexts": contexts,
            "decode_batches": sorted({int(b) for b in decode_batches}), "decode_contexts": bench.decode_contexts,
            "join_contexts": joins, "repeats": repeats, "fill_chunk": fill_chunk, "mixed": mixed,
            "relative_fit": relative}
    out = _fitted_profile(bench, grid, relative)
    out["wall_s"] = time.perf_counter() - t_start
    drift = out["drift"]
    if drift.get("passes", 0) > 1:
        say("[profile] passes against the profile's medians: " + ", ".join(
            f"{k} " + "/".join(f"{x:.2f}" for x in v) for k, v in drift["by_kind"].items()))
    say(f"[profile] {len(bench.records)} steps in {out['wall_s']:.1f} s; fit median relative error "
        f"{out['fit'].get('all', {}).get('median', float('nan')):.3f}")
    return out


def _check_grid(prefill_tokens, contexts, decode_batches, decode_contexts, repeats) -> None:
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for name, vals in (("prefill_tokens", prefill_tokens), ("decode_batches", decode_batches),
                       ("decode_contexts", decode_contexts)):
        if not vals or any(int(v) < 1 for v in vals):
            raise ValueError(f"{name} must be positive integers, got {vals!r}")
    if any(int(c) < 0 for c in contexts):
        raise ValueError(f"contexts must be >= 0, got {contexts!r}")


def _warm_up(bench: Bench, contexts: Sequence[int], decode_batches: Sequence[int], seed: int) -> None:
    """Unrecorded: first allocations, first use of each code path, every decode batch size included.
    On mlx's CUDA backend the first step at a new decode batch size compiles kernels and its first
    mixed steps run cold whatever their chunk's shape: a warm-up of batches 1 and 2 left that to the
    first pass (H200, coder-1.5b, 2026-12-06: the first join of 8 rows took 30 s, and every mixed and
    packed step of batches 8 and 4 ~60 ms more than in the second pass, though counted warm)."""
    bench.recording = False
    try:
        prefill_group(bench, min(contexts))
        decode_group(bench, min(bench.decode_contexts), batches=decode_batches)
        overhead_run(bench, seed)
    finally:
        bench.recording = True


def _fitted_profile(bench: Bench, grid: dict, relative: bool) -> dict:
    """The profile document: the records, their cells' medians and the cost model fitted to them."""
    name = getattr(bench.model, "name", None) or type(bench.model).__name__
    cells = cell_medians(bench.records)
    cm = fit_cost_model(cells, relative=relative, source=f"profile of {name} on this device (cell medians)")
    return {
        "kind": "profile",
        "model": _model_info(bench.model),
        "grid": grid,
        "records": bench.records,
        "cost_model": cm,
        "coefficients": coefficients(cm),
        "fit": fit_report(cm, cells),
        "fit_raw": fit_report(cm, bench.records),
        "cells": cells,
        "drift": pass_drift(bench.records),
        "skipped": bench.skipped,
    }


def _model_info(model) -> dict:
    info = {"name": getattr(model, "name", None)}
    for k in ("dtype", "bits", "group_size", "num_params"):
        v = getattr(model, k, None)
        info[k] = str(v) if k == "dtype" and v is not None else v
    return info
