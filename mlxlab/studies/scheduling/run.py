"""Seed-001 scheduling experiments on the real engine, beside mlx-lm's ``BatchGenerator``.

:func:`scheduling_study` runs, in one process and on one model object:

* ``solo``: one chat stream alone (engine and mlx-lm): the reference inter-token latency (ITL);
* ``alone``: one long prompt alone at each chunk size: the reference TTFT (at chunk 2048 above all);
* ``stall``: a chat streaming while ``W`` batch workers each send one long prompt, under the
  engine's ``interleave`` policy and under mlx-lm, at ``stall_chunk``;
* ``gate``: the same under ``admission_gate`` at ``gate_chunk``, for every ``W`` in ``workers``;
* ``tradeoff``: a chat plus one long prompt under ``interleave`` at each chunk size (the
  ITL-vs-chunk and TTFT-vs-chunk curves);
* ``stall_free`` and ``slo``: a chat plus one long prompt; ``slo`` also with nobody decoding; with
  both ``admission_gate`` and ``stall_free``, the gate too on stall_free's terms (its chunk = the
  token budget, the same prompt);
* ``overlap``: the engine's ``overlap=True`` mode at each chunk size.

It reads in three steps: the plan (:mod:`mlxlab.studies.scheduling.plan`: sizes and the list of
configurations), the runs (here: every configuration ``repeats`` times, the repeats loop
outermost so slow drift in the machine hits every configuration alike) and the verdict
(:mod:`mlxlab.studies.scheduling.result`: medians over repeats, p50/p99 over the pooled
contended gaps of all repeats, one goal per entry of its ``claims`` list). Per run the numbers come
from :func:`~mlxlab.studies.scheduling.metrics.run_metrics`. The verdicts on the claims files'
claims are decided from the result by :func:`mlxlab.studies.scheduling.verdict.verdicts`, which
the CLI stores beside it.

Prompt lengths follow ``platform_scale``: batch prompts are ``(16384, 32768) * platform_scale``
tokens (1.0 on an H200 with a 1.5B model; 1/16 on a CPU with ``small``: 1,024-2,048 tokens).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence

from mlxlab.core.runner import run_workload
from mlxlab.core.workload import Workload
from mlxlab.engine.baseline import MlxLmExecutor
from mlxlab.engine.loop import Engine
from mlxlab.studies.scheduling.metrics import run_metrics
from mlxlab.studies.scheduling.plan import (
    REFERENCE_CHUNK,
    Calibration,
    Job,
    StudyPlan,
    batch_tenant,
    chat_tenant,
    contention_jobs,
    plan_study,
    reference_jobs,
)
from mlxlab.studies.scheduling.merge import kept_runs
from mlxlab.studies.scheduling.result import study_result


def scheduling_study(model, *, log: Optional[Callable[[str], None]] = None,
                     on_run: Optional[Callable[[dict], None]] = None,
                     on_repeat: Optional[Callable[[dict], None]] = None, keep_runs: bool = False,
                     **options) -> dict:
    """Measure the stall and its fixes on the real engine, beside mlx-lm, on the same workloads.

    ``options`` are :func:`~mlxlab.studies.scheduling.plan.plan_study`'s (``platform_scale``,
    ``policies``, ``chunk_sizes``, ``workers``, ``repeats``, chunk sizes and policy settings,
    ``warmup``). ``log`` is called with one line per run (e.g. ``print``); ``on_run`` with each
    run's scalar metrics and configuration as it finishes (the CLI appends them to a JSONL file,
    so a run cut short by a time limit keeps them); ``on_repeat`` with the result so far after
    each repeat (the CLI rewrites its results file, so a study cut short keeps its whole repeats).
    ``keep_runs`` adds every run's own numbers (``runs``), the plan and the calibration, which
    :func:`mlxlab.studies.scheduling.merge.merge_parts` pools across processes.

    Returns a JSON-ready dict (NaN where nothing could be measured): ``config``, ``references``,
    ``claims`` (list of dicts: name, goal, measured, passed, evidence, status), ``table`` (one row
    per configuration), ``warmup_s`` (seconds per warm-up part: a backend's first-use costs) and
    ``wall_s``.
    """
    t_start = time.perf_counter()
    plan = plan_study(model, **options)
    say = log or (lambda s: None)
    bench = _Bench(model, plan, say, on_run)
    warmup_s: Dict[str, float] = {}
    if plan.warmup:
        warmup_s["executors"] = _warm_executors(bench)
        say(f"[scheduling] warm-up done ({warmup_s['executors']:.1f} s)")

    references = reference_jobs(plan)
    for job in references:
        bench.measure(job)
    calib = Calibration.from_runs(bench.runs, plan)
    say(f"[scheduling] solo ITL {calib.solo_itl_s * 1e3:.2f} ms, alone TTFT at {REFERENCE_CHUNK}: "
        f"{calib.alone_ttft_s[REFERENCE_CHUNK]:.3f} s; batch arrives at {calib.batch_arrival_s:.3f} s; "
        f"slo target {calib.itl_target_s * 1e3:.2f} ms")
    jobs = contention_jobs(plan, calib)
    if plan.warmup:
        warmup_s["contention"], n = _warm_jobs(bench, jobs)
        say(f"[scheduling] warm-up of {n} contention executors done ({warmup_s['contention']:.1f} s)")

    def result(done: int) -> dict:
        out = study_result(replace(plan, repeats=done), calib, bench.runs, bench.meta, warmup_s)
        out["wall_s"] = time.perf_counter() - t_start
        if keep_runs:
            out.update(kept_runs(plan, calib, bench.runs, bench.meta, done))
        return out

    for rep in range(plan.repeats):
        for job in (references if rep else []) + jobs:  # repeat 0's references ran above
            bench.measure(job)
        if on_repeat is not None and rep + 1 < plan.repeats:
            on_repeat(result(rep + 1))
    return result(plan.repeats)


class _Bench:
    """Makes each run's executor and workload, runs it, and keeps its metrics by configuration."""

    def __init__(self, model, plan: StudyPlan, say: Callable[[str], None],
                 on_run: Optional[Callable[[dict], None]]):
        self.model, self.plan, self.say, self.on_run = model, plan, say, on_run
        self.runs: Dict[str, List[dict]] = {}
        self.meta: Dict[str, dict] = {}

    def executor(self, kind: str, chunk: int, opts: Optional[dict] = None):
        if kind == "mlx_lm":
            return MlxLmExecutor(self.model, prefill_step_size=chunk)
        if kind == "overlap":
            return Engine(self.model, policy=self.plan.overlap_policy, chunk_size=chunk, overlap=True)
        # serial steps: the study compares chunking policies (slo would run beside decode on a GPU
        # if the engine chose; the "overlap" row measures that mode)
        return Engine(self.model, policy=kind, chunk_size=chunk, overlap=False, **(opts or {}))

    def workload(self, chat_tokens: Optional[int], workers: int, prompt_tokens, start_s: float) -> Workload:
        p, tenants = self.plan, []
        if chat_tokens:
            out = max(2, min(int(chat_tokens), p.max_chat_tokens, p.max_context - p.chat_prompt - 1))
            tenants.append(chat_tenant(p.chat_prompt, out))
        if workers:
            tenants.append(batch_tenant(workers, prompt_tokens, p.batch_output_tokens, start_s))
        return Workload(tenants, vocab_size=p.vocab, seed=p.seed, max_context=p.max_context)

    def run(self, executor, workload: Workload):
        try:
            return run_workload(executor, workload)
        finally:  # run_workload steps by hand: stop an overlap engine's prefill worker thread
            executor.close()

    def measure(self, job: Job) -> None:
        res = self.run(self.executor(job.kind, job.chunk, job.opts),
                       self.workload(job.chat_tokens, job.workers, job.prompt_tokens, job.start_s))
        m = run_metrics(res, job.chunk)
        self.runs.setdefault(job.key, []).append(m)
        self.meta.setdefault(job.key, job.info)
        if self.on_run is not None:
            self.on_run({"config": job.key, **job.info, **{k: v for k, v in m.items() if not isinstance(v, list)}})
        self.say(f"[scheduling] {job.key:34s} worst gap {m['chat_worst_gap_s'] * 1e3:9.1f} ms  "
                 f"itl p99 {m['chat_itl_p99_s'] * 1e3:8.1f} ms  long TTFT {m['long_ttft_s']:8.3f} s  "
                 f"chunk {m['chunk_time_s'] * 1e3:8.1f} ms  ({res.wall_s:.1f} s)")


def _warm_executors(bench: _Bench) -> float:
    """Every executor kind once per chunk size the study uses, unrecorded, on one full chunk and a
    partial one. Returns the seconds it took."""
    p, t0 = bench.plan, time.perf_counter()
    for kind in ["interleave", "mlx_lm"] + (["overlap"] if "overlap" in p.run else []):
        for c in sorted(set(p.chunk_sizes) | {REFERENCE_CHUNK, p.stall_chunk, p.gate_chunk}):
            bench.run(bench.executor(kind, c), bench.workload(8, 1, min(p.hi, c + 16), 0.0))
    return time.perf_counter() - t0


def _warm_jobs(bench: _Bench, jobs: Sequence[Job]) -> tuple:
    """Every contention job's executor once, short and unrecorded: a backend may compile for
    shapes no earlier run used (e.g. slo's small chunks), which would otherwise stall a measured
    step. Returns (seconds, executors warmed)."""
    t0, seen = time.perf_counter(), set()
    for job in jobs:
        sig = (job.kind, job.chunk, tuple(sorted(job.opts.items())))
        if sig in seen:
            continue
        seen.add(sig)
        n = min(bench.plan.hi, 2 * job.chunk + 16)
        chat = 8 + math.ceil(n / job.opts.get("min_chunk", job.chunk))
        bench.run(bench.executor(job.kind, job.chunk, job.opts), bench.workload(chat, 1, n, 0.0))
    return time.perf_counter() - t0, len(seen)


def format_table(study: dict) -> str:
    """The per-configuration table and the claims as readable text."""
    def f(x, k=1, scale=1.0):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x * scale:.{k}f}"

    rows = [("config", "worst gap ms", "gap/solo", "p50 ms", "p99 ms", "chunk ms", "gap/chunk", "TTFT s",
             "TTFT/2048")]
    for r in study["table"]:
        rows.append((r["config"], f(r["chat_worst_gap_s"], 1, 1e3), f(r["worst_gap_over_solo_itl"], 1),
                     f(r["pooled_itl_p50_s"], 2, 1e3), f(r["pooled_itl_p99_s"], 1, 1e3),
                     f(r["chunk_time_s"], 1, 1e3), f(r["worst_gap_over_chunk_time"], 2),
                     f(r["long_ttft_s"], 3), f(r["long_ttft_over_alone_2048"], 2)))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.append("")
    for c in study["claims"]:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[c["passed"]]
        m = c["measured"]
        if isinstance(m, float):
            m = f"{m:.3g}"
        elif isinstance(m, dict):
            m = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items())
        lines.append(f"[{verdict}] {c['name']}: measured {m}  (goal: {c['goal']})")
    return "\n".join(lines)
