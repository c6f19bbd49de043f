"""The simulator validation's verdicts on ``mlx-sim-accuracy`` and ``mlx-sim-heldout``, and the
provenance of the cost model it ran on (no MLX, no device).

:func:`sim_accuracy_verdict` decides the claim from a validation's table (as
:func:`mlxlab.studies.sim_validation.run.validate_simulator` returns it or as saved):
the median relative error of TTFT p50, ITL p50 and ITL p99 over its rows, each within 10%. Every
row is a workload run (the validation mixes under each policy); the cost model is fitted on the
profile grid's isolated steps only, or given, so no row is a cell it was fitted on.
:func:`sim_heldout_verdict` decides ``mlx-sim-heldout`` from the held-out rows alone (traces,
chunk sizes and options no one chose for the simulator): 5% median and 10% worst error per
metric, the engine's own repeat spread the floor.

:func:`cost_model_record` fingerprints the cost model(s) the simulator actually ran on (one per
profile share, or the given one) and keeps where they came from: a validation file then says
both which code ran (``environment.git_commit``) and which coefficients, and
:func:`terms_missing_at` checks that the commit it names knows every cost term the coefficients
use. :func:`decide_stored` adds all of this to a saved validation (``mlxlab rescore``), without running.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np

from mlxlab.core.claims import claim, verdict
from mlxlab.studies.sim_validation.scoring import METRICS, MIN_TOLERANCE, NOISE_FACTOR

TIMING_KEYS = ("overhead_s", "tail_s")  # timing parameters beside the cost terms


def fingerprint(models: Sequence[dict]) -> str:
    """A short stable hash of cost models given as ``{name: coefficient}`` dicts (as saved:
    floats round-trip through JSON exactly, so a saved file gives the same fingerprint)."""
    canon = json.dumps([{k: (None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v))
                         for k, v in sorted(m.items())} for m in models], sort_keys=True)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()[:16]


def terms_missing_at(commit: Optional[str], terms: Sequence[str]) -> Optional[List[str]]:
    """The cost terms that no file of ``mlxlab/`` mentions at ``commit`` (a code version older
    than the coefficients it is said to have produced); None when git or the commit is not
    available here."""
    from mlxlab.core.results import _git

    if not commit or not terms or (_git("cat-file", "-t", str(commit)) or "").strip() != "commit":
        return None
    out = _git("grep", "-h", "-o", "-w", "-E", "|".join(sorted(terms)), str(commit), "--", ":(top)mlxlab")
    found = set((out or "").split())
    return sorted(t for t in terms if t not in found)


def cost_model_record(models: Sequence[dict], *, fitted_in_run: bool, source: Optional[str] = None,
                      profile: Optional[dict] = None, commit: Optional[str] = None) -> dict:
    """What the simulator ran on: ``fingerprint`` (:func:`fingerprint` of ``models``, the
    coefficient dicts of each cost model it ran), ``models_n``, ``terms`` and ``nonzero_terms``,
    ``fitted_in_run``, ``source``, the given profile file's ``profile_file`` / ``profile_commit``
    / ``profile_written_at`` / ``profile_kind`` (``profile``: its path and environment), and,
    with ``commit`` (the code's), ``terms_missing_at_commit`` (:func:`terms_missing_at`)."""
    models = [dict(m) for m in models if m]
    terms = sorted({k for m in models for k in m if k not in TIMING_KEYS})
    nonzero = sorted({k for m in models for k, v in m.items() if k not in TIMING_KEYS and v})
    p = profile or {}
    env = p.get("environment") or {}
    rec = {"fingerprint": fingerprint(models) if models else None, "models_n": len(models), "terms": terms,
           "nonzero_terms": nonzero, "fitted_in_run": bool(fitted_in_run), "source": source,
           "profile_file": p.get("path"), "profile_commit": env.get("git_commit"),
           "profile_written_at": env.get("written_at"), "profile_kind": p.get("kind")}
    rec["code_commit"] = commit
    missing = rec["terms_missing_at_commit"] = terms_missing_at(commit, nonzero) if commit else None
    if missing:
        rec["note"] = (f"the recorded commit {commit} does not know the cost terms {missing}: these "
                       f"coefficients came from code newer than the commit (an uncommitted tree)")
    return rec


def record_of_result(result: dict) -> dict:
    """:func:`cost_model_record` of a saved validation (or re-scoring): the share models it ran
    on (or its one given model, or a re-scoring's refitted ones), against its recorded commit."""
    prof = result.get("profile") or {}
    commit = (result.get("environment") or {}).get("git_commit")
    if prof.get("share_coefficients"):
        return cost_model_record(prof["share_coefficients"], fitted_in_run=True, commit=commit,
                                 source="one cost model per profile share, fitted in the run from its records")
    if result.get("coefficients"):  # rescore_validation's output: each share fitted again
        return cost_model_record(result["coefficients"], fitted_in_run=False, commit=commit,
                                 source=f"the profile shares of {result.get('source')} fitted again by the "
                                        f"re-scoring code")
    return cost_model_record([prof["coefficients"]] if prof.get("coefficients") else [], fitted_in_run=False,
                             commit=commit, source=prof.get("source"), profile=prof.get("given"))


def _median(v) -> Optional[float]:
    v = [float(x) for x in v if x is not None and math.isfinite(float(x))]
    return float(np.median(v)) if v else None


def sim_accuracy_verdict(result: dict, record: Optional[dict] = None) -> dict:
    """``mlx-sim-accuracy`` from a validation's ``table``. measured: ``ttft_p50_median_err_pct``,
    ``itl_p50_median_err_pct``, ``itl_p99_median_err_pct`` (median relative error over the rows
    of each metric), ``worst_median_err_pct``, ``rows_n``, ``rows_within_10pct_n``,
    ``rows_within_noise_rule_n`` (the file's own rule: 10% or 3x the engine's noise),
    ``engine_noise_median_pct``, ``paired_median_err_pct`` (repeat r against share r),
    ``repeats``, ``within_noise`` (a metric's median error within 3x its rows' median engine
    noise of 10%), ``cost_model_fingerprint``."""
    limit = float(claim("mlx-sim-accuracy").published["high"]) / 100.0
    rows = list(result.get("table") or [])
    cfg = result.get("config") or {}
    rec = record or result.get("cost_model") or {}
    meds, near = {}, []
    for _, _, label in METRICS:
        sel = [r for r in rows if r.get("metric") == label]
        meds[label] = _median(r.get("rel_error") for r in sel)
        noise = _median(r.get("noise") for r in sel)
        if meds[label] is not None and noise is not None:
            near.append(abs(meds[label] - limit) <= NOISE_FACTOR * noise)
    paired = _median(e for r in rows for e in (r.get("paired_errors") or []))

    def pct(x):
        return None if x is None else 100.0 * x

    known = [m for m in meds.values() if m is not None]
    measured = {"ttft_p50_median_err_pct": pct(meds["ttft_p50_s"]), "itl_p50_median_err_pct": pct(meds["itl_p50_s"]),
                "itl_p99_median_err_pct": pct(meds["itl_p99_s"]),
                "worst_median_err_pct": pct(max(known)) if known else None, "rows_n": len(rows),
                "rows_within_10pct_n": sum(1 for r in rows if (r.get("rel_error") or 0) <= MIN_TOLERANCE
                                           and r.get("rel_error") is not None),
                "rows_within_noise_rule_n": sum(1 for r in rows if r.get("passed")),
                "engine_noise_median_pct": pct(_median(r.get("noise") for r in rows)), "paired_median_err_pct": pct(paired),
                "repeats": cfg.get("repeats"), "within_noise": any(near) if near else None,
                "cost_model_fingerprint": rec.get("fingerprint")}
    rule = (f"reproduced when the median relative error |sim - engine| / engine over the rows of each of TTFT p50, "
            f"ITL p50 and ITL p99 is at most {limit:.0%}; not reproduced otherwise. The rows are workload runs "
            f"(each mix under each policy, each tenant); the cost model is fitted on the profile grid's isolated "
            f"steps only (or given), so none of them is a cell it was fitted on. Reported beside it: the rows "
            f"within the file's own rule (max(10%, {NOISE_FACTOR:g} x the engine's run-to-run noise)).")
    fairness = (f"the engine and the simulator on the same seeded workloads and policies "
                f"({', '.join(cfg.get('policies') or []) or '?'}) with the same chunk size "
                f"({cfg.get('chunk_size', '?')}); the engine's median over {cfg.get('repeats', '?')} repeats against "
                f"the simulator's median over "
                + ("one cost model per profile share, each share measured just before its repeat"
                   if rec.get("fitted_in_run") else "its cost model(s)")
                + f"; model {cfg.get('model', '?')} at workload scale {cfg.get('scale', '?')}")
    evidence = f"validation table ({len(rows)} rows); cost model {rec.get('fingerprint')}"
    if len(known) < len(METRICS):
        return verdict("mlx-sim-accuracy", "not measured", measured=measured,
                       rule=rule + " Not measured: a metric has no rows (no run produced it).", fairness=fairness,
                       evidence=evidence)
    return verdict("mlx-sim-accuracy", "reproduced" if all(m <= limit for m in known) else "not reproduced",
                   measured=measured, rule=rule, fairness=fairness, evidence=evidence)



HELDOUT_MEDIAN = 0.05  # the targets of mlx-sim-heldout (data/claims/mlxlab.yaml), per metric
HELDOUT_WORST = 0.10


def sim_heldout_verdict(result: dict) -> Optional[dict]:
    """``mlx-sim-heldout`` from a validation's held-out rows (``result["heldout"]["table"]``);
    None when it ran no held-out case. Per metric (TTFT p50, ITL p50, ITL p99) the median error
    must be at most ``max(5%, the median engine noise of its rows)`` and every row's error at most
    ``max(10%, that row's engine noise)``: the engine's repeat spread (coefficient of variation over
    its repeats) is the floor no simulator can be held below. measured: per metric
    ``<metric>_median_err_pct``, ``<metric>_worst_err_pct``, ``<metric>_noise_median_pct`` and
    ``<metric>_rows_over_n`` (rows above their worst bound), and ``rows_n``, ``cases_n``,
    ``seed``."""
    held = result.get("heldout") or {}
    rows = list(held.get("table") or [])
    if not held:
        return None
    measured: dict = {}
    ok, known = [], 0
    for _, _, label in METRICS:
        sel = [r for r in rows if r.get("metric") == label and r.get("rel_error") is not None]
        name = label[:-2] if label.endswith("_s") else label
        errs = [float(r["rel_error"]) for r in sel]
        noise = [float(r["noise"]) if r.get("noise") is not None and math.isfinite(float(r["noise"])) else 0.0
                 for r in sel]
        if not errs:
            measured.update({f"{name}_median_err_pct": None, f"{name}_worst_err_pct": None,
                             f"{name}_noise_median_pct": None, f"{name}_rows_over_n": None})
            continue
        known += 1
        med, floor = float(np.median(errs)), float(np.median(noise))
        over = sum(e > max(HELDOUT_WORST, n) for e, n in zip(errs, noise))
        measured.update({f"{name}_median_err_pct": 100 * med, f"{name}_worst_err_pct": 100 * max(errs),
                         f"{name}_noise_median_pct": 100 * floor, f"{name}_rows_over_n": over})
        ok.append(med <= max(HELDOUT_MEDIAN, floor) and over == 0)
    measured.update(rows_n=len(rows), cases_n=held.get("n"), seed=held.get("seed"))
    rule = (f"reproduced when, for each of TTFT p50, ITL p50 and ITL p99 over the held-out rows (each case's "
            f"tenants), the median relative error |sim - engine| / engine is at most max({HELDOUT_MEDIAN:.0%}, the "
            f"median engine noise of those rows) and every row's error is at most max({HELDOUT_WORST:.0%}, its "
            f"engine noise: the coefficient of variation of the engine over its repeats); not reproduced otherwise")
    cfg = result.get("config") or {}
    fairness = (f"{held.get('n', '?')} held-out cases drawn with seed {held.get('seed', '?')} "
                f"(mlxlab.studies.sim_validation.heldout): arrivals, prompt and output lengths, chunk sizes and policy options "
                f"none of the profile grid's nor the standard runs'; the engine's median over "
                f"{cfg.get('repeats', '?')} repeats against the simulator on the cost models fitted from the profile "
                f"alone; model {cfg.get('model', '?')} at scale {(cfg.get('heldout') or {}).get('scale', '?')}")
    evidence = f"held-out table ({len(rows)} rows)"
    if known < len(METRICS):
        return verdict("mlx-sim-heldout", "not measured", measured=measured,
                       rule=rule + ". Not measured: a metric has no held-out rows.", fairness=fairness,
                       evidence=evidence)
    return verdict("mlx-sim-heldout", "reproduced" if all(ok) else "not reproduced", measured=measured, rule=rule,
                   fairness=fairness, evidence=evidence)


def validation_verdicts(result: dict, record: Optional[dict] = None) -> List[dict]:
    """The verdicts a validation stores: ``mlx-sim-accuracy``, and ``mlx-sim-heldout`` when it
    ran held-out cases."""
    held = sim_heldout_verdict(result)
    return [sim_accuracy_verdict(result, record)] + ([held] if held else [])

def parameters(result: dict, **extra) -> dict:
    """A validation's parameters, from its config (and ``extra``)."""
    c = result.get("config") or {}
    keep = ("model", "dtype", "bits", "policies", "repeats", "chunk_size", "scale", "policy_options")
    return {**{k: c[k] for k in keep if k in c}, **extra}


def _source_doc(doc: dict) -> dict:
    from mlxlab.core.paths import ROOT

    p = doc.get("source")
    if not p or doc.get("config"):
        return {}
    p = Path(p) if Path(p).is_absolute() else ROOT / p
    return json.loads(p.read_text()) if p.is_file() else {}


def decide_stored(doc: dict, path: Union[str, Path, None] = None) -> List[dict]:
    """The ``mlx-sim-accuracy`` verdict (and ``mlx-sim-heldout`` where the file has held-out rows:
    :func:`validation_verdicts`) of a saved validation (:class:`~mlxlab.studies.base.Study`'s
    ``decide``), adding the ``cost_model`` record (checked against the file's recorded commit) and
    ``parameters`` (from the config, where the file has none). Nothing is run or simulated."""
    if "table" not in doc:
        raise ValueError(f"{path or 'this document'} is not a simulator validation (no table)")
    rec = record_of_result(doc)
    src = _source_doc(doc)  # a re-scoring keeps no config: its source's says what ran
    doc["cost_model"] = rec
    if not doc.get("parameters"):
        doc["parameters"] = parameters(doc)
    return validation_verdicts({**doc, "config": doc.get("config") or src.get("config")}, rec)
