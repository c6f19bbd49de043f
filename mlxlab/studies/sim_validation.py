"""Two studies with the simulator: its error against the engine, and seed 001 at its own scale.

:func:`validate_simulator` runs the real engine and the simulator (charged with a profile measured
on this device) on the same workloads and policies, and compares TTFT p50, ITL p50 and ITL p99 per
tenant. The engine runs ``repeats`` times, so every row also carries the engine's run-to-run noise
and a tolerance derived from it:

    noise     = the engine's coefficient of variation over repeats (std, ddof=1, / mean)
    tolerance = max(10%, 3 x noise)
    passed    = |sim - engine median| / engine median <= tolerance

so a metric the engine itself cannot repeat to 10% is not held to 10%, while a quiet machine is.

:func:`seed_scale_study` uses the seed-001 published profile (:func:`mlxlab.sim.profiling.seed001_profile`)
to reproduce the case study's figures at 60k-token scale: the prompt's TTFT floor, the
TTFT-vs-chunk and chat-ITL-vs-chunk curves over 256-4,096, the 0.67 tok/s crawl without a gate and
the 60-70 tok/s windows with one, and where ``stall_free`` and ``slo`` fall on the same TTFT/ITL
plane. Each figure becomes a claim: name, published, measured, verdict.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mlxlab.core.paths import ROOT
from mlxlab.core.plan import SchedulerState, StepPlan
from mlxlab.core.presets import DEFAULT_MAX_CONTEXT, model_limits
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload
from mlxlab.policies.admission_gate import AdmissionGate
from mlxlab.sim.simulator import Simulator

MIN_TOLERANCE = 0.10
NOISE_FACTOR = 3.0
METRICS = (("ttft_s", "p50", "ttft_p50_s"), ("itl_s", "p50", "itl_p50_s"), ("itl_s", "p99", "itl_p99_s"))


def figures_dir() -> Path:
    return ROOT / "paper" / "figures"


def save_chart(chart, name: str, folder: Optional[Path] = None) -> List[Path]:
    """Save an Altair chart as ``<name>.svg`` and ``<name>.png`` (vl-convert, no browser)."""
    folder = Path(folder) if folder else figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("svg", "png"):
        p = folder / f"{name}.{ext}"
        chart.save(str(p), **({"scale_factor": 2} if ext == "png" else {}))
        paths.append(p)
    return paths


# ---------------------------------------------------------------------------------- a policy
class DecodeWindowGate(AdmissionGate):
    """``admission_gate`` plus a decode window: after each step that ran a chunk of a big prompt,
    only decoding (and short prompts) run for ``window_s`` seconds, so interactive streams get
    runs of plain decode steps between chunks (seed 001's "decode window held open between
    prefill chunks"). With nobody decoding, big chunks run back to back. Works on the engine and
    the simulator alike (it reads ``state.now_s`` and observed step records)."""

    name = "admission_gate_window"

    def __init__(self, window_s: float = 1.0, big_prompt_tokens: int = 2048, prefill_batch_size: int = 8):
        super().__init__(big_prompt_tokens=big_prompt_tokens, prefill_batch_size=prefill_batch_size)
        if not window_s >= 0:
            raise ValueError(f"window_s must be >= 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._hold_until = float("-inf")
        self._big: set = set()

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan = super().schedule(state)
        self._big |= {s.seq_id for s in state.prefill_queue if self.is_big(s)}
        if state.decoding and state.now_s < self._hold_until:
            plan.prefill = [(i, n) for i, n in plan.prefill if i not in self._big]
        return plan

    def observe(self, record: dict) -> None:
        if any(i in self._big for i in record.get("prefill_seqs", ())):
            self._hold_until = record["end_s"] + self.window_s

    def __repr__(self) -> str:
        return f"DecodeWindowGate(window_s={self.window_s}, big_prompt_tokens={self.big_prompt_tokens})"


# ---------------------------------------------------------------------------------- validation
def validation_workloads(model, *, scale: float = 1.0, seed: int = 0) -> Dict[str, Workload]:
    """The validation mixes, prompt lengths times ``scale`` (1.0: 1-2k-token batch prompts, for
    ``small`` on a CPU; use ~8 on a GPU with a 1.5B model):

    * ``chat+long``: one chat stream and one long prompt, both at t=0 (the stall scenario);
    * ``chat+batch``: two 2-turn chat sessions (think time 0.2 s) and two batch workers with two
      prompts each, closed loop (arrivals depend on finish times: exercises the clock)."""
    vocab, max_ctx = model_limits(model)

    def n(x):
        return max(8, int(round(x * scale)))

    long_tokens = min(n(2048), max_ctx - 64)
    mixes = {
        "chat+long": [ChatTenant(sessions=1, turns=1, first_prompt_tokens=n(128), output_tokens=48,
                                 think_time_s=0.0, name="chat"),
                      BatchTenant(workers=1, requests=1, prompt_tokens=long_tokens, output_tokens=8, name="batch")],
        "chat+batch": [ChatTenant(sessions=2, turns=2, first_prompt_tokens=n(256), turn_tokens=n(64),
                                  output_tokens=24, think_time_s=0.2, stagger_s=0.05, name="chat"),
                       BatchTenant(workers=2, requests=4, prompt_tokens=(n(1024), long_tokens), output_tokens=8,
                                   name="batch")],
    }
    return {k: Workload(v, vocab_size=vocab, seed=seed, max_context=max_ctx, name=k) for k, v in mixes.items()}


def workload_shape(workloads: Dict[str, Workload], policies: Sequence[str], chunk_size: int,
                   options: Optional[Dict[str, dict]] = None, vocab_size: int = 2**31 - 1,
                   max_context: int = DEFAULT_MAX_CONTEXT) -> dict:
    """What the runs will ask of a cost model, from a dry run in the simulator: the longest
    prompt, the largest decode batch, the longest decoding context."""
    from mlxlab.core.costmodel import StepCostModel
    from mlxlab.core.runner import run_workload

    rough = StepCostModel.from_coefficients({"decode_step": 1e-3, "decode_batch": 2e-4, "decode_context_tokens": 1e-8,
                                             "prefill_chunks": 1e-3,
                                             "prefill_tokens": 1e-5, "prefill_attention": 1e-9}, n_obs=1, source="rough")
    longest = batch = ctx = 0
    for wl in workloads.values():
        for p in policies:
            sim = Simulator(rough, policy=p, chunk_size=chunk_size, vocab_size=vocab_size, max_context=max_context,
                            **(options or {}).get(p, {}))
            res = run_workload(sim, wl)
            longest = max([longest] + [r.prompt_tokens for r in res.submitted])
            for s in res.executor.steps:
                if s.decode_seqs:
                    batch = max(batch, len(s.decode_seqs))
                    ctx = max(ctx, s.decode_context_tokens // len(s.decode_seqs))
    return {"longest_prompt": longest, "max_decode_batch": batch, "max_decode_context": ctx}


def targeted_grid(shape: dict, chunk_size: int, repeats: int = 3) -> dict:
    """A profile grid around what the runs use (:func:`workload_shape`): chunks of the run's chunk
    size (and smaller, for prompts' last chunks, one of them a token off a round size) from empty to the longest prompt's context, decode
    batches up to the largest one, decode contexts up to the longest."""
    L = max(shape["longest_prompt"], 2)
    B = max(shape["max_decode_batch"], 1)
    C = max(shape["max_decode_context"], 2)
    # chunk_size // 2 - 1: a chunk whose key length is off the alignment (the prompt's last piece,
    # a token budget less its decodes), which a GPU's attention runs on a slower path
    return dict(prefill_tokens=tuple(sorted({max(8, chunk_size // 8), max(7, chunk_size // 2 - 1),
                                             max(8, chunk_size // 2), chunk_size})),
                contexts=tuple(sorted({0, max(0, L // 2 - chunk_size), max(0, L - chunk_size)})),
                decode_batches=tuple(sorted({1, max(1, B // 2), B})),
                decode_contexts=tuple(sorted({32, max(32, C // 2), max(32, C)})),
                repeats=repeats, fill_chunk=chunk_size)


def _periods(*runs: List[dict]) -> Dict[str, dict]:
    """Median step period (next step's start - this step's start: what a step costs the run,
    pipelining included) by phase and decode batch, and whether the step changed the batch, over
    the step records of one or more runs; periods that include an idle wait for an arrival are
    left out. The same table for the engine and the simulator shows where their clocks part."""
    by: Dict[str, List[float]] = {}
    for recs in runs:
        for prev, a, b in zip([None] + list(recs), recs, list(recs[1:])):
            if b["start_s"] - a["end_s"] > 0.005:  # the runner waited for an arrival
                continue
            changed = prev is not None and a["decode_batch"] and prev.get("decode_seqs") != a.get("decode_seqs")
            key = f"{a['phase']} b{a['decode_batch']}" + (" changed" if changed else "")
            by.setdefault(key, []).append(b["start_s"] - a["start_s"])
    return {k: {"median_s": float(np.median(v)), "n": len(v)} for k, v in sorted(by.items())}


STEP_COLUMNS = ("start_s", "end_s", "phase", "decode_batch", "decode_context_tokens", "prefill_tokens",
                "prefill_context_tokens", "chunks", "joined", "dropped", "fused")


def step_rows(records: Sequence[dict]) -> List[list]:
    """Step records (``StepRecord.as_dict()``) as compact rows of :data:`STEP_COLUMNS`, to keep
    every step of a validation run beside its summary (``chunks``: how many sequences the step
    prefilled)."""
    out = []
    for r in records:
        d = dict(r, chunks=len(r.get("prefill_seqs") or []))
        out.append([(float(d[c]) if c.endswith("_s") else d.get(c, 0)) for c in STEP_COLUMNS])
    return out


def _metric(summary: dict, tenant: str, key: str, stat: str) -> float:
    s = summary.get(tenant)
    if not s:
        return float("nan")
    v = s[key][stat]
    return float(v) if v is not None else float("nan")


def validate_simulator(model, workloads: Optional[Dict[str, Workload]] = None,
                       policies: Sequence[str] = ("interleave", "admission_gate", "stall_free"),
                       repeats: int = 3, *, profile=None, chunk_size: int = 256,
                       policy_options: Optional[Dict[str, dict]] = None, scale: float = 1.0,
                       profile_grid: Optional[dict] = None, warmup: bool = True, seed: int = 0,
                       save: bool = True, figure: bool = True, platform: Optional[str] = None,
                       name: str = "sim_validation", sentinel_tokens: int = 24,
                       log: Optional[Callable[[str], None]] = None) -> dict:
    """Simulator against engine on the same workloads (see the module docstring for the rule).

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel`.
        workloads: name -> workload (default :func:`validation_workloads` at ``scale``).
        policies: policy names, run with ``policy_options[name]`` on both executors.
        repeats: engine runs per (workload, policy); the simulator runs once (it is deterministic).
        profile: a cost model or profile dict; default: measured here with
            :func:`mlxlab.sim.profiling.profile_device` on :func:`targeted_grid` (``profile_grid``
            overrides), one share per repeat just before that repeat's engine runs, so slow drift
            of a shared machine hits the profile and the engine alike; the fit uses the medians
            of each grid cell over all shares.
        chunk_size: the chunk size of every run.
        sentinel_tokens: before each profile share and each engine run, a lone chat of this many
            output tokens (:func:`sentinel_itl`), whose ITL p50 tracks how fast the machine is
            right then; 0 for none.

    With a measured profile the simulator runs once per profile share (each fitted alone) and its
    value is the median over shares, as the engine's is over repeats.
        save, figure, platform, name: write ``data/results/<platform>/<name>.json`` and
            ``paper/figures/<name>_<platform>.svg/.png``.

    Returns a JSON-ready dict: ``table`` (rows: workload, policy, tenant, metric, engine, sim,
    rel_error, noise, tolerance, passed, engine_runs, sim_runs, paired_errors), ``summary`` (per
    metric: median and max error, pass count; with a measured profile also the median paired
    error, repeat r against the simulator on share r), ``rule``, ``step_ratio`` (per workload/policy and phase: the engine's
    measured step time over the cost model's prediction for that step, a diagnosis of where an
    error comes from), ``periods`` (per workload/policy, for the engine and the simulator: the
    median step period by phase, decode batch and batch change, :func:`_periods`), ``profile``
    (coefficients with ``overhead_s`` and ``tail_s``, fit, grid cells), ``config``, ``wall_s``; plus
    ``paths`` when saved; ``sentinels``: ``runs``, each sentinel's ITL p50 with what ran next, and
    ``sim``, the simulator's sentinel on each share's cost model.
    """
    from mlxlab.core.runner import run_workload
    from mlxlab.engine.loop import Engine
    from mlxlab.sim.profiling import (
        cell_medians,
        coefficients,
        cost_model_from_dict,
        fit_cost_model,
        fit_report,
        profile_device,
    )

    say = log or (lambda s: None)
    if repeats < 2:
        raise ValueError("repeats must be >= 2: the tolerance needs the engine's run-to-run noise")
    t_start = time.perf_counter()
    workloads = workloads or validation_workloads(model, scale=scale, seed=seed)
    options = policy_options or {}
    measure_profile = profile is None
    if measure_profile:
        if profile_grid is None:
            vocab, max_ctx = model_limits(model)
            profile_grid = targeted_grid(workload_shape(workloads, policies, chunk_size, options, vocab, max_ctx),
                                         chunk_size, repeats=1)
            say(f"[validate] profile grid {profile_grid} (measured once per repeat)")
    elif isinstance(profile, dict):
        cm = cost_model_from_dict(profile)
    else:
        cm = profile

    def engine(p):
        return Engine(model, policy=p, chunk_size=chunk_size, **options.get(p, {}))

    def fresh() -> None:  # every run starts from the same process state
        import gc

        import mlx.core as mx

        gc.collect()
        mx.clear_cache()

    if warmup:  # unrecorded: first use of every shape the runs will see (kernels compile on a GPU)
        for wl in workloads.values():
            for p in policies:
                fresh()
                run_workload(engine(p), wl)
        say(f"[validate] warm-up done ({time.perf_counter() - t_start:.1f} s)")

    sentinels: List[dict] = []

    def sentinel(before: str, r: int) -> None:
        if sentinel_tokens > 0:
            fresh()
            sentinels.append({"before": before, "repeat": r, "t_s": time.perf_counter() - t_start,
                              "itl_p50_s": sentinel_itl(engine("interleave"), tokens=sentinel_tokens, seed=seed)})
            say(f"[validate] sentinel before {before}: lone ITL p50 {sentinels[-1]['itl_p50_s'] * 1e3:.2f} ms")

    eng_runs: Dict[tuple, List[dict]] = {}
    eng_steps: Dict[tuple, list] = {}  # per (workload, policy): each run's step records
    shares: List[List[dict]] = []  # the profile's records, one list per repeat
    prof_wall = 0.0
    for r in range(repeats):  # repeats outermost: slow drift of the machine hits every config alike
        if measure_profile:  # the profile too: a share of it in every repeat
            sentinel("profile", r)
            fresh()
            prof = profile_device(model, **profile_grid, warmup=(r == 0), log=say)
            shares.append([dict(rec, share=r) for rec in prof["records"]])
            prof_wall += prof["wall_s"]
            lone = [c["duration_s"] for c in prof["cells"] if c.get("kind") == "decode" and c["decode_batch"] == 1]
            say(f"[validate] profile share {r + 1}: lone decode step {np.median(lone) * 1e3 if lone else float('nan'):.2f} ms")
        for wname, wl in workloads.items():
            for p in policies:
                sentinel(f"{wname}/{p}", r)
                fresh()
                res = run_workload(engine(p), wl)
                eng_runs.setdefault((wname, p), []).append(res.summary)
                eng_steps.setdefault((wname, p), []).append(res.timeline.to_dict("records"))
                say(f"[validate] engine {wname:10s} {p:15s} repeat {r + 1}: "
                    f"TTFT p50 {res.summary['all']['ttft_s']['p50'] * 1e3:8.1f} ms, ITL p50 "
                    f"{res.summary['all']['itl_s']['p50'] * 1e3:7.2f} ms ({res.wall_s:.1f} s)")
    if measure_profile:
        prof_records = [r for share in shares for r in share]
        cells = cell_medians(prof_records)
        cm = fit_cost_model(cells, source=f"profile of {getattr(model, 'name', 'model')} interleaved with the "
                                          f"engine runs (cell medians)")
        # the simulator runs once per share, each share's fit standing for the machine as it was
        # during that repeat; its value is the median over shares, as the engine's over repeats
        cms = [fit_cost_model(cell_medians(share), source=f"profile share {i + 1}") for i, share in enumerate(shares)]
        prof_info = {"coefficients": coefficients(cm), "fit": fit_report(cm, cells), "grid": dict(profile_grid),
                     "share_coefficients": [coefficients(c) for c in cms],
                     "steps": len(prof_records), "wall_s": prof_wall,
                     "records": [{k: v for k, v in r.items() if k not in ("decode_seqs", "_t0")}
                                 for r in prof_records],
                     "cells": [{k: c.get(k) for k in ("cell", "kind", "decode_batch", "decode_context_tokens",
                                                       "decode_kv_tokens", "join_tokens", "drop_tokens",
                                                       "prefill_tokens", "prefill_context_tokens", "duration_s",
                                                       "spread", "n") if k in c} for c in cells]}
    else:
        cms = [cm]
        prof_info = {"coefficients": coefficients(cm) if hasattr(cm, "coef") else None,
                     "source": getattr(cm, "source", None)}
    rows = []
    periods = {}
    steps = {}
    for wname, wl in workloads.items():
        for p in policies:
            sim_res = [run_workload(Simulator.for_model(model, c, policy=p, chunk_size=chunk_size,
                                                        **options.get(p, {})), wl) for c in cms]
            sims = [r.summary for r in sim_res]
            periods[f"{wname}/{p}"] = {"engine": _periods(*eng_steps[(wname, p)]),
                                       "sim": _periods(*[r.timeline.to_dict("records") for r in sim_res])}
            steps[f"{wname}/{p}"] = {"engine": [step_rows(recs) for recs in eng_steps[(wname, p)]],
                                     "sim": [step_rows(r.timeline.to_dict("records")) for r in sim_res]}
            tenants = [t for t in sims[0] if t != "all"]
            for tenant in tenants:
                for key, stat, label in METRICS:
                    vals = [_metric(s, tenant, key, stat) for s in eng_runs[(wname, p)]]
                    vals = [v for v in vals if math.isfinite(v)]
                    sim_runs = [_metric(sm, tenant, key, stat) for sm in sims]
                    simv = float(np.median(sim_runs))
                    if not vals or not math.isfinite(simv):
                        continue
                    med = float(np.median(vals))
                    noise = float(np.std(vals, ddof=1) / np.mean(vals)) if len(vals) > 1 and np.mean(vals) > 0 else float("nan")
                    tol = max(MIN_TOLERANCE, NOISE_FACTOR * noise) if math.isfinite(noise) else MIN_TOLERANCE
                    err = abs(simv - med) / med if med > 0 else float("nan")
                    rows.append({"workload": wname, "policy": p, "tenant": tenant, "metric": label,
                                 "engine": med, "sim": simv, "rel_error": err, "noise": noise,
                                 "tolerance": tol, "passed": bool(err <= tol), "engine_runs": vals,
                                 "sim_runs": sim_runs,
                                 "paired_errors": ([abs(a - b) / b for a, b in zip(sim_runs, vals)]
                                                   if len(sim_runs) == len(vals) > 1 else None)})
    # diagnosis: the pooled cost model on the engine's own steps, by phase: each step's period
    # (next step's start - its start: what the step cost the run, pipelining included) over its
    # prediction. Periods that include an idle wait for an arrival are left out; a record's
    # decode context is the sum, not the padded batch, so batched decode reads a little high.
    step_ratio = {}
    for (wname, p), runs in eng_steps.items():
        by = {}
        for recs in runs:
            for a, b in zip(recs, recs[1:]):
                if b["start_s"] - a["end_s"] > 0.005:  # the runner waited for an arrival
                    continue
                pred = cm.predict_record(a) if hasattr(cm, "predict_record") else float("nan")
                if pred > 0:
                    by.setdefault(a["phase"], []).append((b["start_s"] - a["start_s"]) / pred)
        step_ratio[f"{wname}/{p}"] = {ph: {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)),
                                           "n": len(v)} for ph, v in by.items()}
    # paired view: repeat r's engine run against the simulator on share r's profile, measured just
    # before it (information only: on this shared CPU the load moved within a repeat as much as
    # between repeats, and the paired errors came out larger than the medians' errors)
    summary = _summary(rows)
    out = {
        "rule": (f"noise = coefficient of variation of the engine over {repeats} repeats; tolerance = "
                 f"max({MIN_TOLERANCE:.0%}, {NOISE_FACTOR:g} x noise); passed = |sim - engine median| / "
                 f"engine median <= tolerance"),
        "table": rows,
        "summary": summary,
        "passed": all(r["passed"] for r in rows),
        "step_ratio": step_ratio,
        "periods": periods,
        "steps": {"columns": list(STEP_COLUMNS), "runs": steps},
        "profile": prof_info,
        "sentinels": {"runs": sentinels,
                      "sim": [sentinel_itl(Simulator.for_model(model, c, policy="interleave", chunk_size=chunk_size),
                                           tokens=sentinel_tokens, seed=seed) for c in cms] if sentinel_tokens > 0 else []},
        "config": {"model": getattr(model, "name", None), "dtype": str(getattr(model, "dtype", "")),
                   "bits": getattr(model, "bits", None), "policies": list(policies), "repeats": repeats,
                   "chunk_size": chunk_size, "scale": scale, "policy_options": options,
                   "workloads": {k: w.config() for k, w in workloads.items()}},
        "wall_s": time.perf_counter() - t_start,
    }
    if save:
        from mlxlab.core.environment import platform_name
        from mlxlab.core.results import _clean, save_results

        plat = platform or platform_name()
        paths = {"results": str(save_results(name, out, platform=plat))}
        if figure:
            try:
                paths["figures"] = [str(p) for p in save_chart(validation_chart(rows, title=f"{name} ({plat}, "
                                                                                             f"{getattr(model, 'name', '')})"),
                                                               f"{name}_{plat}")]
            except Exception as e:  # a figure must not lose the numbers
                paths["figure_error"] = repr(e)
        out["paths"] = paths
        out = _clean(out)
    return out


def _summary(rows: List[dict]) -> Dict[str, dict]:
    """Per metric: median and max relative error, how many rows are within 10% and pass."""
    summary = {}
    for _, _, label in METRICS:
        sel = [r for r in rows if r["metric"] == label]
        errs = [r["rel_error"] for r in sel]
        if errs:
            summary[label] = {"median_rel_error": float(np.median(errs)), "max_rel_error": float(max(errs)),
                              "within_10pct": sum(e <= MIN_TOLERANCE for e in errs),
                              "passed": sum(r["passed"] for r in sel), "n": len(errs)}
            paired = [e for r in sel for e in (r.get("paired_errors") or [])]
            if paired:
                summary[label]["paired_median_rel_error"] = float(np.median(paired))
    return summary


def profile_shares(records: Sequence[dict]) -> List[List[dict]]:
    """A validation's profile records split into the shares it measured, one per repeat: by their
    ``share`` field, or (files written before it) wherever the first record's cell comes round
    again (every share walks the same grid in the same order)."""
    if records and all("share" in r for r in records):
        out: Dict[int, List[dict]] = {}
        for r in records:
            out.setdefault(int(r["share"]), []).append(r)
        return [out[k] for k in sorted(out)]
    first = records[0].get("cell") if records else None
    starts = [i for i, r in enumerate(records) if r.get("cell") == first] if first else [0]
    return [list(records[a:b]) for a, b in zip(starts, starts[1:] + [len(records)])]


def rescore_validation(result, *, log: Optional[Callable[[str], None]] = None) -> dict:
    """A saved validation's simulator side again, under this version's cost model and simulator,
    on no device: each profile share's saved records fitted again, the workloads rebuilt from the
    saved config, the engine's side (its runs, its noise) as saved. For asking what a change to the
    cost model or the simulator would have predicted for runs already made.

    ``result``: a dict from :func:`validate_simulator`, or the path of its JSON file. Returns
    ``{"source", "table", "summary", "rule", "coefficients"}``: the table's rows as the saved ones
    with ``sim``, ``sim_runs``, ``rel_error``, ``passed``, ``paired_errors`` recomputed and the
    saved simulator value kept as ``sim_saved``."""
    import json

    from mlxlab.core.runner import run_workload
    from mlxlab.sim.profiling import cell_medians, coefficients, fit_cost_model

    source = None
    if not isinstance(result, dict):
        source = str(result)
        result = json.loads(Path(result).read_text())
    say = log or (lambda s: None)
    cfg, prof = result["config"], result.get("profile") or {}
    if not prof.get("records"):
        raise ValueError("this validation kept no profile records (it ran on a given profile): there is "
                         "nothing to fit again; run validate_simulator with a measured profile")
    cms = [fit_cost_model(cell_medians(share), source=f"profile share {i + 1}, fitted again")
           for i, share in enumerate(profile_shares(prof["records"]))]
    workloads = {k: Workload.from_config(w) for k, w in cfg["workloads"].items()}
    options = cfg.get("policy_options") or {}
    saved = {(r["workload"], r["policy"], r["tenant"], r["metric"]): r for r in result["table"]}
    rows = []
    for wname, wl in workloads.items():
        for p in cfg["policies"]:
            sims = [run_workload(Simulator(c, policy=p, chunk_size=cfg["chunk_size"], vocab_size=wl.vocab_size,
                                           max_context=wl.max_context or DEFAULT_MAX_CONTEXT, **options.get(p, {})), wl).summary
                    for c in cms]
            say(f"[rescore] {wname} {p}: {len(sims)} shares")
            for key, stat, label in METRICS:
                for tenant in [t for t in sims[0] if t != "all"]:
                    old = saved.get((wname, p, tenant, label))
                    if old is None:
                        continue
                    sim_runs = [_metric(sm, tenant, key, stat) for sm in sims]
                    simv = float(np.median(sim_runs))
                    err = abs(simv - old["engine"]) / old["engine"]
                    vals = old["engine_runs"]
                    rows.append(dict(old, sim=simv, sim_saved=old["sim"], sim_runs=sim_runs, rel_error=err,
                                     passed=bool(err <= old["tolerance"]),
                                     paired_errors=([abs(a - b) / b for a, b in zip(sim_runs, vals)]
                                                    if len(sim_runs) == len(vals) > 1 else None)))
    order = {k: i for i, k in enumerate(saved)}
    rows.sort(key=lambda r: order[(r["workload"], r["policy"], r["tenant"], r["metric"])])
    return {"source": source, "table": rows, "summary": _summary(rows), "rule": result.get("rule"),
            "coefficients": [coefficients(c) for c in cms]}


def sentinel_itl(engine, *, prompt_tokens: int = 64, tokens: int = 24, seed: int = 0) -> float:
    """ITL p50 in seconds of one lone chat (``prompt_tokens`` in, ``tokens`` out) on ``engine``,
    through :func:`mlxlab.core.runner.run_workload` as the validation's runs go: a thermometer for how
    fast the machine decodes right now. A lone decode is host-bound on a GPU (Python builds and
    launches a step in about the time the device runs it), so a busy or throttled host shows here
    first."""
    from mlxlab.core.runner import run_workload

    if tokens < 3:
        raise ValueError(f"a sentinel needs tokens >= 3 for an inter-token latency, got {tokens}")
    vocab = int(getattr(engine, "vocab_size", None) or 1000)
    wl = Workload([ChatTenant(sessions=1, turns=1, first_prompt_tokens=prompt_tokens, output_tokens=tokens,
                              think_time_s=0.0, name="sentinel")], vocab_size=vocab, seed=seed,
                  max_context=int(getattr(engine, "max_context", None) or 1 << 20))
    res = run_workload(engine, wl)
    return float(res.summary["all"]["itl_s"]["p50"])


def format_validation(result: dict) -> str:
    """The validation table as fixed-width text."""
    lines = [f"{'workload':11s} {'policy':15s} {'tenant':6s} {'metric':11s} {'engine':>10s} {'sim':>10s} "
             f"{'error':>7s} {'noise':>7s} {'tol':>6s}  ok"]
    for r in result["table"]:
        lines.append(f"{r['workload']:11s} {r['policy']:15s} {r['tenant']:6s} {r['metric']:11s} "
                     f"{r['engine'] * 1e3:8.2f}ms {r['sim'] * 1e3:8.2f}ms {r['rel_error']:7.1%} "
                     f"{(r['noise'] if r['noise'] is not None else float('nan')):7.1%} {r['tolerance']:6.0%}  "
                     f"{'yes' if r['passed'] else 'NO'}")
    lines.append(result["rule"])
    for label, sm in result.get("summary", {}).items():
        line = (f"{label:11s} error median {sm['median_rel_error']:.1%}, max {sm['max_rel_error']:.1%}, "
                f"within 10%: {sm['within_10pct']}/{sm['n']}, passed: {sm['passed']}/{sm['n']}")
        if "paired_median_rel_error" in sm:
            line += f"; paired (repeat r vs share r) median {sm['paired_median_rel_error']:.1%}"
        lines.append(line)
    return "\n".join(lines)


def validation_chart(rows: List[dict], title: str = "simulator vs engine"):
    """Simulated against measured, log-log, one point per (workload, policy, tenant, metric), with
    the y = x line and the 10% band."""
    import altair as alt
    import pandas as pd

    df = pd.DataFrame([{k: v for k, v in r.items() if k not in ("engine_runs", "sim_runs")} for r in rows])
    df["engine_ms"], df["sim_ms"] = df.engine * 1e3, df.sim * 1e3
    lo, hi = float(min(df.engine_ms.min(), df.sim_ms.min())) * 0.8, float(max(df.engine_ms.max(), df.sim_ms.max())) * 1.25
    line = pd.DataFrame({"x": [lo, hi], "y": [lo, hi], "y_lo": [lo * 0.9, hi * 0.9], "y_hi": [lo * 1.1, hi * 1.1]})
    scale = alt.Scale(type="log", domain=[lo, hi])
    band = alt.Chart(line).mark_area(opacity=0.15, color="gray").encode(
        x=alt.X("x:Q", scale=scale, title="engine (ms, median of repeats)"), y=alt.Y("y_lo:Q", scale=scale), y2="y_hi:Q")
    diag = alt.Chart(line).mark_line(color="gray", strokeDash=[4, 4]).encode(x=alt.X("x:Q", scale=scale), y=alt.Y("y:Q", scale=scale))
    pts = alt.Chart(df).mark_point(filled=True, size=70).encode(
        x=alt.X("engine_ms:Q", scale=scale), y=alt.Y("sim_ms:Q", scale=scale, title="simulator (ms)"),
        color=alt.Color("metric:N"), shape=alt.Shape("policy:N"),
        tooltip=["workload", "policy", "tenant", "metric", alt.Tooltip("engine_ms:Q", format=".2f"),
                 alt.Tooltip("sim_ms:Q", format=".2f"), alt.Tooltip("rel_error:Q", format=".1%"),
                 alt.Tooltip("noise:Q", format=".1%"), "passed"])
    return (band + diag + pts).properties(width=420, height=380, title=title)


def decode_periods(result: dict, run: str, batch: int, *, max_context: Optional[int] = None,
                   profile_cell: Optional[str] = None) -> Dict[str, List[List[float]]]:
    """The periods (seconds: next step's start less this one's) of a validation's decode-only steps
    of ``batch`` rows that changed nothing, run by run: ``engine`` for each repeat of ``run``
    ("workload/policy"), ``sim`` for each share, and ``profile`` for each share's records of
    ``profile_cell`` (e.g. "decode b2 c32"). ``max_context``: only steps whose rows' contexts sum
    to at most this. Periods that include a wait for an arrival are left out."""
    cols = result["steps"]["columns"]
    out: Dict[str, List[List[float]]] = {}
    for side in ("engine", "sim"):
        out[side] = []
        for rows in result["steps"]["runs"][run][side]:
            recs = [dict(zip(cols, x)) for x in rows]
            out[side].append([b["start_s"] - a["start_s"] for a, b in zip(recs, recs[1:])
                              if a["phase"] == "decode" and a["decode_batch"] == batch
                              and not (a["joined"] or a["dropped"]) and b["start_s"] - a["end_s"] <= 0.005
                              and (max_context is None or a["decode_context_tokens"] <= max_context)])
    if profile_cell:
        out["profile"] = [[r["duration_s"] for r in share if r.get("cell") == profile_cell]
                          for share in profile_shares(result["profile"]["records"])]
    return out


def decode_periods_chart(samples: Dict[str, Dict[str, List[List[float]]]], title: str = ""):
    """Histograms of decode periods (ms), one row per validation file (``samples``: label ->
    :func:`decode_periods`), engine and profile overlaid: two modes show as two humps."""
    import altair as alt
    import pandas as pd

    rows = [{"validation": label, "side": side, "ms": 1e3 * x}
            for label, d in samples.items() for side in ("engine", "profile") for run in d.get(side, []) for x in run]
    df = pd.DataFrame(rows)
    return alt.Chart(df).mark_bar(opacity=0.6).encode(
        x=alt.X("ms:Q", bin=alt.Bin(step=0.5), title="decode step period (ms)"),
        y=alt.Y("count():Q", stack=None, title="steps"), color=alt.Color("side:N"),
        row=alt.Row("validation:N", title=None, sort=list(samples),
                    header=alt.Header(labelAngle=0, labelAlign="left", labelFontSize=11))
    ).properties(width=420, height=90, title=title)


# ---------------------------------------------------------------------------------- seed scale
def _gaps_in(req, window) -> List[float]:
    t = req.token_times_s
    return [b - a for a, b in zip(t, t[1:]) if b > window[0] and a < window[1]]


def _sim(cm, tenants, *, policy="interleave", chunk_size=2048, vocab=1000, max_context=262_144, seed=0, **opts):
    from mlxlab.core.runner import run_workload

    wl = Workload(tenants, vocab_size=vocab, seed=seed, max_context=max_context)
    sim = Simulator(cm, policy=policy, chunk_size=chunk_size, vocab_size=vocab, max_context=max_context, **opts)
    return run_workload(sim, wl)


def seed_scale_study(cost_model=None, *, chunk_sizes: Sequence[int] = (256, 512, 1024, 2048, 4096),
                     long_prompt_tokens: int = 60_000, chat_context_tokens: int = 23_000,
                     workers: int = 4, batch_prompt_tokens=(10_000, 25_000), stall_chunk: int = 2048,
                     window_s: float = 1.0, stall_free_budgets: Sequence[int] = (256, 512, 1024, 2048),
                     slo_targets_s: Sequence[float] = (0.25, 0.5, 1.0), seed: int = 0, save: bool = False,
                     figure: bool = False, name: str = "seed_scale",
                     log: Optional[Callable[[str], None]] = None) -> dict:
    """Seed 001 at its own scale in the simulator, with the published profile.

    Scenarios (all on the seed-001 cost model, no noise):

    * ``floor``: the 60k prompt alone in one chunk (no chunk boundary to pay for), and alone at each
      chunk size;
    * ``tradeoff``: a chat stream whose prompt is ``chat_context_tokens`` decodes while the 60k
      prompt arrives (once the chat streams) and is prefilled under ``interleave`` (one decode
      step per chunk, as mlx-vlm) at each chunk size: the prompt's TTFT and its premium over the
      floor, the chat's gaps while the prompt is being prefilled (p50, p99, mean, tok/s);
    * ``crawl``: the chat beside ``workers`` concurrent fresh batch prompts
      (``batch_prompt_tokens``) under ``interleave`` at ``stall_chunk`` (no gate), beside the same
      under ``admission_gate`` and :class:`DecodeWindowGate` (``window_s``);
    * ``plane``: the 60k prompt's TTFT against the chat's ITL for ``interleave`` at each chunk
      size, ``stall_free`` at each token budget, ``slo`` at each ITL target (given the seed cost
      model as its prior, so it needs no warm-up), and the two gates.

    Returns a JSON-ready dict with ``claims`` (name, published, measured, verdict, role: whether
    the figure was an input of the profile's derivation ("calibration") or follows from it
    ("prediction"), evidence), ``curves``, ``crawl``, ``plane`` and ``profile``.
    """
    from mlxlab.sim.profiling import coefficients, seed001_cost_model, seed001_figures

    say = log or (lambda s: None)
    t_start = time.perf_counter()
    cm = cost_model or seed001_cost_model()
    figs = seed001_figures()
    n_long = int(long_prompt_tokens)
    solo_itl = cm.predict(1, chat_context_tokens + 1, [])

    def chat(out_tokens: int) -> ChatTenant:
        return ChatTenant(sessions=1, turns=1, first_prompt_tokens=chat_context_tokens, output_tokens=int(out_tokens),
                          think_time_s=0.0, name="chat")

    def long_prompt(start_s: float, n_tokens=n_long, w=1, out=1) -> BatchTenant:
        return BatchTenant(workers=w, requests=w, prompt_tokens=n_tokens, output_tokens=out, start_s=start_s,
                           name="batch")

    # ---------------------------------------------------------------- floor
    floor_res = _sim(cm, [long_prompt(0.0)], chunk_size=n_long, seed=seed)
    floor_s = floor_res.submitted[0].ttft_s
    alone = {}
    for c in chunk_sizes:
        alone[c] = _sim(cm, [long_prompt(0.0)], chunk_size=c, seed=seed).submitted[0].ttft_s
    say(f"[seed] floor {floor_s:.2f} s; alone " + ", ".join(f"{c}: {t:.1f} s" for c, t in alone.items()))

    def contended(res, big_ids=None):
        reqs = res.submitted
        ch = [r for r in reqs if r.tenant == "chat"][0]
        big = [r for r in reqs if r.tenant == "batch"]
        window = (min(r.arrival_s for r in big), max(r.token_times_s[0] for r in big))
        gaps = _gaps_in(ch, window)
        tl = res.timeline
        ids = {r.id for r in big}
        chunk_steps = tl[[bool(ids & set(s)) for s in tl.prefill_seqs]] if len(tl) else tl
        return ch, big, window, gaps, chunk_steps

    def gap_stats(gaps):
        g = np.asarray(gaps, dtype=float)
        if not g.size:
            return {k: float("nan") for k in ("itl_p50_s", "itl_p99_s", "itl_mean_s", "itl_max_s", "tok_s")}
        return {"itl_p50_s": float(np.percentile(g, 50)), "itl_p99_s": float(np.percentile(g, 99)),
                "itl_mean_s": float(g.mean()), "itl_max_s": float(g.max()), "tok_s": float(1.0 / g.mean()),
                "gaps": int(g.size)}

    # when the chat streams under a policy (its own 23k prompt prefilled first, alone)
    def fresh(policy):
        return policy() if callable(policy) and not isinstance(policy, str) else policy

    def chat_start(policy, c: int, **opts) -> float:
        res = _sim(cm, [chat(2)], policy=fresh(policy), chunk_size=c, seed=seed, **opts)
        return res.submitted[0].token_times_s[0] + 10 * solo_itl

    def chat_tokens_for(seconds: float) -> int:
        return int(1.5 * seconds / solo_itl) + 64

    # ---------------------------------------------------------------- trade-off curves (interleave)
    curves = []
    plane = []

    def run_point(policy, c: int, label: str, **opts) -> dict:
        start = chat_start(policy, c, **opts)
        res = _sim(cm, [chat(chat_tokens_for(start + 3 * max(alone.values()))), long_prompt(start)],
                   policy=fresh(policy), chunk_size=c, seed=seed, **opts)
        ch, big, window, gaps, steps = contended(res)
        ttft = big[0].ttft_s
        row = {"policy": res.executor.policy.name, "label": label, "chunk_size": c,
               "options": {k: (v if isinstance(v, (int, float, str)) else getattr(v, "source", repr(v)))
                           for k, v in opts.items()}, "long_ttft_s": ttft,
               "premium": ttft / floor_s - 1.0, **gap_stats(gaps),
               "chunk_step_p50_s": float(steps.duration_s.median()) if len(steps) else float("nan"),
               "chunk_step_max_s": float(steps.duration_s.max()) if len(steps) else float("nan"),
               "chunks": int(len(steps))}
        chosen = getattr(res.executor.policy, "chosen", None)
        if chosen:
            row["chosen_chunk_median"] = float(np.median(chosen))
        return row

    for c in chunk_sizes:
        row = run_point("interleave", c, f"interleave {c}")
        curves.append(row)
        plane.append(row)
        say(f"[seed] interleave {c:5d}: TTFT {row['long_ttft_s']:6.1f} s (+{row['premium']:.0%}), chat gap p50 "
            f"{row['itl_p50_s']:.3f} s p99 {row['itl_p99_s']:.3f} s, {row['tok_s']:.2f} tok/s")
    for b in stall_free_budgets:
        plane.append(run_point("stall_free", 4096, f"stall_free {b}", token_budget=int(b)))
    for tgt in slo_targets_s:
        plane.append(run_point("slo", 4096, f"slo {tgt:g} s", itl_target_s=float(tgt), min_chunk=64, max_chunk=4096,
                               cost_model=cm))
    for c in (512, stall_chunk):
        plane.append(run_point("admission_gate", c, f"admission_gate {c}", big_prompt_tokens=4096))
    plane.append(run_point(lambda: DecodeWindowGate(window_s=window_s, big_prompt_tokens=4096), stall_chunk,
                           f"gate+window {window_s:g} s, {stall_chunk}"))

    # ---------------------------------------------------------------- crawl vs gate (several prompts)
    crawl = {}
    start = chat_start("interleave", stall_chunk)
    est = workers * cm.predict(0, 0, [(max(batch_prompt_tokens), max(batch_prompt_tokens) / 2)]) * 1.5
    for label, pol, opts in (("no gate (interleave)", "interleave", {}),
                             ("admission_gate", "admission_gate", {"big_prompt_tokens": 4096}),
                             (f"gate + {window_s:g} s decode window", DecodeWindowGate(window_s=window_s,
                                                                                     big_prompt_tokens=4096), {})):
        res = _sim(cm, [chat(chat_tokens_for(start + 4 * est)),
                        long_prompt(start, tuple(batch_prompt_tokens), w=workers, out=227)],
                   policy=pol, chunk_size=stall_chunk, seed=seed, **opts)
        ch, big, window, gaps, steps = contended(res)
        st = gap_stats(gaps)
        fast = [g for g in gaps if g < 0.25 * float(steps.duration_s.min())] if len(steps) else []
        big_ids = {r.id for r in big}
        one_chunk = [cm.predict(0, 0, [(n, c)]) for rec in res.executor.steps for (i, n, c) in rec.prefill
                     if i in big_ids]
        st.update({"one_chunk_max_s": max(one_chunk) if one_chunk else float("nan"),
                   "worst_gap_over_one_chunk": (st["itl_max_s"] / max(one_chunk)) if one_chunk else float("nan"),
                   "window_gaps": len(fast), "window_tok_s": (1.0 / float(np.mean(fast))) if fast else float("nan"),
                   "chunk_step_p50_s": float(steps.duration_s.median()) if len(steps) else float("nan"),
                   "chunk_step_max_s": float(steps.duration_s.max()) if len(steps) else float("nan"),
                   "batch_ttft_p50_s": float(np.median([r.ttft_s for r in big])),
                   "batch_last_first_token_s": window[1] - window[0]})
        crawl[label] = st
        say(f"[seed] crawl {label:28s}: chat {st['tok_s']:.2f} tok/s, worst gap {st['itl_max_s']:.2f} s, "
            f"window {st['window_tok_s']:.1f} tok/s over {st['window_gaps']} gaps")

    # ---------------------------------------------------------------- claims
    by_c = {r["chunk_size"]: r for r in curves}
    doc_lo, doc_hi = figs["doc_context_tokens"]["value"]
    chunk_doc = [cm.predict(0, 0, [(2048, doc_lo)]), cm.predict(0, 0, [(2048, doc_hi)])]
    gated = crawl["admission_gate"]
    windowed = crawl[f"gate + {window_s:g} s decode window"]
    nogate = crawl["no gate (interleave)"]
    claims = []

    def claim(name, published, measured, lo, hi, role, evidence, unit=""):
        vals = measured if isinstance(measured, list) else [measured]
        if not all(v is not None and math.isfinite(v) for v in vals):
            verdict = "not measurable here"
        else:
            verdict = "reproduced" if all(lo <= v <= hi for v in vals) else "not reproduced"
        claims.append({"name": name, "published": published, "measured": measured, "unit": unit,
                       "accept": [lo, hi], "verdict": verdict, "role": role, "evidence": evidence})

    claim("60k prompt TTFT floor", 44.0, floor_s, 44 * 0.95, 44 * 1.05, "calibration",
          "the 60k prompt alone in one chunk (one chunk overhead, one decode step for its first token)", "s")
    claim("decode near 23k context", 65.0, 1.0 / solo_itl, 65 * 0.9, 65 * 1.1, "calibration",
          "one chat stream alone at 23k tokens of context: 1 / step time", "tok/s")
    claim("2,048-token chunk at document scale", [1.0, 2.0], chunk_doc, 1.0, 2.0, "prediction",
          f"predicted chunk step at {doc_lo}- and {doc_hi}-token context", "s")
    claim("TTFT premium at 1,024", 0.15, by_c.get(1024, {}).get("premium", float("nan")), 0.15 * 0.8, 0.30 * 1.1,
          "calibration", "60k prompt beside the chat, interleave at 1,024, over the floor", "fraction")
    claim("TTFT premium at 512", 0.30, by_c.get(512, {}).get("premium", float("nan")), 0.15, 0.30 * 1.15,
          "prediction", "as above at 512 (the overhead was set at 1,024 only)", "fraction")
    claim("chat gaps at 512-1,024", [0.4, 0.8],
          [by_c.get(512, {}).get("itl_mean_s", float("nan")), by_c.get(1024, {}).get("itl_mean_s", float("nan"))],
          0.4 * 0.9, 0.8 * 1.15, "prediction", "mean chat gap while the 60k prompt is prefilled, chunks 512 and 1,024", "s")
    claim("chat gap at 2,048", 1.5, by_c.get(2048, {}).get("itl_mean_s", float("nan")), 1.5 * 0.85, 1.5 * 1.15,
          "prediction", "mean chat gap while the 60k prompt is prefilled at 2,048", "s")
    claim("crawl during a 60k prefill (no gate)", 0.67, by_c.get(2048, {}).get("tok_s", float("nan")), 0.67 * 0.85,
          0.67 * 1.15, "prediction", "chat tokens / s while the 60k prompt is prefilled at 2,048 under interleave", "tok/s")
    claim(f"gate bounds the worst gap at ~one chunk ({workers} concurrent prompts)",
          "worst gap ~ one chunk time", gated["worst_gap_over_one_chunk"], 0.0, 1.25, "prediction",
          f"admission_gate: chat worst gap / the longest single {stall_chunk}-token chunk (no gate: "
          f"{nogate['worst_gap_over_one_chunk']:.1f}x, worst gap {nogate['itl_max_s']:.1f} s, {nogate['tok_s']:.2f} tok/s)",
          "ratio")
    claim("60-70 tok/s windows with the gate", [60.0, 70.0], windowed["window_tok_s"], 60 * 0.95, 70 * 1.05,
          "prediction", f"DecodeWindowGate(window_s={window_s:g}): chat rate over the decode-only gaps (the batch "
          "prompts' own outputs decode in the same batch)", "tok/s")
    out = {
        "claims": claims,
        "floor_s": floor_s,
        "alone_ttft_s": {str(c): t for c, t in alone.items()},
        "solo_itl_s": solo_itl,
        "curves": curves,
        "crawl": crawl,
        "plane": plane,
        "profile": {"coefficients": coefficients(cm), "source": getattr(cm, "source", None)},
        "config": {"chunk_sizes": list(chunk_sizes), "long_prompt_tokens": n_long,
                   "chat_context_tokens": chat_context_tokens, "workers": workers,
                   "batch_prompt_tokens": list(batch_prompt_tokens), "stall_chunk": stall_chunk, "window_s": window_s,
                   "stall_free_budgets": list(stall_free_budgets), "slo_targets_s": list(slo_targets_s)},
        "wall_s": time.perf_counter() - t_start,
    }
    from mlxlab.core.results import _clean

    out = _clean(out)
    if save:
        from mlxlab.core.results import save_results

        paths = {"results": str(save_results(name, out, platform="sim-seed001"))}
        if figure:
            try:
                paths["figures"] = [str(p) for p in save_chart(seed_scale_chart(out), name)]
            except Exception as e:
                paths["figure_error"] = repr(e)
        out["paths"] = paths
    return out


def format_claims(result: dict) -> str:
    lines = []
    for c in result["claims"]:
        m = c["measured"]
        ms = ", ".join(f"{x:.3g}" for x in m) if isinstance(m, list) else (f"{m:.3g}" if m is not None else "n/a")
        lines.append(f"{c['verdict']:15s} {c['name']:55s} published {c['published']!s:22s} measured {ms} {c['unit']}"
                     f"  [{c['role']}]")
    return "\n".join(lines)


def seed_scale_chart(result: dict):
    """TTFT vs chunk size, chat ITL vs chunk size (interleave), and the TTFT/ITL plane."""
    import altair as alt
    import pandas as pd

    cur = pd.DataFrame(result["curves"])
    floor = result["floor_s"]
    xs = alt.X("chunk_size:Q", scale=alt.Scale(type="log", base=2), title="chunk size (tokens)")
    ttft = alt.Chart(cur).mark_line(point=True).encode(x=xs, y=alt.Y("long_ttft_s:Q", title="60k prompt TTFT (s)",
                                                                     scale=alt.Scale(zero=False)))
    rule = alt.Chart(pd.DataFrame({"y": [floor]})).mark_rule(strokeDash=[4, 4], color="gray").encode(y="y:Q")
    itl = cur.melt(id_vars=["chunk_size"], value_vars=["itl_p50_s", "itl_p99_s", "itl_mean_s"], var_name="stat",
                   value_name="s")
    itlc = alt.Chart(itl).mark_line(point=True).encode(x=xs, y=alt.Y("s:Q", title="chat gap during prefill (s)"),
                                                       color="stat:N")
    pl = pd.DataFrame([{k: v for k, v in r.items() if k != "options"} for r in result["plane"]])
    plane = alt.Chart(pl).mark_point(filled=True, size=80).encode(
        x=alt.X("long_ttft_s:Q", title="60k prompt TTFT (s)", scale=alt.Scale(zero=False)),
        y=alt.Y("itl_p99_s:Q", title="chat ITL p99 (s)"), color="policy:N", tooltip=["label", "long_ttft_s",
                                                                                   "itl_p50_s", "itl_p99_s"])
    line = alt.Chart(pl[pl.policy == "interleave"]).mark_line(color="gray", opacity=0.5).encode(
        x="long_ttft_s:Q", y="itl_p99_s:Q", order="chunk_size:Q")
    keep = pl.policy.isin(["interleave", "slo", "admission_gate_window"])
    labels = alt.Chart(pl[keep]).mark_text(dx=6, dy=-6, fontSize=9, align="left").encode(
        x="long_ttft_s:Q", y="itl_p99_s:Q", text="label:N")
    plane = line + plane + labels
    return alt.hconcat((ttft + rule).properties(width=260, height=220, title="TTFT vs chunk (seed-001 profile)"),
                       itlc.properties(width=260, height=220, title="chat ITL vs chunk"),
                       plane.properties(width=320, height=220, title="TTFT / ITL plane (chat beside the 60k prompt)")
                       ).resolve_scale(color="independent")


# ---------------------------------------------------------------------------------- CLI
def add_validate_arguments(parser) -> None:
    """Arguments of a ``mlxlab sim validate`` command (the lead wires this into :mod:`mlxlab.cli`)."""
    from mlxlab.cli.common import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("--policies", nargs="+", default=["interleave", "admission_gate", "stall_free"])
    parser.add_argument("--repeats", type=int, default=3, help="engine runs per configuration (>= 2)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="workload prompt lengths x this (1: 1-2k-token batch prompts; ~8 on a GPU)")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--profile", default=None, help="a saved profile (path or name) instead of measuring one")
    parser.add_argument("--platform", default=None, help="results folder name (default: detected)")
    parser.add_argument("--name", default="sim_validation", help="results file name")
    parser.add_argument("--rescore", default=None, metavar="JSON",
                        help="score a saved validation file again under this version's cost model and "
                             "simulator (no model, no device) and write <its name>_rescored.json beside it")
    parser.add_argument("--sentinel-tokens", type=int, default=24,
                        help="output tokens of the lone chat run before each profile share and engine run "
                             "(its ITL tracks the machine's speed); 0 for none")
    parser.add_argument("--no-figure", action="store_true")
    parser.add_argument("--quiet", action="store_true")


def cli_validate(args) -> int:
    """Run :func:`validate_simulator` and print its table; exit status 1 if a row fails. With
    ``--rescore FILE``: :func:`rescore_validation` of that file instead."""
    if getattr(args, "rescore", None):
        import json

        from mlxlab.core.results import _clean

        res = rescore_validation(args.rescore, log=None if args.quiet else (lambda s: print(s, flush=True)))
        print(format_validation(res))
        src = Path(args.rescore)
        out = src.with_name(src.stem + "_rescored.json")
        out.write_text(json.dumps(_clean(res), indent=1))
        print(f"wrote {out}")
        return 0 if all(r["passed"] for r in res["table"]) else 1
    from mlxlab.engine.models import load_model

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    profile = None
    if args.profile:
        from mlxlab.sim.profiling import load_profile

        profile = load_profile(args.profile)
    res = validate_simulator(model, validation_workloads(model, scale=args.scale), policies=args.policies,
                             repeats=args.repeats, profile=profile, chunk_size=args.chunk_size, scale=args.scale,
                             platform=args.platform, name=args.name, figure=not args.no_figure,
                             sentinel_tokens=args.sentinel_tokens, log=None if args.quiet else (lambda s: print(s, flush=True)))
    print(format_validation(res))
    print(f"wrote {res.get('paths')}")
    return 0 if res["passed"] else 1


def cli_seed_scale(args=None) -> int:
    """Run :func:`seed_scale_study` with the published seed-001 profile, save it, print the claims."""
    res = seed_scale_study(save=True, figure=True, log=print)
    print(format_claims(res))
    print(f"wrote {res.get('paths')}")
    return 0 if all(c["verdict"] == "reproduced" for c in res["claims"]) else 1


def main(argv=None) -> int:
    """``python -m mlxlab.studies.sim_validation validate ...`` or ``python -m mlxlab.studies.sim_validation seed-scale``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mlxlab.studies.sim_validation")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="simulator against engine on this device")
    add_validate_arguments(v)
    v.set_defaults(func=cli_validate)
    s = sub.add_parser("seed-scale", help="seed 001 at its own scale with the published profile")
    s.set_defaults(func=cli_seed_scale)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    import sys

    from mlxlab.core.environment import reexec_with_fast_blas

    reexec_with_fast_blas()
    sys.exit(main())
