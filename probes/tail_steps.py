"""Tail steps: where a tenant's ITL tail comes from, step by step, on the engine and on the
simulator, for settings of a stored tune.

``mlxlab tune``'s sweep keeps each run's summary, not its steps. On the H100 files the simulator
misplaces the chat's ITL p99 where documents are prefilled in large chunks (llama-1b's
interleave-4096: measured 6-20 ms in three runs, simulated 44 ms; coder-1.5b's: measured above the
simulation). This replays the tune's trace with the chosen settings on the engine (serial steps, as
the sweep runs them) and on the cost model its grid was simulated on (``profile.cost_model``, or
``calibration``'s), keeps every step, and splits the tenant's gaps between two of its tokens by
what ran in them:

* ``decode``: no prefill chunk ended inside the gap; ``chunk``: at least one did (its tokens are
  the gap's ``chunk_tokens``);
* per gap the steps' own time (``steps_s``), the rest idle or host time (``gap - steps``), and what
  the cost model predicts for the steps the engine ran (``predicted_s``: the same records, cold
  chunks counted along the run as the profile counted them, plus its per-step overhead).

A step's own time (:func:`own_times`) is what the profile times and the cost model prices: from the
later of its start and the previous step's end to its end. A decode-only step's record runs from
its start until its tokens are read, which the engine (and the simulator, with a measured
``tail_s``) does inside the next step, after queueing that step's forward: its span covers two
forwards where the chain of token reads shows one. Files written before 2026-12-08 compared
spans (``step_time`` absent); files since say ``"step_time": "own"`` and keep the span's median
beside (``span_p50_s``).

So a tail that differs can be told apart: the same kinds of gaps costing another time (the step
cost is wrong: ``predicted_s`` against ``steps_s`` on the engine's own steps), or another count of
chunk gaps (the plan differs: the two sides put chunks beside the tenant's tokens at other
times). ``--output-scale chat=4`` replays the trace with the chat asking for four times its tokens,
so its p99 rests on about four times the gaps (:func:`mlxlab.core.traces.scale_outputs`).

Usage::

    python -m probes.tail_steps data/results/h100/tune_llama-3.2-1b.json --settings interleave-4096 admission_gate-4096
    python -m probes.tail_steps FILE --settings interleave-4096 --output-scale chat=4 --repeats 3

Runs the tune's model (``parameters.model``, ``bits``, ``dtype``), one warm-up run first (not kept).
Prints a table per setting and writes ``data/results/<platform>/tail_steps_<model>[_LABEL].json``.
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from probes import common

GAP_FIELDS = ("gap_s", "steps", "chunk_tokens", "largest_chunk", "decode_batch", "steps_s", "predicted_s")
REQUEST_FIELDS = ("tenant", "arrival_s", "first_token_s", "last_token_s", "tokens")
CHUNK_FIELDS = ("start_s", "end_s", "chunk_tokens", "decode_batch")


def parse_args(argv=None):
    from mlxlab.cli.tune import tenant_factor

    p = common.parser(__doc__, None, model=None)
    p.add_argument("tune", help="a tune.json with profile.cost_model and a trace (mlxlab tune since 2026-12-06)")
    p.add_argument("--settings", nargs="+", default=None, metavar="LABEL",
                   help="grid labels to replay (default: interleave-4096 and admission_gate-4096, those present)")
    p.add_argument("--tenant", default="chat", help="whose gaps (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="engine runs per setting (the simulator runs once)")
    p.add_argument("--output-scale", type=tenant_factor, action="append", default=None, metavar="TENANT=F",
                   help="that tenant asks for F times the tokens it asked for in the tune (repeatable)")
    p.add_argument("--top", type=int, default=12, help="largest gaps kept per run")
    p.add_argument("--traces", default="data/traces/samples", help="the folder holding the tune's trace file")
    p.add_argument("--label", default="", help="a suffix for the results file")
    args = common.parse(p, argv)
    if args.repeats < 1 or args.top < 1:
        p.error("--repeats and --top must be >= 1")
    return args


# ------------------------------------------------------------------------------ analysis (pure)
def own_times(records: Sequence[dict]) -> List[float]:
    """Each record's own time (records in step order): its end less the later of its start and the
    latest end of the records before it. Steps that do not overlap keep their span; a pipelined
    decode-only step, whose tokens are read inside the next step, counts from the previous read to
    its own (one forward, the profile's measure), and the step after it from that read on."""
    out, last = [], float("-inf")
    for r in records:
        out.append(max(0.0, r["end_s"] - max(r["start_s"], last)))
        last = max(last, r["end_s"])
    return out


def predicted_steps(records: Sequence[dict], cost_model) -> List[float]:
    """The cost model's time for each of ``records`` (``StepRecord.as_dict()``, in the run's order):
    cold chunks counted along the run as the model's profile counted them, plus its per-step
    overhead, as the simulator charges a step."""
    warm = cost_model.warm_shapes()
    out = []
    for r in records:
        cold = sum(warm.cold([tuple(c) for c in r.get("prefill_chunks") or []]))
        out.append(cost_model.predict_record({**r, "cold_chunks": cold}) + cost_model.overhead_s)
    return out


def tenant_gaps(requests: Sequence, records: Sequence[dict], tenant: str,
                predicted: Optional[Sequence[float]] = None) -> List[dict]:
    """Every gap between two consecutive tokens of ``tenant``'s requests (objects with ``tenant``
    and ``token_times_s``, on the records' clock) with the steps that ended inside it
    (``(earlier token, later token]``): how many, their prefill tokens and largest chunk, the decode
    batch of the step that made the later token, their summed own time (:func:`own_times`) and
    prediction."""
    order = sorted(range(len(records)), key=lambda i: records[i]["end_s"])
    ends = [records[i]["end_s"] for i in order]
    own = own_times(records)
    out = []
    for req in requests:
        if req.tenant != tenant:
            continue
        t = list(req.token_times_s)
        for a, b in zip(t, t[1:]):
            idx = [order[i] for i in range(bisect.bisect_right(ends, a), bisect.bisect_right(ends, b))]
            inside = [records[i] for i in idx]
            chunks = [c[0] for r in inside for c in (r.get("prefill_chunks") or [])]
            out.append({"gap_s": b - a, "steps": len(inside), "chunk_tokens": int(sum(chunks)),
                        "largest_chunk": int(max(chunks, default=0)),
                        "decode_batch": int(inside[-1]["decode_batch"]) if inside else 0,
                        "steps_s": float(sum(own[i] for i in idx)),
                        "predicted_s": float(sum(predicted[i] for i in idx)) if predicted is not None else None})
    return out


def gap_summary(gaps: Sequence[dict], top: int = 12) -> dict:
    """The gaps' p50/p99 (numpy's linear percentiles, as the runner's), how many hold a chunk and
    what those and the chunk-free ones cost (median gap, steps and prediction), the summed stall
    (each gap less the median), and the ``top`` largest as rows of :data:`GAP_FIELDS`."""
    g = np.array([x["gap_s"] for x in gaps], dtype=float)
    if not g.size:
        return {"n": 0}
    med = float(np.median(g))

    def kind(sel: List[dict]) -> dict:
        if not sel:
            return {"n": 0}
        pred = [x["predicted_s"] for x in sel if x["predicted_s"] is not None]
        return {"n": len(sel), "gap_p50_s": statistics.median(x["gap_s"] for x in sel),
                "gap_max_s": max(x["gap_s"] for x in sel),
                "steps_p50_s": statistics.median(x["steps_s"] for x in sel),
                "predicted_p50_s": statistics.median(pred) if pred else None,
                "chunk_tokens_p50": statistics.median(x["chunk_tokens"] for x in sel)}

    ranked = sorted(gaps, key=lambda x: -x["gap_s"])
    return {"n": int(g.size), "p50_s": med, "p99_s": float(np.percentile(g, 99)), "max_s": float(g.max()),
            "rank_of_p99": int(np.sum(g >= np.percentile(g, 99))),
            "stall_s": float(np.sum(np.maximum(g - med, 0.0))),
            "decode": kind([x for x in gaps if not x["chunk_tokens"]]),
            "chunk": kind([x for x in gaps if x["chunk_tokens"]]),
            "top": [[x[f] for f in GAP_FIELDS] for x in ranked[:top]]}


def timeline(requests: Sequence, records: Sequence[dict]) -> dict:
    """When each request arrived, got its first and last token (rows of :data:`REQUEST_FIELDS`), and
    when each step with a prefill chunk ran (rows of :data:`CHUNK_FIELDS`), seconds from the first
    arrival: where the two sides' counts of chunk gaps part, which documents met which chats."""
    t0 = min((r.arrival_s for r in requests), default=0.0)
    reqs = [[r.tenant, r.arrival_s - t0, (r.token_times_s[0] - t0) if r.token_times_s else None,
             (r.token_times_s[-1] - t0) if r.token_times_s else None, len(r.token_times_s)] for r in requests]
    chunks = [[r["start_s"] - t0, r["end_s"] - t0, int(sum(c[0] for c in r.get("prefill_chunks") or [])),
               int(r.get("decode_batch", 0))] for r in records if r.get("prefill_chunks")]
    return {"requests": reqs, "chunk_steps": chunks}


def step_costs(records: Sequence[dict], predicted: Sequence[float]) -> Dict[str, dict]:
    """The engine's steps by kind (decode only; prefill with the largest chunk up to 512, 2048 or
    more tokens; with or without decode rows): the median own time (:func:`own_times`), the
    median prediction and the median of their ratio, how many, and the median span (start to
    end, which for a pipelined decode-only step covers the next step's forward too)."""
    by: Dict[str, List[tuple]] = {}
    for r, own, p in zip(records, own_times(records), predicted):
        chunk = max((c[0] for c in r.get("prefill_chunks") or []), default=0)
        size = "none" if not chunk else ("<=512" if chunk <= 512 else "<=2048" if chunk <= 2048 else ">2048")
        key = f"chunk {size}, decode {'rows' if r.get('decode_batch') else 'none'}"
        by.setdefault(key, []).append((own, p, r["duration_s"]))
    return {k: {"n": len(v), "measured_p50_s": statistics.median(m for m, _, _ in v),
                "predicted_p50_s": statistics.median(p for _, p, _ in v),
                "ratio_p50": _ratio(v), "span_p50_s": statistics.median(d for _, _, d in v)}
            for k, v in sorted(by.items())}


def _ratio(rows: Sequence[tuple]) -> Optional[float]:
    """The median of measured / predicted over rows of (measured, predicted, ...) with a prediction."""
    r = [m / p for m, p, *_ in rows if p > 0]
    return statistics.median(r) if r else None


def decode_steps(records: Sequence[dict], predicted: Sequence[float], requests: Sequence, tenant: str) -> Dict[str, dict]:
    """The steps with decode rows and no prefill chunk, split by whether ``tenant``'s requests (objects
    with ``id`` and ``tenant``) decode in them and whether a row joined or left the batch there: per
    group how many, the median own time (:func:`own_times`) and prediction and the median of their
    ratio, and the median decode rows and decoding context tokens (which steps the cost model
    misprices, and what they hold)."""
    ids = {q.id for q in requests if q.tenant == tenant}
    by: Dict[str, List[tuple]] = {}
    for r, own, p in zip(records, own_times(records), predicted):
        if r.get("prefill_chunks") or not r.get("decode_batch"):
            continue
        mine = "with" if ids.intersection(r.get("decode_seqs") or ()) else "without"
        changed = "batch changed" if r.get("joined") or r.get("dropped") else "same batch"
        by.setdefault(f"{mine} {tenant}, {changed}", []).append((own, p, r))
    return {k: {"n": len(v), "measured_p50_s": statistics.median(m for m, _, _ in v),
                "predicted_p50_s": statistics.median(p for _, p, _ in v), "ratio_p50": _ratio(v),
                "rows_p50": statistics.median(r["decode_batch"] for _, _, r in v),
                "context_p50": statistics.median(r.get("decode_context_tokens", 0) for _, _, r in v)}
            for k, v in sorted(by.items())}


# ------------------------------------------------------------------------------ runs
def _records(executor) -> List[dict]:
    return [s.as_dict() for s in executor.steps]


def replay(executor, arrivals, tenant: str, cost_model, top: int) -> dict:
    """One run of ``executor`` on the arrivals: its tenant's summary, gap summary and step costs."""
    from mlxlab.core.runner import run_workload
    from mlxlab.core.workload import TraceWorkload

    res = run_workload(executor, TraceWorkload(list(arrivals), name="trace"))
    recs = _records(res.executor)
    pred = predicted_steps(recs, cost_model)
    s = res.summary.get(tenant, {})
    return {"itl_p99_s": s.get("itl_s", {}).get("p99"), "itl_p50_s": s.get("itl_s", {}).get("p50"),
            "steps": len(recs), "wall_s": res.wall_s,
            "gaps": gap_summary(tenant_gaps(res.submitted, recs, tenant, pred), top),
            "step_costs": step_costs(recs, pred), "decode_steps": decode_steps(recs, pred, res.submitted, tenant),
            "timeline": timeline(res.submitted, recs)}


def _point(doc: dict, traces: str, output_scale: Optional[dict]) -> dict:
    from probes.key_align_sim import load_point

    if output_scale:
        doc = {**doc, "parameters": {**doc["parameters"],
                                     "output_scale": {**(doc["parameters"].get("output_scale") or {}), **output_scale}}}
    return load_point(doc, traces)


def _print(label: str, side: str, r: dict) -> None:
    g = r["gaps"]
    ms = lambda v: "n/a" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
    c, d = g.get("chunk", {}), g.get("decode", {})
    print(f"{label:20s} {side:8s} gaps {g['n']:5d}  p50 {ms(g['p50_s']):>6s}  p99 {ms(g['p99_s']):>6s} ms  "
          f"chunk gaps {c.get('n', 0):4d} (p50 {ms(c.get('gap_p50_s')):>6s}, steps {ms(c.get('steps_p50_s')):>6s}, "
          f"model {ms(c.get('predicted_p50_s')):>6s})  decode p50 {ms(d.get('gap_p50_s')):>5s}  "
          f"stall {g['stall_s']:.2f} s", flush=True)


def main(argv=None) -> int:
    from mlxlab.core.runner import run_workload
    from mlxlab.core.workload import TraceWorkload
    from mlxlab.engine.models import load_model
    from mlxlab.sim.simulator import Simulator
    from mlxlab.studies.tune.run import _engine

    args = parse_args(argv)
    doc = json.loads(Path(args.tune).read_text())
    grid = {g["label"]: {k: g[k] for k in ("label", "policy", "chunk_size", "options")} for g in doc["grid"]}
    labels = args.settings or [x for x in ("interleave-4096", "admission_gate-4096") if x in grid]
    missing = [x for x in labels if x not in grid]
    if missing or not labels:
        raise SystemExit(f"{args.tune}: no grid setting {missing or labels}; its labels: {sorted(grid)}")
    scale = dict(args.output_scale) if args.output_scale else None
    point = _point(doc, args.traces, scale)
    cm, tenant = point["cost_model"], args.tenant
    p = doc["parameters"]
    model = load_model(p["model"], bits=p.get("bits"), dtype=p.get("dtype"))
    common.log("tail_steps", f"{p['model']} ({p.get('bits')} bits): {len(point['arrivals'])} requests, "
                             f"settings {labels}, {args.repeats} repeat(s), output scale {scale}")
    t = time.perf_counter()
    run_workload(_engine(model, grid[labels[0]]), TraceWorkload(list(point["arrivals"]), name="trace"))
    common.log("tail_steps", f"warm-up run of {labels[0]}: {time.perf_counter() - t:.1f} s (not kept)")
    out = {}
    for label in labels:
        s = grid[label]
        sim = Simulator(cm, policy=s["policy"], chunk_size=int(s["chunk_size"]), **{**point["limits"], **s["options"]})
        out[label] = {"setting": s, "sim": replay(sim, point["arrivals"], tenant, cm, args.top), "engine": []}
        _print(label, "sim", out[label]["sim"])
    for r in range(args.repeats):  # repeats outermost, as the sweep runs them
        for label in labels:
            run = replay(_engine(model, grid[label]), point["arrivals"], tenant, cm, args.top)
            out[label]["engine"].append(run)
            _print(label, f"engine{r + 1}", run)
    for label in labels:
        print(f"{label}: the engine's steps by kind (own time / the cost model on the same steps, medians of run 1)")
        for k, v in out[label]["engine"][0]["step_costs"].items():
            print(f"   {k:28s} n {v['n']:5d}  {v['measured_p50_s'] * 1e3:7.1f} / {v['predicted_p50_s'] * 1e3:7.1f} ms"
                  f"  ratio {v['ratio_p50'] if v['ratio_p50'] is not None else float('nan'):.2f}")
        for k, v in out[label]["engine"][0]["decode_steps"].items():
            print(f"   decode only, {k:28s} n {v['n']:5d}  {v['measured_p50_s'] * 1e3:7.1f} / "
                  f"{v['predicted_p50_s'] * 1e3:7.1f} ms  rows {v['rows_p50']:g}  context {v['context_p50']:g}")
    plat = args.platform or (doc.get("environment") or {}).get("platform") or Path(args.tune).parent.name
    args.platform = plat
    name = f"tail_steps_{p['model']}" + (f"_{args.label}" if args.label else "")
    common.save(args, "tail_steps", {"step_time": "own", "tune": Path(args.tune).name, "tune_source_commit": (doc.get("environment") or {})
                                     .get("source_commit"), "tenant": tenant, "output_scale": scale,
                                     "repeats": args.repeats, "gap_fields": list(GAP_FIELDS),
                                     "request_fields": list(REQUEST_FIELDS), "chunk_fields": list(CHUNK_FIELDS),
                                     "cost_model": cm.as_dict(), "settings": out}, name=name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
