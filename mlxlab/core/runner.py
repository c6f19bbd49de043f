"""Run a workload on an executor and collect per-request, per-step and per-tenant results.

The loop: submit every arrival whose time has come (with ``arrival_s`` = its scheduled time, so
TTFT includes queueing), run one step, hand each finished request to the workload for its
follow-ups (next chat turn, next batch prompt). When the executor is idle and the next arrival
lies in the future, wait for it: ``executor.advance_to(t)`` if the executor has it (a simulator
jumps its virtual clock), else ``time.sleep`` (the real engine's wall clock).

An executor is anything with ``submit(prompt, max_tokens, *, tenant, arrival_s) -> request``,
``step()``, ``now()``, ``has_work``, ``requests`` and ``steps``: :class:`mlxlab.engine.Engine`
or the simulator. Requests must expose the fields :mod:`mlxlab.core.metrics` reads plus ``done``,
``output_tokens`` and ``finish_s``.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from mlxlab.core import metrics
from mlxlab.core.workload import Arrival, save_trace

MAX_IDLE_STEPS = 10_000  # consecutive empty steps with work queued and nothing due: a stuck policy


@dataclass
class RunResult:
    """What one run produced.

    * ``requests``: one row per request (:func:`mlxlab.core.metrics.request_table`) plus ``key`` and
      ``index`` (session/worker and turn/question number), ``scheduled_s`` (arrival time from run
      start) and ``finish_s``; times other than ``scheduled_s`` are on the executor's clock.
    * ``timeline``: one row per executed step (:func:`mlxlab.core.metrics.timeline_table`).
    * ``summary``: per tenant (and ``"all"``), :func:`mlxlab.core.metrics.summarize` plus
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
        import pandas as pd

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
        from mlxlab.core.results import _clean

        return _clean({"config": self.config, "complete": self.complete, "wall_s": self.wall_s,
                       "num_requests": len(self.submitted), "num_steps": int(len(self.timeline)),
                       "summary": self.summary})

    def save_trace(self, path) -> Any:
        """Write the submitted arrivals as a JSONL trace (a bare name goes to ``data/traces/``)."""
        return save_trace(path, self.trace)


def _is_executor(x) -> bool:
    return all(hasattr(x, a) for a in ("submit", "step", "now", "has_work"))


def _tenant_summary(reqs) -> Dict[str, dict]:
    out = metrics.summarize(reqs)
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

    ``executor``: an Engine-like object (used as is; then ``policy`` and ``chunk_size`` must be
    None, since they belong to the executor) or a model, for which an
    ``Engine(model, policy=policy or "interleave", chunk_size=chunk_size or 2048)`` is built.
    ``workload``: a :class:`mlxlab.core.workload.Workload` or :class:`~mlxlab.core.workload.TraceWorkload`.
    ``max_wall_s``: stop (with ``complete=False``) after this many wall-clock seconds."""
    if _is_executor(executor):
        if policy is not None or chunk_size is not None:
            raise ValueError("policy and chunk_size configure an engine that run_workload builds; "
                             "pass a model, or set them on the executor you pass")
        ex = executor
    else:
        from mlxlab.engine.loop import Engine

        ex = Engine(executor, policy=policy or "interleave", chunk_size=chunk_size or 2048)
    vocab = getattr(ex, "vocab_size", None)
    if vocab is not None and getattr(workload, "vocab_size", 0) > vocab:
        raise ValueError(f"the workload draws token ids up to {workload.vocab_size - 1} but the executor's "
                         f"vocabulary has {vocab} ids; build the workload with vocab_size={vocab}")

    wall0 = time.perf_counter()
    deadline = None if max_wall_s is None else wall0 + max_wall_s
    t0 = ex.now()
    first_step = len(getattr(ex, "steps", []))
    order = itertools.count()  # ties in time keep submission order
    pending: list = []
    for a in workload.start():
        heapq.heappush(pending, (a.time_s, next(order), a))
    open_reqs: Dict[int, tuple] = {}  # executor request id -> (request, arrival)
    submitted, trace, meta = [], [], {}
    complete, idle_steps = True, 0

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=getattr(workload, "total_requests", None), desc="requests", leave=False)

    def submit_due() -> None:
        now = ex.now() - t0
        while pending and pending[0][0] <= now:
            _, _, a = heapq.heappop(pending)
            try:
                req = ex.submit(a.prompt, a.max_tokens, tenant=a.tenant, arrival_s=t0 + a.time_s)
            except ValueError as e:
                raise ValueError(f"{a.tenant} stream {a.key} request {a.index}: {e}") from e
            open_reqs[req.id] = (req, a)
            submitted.append(req)
            trace.append(a)
            meta[req.id] = a

    def collect_finished() -> None:
        for rid in [rid for rid, (r, _) in open_reqs.items() if r.done]:
            req, a = open_reqs.pop(rid)
            for nxt in workload.on_finish(a, list(req.output_tokens), req.finish_s - t0):
                heapq.heappush(pending, (nxt.time_s, next(order), nxt))
            if bar is not None:
                bar.update(1)

    try:
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                complete = not pending and not open_reqs
                break
            submit_due()
            if ex.has_work:
                rec = ex.step()
                collect_finished()
                if rec is None and ex.has_work and not (pending and pending[0][0] <= ex.now() - t0):
                    # the policy planned nothing although work is queued: let time pass, but not forever
                    idle_steps += 1
                    if idle_steps > MAX_IDLE_STEPS:
                        raise RuntimeError(f"executor has work but its policy planned {MAX_IDLE_STEPS} "
                                           f"empty steps in a row; the run is stuck")
                    if pending:
                        _wait_until(ex, t0 + pending[0][0], deadline)
                else:
                    idle_steps = 0
                continue
            collect_finished()
            if not pending:
                if open_reqs:  # idle executor but requests not done: should not happen
                    raise RuntimeError(f"executor is idle but {len(open_reqs)} request(s) never finished")
                break
            _wait_until(ex, t0 + pending[0][0], deadline)
    finally:
        if bar is not None:
            bar.close()

    if callable(getattr(ex, "flush", None)):
        ex.flush()  # tokens still in flight belong to this run
    if callable(getattr(ex, "close", None)):
        ex.close()  # stops an overlap engine's prefill worker (a later step would start a new one)
    wall_s = time.perf_counter() - wall0
    table = metrics.request_table(submitted)
    if len(table):
        table["key"] = [meta[r.id].key for r in submitted]
        table["index"] = [meta[r.id].index for r in submitted]
        table["scheduled_s"] = [meta[r.id].time_s for r in submitted]
        table["finish_s"] = [r.finish_s for r in submitted]
    steps = list(getattr(ex, "steps", []))[first_step:]
    pol = getattr(ex, "policy", None)
    config = {
        "policy": getattr(pol, "name", None if pol is None else str(pol)),
        "policy_repr": None if pol is None else repr(pol),
        "chunk_size": getattr(ex, "chunk_size", None),
        "executor": type(ex).__name__,
        "max_wall_s": max_wall_s,
        "workload": workload.config() if hasattr(workload, "config") else repr(workload),
    }
    return RunResult(requests=table, timeline=metrics.timeline_table(steps),
                     summary=_tenant_summary(submitted), trace=trace, config=config,
                     complete=complete, wall_s=wall_s, t0_s=t0, submitted=submitted, executor=ex)


def _wait_until(ex, t: float, deadline: Optional[float]) -> None:
    """Let the executor's clock reach ``t`` (executor seconds)."""
    advance = getattr(ex, "advance_to", None)
    if advance is not None:
        advance(t)
        return
    dt = t - ex.now()
    if deadline is not None:
        dt = min(dt, deadline - time.perf_counter())
    if dt > 0:
        time.sleep(dt)
