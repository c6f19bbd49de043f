"""Repeats of the scheduling study run in separate processes, pooled into one result.

A GPU call here is limited to ten minutes, and five repeats of the full study on the H200 take
longer than that. So the study runs as *parts*: each part is a whole study in its own process
(its own warm-up, its own references and calibration) run with ``keep_runs``, which keeps every
run's own numbers beside the usual result. :func:`merge_parts` pools the parts' runs
configuration by configuration and recomputes the medians, the pooled percentiles and the
claims with :func:`~mlxlab.studies.scheduling.result.study_result`, exactly as one process with
that many repeats would.

Two things differ from one long process, and the merged result says so in ``parts``:

* each part calibrated its own contention runs (when the long prompts arrive, slo's ITL target,
  how long the chat streams) from its own first references; the merged ``references.calibration``
  is the median of the parts' calibrations, and each part's own is kept;
* the repeats of different parts also measure process-to-process variation (a new process, a
  new warm-up), which a fresh-process protocol wants anyway.

Parts that do not share the same plan (model, sizes, policies, seed) or the same code and
backend switches are refused: their runs would not be repeats of one configuration.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from typing import Dict, List, Sequence

from mlxlab.studies.scheduling.plan import Calibration, StudyPlan
from mlxlab.studies.scheduling.result import study_result

# environment fields that must agree for two parts' runs to count as repeats of one measurement
_SAME_ENV = ("git_commit", "source_commit", "mlx", "mlx_lm", "device_name", "platform", "mlx_env")


def plan_record(plan: StudyPlan) -> dict:
    """``plan`` as JSON-ready values (sets and tuples as sorted lists)."""
    d = asdict(plan)
    d["run"] = sorted(d["run"])
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def plan_from_record(d: dict) -> StudyPlan:
    """The :class:`StudyPlan` :func:`plan_record` wrote."""
    d = dict(d)
    d["run"] = frozenset(d["run"])
    for k in ("policies", "chunk_sizes", "workers"):
        d[k] = tuple(d[k])
    return StudyPlan(**d)


def calibration_record(calib: Calibration) -> dict:
    return {"solo_itl_s": calib.solo_itl_s, "solo_chat_ttft_s": calib.solo_chat_ttft_s,
            "alone_ttft_s": {int(c): t for c, t in calib.alone_ttft_s.items()}}


def calibration_from_record(d: dict) -> Calibration:
    return Calibration(float(d["solo_itl_s"]), float(d["solo_chat_ttft_s"]),
                       {int(c): float(t) for c, t in d["alone_ttft_s"].items()})  # JSON keys are strings


def kept_runs(plan: StudyPlan, calib: Calibration, runs: Dict[str, List[dict]], meta: Dict[str, dict],
              done: int) -> dict:
    """What ``keep_runs`` adds to a study's result: every run's numbers, the plan and the
    calibration, and the repeats done."""
    return {"plan": {**plan_record(plan), "repeats": done}, "calibration": calibration_record(calib),
            "runs": {k: list(v) for k, v in runs.items()}, "meta": dict(meta), "repeats_done": done}


def _label(part: dict, i: int) -> str:
    return str(part.get("source", f"part {i + 1}"))


def merge_parts(parts: Sequence[dict]) -> dict:
    """Pool the runs of study results made with ``keep_runs`` (each a whole study in its own
    process) into one result with their repeats added up.

    Returns the study's usual payload (``config``, ``references``, ``claims``, ``table``,
    ``warmup_s``, ``wall_s``, ``model``) plus ``runs`` (each run tagged with its ``part``) and
    ``parts`` (per part: its source, repeats, calibration, warm-up, wall time, commit and date).
    Raises ValueError, naming the part and the field, when a part kept no runs or the parts do not
    share one plan, model, code and backend."""
    if not parts:
        raise ValueError("nothing to merge: give the results files of at least one part")
    for i, p in enumerate(parts):
        if not all(k in p for k in ("runs", "plan", "calibration", "meta")):
            raise ValueError(f"{_label(p, i)} kept no runs: run each part with `bench scheduling --keep-runs`")
    first = parts[0]
    for i, p in enumerate(parts[1:], 1):
        diff = sorted(k for k in set(first["plan"]) | set(p["plan"])
                      if k != "repeats" and first["plan"].get(k) != p["plan"].get(k))
        if diff:
            raise ValueError(f"{_label(p, i)} has another plan than {_label(first, 0)} ({', '.join(diff)}): "
                             "its runs are not repeats of the same configurations")
        env0, env = first.get("environment", {}), p.get("environment", {})
        diff = [k for k in _SAME_ENV if env0.get(k) != env.get(k)]
        if first.get("model") != p.get("model"):
            diff.append("model")
        if (first.get("config", {}).get("mlx_env") != p.get("config", {}).get("mlx_env")):
            diff.append("config.mlx_env")
        if diff:
            raise ValueError(f"{_label(p, i)} ran with other {', '.join(diff)} than {_label(first, 0)}: "
                             "merge only parts of one code, backend and model")
        if set(p["runs"]) != set(first["runs"]):
            raise ValueError(f"{_label(p, i)} ran other configurations than {_label(first, 0)}")

    runs: Dict[str, List[dict]] = {}
    for i, p in enumerate(parts):
        for key, rs in p["runs"].items():
            runs.setdefault(key, []).extend({**r, "part": i} for r in rs)
    done = [int(p.get("repeats_done", p["plan"]["repeats"])) for p in parts]
    plan = plan_from_record({**first["plan"], "repeats": sum(done)})
    calibs = [calibration_from_record(p["calibration"]) for p in parts]
    calib = Calibration(statistics.median(c.solo_itl_s for c in calibs),
                        statistics.median(c.solo_chat_ttft_s for c in calibs),
                        {c: statistics.median(k.alone_ttft_s[c] for k in calibs) for c in calibs[0].alone_ttft_s})
    warm_keys = set().union(*(p.get("warmup_s", {}) for p in parts))
    warmup = {k: statistics.median(p["warmup_s"][k] for p in parts if k in p.get("warmup_s", {})) for k in warm_keys}
    out = study_result(plan, calib, runs, first["meta"], warmup)
    out["references"]["calibration"]["note"] = (
        f"the median of {len(parts)} parts' calibrations; each part's contention runs used its own "
        "(see parts)")
    out["config"].update({k: first["config"][k] for k in ("quick", "mlx_env", "mlx_env_warnings")
                          if k in first.get("config", {})})
    out["wall_s"] = sum(float(p.get("wall_s", math.nan)) for p in parts)
    out["model"] = first.get("model")
    out["runs"] = runs
    out["parts"] = [{"source": _label(p, i), "repeats": done[i], "calibration": p["calibration"],
                     "batch_arrival_s": calibs[i].batch_arrival_s, "warmup_s": p.get("warmup_s"),
                     "wall_s": p.get("wall_s"),
                     **{k: p.get("environment", {}).get(k) for k in ("git_commit", "git_dirty", "written_at")}}
                    for i, p in enumerate(parts)]
    return out
