"""How a simulator validation is scored, and a saved validation scored again (no MLX, no device).

Each row compares one metric of one tenant (TTFT p50, ITL p50, ITL p99) between the engine's
repeats and the simulator's runs:

    noise     = the engine's coefficient of variation over repeats (std, ddof=1, / mean)
    tolerance = max(10%, 3 x noise)
    passed    = |sim - engine median| / engine median <= tolerance

so a metric the engine itself cannot repeat to 10% is not held to 10%, while a quiet machine is.
:func:`rescore_validation` fits a saved validation's profile records again and reruns its
simulator side under this version's cost model and simulator; :func:`decode_periods` reads the
saved step rows back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mlxlab.core.costmodel import WarmShapes
from mlxlab.core.presets import DEFAULT_MAX_CONTEXT
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import Workload
from mlxlab.sim.fit import cell_medians, coefficients, fit_cost_model, mark_cold_chunks
from mlxlab.sim.simulator import Simulator
from mlxlab.studies.sim_validation.heldout import HeldOutCase

MIN_TOLERANCE = 0.10
NOISE_FACTOR = 3.0
METRICS = (("ttft_s", "p50", "ttft_p50_s"), ("itl_s", "p50", "itl_p50_s"), ("itl_s", "p99", "itl_p99_s"))
STEP_COLUMNS = ("start_s", "end_s", "phase", "decode_batch", "decode_context_tokens", "prefill_tokens",
                "prefill_context_tokens", "chunks", "joined", "dropped", "fused")
IDLE_GAP_S = 0.005  # a gap this long between one step's end and the next one's start: the runner waited


def rule(repeats: int) -> str:
    return (f"noise = coefficient of variation of the engine over {repeats} repeats; tolerance = "
            f"max({MIN_TOLERANCE:.0%}, {NOISE_FACTOR:g} x noise); passed = |sim - engine median| / "
            f"engine median <= tolerance")


def metric(summary: dict, tenant: str, key: str, stat: str) -> float:
    """One statistic of a run summary (``summary[tenant][key][stat]``), NaN where missing."""
    s = summary.get(tenant)
    if not s:
        return float("nan")
    v = s[key][stat]
    return float(v) if v is not None else float("nan")


def _paired(sim_runs: Sequence[float], engine_runs: Sequence[float]) -> Optional[List[float]]:
    """Repeat r's engine value against the simulator on share r, when they pair up."""
    if len(sim_runs) == len(engine_runs) > 1:
        return [abs(a - b) / b for a, b in zip(sim_runs, engine_runs)]
    return None


def score(engine_runs: Sequence[float], sim_runs: Sequence[float]) -> Optional[dict]:
    """One row's numbers under the rule (module docstring); None when either side has no value."""
    vals = [v for v in engine_runs if math.isfinite(v)]
    simv = float(np.median(sim_runs))
    if not vals or not math.isfinite(simv):
        return None
    med = float(np.median(vals))
    noise = float(np.std(vals, ddof=1) / np.mean(vals)) if len(vals) > 1 and np.mean(vals) > 0 else float("nan")
    tol = max(MIN_TOLERANCE, NOISE_FACTOR * noise) if math.isfinite(noise) else MIN_TOLERANCE
    err = abs(simv - med) / med if med > 0 else float("nan")
    return {"engine": med, "sim": simv, "rel_error": err, "noise": noise, "tolerance": tol, "passed": bool(err <= tol),
            "engine_runs": vals, "sim_runs": list(sim_runs), "paired_errors": _paired(sim_runs, vals)}


def score_config(workload: str, policy: str, engine_summaries: List[dict], sim_summaries: List[dict]) -> List[dict]:
    """The rows of one (workload, policy): each tenant's metrics, the engine's repeats against the
    simulator's runs (:func:`score`)."""
    rows = []
    for tenant in [t for t in sim_summaries[0] if t != "all"]:
        for key, stat, label in METRICS:
            s = score([metric(e, tenant, key, stat) for e in engine_summaries],
                      [metric(sm, tenant, key, stat) for sm in sim_summaries])
            if s is not None:
                rows.append({"workload": workload, "policy": policy, "tenant": tenant, "metric": label, **s})
    return rows


def summarize(rows: List[dict]) -> Dict[str, dict]:
    """Per metric: median and max relative error, how many rows are within 10% and pass, and the
    engine's own repeat spread over the same rows (``noise_median``, ``noise_max``: the floor no
    simulator can be held below)."""
    summary = {}
    for _, _, label in METRICS:
        sel = [r for r in rows if r["metric"] == label]
        errs = [r["rel_error"] for r in sel]
        if errs:
            summary[label] = {"median_rel_error": float(np.median(errs)), "max_rel_error": float(max(errs)),
                              "within_10pct": sum(e <= MIN_TOLERANCE for e in errs),
                              "passed": sum(r["passed"] for r in sel), "n": len(errs)}
            noise = [r["noise"] for r in sel if r.get("noise") is not None and math.isfinite(r["noise"])]
            if noise:
                summary[label].update(noise_median=float(np.median(noise)), noise_max=float(max(noise)))
            paired = [e for r in sel for e in (r.get("paired_errors") or [])]
            if paired:
                summary[label]["paired_median_rel_error"] = float(np.median(paired))
    return summary


def format_validation(result: dict) -> str:
    """The validation table as fixed-width text, the held-out table after it (when there is one)."""
    text = _format_table(result["table"], result.get("summary", {}), result.get("rule"))
    held = result.get("heldout")
    if held:
        text += f"\n\nheld-out traces (seed {held.get('seed')}, {held.get('n')} cases):\n"
        text += _format_table(held["table"], held.get("summary", {}), None)
    return text


def _format_table(table: List[dict], summary: dict, rule_text: Optional[str]) -> str:
    lines = [f"{'workload':11s} {'policy':15s} {'tenant':6s} {'metric':11s} {'engine':>10s} {'sim':>10s} "
             f"{'error':>7s} {'noise':>7s} {'tol':>6s}  ok"]
    for r in table:
        lines.append(f"{r['workload']:11s} {r['policy']:15s} {r['tenant']:6s} {r['metric']:11s} "
                     f"{r['engine'] * 1e3:8.2f}ms {r['sim'] * 1e3:8.2f}ms {r['rel_error']:7.1%} "
                     f"{(r['noise'] if r['noise'] is not None else float('nan')):7.1%} {r['tolerance']:6.0%}  "
                     f"{'yes' if r['passed'] else 'NO'}")
    if rule_text:
        lines.append(rule_text)
    for label, sm in summary.items():
        line = (f"{label:11s} error median {sm['median_rel_error']:.1%}, max {sm['max_rel_error']:.1%}, "
                f"within 10%: {sm['within_10pct']}/{sm['n']}, passed: {sm['passed']}/{sm['n']}")
        if "paired_median_rel_error" in sm:
            line += f"; paired (repeat r vs share r) median {sm['paired_median_rel_error']:.1%}"
        if "noise_median" in sm:
            line += f"; engine spread median {sm['noise_median']:.1%}, max {sm['noise_max']:.1%}"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- step rows
def step_rows(records: Sequence[dict]) -> List[list]:
    """Step records (``StepRecord.as_dict()``) as compact rows of :data:`STEP_COLUMNS`, to keep
    every step of a validation run beside its summary (``chunks``: how many sequences the step
    prefilled)."""
    out = []
    for r in records:
        d = dict(r, chunks=len(r.get("prefill_seqs") or []))
        out.append([(float(d[c]) if c.endswith("_s") else d.get(c, 0)) for c in STEP_COLUMNS])
    return out


def periods(*runs: List[dict]) -> Dict[str, dict]:
    """Median step period (next step's start - this step's start: what a step costs the run,
    pipelining included) by phase and decode batch, and whether the step changed the batch, over
    the step records of one or more runs; periods that include an idle wait for an arrival are
    left out. The same table for the engine and the simulator shows where their clocks part."""
    by: Dict[str, List[float]] = {}
    for recs in runs:
        for prev, a, b in zip([None] + list(recs), recs, list(recs[1:])):
            if b["start_s"] - a["end_s"] > IDLE_GAP_S:
                continue
            changed = prev is not None and a["decode_batch"] and prev.get("decode_seqs") != a.get("decode_seqs")
            key = f"{a['phase']} b{a['decode_batch']}" + (" changed" if changed else "")
            by.setdefault(key, []).append(b["start_s"] - a["start_s"])
    return {k: {"median_s": float(np.median(v)), "n": len(v)} for k, v in sorted(by.items())}


def compare_periods(result: dict, *, min_n: int = 3) -> List[dict]:
    """The step-level comparison of the two clocks: for every run of a validation
    (``result["periods"]``) and every kind of step (phase, decode batch, batch change) both sides
    ran at least ``min_n`` times, the engine's and the simulator's median period, their ratio
    ``sim / engine`` and the time the kind takes in the engine's run (``share``: its periods'
    median times their count, over the run's total): where the simulator's clock runs fast or
    slow, and how much of the run that is."""
    out = []
    for run, sides in result.get("periods", {}).items():
        eng, sim = sides["engine"], sides["sim"]
        total = sum(v["median_s"] * v["n"] for v in eng.values()) or 1.0
        for kind in sorted(set(eng) & set(sim)):
            e, s_ = eng[kind], sim[kind]
            if min(e["n"], s_["n"]) < min_n or e["median_s"] <= 0:
                continue
            out.append({"run": run, "kind": kind, "engine_s": e["median_s"], "sim_s": s_["median_s"],
                        "ratio": s_["median_s"] / e["median_s"], "n": e["n"],
                        "share": e["median_s"] * e["n"] / total})
    return out


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
                              and not (a["joined"] or a["dropped"]) and b["start_s"] - a["end_s"] <= IDLE_GAP_S
                              and (max_context is None or a["decode_context_tokens"] <= max_context)])
    if profile_cell:
        out["profile"] = [[r["duration_s"] for r in share if r.get("cell") == profile_cell]
                          for share in profile_shares(result["profile"]["records"])]
    return out


# ---------------------------------------------------------------------------------- rescoring
def recount_cold(shares: Sequence[Sequence[dict]], key: str, capacity: Optional[int] = None) -> List[List[dict]]:
    """A validation's profile shares with ``cold_chunks`` counted again under the rule ``key``
    (:class:`mlxlab.core.costmodel.WarmShapes`: ``"size"`` or ``"shape"``, an LRU of ``capacity``
    shapes), in the order each share measured its steps, the rule stamped on every record (so the
    fit keeps it). Each share is a process of its own after other work; the first came right after
    the profile's warm-up, which ran the share's first prefill group (its leading ``prefill``
    records' chunks, then warm)."""
    out = []
    for i, share in enumerate(shares):
        warm = WarmShapes(key, capacity)
        if i == 0:
            for r in share:
                if r.get("kind") != "prefill":
                    break
                warm.cold(r.get("prefill_chunks") or [])
        out.append([dict(r, cold_chunks=sum(warm.cold(r.get("prefill_chunks") or [])), cold_key=key,
                         cold_capacity=warm.capacity) for r in share])
    return out


def rescore_validation(result, *, cold_key: Optional[str] = None, cold_capacity: Optional[int] = None,
                       log: Optional[Callable[[str], None]] = None) -> dict:
    """A saved validation's simulator side again, under this version's cost model and simulator,
    on no device: each profile share's saved records fitted again, the workloads rebuilt from the
    saved config, the engine's side (its runs, its noise) as saved. For asking what a change to the
    cost model or the simulator would have predicted for runs already made.

    ``result``: a dict from :func:`mlxlab.studies.sim_validation.run.validate_simulator`, or the path
    of its JSON file. Returns ``{"source", "table", "summary", "rule", "coefficients", "config"}``: the
    table's rows as the saved ones with ``sim``, ``sim_runs``, ``rel_error``, ``passed``,
    ``paired_errors`` recomputed and the saved simulator value kept as ``sim_saved``. ``cold_key``
    (``"size"`` or ``"shape"``, with ``cold_capacity``): count the profile's cold chunks again under
    that rule (:func:`recount_cold`) and simulate by it, e.g. the shape rule on a run made with cuDNN
    attention on before profiles counted that way; the result's ``cold_rule`` names the rule."""
    source = None
    if not isinstance(result, dict):
        source = str(result)
        result = json.loads(Path(result).read_text())
    say = log or (lambda s: None)
    cfg, prof = result["config"], result.get("profile") or {}
    if not prof.get("records"):
        raise ValueError("this validation kept no profile records (it ran on a given profile): there is "
                         "nothing to fit again; run validate_simulator with a measured profile")
    # a validation warms the profile up before its first share only (mark_cold_chunks); with
    # ``cold_key`` the records' cold chunks are counted again under that rule (recount_cold)
    shares = profile_shares(prof["records"])
    shares = (recount_cold(shares, cold_key, cold_capacity) if cold_key else
              [mark_cold_chunks(share, warm=i == 0) for i, share in enumerate(shares)])
    cms = [fit_cost_model(cell_medians(share), source=f"profile share {i + 1}, fitted again")
           for i, share in enumerate(shares)]
    saved = {(r["workload"], r["policy"], r["tenant"], r["metric"]): r for r in result["table"]}
    rows, period_tables = [], {}
    for wname, wconf in cfg["workloads"].items():
        wl = Workload.from_config(wconf)
        for p in cfg["policies"]:
            res = [run_workload(Simulator(c, policy=p, chunk_size=cfg["chunk_size"], vocab_size=wl.vocab_size,
                                          max_context=wl.max_context or DEFAULT_MAX_CONTEXT,
                                          **(cfg.get("policy_options") or {}).get(p, {})), wl) for c in cms]
            sims = [r.summary for r in res]
            _rescored_periods(result, period_tables, f"{wname}/{p}", res)
            say(f"[rescore] {wname} {p}: {len(sims)} shares")
            rows += _rescored_rows(saved, wname, p, sims)
    order = {k: i for i, k in enumerate(saved)}
    rows.sort(key=lambda r: order[(r["workload"], r["policy"], r["tenant"], r["metric"])])
    out = {"source": source, "table": rows, "summary": summarize(rows), "rule": result.get("rule"),
           "coefficients": [coefficients(c) for c in cms], "config": cfg, "periods": period_tables,
           "cold_rule": {"key": cms[0].cold_key, "capacity": cms[0].cold_capacity,
                         "recounted": bool(cold_key)} if cms else None}
    if result.get("heldout"):
        out["heldout"] = _rescored_heldout(result, cms, cfg, say, period_tables)
    return out


def _rescored_periods(result: dict, tables: dict, run: str, sims: list) -> None:
    """The periods of a rescored run: the engine's as saved, the simulator's from its new runs."""
    eng = (result.get("periods") or {}).get(run, {}).get("engine")
    if eng is not None:
        tables[run] = {"engine": eng, "sim": periods(*[r.timeline.to_dict("records") for r in sims])}


def _rescored_heldout(result: dict, cms: list, cfg: dict, say: Callable[[str], None], period_tables: dict,
                      variants: Callable[[object], list] = lambda cm: [(cm, {})]) -> dict:
    """The held-out cases of a saved validation again: each rebuilt from its spec, the simulator
    rerun on every refitted share, the engine's side as saved. ``variants(cm)``: the (cost model,
    extra Simulator options) pairs each share runs as (default: the share once; probes.sim_draws
    passes several draws)."""
    held = result["heldout"]
    vocab = next(iter(cfg["workloads"].values()))["vocab_size"]
    max_ctx = next(iter(cfg["workloads"].values())).get("max_context") or DEFAULT_MAX_CONTEXT
    saved = {(r["workload"], r["policy"], r["tenant"], r["metric"]): r for r in held["table"]}
    rows = []
    for d in held["cases"]:
        case = HeldOutCase.from_dict(d)
        wl = case.workload(vocab)
        res = [run_workload(Simulator(c, policy=case.policy, chunk_size=case.chunk_size, vocab_size=vocab,
                                      max_context=max_ctx, **case.options, **kw), wl)
               for cm in cms for c, kw in variants(cm)]
        sims = [r.summary for r in res]
        _rescored_periods(result, period_tables, f"{case.name}/{case.policy}", res)
        say(f"[rescore] {case.name} {case.policy}: {len(sims)} shares")
        rows += _rescored_rows(saved, case.name, case.policy, sims)
    order = {k: i for i, k in enumerate(saved)}
    rows.sort(key=lambda r: order[(r["workload"], r["policy"], r["tenant"], r["metric"])])
    return {**held, "table": rows, "summary": summarize(rows), "passed": all(r["passed"] for r in rows)}


def _rescored_rows(saved: Dict[tuple, dict], wname: str, policy: str, sims: List[dict]) -> List[dict]:
    """The saved rows of one (workload, policy) with the simulator's side recomputed from ``sims``."""
    rows = []
    for key, stat, label in METRICS:
        for tenant in [t for t in sims[0] if t != "all"]:
            old = saved.get((wname, policy, tenant, label))
            if old is None:
                continue
            sim_runs = [metric(sm, tenant, key, stat) for sm in sims]
            simv = float(np.median(sim_runs))
            err = abs(simv - old["engine"]) / old["engine"]
            rows.append(dict(old, sim=simv, sim_saved=old["sim"], sim_runs=sim_runs, rel_error=err,
                             passed=bool(err <= old["tolerance"]), paired_errors=_paired(sim_runs, old["engine_runs"])))
    return rows
