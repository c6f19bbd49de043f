"""Run a workload on an executor and collect per-request, per-step and per-tenant results.

The loop: submit every arrival whose time has come (with ``arrival_s`` = its scheduled time, so
TTFT includes queueing), run one step, hand each finished request to the workload for its
follow-ups (next chat turn, next batch prompt). When the executor is idle and the next arrival
lies in the future, wait for it with ``executor.advance_to(t)``: a simulator jumps its virtual
clock, the engine sleeps.

The executor is any :class:`mlxlab.core.executor.Executor` (:class:`mlxlab.engine.Engine`, the
simulator, mlx-lm's ``BatchGenerator`` behind the same interface), or a model, for which an
engine is built.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from mlxlab.core import metrics
from mlxlab.core.executor import Executor, progress_bar
from mlxlab.core.results import jsonable
from mlxlab.core.workload import Arrival, save_trace

MAX_IDLE_STEPS = 10_000  # consecutive empty steps with work queued and nothing due: a stuck policy


@dataclass
class RunResult:
    """What one run produced.

    * ``requests``: one row per request (:func:`mlxlab.core.metrics.request_table`) plus ``key`` and
      ``index`` (session/worker and turn/question number), ``scheduled_s`` (arrival time from run
      start) and ``finish_s``; times other than ``scheduled_s`` are on the executor's clock.
    * ``timeline``: one row per executed step (:func:`mlxlab.core.metrics.timeline_table`).
    * ``summary``: per tenant (and ``"all"``), :func:`mlxlab.core.metrics.tenant_summaries` plus
      ``itl_max_s``, ``prompt_tokens``, ``output_tokens`` and ``prefill_tok_s_run``: the
      tenant's prompt tokens / seconds during which at least one of its prompts was waiting for
      its first token (the union of its [arrival, first token] intervals), i.e. the prompt
      throughput the tenant got while it wanted some; for always-busy batch workers this is
      prompt tokens / (last first token - first arrival).
    * ``trace``: the arrivals submitted, replayable with :class:`mlxlab.core.workload.TraceWorkload`.
    * ``config``: policy name, chunk size, workload config, executor type.
    * ``complete``: False if ``max_wall_s`` stopped the run before every request finished.
    """

    requests: Any
    timeline: Any
    summary: Dict[str, dict]
    trace: List[Arrival]
    config: dict
    complete: bool
    wall_s: float
    t0_s: float = 0.0
    submitted: list = field(default_factory=list, repr=False)  # the executor's request objects
    executor: Any = field(default=None, repr=False)

    def summary_table(self):
        """The headline numbers, one row per tenant (seconds and tokens per second)."""
        import pandas as pd  # tables are optional plumbing: the runner imports without pandas

        rows = []
        for tenant, s in self.summary.items():
            rows.append({"tenant": tenant, "requests": s["requests"],
                         "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"],
                         "itl_p50_s": s["itl_s"]["p50"], "itl_p99_s": s["itl_s"]["p99"],
                         "itl_max_s": s["itl_max_s"], "decode_tok_s": s["decode_tok_s"],
                         "prefill_tok_s": s["prefill_tok_s"], "prefill_tok_s_run": s["prefill_tok_s_run"]})
        return pd.DataFrame(rows)

    def to_json(self) -> dict:
        """Config and summary as a JSON-ready dict (NaN written as None; no per-request tables),
        for :func:`mlxlab.core.results.save_results`."""
        return jsonable({"config": self.config, "complete": self.complete, "wall_s": self.wall_s,
                       "num_requests": len(self.submitted), "num_steps": int(len(self.timeline)),
                       "summary": self.summary})

    def save_trace(self, path) -> Any:
        """Write the submitted arrivals as a JSONL trace (a bare name goes to ``data/traces/``)."""
        return save_trace(path, self.trace)


def _tenant_summary(reqs) -> Dict[str, dict]:
    out = metrics.tenant_summaries(reqs)
    groups: Dict[str, list] = {"all": list(reqs)}
    for r in reqs:
        groups.setdefault(r.tenant, []).append(r)
    for name, rs in groups.items():
        s = out[name]
        s["itl_max_s"] = s["itl_s"]["max"]
        s["prompt_tokens"] = sum(r.prompt_tokens for r in rs)
        s["output_tokens"] = sum(len(r.output_tokens) for r in rs)
        started = [r for r in rs if r.token_times_s]
        span = _union_length([(r.arrival_s, r.token_times_s[0]) for r in started])
        s["prefill_tok_s_run"] = (sum(r.prompt_tokens for r in started) / span) if span > 0 else float("nan")
    return out


def _union_length(intervals) -> float:
    """Total length covered by (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def run_workload(executor, workload, policy=None, *, chunk_size: Optional[int] = None,
                 progress: bool = False, max_wall_s: Optional[float] = None) -> RunResult:
    """Run ``workload`` to completion on ``executor`` and return a :class:`RunResult`.

    ``executor``: an :class:`~mlxlab.core.executor.Executor` (used as is; then ``policy`` and
    ``chunk_size`` must be None, since they belong to the executor) or a model, for which an
    ``Engine(model, policy=policy or "interleave", chunk_size=chunk_size or 2048)`` is built.
    ``workload``: a :class:`mlxlab.core.workload.Workload` or :class:`~mlxlab.core.workload.TraceWorkload`.
    ``max_wall_s``: stop (with ``complete=False``) after this many wall-clock seconds."""
    ex = _executor_for(executor, policy, chunk_size)
    vocab = getattr(ex, "vocab_size", None)
    if vocab is not None and getattr(workload, "vocab_size", 0) > vocab:
        raise ValueError(f"the workload draws token ids up to {workload.vocab_size - 1} but the executor's "
                         f"vocabulary has {vocab} ids; build the workload with vocab_size={vocab}")
    wall0 = time.perf_counter()
    first_step = len(ex.steps)
    run = _Run(ex, workload)
    bar = progress_bar(getattr(workload, "total_requests", None)) if progress else None
    try:
        complete = run.drive(None if max_wall_s is None else wall0 + max_wall_s, bar)
    finally:
        if bar is not None:
            bar.close()
    ex.flush()  # tokens still in flight belong to this run
    ex.close()  # stops an overlap engine's prefill worker (a later step would start a new one)
    return run.result(complete, time.perf_counter() - wall0, first_step, max_wall_s)


def _executor_for(executor, policy, chunk_size: Optional[int]) -> Executor:
    if isinstance(executor, Executor):
        if policy is not None or chunk_size is not None:
            raise ValueError("policy and chunk_size configure an engine that run_workload builds; "
                             "pass a model, or set them on the executor you pass")
        return executor
    # mlx is heavy and the runner must import without it: the engine only when given a model
    from mlxlab.engine.loop import Engine

    return Engine(executor, policy=policy or "interleave", chunk_size=chunk_size or 2048)


class _Run:
    """One run's arrivals: those due are submitted, finished requests bring their follow-ups."""

    def __init__(self, ex: Executor, workload):
        self.ex, self.workload = ex, workload
        self.t0 = ex.now()
        self.order = itertools.count()  # ties in time keep submission order
        self.pending: list = []  # (time from run start, order, arrival)
        for a in workload.start():
            self._push(a)
        self.open: Dict[int, tuple] = {}  # executor request id -> (request, arrival)
        self.submitted: list = []
        self.trace: List[Arrival] = []
        self.meta: Dict[int, Arrival] = {}

    def _push(self, a: Arrival) -> None:
        heapq.heappush(self.pending, (a.time_s, next(self.order), a))

    def _due(self) -> bool:
        return bool(self.pending) and self.pending[0][0] <= self.ex.now() - self.t0

    def drive(self, deadline: Optional[float], bar) -> bool:
        """Step until every request (and follow-up) is done; False if ``deadline`` (wall clock)
        came first."""
        idle_steps = 0
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                return not self.pending and not self.open
            self.submit_due()
            if self.ex.has_work:
                rec = self.ex.step()
                self.collect_finished(bar)
                if rec is None and self.ex.has_work and not self._due():
                    # the policy planned nothing although work is queued: let time pass, but not forever
                    idle_steps += 1
                    if idle_steps > MAX_IDLE_STEPS:
                        raise RuntimeError(f"executor has work but its policy planned {MAX_IDLE_STEPS} "
                                           f"empty steps in a row; the run is stuck")
                    if self.pending:
                        self.wait_for_next(deadline)
                else:
                    idle_steps = 0
                continue
            self.collect_finished(bar)
            if not self.pending:
                if self.open:  # idle executor but requests not done: should not happen
                    raise RuntimeError(f"executor is idle but {len(self.open)} request(s) never finished")
                return True
            self.wait_for_next(deadline)

    def submit_due(self) -> None:
        while self._due():
            _, _, a = heapq.heappop(self.pending)
            try:
                req = self.ex.submit(a.prompt, a.max_tokens, tenant=a.tenant, arrival_s=self.t0 + a.time_s)
            except ValueError as e:
                raise ValueError(f"{a.tenant} stream {a.key} request {a.index}: {e}") from e
            self.open[req.id] = (req, a)
            self.submitted.append(req)
            self.trace.append(a)
            self.meta[req.id] = a

    def collect_finished(self, bar) -> None:
        for rid in [rid for rid, (r, _) in self.open.items() if r.done]:
            req, a = self.open.pop(rid)
            for nxt in self.workload.on_finish(a, list(req.output_tokens), req.finish_s - self.t0):
                self._push(nxt)
            if bar is not None:
                bar.update(1)

    def wait_for_next(self, deadline: Optional[float]) -> None:
        """Let the executor's clock reach the next arrival (a wall clock no later than ``deadline``)."""
        t = self.t0 + self.pending[0][0]
        if deadline is not None and not self.ex.virtual_clock:
            t = min(t, self.ex.now() + deadline - time.perf_counter())
        self.ex.advance_to(t)

    def result(self, complete: bool, wall_s: float, first_step: int, max_wall_s: Optional[float]) -> RunResult:
        ex, submitted = self.ex, self.submitted
        table = metrics.request_table(submitted)
        if len(table):
            table["key"] = [self.meta[r.id].key for r in submitted]
            table["index"] = [self.meta[r.id].index for r in submitted]
            table["scheduled_s"] = [self.meta[r.id].time_s for r in submitted]
            table["finish_s"] = [r.finish_s for r in submitted]
        pol = getattr(ex, "policy", None)
        config = {
            "policy": getattr(pol, "name", None if pol is None else str(pol)),
            "policy_repr": None if pol is None else repr(pol),
            "chunk_size": getattr(ex, "chunk_size", None),
            "executor": type(ex).__name__,
            "max_wall_s": max_wall_s,
            "workload": self.workload.config() if hasattr(self.workload, "config") else repr(self.workload),
        }
        return RunResult(requests=table, timeline=metrics.timeline_table(list(ex.steps)[first_step:]),
                         summary=_tenant_summary(submitted), trace=self.trace, config=config,
                         complete=complete, wall_s=wall_s, t0_s=self.t0, submitted=submitted, executor=ex)
