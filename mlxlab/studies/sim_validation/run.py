"""The simulator's error against the engine, on this device (MLX).

:func:`validate_simulator` runs the real engine and the simulator (charged with a profile measured
on this device, in shares between the engine's repeats) on the same workloads and policies, and
compares TTFT p50, ITL p50 and ITL p99 per tenant under the rule of
:mod:`mlxlab.studies.sim_validation.scoring` (tolerance: 10% or three times the engine's run-to-run noise).
It reads as three steps: :func:`plan_validation` (workloads, policies, the profile grid),
:func:`run_engine` (the engine's repeats and the profile shares, each beside a sentinel),
:func:`score_validation` (fit, simulate, score, diagnose). The claim ``mlx-sim-accuracy`` is decided
from the scored table by :mod:`mlxlab.studies.sim_validation.verdict`, which also fingerprints the cost models
the simulator ran on.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

from mlxlab.core.costmodel import StepCostModel
from mlxlab.core.environment import platform_name
from mlxlab.core.presets import DEFAULT_MAX_CONTEXT, model_limits
from mlxlab.core.results import _git_commit, jsonable, save_results
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload
from mlxlab.engine.loop import Engine
from mlxlab.sim.fit import cell_medians, coefficients, fit_cost_model, fit_report
from mlxlab.sim.measure import profile_device
from mlxlab.sim.profiles import cost_model_from_dict
from mlxlab.sim.simulator import Simulator
from mlxlab.studies.sim_validation.heldout import HeldOutCase, heldout_cases
from mlxlab.studies.sim_validation.verdict import parameters, record_of_result, validation_verdicts
from mlxlab.studies.sim_validation.scoring import (
    IDLE_GAP_S,
    STEP_COLUMNS,
    periods,
    rule,
    score_config,
    step_rows,
    summarize,
)

CELL_FIELDS = ("cell", "kind", "decode_batch", "decode_context_tokens", "decode_kv_tokens", "join_tokens",
               "drop_tokens", "prefill_tokens", "prefill_context_tokens", "cold_chunks", "duration_s", "spread", "n")


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
    size (and smaller, for prompts' last chunks, one of them a token off a round size) from empty
    to the longest prompt's context, decode batches up to the largest one, decode contexts up to
    the longest."""
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


def sentinel_itl(engine, *, prompt_tokens: int = 64, tokens: int = 24, seed: int = 0) -> float:
    """ITL p50 in seconds of one lone chat (``prompt_tokens`` in, ``tokens`` out) on ``engine``
    (or a simulator), through :func:`mlxlab.core.runner.run_workload` as the validation's runs go:
    a thermometer for how fast the machine decodes right now. A lone decode is host-bound on a
    GPU (Python builds and launches a step in about the time the device runs it), so a busy or
    throttled host shows here first."""
    if tokens < 3:
        raise ValueError(f"a sentinel needs tokens >= 3 for an inter-token latency, got {tokens}")
    vocab = int(getattr(engine, "vocab_size", None) or 1000)
    wl = Workload([ChatTenant(sessions=1, turns=1, first_prompt_tokens=prompt_tokens, output_tokens=tokens,
                              think_time_s=0.0, name="sentinel")], vocab_size=vocab, seed=seed,
                  max_context=int(getattr(engine, "max_context", None) or 1 << 20))
    res = run_workload(engine, wl)
    return float(res.summary["all"]["itl_s"]["p50"])


# ---------------------------------------------------------------------------------- plan
@dataclass
class ValidationPlan:
    """What a validation runs: every (workload, policy) on both executors, ``repeats`` engine runs
    each, and either a profile measured in shares on ``profile_grid`` or a given ``cost_model``."""

    workloads: Dict[str, Workload]
    policies: Tuple[str, ...]
    options: Dict[str, dict]
    chunk_size: int
    repeats: int
    scale: float
    seed: int
    sentinel_tokens: int
    profile_grid: Optional[dict] = None
    cost_model: Optional[object] = None
    profile_doc: Optional[dict] = None  # a given profile file's path, kind and environment (its provenance)
    heldout: List[HeldOutCase] = field(default_factory=list)
    heldout_seed: Optional[int] = None

    @property
    def measure_profile(self) -> bool:
        return self.cost_model is None

    def configs(self, vocab_size: int) -> List["RunConfig"]:
        """Every run: each standard workload under each policy, then each held-out case under its own."""
        out = [RunConfig((w, p), wl, p, self.chunk_size, dict(self.options.get(p, {})), False)
               for w, wl in self.workloads.items() for p in self.policies]
        return out + [RunConfig((c.name, c.policy), c.workload(vocab_size), c.policy, c.chunk_size, dict(c.options),
                                True) for c in self.heldout]


@dataclass
class RunConfig:
    """One (workload, policy) both executors run: its key in the results, the chunk size and
    policy options, and whether it is a held-out case (:mod:`mlxlab.studies.sim_validation.heldout`)."""

    key: Tuple[str, str]
    workload: object
    policy: str
    chunk_size: int
    options: dict
    heldout: bool

    def engine(self, model) -> Engine:
        # serial steps, as the simulator runs them (slo would run beside decode on a GPU if the engine chose)
        return Engine(model, policy=self.policy, chunk_size=self.chunk_size, overlap=False, **self.options)

    def simulator(self, model, cost_model) -> Simulator:
        return Simulator.for_model(model, cost_model, policy=self.policy, chunk_size=self.chunk_size, **self.options)


def plan_validation(model, workloads: Optional[Dict[str, Workload]], policies: Sequence[str], repeats: int, *,
                    profile=None, chunk_size: int = 256, policy_options: Optional[Dict[str, dict]] = None,
                    scale: float = 1.0, profile_grid: Optional[dict] = None, seed: int = 0,
                    sentinel_tokens: int = 24, heldout: int = 0, heldout_seed: int = 1,
                    heldout_scale: Optional[float] = None, say: Callable[[str], None] = print) -> ValidationPlan:
    """The workloads (default :func:`validation_workloads`), and the profile: the given one, or a
    grid around what the standard workloads use (:func:`targeted_grid`, one repeat per share);
    ``heldout`` cases drawn with ``heldout_seed`` (:func:`mlxlab.studies.sim_validation.heldout.heldout_cases`
    at ``heldout_scale``, default ``scale``) whose chunk sizes and options are none of the grid's
    chunk sizes nor the standard chunk size."""
    if repeats < 2:
        raise ValueError("repeats must be >= 2: the tolerance needs the engine's run-to-run noise")
    workloads = workloads or validation_workloads(model, scale=scale, seed=seed)
    options = policy_options or {}
    cm, doc = None, None
    if profile is not None:
        cm = cost_model_from_dict(profile) if isinstance(profile, dict) else profile
        if isinstance(profile, dict):
            env = profile.get("environment") or {}
            doc = {"path": profile.get("path"), "kind": profile.get("kind"),
                   "environment": {k: env.get(k) for k in ("git_commit", "git_dirty", "written_at", "device_name")}}
    elif profile_grid is None:
        vocab, max_ctx = model_limits(model)
        shape = workload_shape(workloads, policies, chunk_size, options, vocab, max_ctx)
        profile_grid = targeted_grid(shape, chunk_size, repeats=1)
        say(f"[validate] profile grid {profile_grid} (measured once per repeat)")
    avoid = {chunk_size} | set((profile_grid or {}).get("prefill_tokens", ()))
    cases = heldout_cases(heldout, heldout_seed, scale=scale if heldout_scale is None else heldout_scale,
                          max_context=model_limits(model)[1], avoid=avoid) if heldout else []
    for c in cases:
        say(f"[validate] {c.label()}")
    return ValidationPlan(workloads, tuple(policies), options, chunk_size, repeats, scale, seed, sentinel_tokens,
                          profile_grid, cm, doc, cases, heldout_seed if heldout else None)


# ---------------------------------------------------------------------------------- run
@dataclass
class EngineRuns:
    """The engine's side: per (workload, policy) each repeat's summary and step records; the
    profile's records, one list per repeat (share); the sentinels; the profile's wall time."""

    summaries: Dict[tuple, List[dict]] = field(default_factory=dict)
    steps: Dict[tuple, List[List[dict]]] = field(default_factory=dict)
    shares: List[List[dict]] = field(default_factory=list)
    sentinels: List[dict] = field(default_factory=list)
    profile_wall_s: float = 0.0


def _fresh() -> None:
    """Every run starts from the same process state."""
    gc.collect()
    mx.clear_cache()


def run_engine(model, plan: ValidationPlan, *, warmup: bool = True, say: Callable[[str], None] = print,
               t_start: Optional[float] = None) -> EngineRuns:
    """The engine's repeats, repeats outermost so slow drift of the machine hits every
    configuration alike; with a measured profile, a share of it in every repeat just before that
    repeat's engine runs; a sentinel (:func:`sentinel_itl`) before each profile share and run."""
    t_start = time.perf_counter() if t_start is None else t_start
    runs = EngineRuns()

    def engine(p):
        return Engine(model, policy=p, chunk_size=plan.chunk_size, overlap=False, **plan.options.get(p, {}))  # serial

    def sentinel(before: str, r: int) -> None:
        if plan.sentinel_tokens > 0:
            _fresh()
            itl = sentinel_itl(engine("interleave"), tokens=plan.sentinel_tokens, seed=plan.seed)
            runs.sentinels.append({"before": before, "repeat": r, "t_s": time.perf_counter() - t_start,
                                   "itl_p50_s": itl})
            say(f"[validate] sentinel before {before}: lone ITL p50 {itl * 1e3:.2f} ms")

    configs = plan.configs(model_limits(model)[0])
    if warmup:  # unrecorded: first use of every shape the runs will see (kernels compile on a GPU)
        for c in configs:
            _fresh()
            run_workload(c.engine(model), c.workload)
        say(f"[validate] warm-up done ({time.perf_counter() - t_start:.1f} s)")
    for r in range(plan.repeats):
        if plan.measure_profile:
            sentinel("profile", r)
            _profile_share(model, plan, runs, r, say)
        for c in configs:
            wname, p = c.key
            sentinel(f"{wname}/{p}", r)
            _fresh()
            res = run_workload(c.engine(model), c.workload)
            runs.summaries.setdefault(c.key, []).append(res.summary)
            runs.steps.setdefault(c.key, []).append(res.timeline.to_dict("records"))
            say(f"[validate] engine {wname:10s} {p:15s} repeat {r + 1}: "
                f"TTFT p50 {res.summary['all']['ttft_s']['p50'] * 1e3:8.1f} ms, ITL p50 "
                f"{res.summary['all']['itl_s']['p50'] * 1e3:7.2f} ms ({res.wall_s:.1f} s)")
    return runs


def _profile_share(model, plan: ValidationPlan, runs: EngineRuns, r: int, say: Callable[[str], None]) -> None:
    _fresh()
    prof = profile_device(model, **plan.profile_grid, warmup=(r == 0), log=say)
    runs.shares.append([dict(rec, share=r) for rec in prof["records"]])
    runs.profile_wall_s += prof["wall_s"]
    lone = [c["duration_s"] for c in prof["cells"] if c.get("kind") == "decode" and c["decode_batch"] == 1]
    say(f"[validate] profile share {r + 1}: lone decode step {np.median(lone) * 1e3 if lone else float('nan'):.2f} ms")


# ---------------------------------------------------------------------------------- score
def fitted_profile(model, plan: ValidationPlan, runs: EngineRuns) -> tuple:
    """The pooled cost model (for the diagnosis), the cost models the simulator runs on (one
    per share, each standing for the machine as it was during its repeat; or the given one), and
    the profile's part of the result."""
    if not plan.measure_profile:
        cm = plan.cost_model
        return cm, [cm], {"coefficients": coefficients(cm) if hasattr(cm, "coef") else None,
                          "source": getattr(cm, "source", None), "given": plan.profile_doc}
    records = [r for share in runs.shares for r in share]
    cells = cell_medians(records)
    cm = fit_cost_model(cells, source=f"profile of {getattr(model, 'name', 'model')} interleaved with the "
                                      f"engine runs (cell medians)")
    cms = [fit_cost_model(cell_medians(share), source=f"profile share {i + 1}") for i, share in enumerate(runs.shares)]
    info = {"coefficients": coefficients(cm), "fit": fit_report(cm, cells), "grid": dict(plan.profile_grid),
            "share_coefficients": [coefficients(c) for c in cms], "steps": len(records),
            "wall_s": runs.profile_wall_s,
            "records": [{k: v for k, v in r.items() if k != "decode_seqs"} for r in records],
            "cells": [{k: c.get(k) for k in CELL_FIELDS if k in c} for c in cells]}
    return cm, cms, info


def step_ratio(cm, eng_steps: Dict[tuple, List[List[dict]]]) -> Dict[str, dict]:
    """Diagnosis: the pooled cost model on the engine's own steps, by phase: each step's period
    (next step's start - its start: what the step cost the run, pipelining included) over its
    prediction. Periods that include an idle wait for an arrival are left out; a record's decode
    context is the sum, not the padded batch, so batched decode reads a little high."""
    out = {}
    for (wname, p), runs in eng_steps.items():
        by: Dict[str, List[float]] = {}
        for recs in runs:
            for a, b in zip(recs, recs[1:]):
                if b["start_s"] - a["end_s"] > IDLE_GAP_S:
                    continue
                pred = cm.predict_record(a) if hasattr(cm, "predict_record") else float("nan")
                if pred > 0:
                    by.setdefault(a["phase"], []).append((b["start_s"] - a["start_s"]) / pred)
        out[f"{wname}/{p}"] = {ph: {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "n": len(v)}
                               for ph, v in by.items()}
    return out


def score_validation(model, plan: ValidationPlan, runs: EngineRuns) -> dict:
    """The simulator on every configuration once per cost model, scored against the engine's
    repeats; the periods and step rows of both sides, the step-ratio diagnosis, the sentinels."""
    cm, cms, prof_info = fitted_profile(model, plan, runs)
    rows, held, period_tables, steps = [], [], {}, {}
    for c in plan.configs(model_limits(model)[0]):
        wname, p = c.key
        sim_res = [run_workload(c.simulator(model, m), c.workload) for m in cms]
        eng, sim = runs.steps[c.key], [r.timeline.to_dict("records") for r in sim_res]
        period_tables[f"{wname}/{p}"] = {"engine": periods(*eng), "sim": periods(*sim)}
        steps[f"{wname}/{p}"] = {"engine": [step_rows(recs) for recs in eng], "sim": [step_rows(s) for s in sim]}
        (held if c.heldout else rows).extend(score_config(wname, p, runs.summaries[c.key],
                                                          [r.summary for r in sim_res]))
    sim_sentinels = [sentinel_itl(Simulator.for_model(model, c, policy="interleave", chunk_size=plan.chunk_size),
                                  tokens=plan.sentinel_tokens, seed=plan.seed)
                     for c in cms] if plan.sentinel_tokens > 0 else []
    out = {"rule": rule(plan.repeats), "table": rows, "summary": summarize(rows),
           "passed": all(r["passed"] for r in rows), "step_ratio": step_ratio(cm, runs.steps),
           "periods": period_tables, "steps": {"columns": list(STEP_COLUMNS), "runs": steps}, "profile": prof_info,
           "sentinels": {"runs": runs.sentinels, "sim": sim_sentinels}}
    if plan.heldout:
        out["heldout"] = heldout_block(plan.heldout, plan.heldout_seed, held)
    return out


def heldout_block(cases: Sequence[HeldOutCase], seed: Optional[int], rows: List[dict]) -> dict:
    """A validation's held-out part: the cases (their specs, to rebuild them), the rows, and per
    metric the error summary beside the engine's own repeat spread (its noise floor)."""
    return {"seed": seed, "n": len(cases), "cases": [c.as_dict() for c in cases], "table": rows,
            "summary": summarize(rows), "passed": all(r["passed"] for r in rows)}


# ---------------------------------------------------------------------------------- the study
def validate_simulator(model, workloads: Optional[Dict[str, Workload]] = None,
                       policies: Sequence[str] = ("interleave", "admission_gate", "stall_free"),
                       repeats: int = 3, *, profile=None, chunk_size: int = 256,
                       policy_options: Optional[Dict[str, dict]] = None, scale: float = 1.0,
                       profile_grid: Optional[dict] = None, warmup: bool = True, seed: int = 0,
                       save: bool = True, figure: bool = True, platform: Optional[str] = None,
                       name: str = "sim_validation", sentinel_tokens: int = 24, heldout: int = 0,
                       heldout_seed: int = 1, heldout_scale: Optional[float] = None,
                       log: Optional[Callable[[str], None]] = None) -> dict:
    """Simulator against engine on the same workloads (rule: :mod:`mlxlab.studies.sim_validation.scoring`).

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel`.
        workloads: name -> workload (default :func:`validation_workloads` at ``scale``).
        policies: policy names, run with ``policy_options[name]`` on both executors.
        repeats: engine runs per (workload, policy); the simulator runs once per cost model (it is
            deterministic).
        profile: a cost model or profile dict; default: measured here with
            :func:`mlxlab.sim.measure.profile_device` on :func:`targeted_grid` (``profile_grid``
            overrides), one share per repeat just before that repeat's engine runs, so slow drift
            of a shared machine hits the profile and the engine alike. The simulator runs once per
            share (each fitted alone) and its value is the median over shares, as the engine's is
            over repeats.
        chunk_size: the chunk size of every run.
        sentinel_tokens: before each profile share and each engine run, a lone chat of this many
            output tokens (:func:`sentinel_itl`), whose ITL p50 tracks how fast the machine is
            right then; 0 for none.
        heldout, heldout_seed, heldout_scale: that many held-out cases
            (:mod:`mlxlab.studies.sim_validation.heldout`: random traces, chunk sizes, options and policies
            neither the profile grid nor the standard runs use), run and scored beside the
            standard workloads and reported apart (``heldout``).
        save, figure, platform, name: write ``data/results/<platform>/<name>.json`` and
            ``paper/figures/<name>_<platform>.svg/.png``.

    Returns a JSON-ready dict: ``table`` (rows: workload, policy, tenant, metric, engine, sim,
    rel_error, noise, tolerance, passed, engine_runs, sim_runs, paired_errors), ``summary`` (per
    metric: median and max error, pass count; with a measured profile also the median paired
    error, repeat r against the simulator on share r), ``rule``, ``step_ratio`` (per
    workload/policy and phase: the engine's step period over the pooled cost model's prediction),
    ``periods`` (per workload/policy, engine and simulator: the median step period by phase,
    decode batch and batch change), ``steps`` (every step of every run as compact rows),
    ``profile`` (coefficients with ``overhead_s`` and ``tail_s``, fit, grid, records and cells),
    ``sentinels`` (``runs``: each sentinel's ITL p50 with what ran next; ``sim``: the simulator's
    sentinel on each share's cost model), ``config``, ``cost_model`` (the fingerprint and provenance of
    the cost models the simulator ran on: :func:`mlxlab.studies.sim_validation.verdict.cost_model_record`),
    ``verdicts`` (``mlx-sim-accuracy``: :func:`mlxlab.studies.sim_validation.verdict.sim_accuracy_verdict`;
    with held-out cases also ``mlx-sim-heldout``: :func:`mlxlab.studies.sim_validation.verdict.sim_heldout_verdict`),
    ``parameters``, ``wall_s``; with held-out cases ``heldout`` (``cases``: each one's spec,
    ``table`` and ``summary`` as for the standard rows, ``seed``); plus ``paths`` when saved.
    """
    say = log or (lambda s: None)
    t_start = time.perf_counter()
    plan = plan_validation(model, workloads, policies, repeats, profile=profile, chunk_size=chunk_size,
                           policy_options=policy_options, scale=scale, profile_grid=profile_grid, seed=seed,
                           sentinel_tokens=sentinel_tokens, heldout=heldout, heldout_seed=heldout_seed,
                           heldout_scale=heldout_scale, say=say)
    runs = run_engine(model, plan, warmup=warmup, say=say, t_start=t_start)
    out = score_validation(model, plan, runs)
    out["config"] = {"model": getattr(model, "name", None), "dtype": str(getattr(model, "dtype", "")),
                     "bits": getattr(model, "bits", None), "policies": list(plan.policies), "repeats": repeats,
                     "chunk_size": chunk_size, "scale": scale, "policy_options": plan.options,
                     "workloads": {k: w.config() for k, w in plan.workloads.items()},
                     "heldout": {"n": len(plan.heldout), "seed": plan.heldout_seed,
                                 "scale": scale if heldout_scale is None else heldout_scale}}
    out["cost_model"] = record_of_result({**out, "environment": {"git_commit": _git_commit()}})
    out["verdicts"] = validation_verdicts(out, out["cost_model"])
    out["parameters"] = parameters(out, seed=seed, sentinel_tokens=sentinel_tokens, warmup=warmup,
                                   heldout=len(plan.heldout), heldout_seed=plan.heldout_seed,
                                   profile="measured in the run" if plan.measure_profile else
                                   ((plan.profile_doc or {}).get("path") or "given"))
    out["wall_s"] = time.perf_counter() - t_start
    if save:
        out["paths"] = _save(out, model, name, platform or platform_name(), figure)
        out = jsonable(out)
    return out


def _save(out: dict, model, name: str, plat: str, figure: bool) -> dict:
    payload = {k: v for k, v in out.items() if k not in ("verdicts", "parameters")}
    paths = {"results": str(save_results(name, payload, platform=plat, verdicts=out["verdicts"],
                                         parameters=out["parameters"]))}
    if figure:
        try:
            from mlxlab.notebook.plots import save_figure  # altair: only for the figure
            from mlxlab.studies.sim_validation.charts import (  # altair, as above
                FIGURES,
                heldout_chart,
                validation_chart,
            )

            chart = validation_chart(out["table"], title=f"{name} ({plat}, {getattr(model, 'name', '')})")
            paths["figures"] = [str(p) for p in save_figure(chart, f"{name}_{plat}", FIGURES)]
            if (out.get("heldout") or {}).get("table"):
                held = heldout_chart(out["heldout"]["table"], title=f"held-out traces ({plat})")
                paths["figures"] += [str(p) for p in save_figure(held, f"{name}_heldout_{plat}", FIGURES)]
        except Exception as e:  # a figure must not lose the numbers
            paths["figure_error"] = repr(e)
    return paths
