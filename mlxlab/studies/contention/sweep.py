"""The contention benchmark over a cluster: one setting per point, one timed point per accelerator.

``mlxlab bench contention --cluster`` splits :func:`mlxlab.studies.contention.run.run_contention`
into points of one (model, setting) each (:func:`contention_points`), runs each on a worker that
holds an accelerator (:class:`mlxlab.core.cluster.Sweep`, timed) and joins them back into the
file the in-process run writes (:func:`merge_points`), so its verdicts and figure read it as
they are.

What changes against the in-process run, and is stored with it (each row's ``solo`` and
``ran_on``, the preset's ``config.cluster``): a point runs its setting's repeats on its own, each
repeat after its own solo chat, on the worker's model (loaded once per worker process, seeded as
every preset is), so a row's ITL ratios are over a solo reference measured on the same machine
in the same process, and its first run follows whatever that worker ran before (the in-process
run: the solo chat and the settings before it). The best alone TTFT, which every row's
``doc_ttft_over_best_alone`` is over, is taken across all the points, as across all settings in
one process: on a cluster of unlike machines that ratio compares machines too.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Mapping, Optional, Sequence

from mlxlab.studies.contention.run import _div

#: the run's options a point carries (the rest of run_contention's are its defaults)
POINT_KEYS = ("doc_tokens", "chat_context", "repeats", "warmup", "seed")


def contention_points(models: Sequence[str], settings: Sequence[str], *, bits: Optional[int] = None,
                      dtype: Optional[str] = None, **options) -> List[dict]:
    """One point per (model, setting), models outermost: ``model``, ``bits``, ``dtype``,
    ``setting`` and the run's ``options`` (:data:`POINT_KEYS`)."""
    extra = set(options) - set(POINT_KEYS)
    if extra:
        raise ValueError(f"unknown contention options {sorted(extra)}; a point takes {list(POINT_KEYS)}")
    return [{"model": m, "bits": bits, "dtype": dtype, "setting": s, **options} for m in models for s in settings]


@functools.lru_cache(maxsize=1)
def _model(name: str, bits: Optional[int], dtype: Optional[str]):
    from mlxlab.engine.models import load_model  # mlx: on the worker, when a point runs

    return load_model(name, bits=bits, dtype=dtype)


def run_setting(point: Mapping) -> dict:
    """One point on this process: :func:`~mlxlab.studies.contention.run.run_contention` of its one
    setting on the model (kept between the points this process runs), with the model's record."""
    from mlxlab.studies.contention.run import run_contention

    model = _model(point["model"], point.get("bits"), point.get("dtype"))
    res = run_contention(model, settings=[point["setting"]], progress=False,
                         **{k: point[k] for k in POINT_KEYS if k in point})
    res["model"] = {"preset": point["model"], "dtype": str(model.dtype), "bits": model.bits,
                    "num_params": model.num_params, "nbytes": model.nbytes}
    return res


def merge_points(results) -> Dict[str, dict]:
    """Model -> a :func:`run_contention`-shaped result, from the points' :class:`PointResult`\\ s
    (:mod:`mlxlab.core.cluster`) in their input order: the settings' rows as each point measured
    them, with the point's ``solo`` reference and ``ran_on`` (host, worker, start and end), the
    best alone TTFT over them all and every row's (and first run's) ``doc_ttft_over_best_alone``
    over it; ``solo`` at the top is the first point's (the ratios use each row's own); ``wall_s``
    from the first point's start to the last one's end."""
    by_model: Dict[str, list] = {}
    for r in results:
        by_model.setdefault(r.params["model"], []).append(r)
    out = {}
    for name, rs in by_model.items():
        settings = {}
        for r in rs:
            label = r.params["setting"]
            row = dict(r.value["settings"][label])
            row["solo"] = r.value["solo"]
            row["ran_on"] = {"host": r.host, "worker": r.worker, "started_at": r.started_at, "ended_at": r.ended_at}
            settings[label] = row
        alone = {k: s["alone_ttft_s"] for k, s in settings.items() if _finite(s.get("alone_ttft_s"))}
        best_label = min(alone, key=alone.get) if alone else None
        best = alone[best_label] if best_label else float("nan")
        for s in settings.values():
            s["doc_ttft_over_best_alone"] = _div(s.get("doc_ttft_s"), best)
            first_ttft = s["first_run"].get("doc_ttft_s")
            s["first_run"] = {**s["first_run"], "doc_ttft_over_best_alone": _div(first_ttft, best)}
        first = rs[0].value
        out[name] = {"solo": first["solo"], "settings": settings, "best_alone_ttft_s": best,
                     "best_alone_setting": best_label, "model": first["model"],
                     "config": {**first["config"], "settings": list(settings),
                                "cluster": "one setting per point, each with its own solo chat on its worker"},
                     "wall_s": max(r.ended_at for r in rs) - min(r.started_at for r in rs)}
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and x == x and abs(x) != float("inf")
