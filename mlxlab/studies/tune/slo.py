"""Service-level objectives and the choice among settings (``mlxlab tune``); pure Python.

An SLO is ``TENANT.METRIC<=VALUE`` with VALUE in milliseconds (``40ms``), seconds (``1.2s``) or
times the tenant's figure when it runs alone (``2x``, measured in the same run): e.g.
``chat.itl_p99<=2x``, ``chat.itl_p99<=40ms``, ``batch.ttft_p50<=1.2x``. METRIC is one of
:data:`METRICS`; TENANT a tenant of the trace or ``all``.

A setting's figures are a run summary (:func:`mlxlab.core.runner.run_workload`'s ``summary``:
tenant -> ``ttft_s``/``itl_s``/``e2e_s`` percentiles). :func:`check` says per SLO whether a
summary meets it and by how much (``ratio``: the figure over its bound, at most 1 to pass);
:func:`pareto` keeps the settings no other beats on both the binding SLO and the objective;
:func:`choose` picks among measured settings and says why, or, where none meets every SLO, which
SLO binds and the closest setting.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence

#: metric name -> (summary key, percentile key)
METRICS = {"ttft_p50": ("ttft_s", "p50"), "ttft_p90": ("ttft_s", "p90"), "ttft_p99": ("ttft_s", "p99"),
           "itl_p50": ("itl_s", "p50"), "itl_p90": ("itl_s", "p90"), "itl_p99": ("itl_s", "p99"),
           "itl_max": ("itl_s", "max"), "e2e_p50": ("e2e_s", "p50"), "e2e_p99": ("e2e_s", "p99")}
_SLO = re.compile(r"^\s*([A-Za-z0-9_+\-]+)\.([a-z0-9_]+)\s*<=\s*([0-9]*\.?[0-9]+)\s*(x|ms|s)\s*$")


@dataclass(frozen=True)
class SLO:
    """``tenant.metric <= value`` in ``unit`` ("x": times the tenant's solo figure, "s" or "ms")."""

    tenant: str
    metric: str
    value: float
    unit: str

    @property
    def text(self) -> str:
        return f"{self.tenant}.{self.metric}<={self.value:g}{self.unit}"

    def bound_s(self, solo: Optional[Mapping]) -> float:
        """The bound in seconds: relative ones need the tenant's solo summary."""
        if self.unit == "s":
            return self.value
        if self.unit == "ms":
            return self.value / 1e3
        ref = figure(solo, "all" if solo and self.tenant not in solo else self.tenant, self.metric) if solo else None
        if ref is None or not ref > 0:
            raise ValueError(f"{self.text}: no solo {self.metric} for tenant {self.tenant!r} to be relative to")
        return self.value * ref


def parse_slo(text: str) -> SLO:
    """``"chat.itl_p99<=2x"`` -> :class:`SLO`; a ValueError saying the form otherwise."""
    m = _SLO.match(text)
    if not m:
        raise ValueError(f"SLO {text!r}: write TENANT.METRIC<=VALUE with VALUE in ms, s or x (times the tenant's "
                         f"solo figure), e.g. chat.itl_p99<=2x or batch.ttft_p50<=1.5s")
    tenant, metric, value, unit = m.groups()
    if metric not in METRICS:
        raise ValueError(f"SLO {text!r}: unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if not float(value) > 0:
        raise ValueError(f"SLO {text!r}: the bound must be above 0")
    return SLO(tenant, metric, float(value), unit)


def figure(summary: Optional[Mapping], tenant: str, metric: str) -> Optional[float]:
    """A metric of a run summary in seconds (None where the tenant or figure is missing or NaN)."""
    key, pct = METRICS[metric]
    try:
        v = float(summary[tenant][key][pct])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def check(summary: Mapping, slos: Sequence[SLO], solos: Mapping[str, Mapping]) -> List[dict]:
    """Per SLO: the figure, its bound (s), ``ratio`` (figure / bound) and ``met``. ``solos``:
    tenant -> that tenant's solo summary (for ``x`` bounds)."""
    out = []
    for s in slos:
        bound = s.bound_s(solos.get(s.tenant))
        v = figure(summary, s.tenant, s.metric)
        ratio = None if v is None else v / bound
        out.append({"slo": s.text, "figure_s": v, "bound_s": bound, "ratio": ratio,
                    "met": ratio is not None and ratio <= 1.0})
    return out


def worst_ratio(checks: Sequence[dict]) -> float:
    """The binding SLO's ratio (the largest; inf where a figure is missing)."""
    return max((c["ratio"] if c["ratio"] is not None else math.inf for c in checks), default=0.0)


def pareto(points: Sequence[dict], x: str = "slo_ratio", y: str = "objective_s") -> List[dict]:
    """The points no other point beats on both ``x`` and ``y`` (lower is better on each), sorted by ``x``."""
    ok = [p for p in points if p.get(x) is not None and p.get(y) is not None and math.isfinite(p[y])]
    front = [p for p in ok if not any((q[x] <= p[x] and q[y] <= p[y]) and (q[x] < p[x] or q[y] < p[y]) for q in ok)]
    return sorted(front, key=lambda p: (p[x], p[y]))


@dataclass
class Choice:
    """What tune recommends: ``label`` (None where nothing was measured), whether it ``meets`` every
    SLO on the engine, ``binding`` (the SLO closest to or past its bound), and ``why``."""

    label: Optional[str]
    meets: bool
    binding: Optional[str]
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def choose(rows: Sequence[dict]) -> Choice:
    """Among measured rows (``label``, ``checks``: per-SLO checks of the median figures,
    ``checks_worst``: of the worst repeat, ``objective_s``), the best objective among those meeting
    every SLO in every repeat; else among those whose median meets them (said so); else, where none
    does, the best objective among the settings the engine cannot tell from the closest one on its
    bounds: those whose median worst ratio is no higher than the closest one's own worst repeat
    reached (the closest itself among them), naming the SLO that binds. Never silent.

    Why not the closest alone: on the H200 (``data/results/h200/tune_qwen2.5-coder-1.5b_chat_x4.json``)
    no confirmed setting met the chat's ITL p99 bound, and the closest at the median, stall_free-256
    (1.08x), reached 1.43x in a repeat, while stall_free-1024's median was 1.27x: within that spread,
    at a 14th of its documents' TTFT. The exhaustive sweep then measured the two at 0.97x and 0.96x,
    and stall_free-1024 was its best setting."""
    if not rows:
        return Choice(None, False, None, "nothing was measured")
    firm = [r for r in rows if all(c["met"] for c in r["checks_worst"])]
    median = [r for r in rows if all(c["met"] for c in r["checks"])]
    pool, how = (firm, "met every SLO in every repeat") if firm else (median, "met every SLO at the median "
                                                                             "(not in every repeat)")
    if pool:
        best = min(pool, key=lambda r: r["objective_s"])
        binding = max(best["checks"], key=lambda c: c["ratio"] or 0.0)["slo"] if best["checks"] else None
        return Choice(best["label"], True, binding,
                      f"{best['label']} {how} and had the best objective of the {len(pool)} that did "
                      f"({best['objective_s'] * 1e3:.1f} ms)")
    closest = min(rows, key=lambda r: worst_ratio(r["checks"]))
    bind = max(closest["checks"], key=lambda c: c["ratio"] if c["ratio"] is not None else math.inf)
    if bind["ratio"] is None:
        return Choice(closest["label"], False, bind["slo"], f"no measured setting met every SLO; {bind['slo']} has "
                                                            f"no figure")
    reach = worst_ratio(closest.get("checks_worst") or closest["checks"])
    tied = [r for r in rows if worst_ratio(r["checks"]) <= reach]
    pick = min(tied, key=lambda r: r["objective_s"])
    why = (f"no measured setting met every SLO; {bind['slo']} binds: the closest, {closest['label']}, reached "
           f"{bind['ratio']:.2f}x its bound")
    if pick is not closest:
        why += (f" ({reach:.2f}x in its worst repeat); {pick['label']} reached {worst_ratio(pick['checks']):.2f}x, within "
                f"that spread, at the best objective of the {len(tied)} within it ({pick['objective_s'] * 1e3:.1f} ms "
                f"against {closest['objective_s'] * 1e3:.1f} ms)")
    return Choice(pick["label"], False, bind["slo"], why)


def outrun(rows: Sequence[dict], min_repeats: int = 2) -> Optional[Dict[str, str]]:
    """The settings the confirmation's repeats so far have put out of the choice, each with why: after
    at least ``min_repeats`` repeats of every row (``repeats``), where :func:`choose`'s pick met every SLO
    in every repeat, each other setting that missed one in some repeat (it can never meet them in every
    repeat again) or whose objective over the repeats (``objective_range_s``) lies wholly above the
    pick's. None where the pick missed an SLO in some repeat (more repeats can move it) or too few repeats ran.
    Racing (configuration racing drops a candidate once its runs separate it from the best) runs
    only the others in the repeats after (:func:`mlxlab.studies.tune.confirm.confirm_runs`)."""
    if not rows or min(int(r.get("repeats") or 0) for r in rows) < max(min_repeats, 2):
        return None
    pick = choose(rows)
    me = next((r for r in rows if r["label"] == pick.label), None)
    if me is None or not pick.meets or not all(c["met"] for c in me["checks_worst"]):
        return None
    out = {}
    for r in rows:
        if r is me:
            continue
        miss = [c["slo"] for c in r["checks_worst"] if not c["met"]]
        if miss:
            out[r["label"]] = f"missed {miss[0]} in a repeat, where {pick.label} met every SLO in every repeat"
        elif r["objective_range_s"][0] > me["objective_range_s"][1]:
            out[r["label"]] = f"every run's objective worse than every run of {pick.label}"
    return out


def settled(rows: Sequence[dict], min_repeats: int = 2) -> Optional[str]:
    """Why the confirmation's repeats so far already decide :func:`choose`'s pick, or None: every
    setting but the pick is :func:`outrun` (the pick met every SLO in every repeat, and every other
    either missed one in some repeat or ran worse in every repeat). Where no setting met the SLOs in
    every repeat, more repeats can move the closest one: never settled. Tune stops confirming there,
    so the repeats asked for are a ceiling."""
    out = outrun(rows, min_repeats)
    if out is None or len(out) < len(rows) - 1:
        return None
    pick = next(r["label"] for r in rows if r["label"] not in out)
    missed = sum(why.startswith("missed") for why in out.values())
    return (f"after {max(int(r['repeats']) for r in rows)} repeats {pick} met every SLO in every repeat, "
            f"{missed} other setting(s) missed one in some repeat, and every run of the "
            f"{len(out) - missed} other(s) that met them all had a worse objective than every run of {pick}")


def objective_name(tenants: Sequence[str]) -> str:
    """The default objective: the batch tenant's TTFT p50 where there is one (its queueing is the
    throughput the chat's SLO costs), else every request's."""
    return "batch.ttft_p50" if "batch" in tenants else "all.ttft_p50"


def parse_objective(text: str) -> tuple:
    tenant, _, metric = text.partition(".")
    if metric not in METRICS or not tenant:
        raise ValueError(f"objective {text!r}: write TENANT.METRIC (minimized), METRIC one of {', '.join(METRICS)}")
    return tenant, metric


#: a tail figure that is about its trace's THIN_RANK-th largest sample or nearer the top rests on too few: on
#: an H100 the chat's ITL p99 of 1,015 gaps (the 11th largest) sat on a decode gap where the engine put a
#: document's chunk beside 4 of its gaps and on a chunk step where it put one beside 19-29 (or the simulator
#: 11-12), so the same setting measured 4.5 or 86 ms; with the chat asking 4x its tokens (the 43rd largest of
#: 4,087) every run's p99 sat on a chunk step (probes/tail_steps.py, data/results/h100/tail_steps_*.json)
THIN_RANK = 20


def support(slo: SLO, arrivals: Sequence) -> dict:
    """How many of a trace's samples ``slo``'s figure rests on: ``n``, the samples of its metric for
    its tenant (``all``: every request) in one run (ITL: each request's tokens less one, as a run
    with no stop token produces them all; TTFT and end-to-end: one per request); ``rank``, the
    figure's place counted from the largest sample (a p99 of 1,015 gaps is about the 10th largest);
    and ``rank_95``, the run's samples, counted from the largest, between which the distribution's own
    percentile lies with 95% confidence (the distribution-free interval of a quantile from binomial
    order statistics, scipy). A figure that rests on a handful of samples moves between runs by what
    those few met (a chat's p99 gap lands on a decode step or on a document's chunk): ``thin`` where
    ``rank`` is below :data:`THIN_RANK`, and then ``more``: how many times its tokens would lift it there."""
    from scipy.stats import binom

    kind, pct = METRICS[slo.metric]
    mine = [a for a in arrivals if slo.tenant == "all" or a.tenant == slo.tenant]
    n = sum(max(int(a.max_tokens) - 1, 0) for a in mine) if kind == "itl_s" else len(mine)
    tail = 0.0 if pct == "max" else 1.0 - int(pct[1:]) / 100
    if n == 0 or tail == 0.0:
        return {"slo": slo.text, "n": n, "rank": 1, "rank_95": [1, 1], "thin": False}
    lo, hi = (int(binom.ppf(q, n, tail)) + 1 for q in (0.025, 0.975))
    rank = max(1, round(n * tail))
    out = {"slo": slo.text, "n": n, "rank": rank, "rank_95": [lo, hi], "thin": rank < THIN_RANK}
    if out["thin"]:  # ITL: gaps grow with the tokens asked, so this many times them lifts it to the #THIN_RANK
        out["more"] = math.ceil(THIN_RANK / rank)
    return out


def solo_needed(slos: Sequence[SLO]) -> List[str]:
    """The tenants whose solo figures relative SLOs need."""
    return sorted({s.tenant for s in slos if s.unit == "x"})


def slo_table(slos: Sequence[SLO], solos: Mapping[str, Mapping]) -> Dict[str, float]:
    """SLO text -> its bound in seconds."""
    return {s.text: s.bound_s(solos.get(s.tenant)) for s in slos}
