"""``mlxlab tune``: the serving settings for a model and a trace, found by the simulator and
confirmed on the engine.

1. **Profile** the device for this model (:func:`cached_profile`: kept under
   ``data/profiles/cache/`` keyed by model, dtype, bits, device, mlx version and BLAS; measured
   again with ``reprofile``).
2. **Solo figures**: each tenant that a relative SLO (``2x``) names runs alone on the engine, so
   ``x`` means times what that tenant gets with the machine to itself, measured in this run (after one run not
   kept where the confirmation warms up: :func:`mlxlab.studies.tune.confirm.solo_runs`).
3. **Simulate the grid** (:mod:`mlxlab.studies.tune.grid`: policies x chunk sizes x token budgets; the
   engine's overlap modes are not in it, as the simulator runs serial steps) on the trace, score
   each setting against the SLOs and the objective, keep the Pareto frontier.
4. **Confirm** the ``top_k`` best simulated settings (those meeting every SLO first; one of each group
   the simulation ran as one schedule, :func:`mlxlab.studies.tune.grid.same_schedule`) and mlx-lm's
   ``BatchGenerator`` on the real engine, replaying the same trace up to ``repeats`` times, repeats
   outermost, in a balanced order per repeat (:func:`run_order`), stopping once the repeats decide the
   choice (a race, :func:`mlxlab.studies.tune.slo.settled`); the simulator's error on each is kept beside it.
5. **Choose** (:func:`mlxlab.studies.tune.slo.choose`) and write a serve command.

Runs serial (``overlap=False``) on the engine too, so the confirmation measures what was simulated.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from mlxlab.core.paths import data_dir
from mlxlab.studies.tune.calibrate import REF, calibrate_from_solos
from mlxlab.studies.tune.confirm import (BASELINE, CONFIRM_ORDER, SOLO_REPEATS, confirm_runs, solo_runs,
                                        wants_warm_up, warm_runs)
from mlxlab.studies.tune.confirm import median_summary as _medians  # noqa: F401 - the probes' name too
from mlxlab.studies.tune.grid import default_grid, make_grid, same_schedule  # noqa: F401 - default_grid: the API
from mlxlab.studies.tune.order import run_order  # noqa: F401 - the sweep's and confirmation's order (also an API)
from mlxlab.studies.tune.slo import (SLO, check, choose, figure, objective_name, pareto, parse_objective, slo_table,
                                     solo_needed, support, worst_ratio)


# ------------------------------------------------------------------------------ profile
def profile_grid(arrivals: list, grid: List[dict], quick: bool = False) -> dict:
    """A device-profile grid sized to the trace and the settings (what
    :func:`mlxlab.sim.measure.profile_device` takes): the grid's chunk sizes and token budgets up to
    the longest prompt, and a small chunk for prompts' last pieces; contexts from empty to the
    longest prompt; decode batches of 1 to 8 rows (fewer for a shorter trace); decode contexts up
    to the longest request. Profiling what the trace never asks for costs time and buys nothing."""
    longest = max(len(a.prompt) + a.max_tokens for a in arrivals)
    sizes = {int(s["chunk_size"]) for s in grid} | {int(s["options"].get("token_budget", 0)) for s in grid}
    chunks = sorted({min(c, longest) for c in sizes if c > 0})
    small = max(8, chunks[0] // 4)
    top = max(1, min(8, len(arrivals)))  # a trace does not say how many decode at once: up to 8 rows
    return dict(prefill_tokens=tuple(sorted({small, *chunks[-3:]})),
                contexts=tuple(sorted({0, max(0, longest // 2 - chunks[0]), max(0, longest - chunks[0])})),
                decode_batches=tuple(sorted({1, max(1, top // 2), top})),
                decode_contexts=tuple(sorted({32, max(32, longest // 2), max(32, longest)})),
                repeats=1 if quick else 2, fill_chunk=max(chunks))


def profile_key(model, pgrid: dict) -> str:
    from mlxlab.core.environment import device_summary

    d = device_summary()
    parts = [getattr(model, "name", "model"), str(getattr(model, "dtype", "")), str(getattr(model, "bits", None)),
             d["device"], d["device_name"], d["mlx"], d["mlx_lm"], d["blas"], json.dumps(pgrid, sort_keys=True)]
    from mlxlab.engine.fused import cold_keying

    key, capacity, _ = cold_keying()
    if key != "size":  # a profile that counted its cold chunks by token count is not this one
        parts.append(f"cold={key}/{capacity}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def cached_profile(model, pgrid: dict, *, reprofile: bool = False, say: Callable[[str], None] = print) -> dict:
    """The device profile of ``model`` over ``pgrid`` (:func:`profile_grid`) from the cache
    (``data/profiles/cache/``, keyed by the model, dtype, bits, device, mlx, mlx-lm, BLAS and the
    grid), or measured now and cached. Returns ``{"cost_model", "path", "cached", "key", "grid",
    "wall_s"}``."""
    from mlxlab.sim.measure import profile_device
    from mlxlab.sim.profiles import cost_model_from_dict, save_profile

    key = profile_key(model, pgrid)
    path = data_dir() / "profiles" / "cache" / f"{Path(str(getattr(model, 'name', 'model'))).name}-{key}.json"
    if path.is_file() and not reprofile:
        say(f"[tune] profile from the cache: {path}")
        return {"cost_model": cost_model_from_dict(json.loads(path.read_text())), "path": str(path), "cached": True,
                "key": key, "grid": pgrid, "wall_s": 0.0}
    say(f"[tune] profiling {getattr(model, 'name', 'model')} on this device: {pgrid}")
    prof = profile_device(model, **pgrid, log=say)
    save_profile(prof, path=path)
    return {"cost_model": cost_model_from_dict(prof), "path": str(path), "cached": False, "key": key, "grid": pgrid,
            "wall_s": prof.get("wall_s", 0.0)}


# ------------------------------------------------------------------------------ runs
def _bar(total: int, desc: str):
    from tqdm.auto import tqdm  # progress bars are plumbing, not needed to run

    return tqdm(total=total, desc=desc, leave=False)


def _fresh() -> None:
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


def _engine(model, s: dict):
    from mlxlab.engine.loop import Engine

    return Engine(model, policy=s["policy"], chunk_size=int(s["chunk_size"]), overlap=False, **s["options"])


def _executor(model, s: dict):
    if s["policy"] == BASELINE:
        from mlxlab.engine.baseline import MlxLmExecutor

        return MlxLmExecutor(model, prefill_step_size=int(s["chunk_size"]))
    return _engine(model, s)


def _workload(arrivals, only: Optional[str] = None):
    from mlxlab.core.workload import TraceWorkload

    return TraceWorkload([a for a in arrivals if only is None or a.tenant == only], name=only or "trace")


def _objective(summary, objective: str) -> float:
    tenant, metric = parse_objective(objective)
    v = figure(summary, tenant, metric)
    return math.inf if v is None else v


def _worst(summaries: Sequence[dict], slos: Sequence[SLO], solos: dict) -> List[dict]:
    """Per SLO the check of the repeat that did worst on it."""
    per = [check(s, slos, solos) for s in summaries]
    return [max((p[i] for p in per), key=lambda c: c["ratio"] if c["ratio"] is not None else math.inf)
            for i in range(len(slos))]


def _more(sp: dict, scaled: Optional[Dict[str, float]]) -> str:
    """``TENANT=F``: the output scale that lifts a thin SLO figure to :data:`slo.THIN_RANK` (over any given)."""
    ten = sp["slo"].split(".")[0]
    return f"{ten}={sp.get('more', 1) * (scaled or {}).get(ten, 1):g}"


def _confirm_row(c: dict, runs: List[dict], tenants: List[str], slos: Sequence[SLO], solos: dict,
                 objective: str) -> dict:
    """A confirmed setting's row from its engine runs: the median summary, the SLO checks of the medians
    and of the worst repeat, the objective's median and range."""
    med = _medians(runs, tenants + ["all"])
    objs = [_objective(s, objective) for s in runs]
    row = {**c, "summary": med, "checks": check(med, slos, solos), "checks_worst": _worst(runs, slos, solos),
           "objective_s": statistics.median(objs), "objective_range_s": [min(objs), max(objs)], "repeats": len(runs),
           "repeat_ratios": [worst_ratio(check(s, slos, solos)) for s in runs]}  # in the order they ran
    row["slo_ratio"] = worst_ratio(row["checks"])
    return row


def simulate_setting(point: dict) -> dict:
    """One grid setting on the simulator: the row ``tune`` keeps (its medians, SLO checks, worst
    ratio, whether it meets them, its objective). A module-level function of plain data, so a
    cluster's worker can run it."""
    from mlxlab.core.runner import run_workload
    from mlxlab.sim.simulator import Simulator

    s, slos, solos, cm = point["setting"], point["slos"], point["solos"], point["cost_model"]
    # steady: the setting's second run, its shapes warm from the first (a server that has run it a while)
    warm = cm.warm_shapes() if point.get("steady") and hasattr(cm, "warm_shapes") else None
    for _ in range(2 if warm is not None else 1):
        sim = Simulator(cm, policy=s["policy"], chunk_size=int(s["chunk_size"]), warm=warm,
                        **{**point["limits"], **s["options"]})
        summ = run_workload(sim, _workload(point["arrivals"])).summary
    checks = check(summ, slos, solos)
    return {**s, "summary": _medians([summ], point["tenants"] + ["all"]), "checks": checks,
            "slo_ratio": worst_ratio(checks), "meets": all(c["met"] for c in checks),
            "objective_s": _objective(summ, point["objective"])}


def tune(model, arrivals: list, slos: Sequence[SLO], *, objective: Optional[str] = None,
         grid: Optional[List[dict]] = None, top_k: int = 3, repeats: int = 3, quick: bool = False,
         reprofile: bool = False, cost_model=None, baseline: bool = True, progress: bool = True,
         say: Callable[[str], None] = print, mapper: Optional[Callable] = None, calibrate: bool = True,
         scaled: Optional[Dict[str, float]] = None, grid_name: str = "standard", race: bool = True,
         warm_up: Optional[bool] = None, steady: bool = False, solo_repeats: Optional[int] = None) -> dict:
    """Tune ``model``'s serving settings for ``arrivals`` (a trace's
    :func:`mlxlab.core.traces.to_arrivals`) under ``slos``; returns the ``tune.json`` document
    (see the module docstring). ``cost_model``: use this one instead of the device profile.
    ``mapper``: a ``map``-like ``(fn, points) -> values in order`` for the simulated grid (a
    cluster's, :meth:`mlxlab.core.cluster.Sweep.mapper`); default: this process. ``calibrate``: move the
    profile's decode cost to the solo run measured here before simulating
    (:mod:`mlxlab.studies.tune.calibrate`; the file keeps the fitted model and the calibration). ``scaled``:
    the ``--output-scale`` the arrivals already carry, for the hint where an SLO's figure is thin.
    ``grid_name``: :data:`mlxlab.studies.tune.grid.GRIDS` (where ``grid`` is not given; stored as
    ``given`` where it is). ``race``: stop confirming after a repeat that decides the choice
    (:func:`mlxlab.studies.tune.slo.settled`, from the second on; ``race`` in the document says when), so
    ``repeats`` is a ceiling; False runs them all. ``warm_up``: run each confirmed setting once before the
    confirmation, not kept (:func:`mlxlab.studies.tune.confirm.warm_runs`); None: where the device prepares
    attention per shape (:func:`mlxlab.engine.fused.cold_keying`), whose first uses cost tens of ms a shape.
    ``steady``: score each setting as a server that has run it a while: simulated on its second run (the
    first's shapes warm), confirmed after a warm-up (``warm_up`` then on), and, with :func:`sweep`'s
    ``warm_each``, swept so. ``solo_repeats``: runs of each tenant alone (default ``repeats``, at least
    :data:`mlxlab.studies.tune.confirm.SOLO_REPEATS` but in ``quick`` mode)."""
    from mlxlab.core.runner import run_workload
    from mlxlab.sim.simulator import Simulator

    t0 = time.perf_counter()
    if repeats < 2:
        raise ValueError("repeats must be at least 2: the choice needs the engine's run-to-run spread")
    tenants = sorted({a.tenant for a in arrivals})
    for s in slos:
        if s.tenant not in tenants and s.tenant != "all":
            raise ValueError(f"SLO {s.text}: the trace has no tenant {s.tenant!r} (it has {', '.join(tenants)})")
    objective = objective or objective_name(tenants)
    obj_tenant, _ = parse_objective(objective)
    if obj_tenant not in tenants and obj_tenant != "all":
        raise ValueError(f"objective {objective}: the trace has no tenant {obj_tenant!r}")
    from mlxlab.engine.fused import cold_keying, packs_well

    packs, packs_why = packs_well()
    grid_name = grid_name if not grid else "given"  # a caller's own list of settings is none of the named grids
    grid = grid or make_grid(grid_name, quick, max(len(a.prompt) for a in arrivals), packed=packs,
                             shape_keyed=cold_keying()[0] == "shape")

    prof = {"cost_model": cost_model, "path": None, "cached": None, "grid": None, "wall_s": 0.0} \
        if cost_model is not None else cached_profile(model, profile_grid(arrivals, grid, quick), reprofile=reprofile,
                                                      say=say)
    cm = prof["cost_model"]
    t_prof = time.perf_counter()

    # solo figures: each tenant a relative SLO names, alone on the engine (default settings), warm where the
    # confirmation is (a cold first run would loosen every bound and inflate the calibrated decode cost)
    def run_solo(t: str) -> dict:
        _fresh()
        return run_workload(_engine(model, REF), _workload(arrivals, t if t != "all" else None)).summary

    warm = wants_warm_up(warm_up, steady=steady)
    n_solo = solo_repeats or (repeats if quick else max(repeats, SOLO_REPEATS))
    solos, solo_record = solo_runs({t: sorted({s.metric for s in slos if s.tenant == t}) for t in solo_needed(slos)},
                                   repeats=n_solo, run_solo=run_solo, medians=_medians, warm=warm, say=say)
    bounds = slo_table(slos, solos)
    samples = [support(s, arrivals) for s in slos]
    for sp in samples:
        say(f"[tune] {sp['slo']}: {sp['n']:,} samples a run in this trace, its figure about the #{sp['rank']} largest "
            f"(the distribution's own lies between #{sp['rank_95'][0]} and #{sp['rank_95'][1]}, 95%)"
            + (f"; thin: a few steps more or less beside them move it, so settings close on it rank by chance "
               + (f"(more of them: --output-scale {_more(sp, scaled)})" if not sp["slo"].startswith("all.")
                  else "(a longer trace)") if sp.get("thin") else ""))
    t_solo = time.perf_counter()
    fitted, calibration = cm, None  # simulation time from here: the calibration simulates the solo runs
    if calibrate:
        cm, calibration = calibrate_from_solos(cm, arrivals, Simulator.limits_of(model), solos, say)

    # the simulated grid: here, or on a cluster's workers through ``mapper`` (each point carries the
    # cost model, the model's limits and the trace: no MLX object travels)
    base_point = {"cost_model": cm, "limits": Simulator.limits_of(model), "arrivals": arrivals, "slos": list(slos),
                  "solos": solos, "objective": objective, "tenants": tenants, "steady": steady}
    points = [{**base_point, "setting": s} for s in grid]
    if mapper is not None:
        sim_rows = list(mapper(simulate_setting, points))
    else:
        sim_rows = []
        bar = _bar(len(grid), "tune: simulating") if progress else None
        for point in points:
            sim_rows.append(simulate_setting(point))
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    t_sim = time.perf_counter()
    frontier = [r["label"] for r in pareto(sim_rows)]
    same = same_schedule(sim_rows)
    ranked = sorted((r for r in sim_rows if r["label"] not in same),
                    key=lambda r: (not r["meets"], r["objective_s"] if r["meets"] else r["slo_ratio"]))
    picked = ranked[:top_k]
    say(f"[tune] simulated {len(grid)} settings in {t_sim - t_solo:.1f} s"
        + (f" ({len(same)} ran as another's schedule: {', '.join(f'{a} as {b}' for a, b in same.items())})"
           if same else "")
        + f"; {sum(r['meets'] for r in sim_rows)} meet the SLOs; confirming {', '.join(r['label'] for r in picked)}"
        + (f" and {BASELINE}" if baseline else ""))

    # the engine: the candidates and mlx-lm's BatchGenerator, repeats outermost, order balanced per repeat
    confirm = [{k: r[k] for k in ("label", "policy", "chunk_size", "options")} for r in picked]
    if baseline:
        confirm.append({"label": BASELINE, "policy": BASELINE, "chunk_size": 2048, "options": {}})

    ran: List[list] = []  # each confirmation run's [label, "warm-up" or "kept"], in the order they ran

    def run_one(c: dict, kept: str = "kept") -> dict:
        _fresh()
        ran.append([c["label"], kept])
        return run_workload(_executor(model, c), _workload(arrivals)).summary

    order = lambda items, r: run_order(items, r, CONFIRM_ORDER)  # noqa: E731
    warmed = warm_runs(confirm, run_one=lambda c: run_one(c, "warm-up"), order=order, say=say) if warm else None
    bar = _bar(repeats * len(confirm), "tune: confirming on the engine") if progress else None
    measured, raced = confirm_runs(confirm, repeats=repeats, run_one=run_one, order=order,
                                   row=lambda c, runs: _confirm_row(c, runs, tenants, slos, solos, objective),
                                   race=race, bar=bar, say=say)
    if bar is not None:
        bar.close()
    t_conf = time.perf_counter()

    sim_by = {r["label"]: r for r in sim_rows}
    rows = []
    for c in confirm:
        row = _confirm_row(c, measured[c["label"]], tenants, slos, solos, objective)
        s = sim_by.get(c["label"])
        if s is not None:
            row["sim_objective_s"] = s["objective_s"]
            row["sim_error"] = {k: (s[k] - row[k]) / row[k] if row[k] and math.isfinite(row[k]) else None
                                for k in ("objective_s", "slo_ratio")}
        rows.append(row)
    choice = choose([r for r in rows if r["policy"] != BASELINE])
    base = next((r for r in rows if r["policy"] == BASELINE), None)
    chosen = next((r for r in rows if r["label"] == choice.label), None)
    vs_mlx_lm = None
    if base is not None and chosen is not None and base["objective_s"] > 0:
        vs_mlx_lm = {"objective_x": chosen["objective_s"] / base["objective_s"],
                     "slo_ratio_mlx_lm": base["slo_ratio"], "slo_ratio_chosen": chosen["slo_ratio"]}
    return {"tenants": tenants, "slos": [s.text for s in slos], "bounds_s": bounds, "slo_samples": samples,
            "objective": objective,
            "solo": solos, "solo_runs": solo_record,
            "profile": {"path": Path(prof["path"]).name if prof["path"] else None,
                        **{k: prof[k] for k in ("cached", "grid", "wall_s")},
                        "cost_model": fitted.as_dict() if hasattr(fitted, "as_dict") else None},
            "calibration": calibration,
            "grid": sim_rows, "grid_name": grid_name, "same_schedule": same, "frontier": frontier, "confirmed": rows,
            "choice": choice.as_dict(), "race": raced, "confirm_warm_up": warmed, "steady": steady,
            "confirm_order": CONFIRM_ORDER, "confirm_ran": ran,
            "vs_mlx_lm": vs_mlx_lm, "wall_s": {"profile": t_prof - t0, "solo": t_solo - t_prof,
                                               "simulate": t_sim - t_solo, "confirm": t_conf - t_sim,
                                               "total": time.perf_counter() - t0},
            "not_in_grid": "the engine's overlap modes (prefill on a second stream): the simulator runs serial steps",
            "packed_steps": {"packs_well": packs, "why": packs_why or "packed steps are not slow on this device"}}


def serve_command(doc: dict, model: str, bits=None, dtype=None, config: Optional[str] = None) -> Optional[str]:
    """The ``mlxlab serve`` line for the chosen setting (None where nothing was chosen)."""
    label = (doc.get("choice") or {}).get("label")
    row = next((r for r in doc.get("confirmed", []) if r["label"] == label), None)
    if row is None:
        return None
    parts = ["mlxlab serve", f"--model {model}"]
    parts += [f"--bits {bits}"] if bits else []
    parts += [f"--dtype {dtype}"] if dtype else []
    parts += [f"--policy {row['policy']}", f"--chunk-size {row['chunk_size']}"]
    parts += [f"--policy-option {k}={json.dumps(v)}" for k, v in sorted(row["options"].items())]
    parts += ["--no-overlap"]  # tune ran it in serial steps (slo would otherwise run overlapped on a GPU)
    line = " ".join(parts)
    return line + (f"   # or: mlxlab serve --model {model} --config {config}" if config else "")


def serve_settings(path: str) -> dict:
    """The chosen setting of a ``tune.json`` (for ``mlxlab serve --config``): ``policy``,
    ``chunk_size``, ``options``, ``model``, ``meets`` and ``overlap`` (False: tune runs the engine in
    serial steps, as the simulator does, so serving it overlapped would serve what it did not measure);
    a ValueError saying what is missing."""
    doc = json.loads(Path(path).read_text())
    label = (doc.get("choice") or {}).get("label")
    row = next((r for r in doc.get("confirmed", []) if r.get("label") == label), None)
    if row is None or row.get("policy") == BASELINE:
        raise ValueError(f"{path}: no chosen mlxlab setting in it (its choice: {label!r}); run mlxlab tune first")
    return {"policy": row["policy"], "chunk_size": int(row["chunk_size"]), "options": dict(row["options"]),
            "model": (doc.get("parameters") or {}).get("model"), "meets": (doc.get("choice") or {}).get("meets"),
            "overlap": False}


def sweep(model, arrivals: list, doc: dict, *, repeats: int = 3, progress: bool = True,
          say: Callable[[str], None] = print, deadline: Optional[float] = None,
          on_progress: Optional[Callable[[dict], None]] = None, warm_up: bool = False,
          warm_each: Optional[set] = None) -> dict:
    """The exhaustive engine sweep of ``doc``'s grid on the same trace (``mlxlab tune --sweep``):
    every setting (one of each group the simulation ran as one schedule: ``doc["same_schedule"]``) ``repeats`` times, repeats outermost, in an order shuffled per repeat
    (:func:`run_order`), scored against the same SLOs (the solo figures tune measured) and
    objective. A ``doc`` that already holds a sweep block (``mlxlab tune --resume``) goes on from its
    stored runs, a repeat's finished settings too: only the missing runs run, in the order the block
    names (a block from before it named one rotated: it goes on rotating). ``deadline`` (a ``time.perf_counter()`` value):
    start a run only where that setting's slowest run so far (else the slowest of any; this call's or
    a stored one's) still fits before it; the block then says ``stopped``. ``on_progress``: called
    with the block after each run but the last (to save progress a time limit could otherwise take:
    a call of the device tool cut in the middle of a repeat loses one run, not the repeat).
    ``warm_up`` (a process that has run nothing yet: ``mlxlab tune --resume``): the first setting
    to run runs once more before it, not kept, so no kept run pays the process's first uses (on an
    H100 the first run of a resumed call took 125 s where its setting's others took 28-30 s, and
    167 s against 13 s in another file: ``data/results/h100/tune_llama-3.2-1b*.json``); the block
    says which setting warmed up and for how long (``warm_up``), and ``ran`` the ``[repeat, label]`` of
    each run this call made, in order. ``warm_each`` (a steady tune: ``doc["steady"]``): the labels this
    process has run already (the fresh call's confirmed ones; none in a resumed call): every other setting
    runs once, not kept, before its first kept run here (``warm_each`` in the block: label -> seconds), so
    every kept run finds its shapes warm, as the steady simulation assumes; it replaces ``warm_up``.
    Returns the ``sweep`` block of tune.json."""
    from mlxlab.core.runner import run_workload

    same = doc.get("same_schedule") or {}  # one schedule is replayed once: its first setting in grid order
    grid = [{k: r[k] for k in ("label", "policy", "chunk_size", "options")} for r in doc["grid"] if r["label"] not in same]
    prior = doc.get("sweep") or {}
    stored, walls = prior.get("runs") or {}, prior.get("run_wall_s") or {}
    runs: Dict[str, List[dict]] = {s["label"]: list(stored.get(s["label"], [])) for s in grid}
    # each run's wall time (setup included); a file from before they were stored: its repeats' shares
    took = {s["label"]: list(walls.get(s["label"]) or _shares(prior, len(runs[s["label"]]), len(grid))) for s in grid}
    done = min((len(v) for v in runs.values()), default=0)
    order = prior.get("order") or ("rotation" if any(runs.values()) else "shuffle")
    left = [(r, s) for r in range(done, repeats) for s in run_order(grid, r, order)
            if len(runs[s["label"]]) <= r]
    if any(runs.values()):
        say(f"[tune] sweep: {sum(map(len, runs.values()))} runs stored ({done} whole repeat(s)); {len(left)} to run")
    warm, each = None, {}
    if warm_up and left and warm_each is None:
        t_run, label = time.perf_counter(), left[0][1]["label"]
        _fresh()
        run_workload(_engine(model, left[0][1]), _workload(arrivals))
        warm = {"label": label, "wall_s": time.perf_counter() - t_run}
        say(f"[tune] sweep: warmed the process up with one run of {label} ({warm['wall_s']:.1f} s, not kept)")
    ran: List[list] = []  # [repeat, label] of each run this process made, in order (its shapes' history)
    extra = {"order": order, "ran": ran, **({"warm_up": warm} if warm else {}),
             **({"warm_each": each} if warm_each is not None else {})}
    bar = _bar(len(left), "tune: exhaustive engine sweep") if progress else None
    stopped = None
    for i, (r, s) in enumerate(left):
        # this setting's slowest run so far, else the slowest of any (settings differ several times over)
        slowest = max(took[s["label"]] or [w for v in took.values() for w in v], default=None)
        cold = warm_each is not None and s["label"] not in warm_each  # it runs twice: a warm-up, then the kept one
        if deadline is not None and slowest is not None and time.perf_counter() + slowest * (1 + cold) > deadline:
            stopped = (f"at {sum(map(len, runs.values()))} of {len(grid) * repeats} runs: the next ({s['label']}, "
                       f"{slowest:.0f} s at its slowest) would have run past the time budget; `mlxlab tune --resume` "
                       f"runs the rest")
            say(f"[tune] sweep stopped {stopped}")
            break
        if cold:
            t_warm = time.perf_counter()
            _fresh()
            run_workload(_engine(model, s), _workload(arrivals))
            each[s["label"]] = time.perf_counter() - t_warm
            warm_each.add(s["label"])
        t_run = time.perf_counter()
        _fresh()
        runs[s["label"]].append(run_workload(_engine(model, s), _workload(arrivals)).summary)
        took[s["label"]].append(time.perf_counter() - t_run)
        ran.append([r, s["label"]])
        if bar is not None:
            bar.update(1)
        if on_progress is not None and i + 1 < len(left):
            on_progress({**sweep_block(doc, grid, runs, took, repeats), **extra})
    if bar is not None:
        bar.close()
    out = {**sweep_block(doc, grid, runs, took, repeats, stopped), **extra}
    say(f"[tune] sweep: {len(grid)} settings x {out['repeats']} whole repeats on the engine in {out['wall_s']:.1f} s")
    return out


def _shares(prior: dict, n: int, settings: int) -> List[float]:
    """A stored run's wall time where the file kept only its repeats' (before ``run_wall_s``): each
    repeat's time spread evenly over its settings."""
    reps = list(prior.get("repeat_wall_s") or [])[:n]
    return [w / max(settings, 1) for w in reps] if len(reps) == n else []


def sweep_block(doc: dict, grid: List[dict], runs: Dict[str, List[dict]], took: Dict[str, List[float]], planned: int,
                stopped: Optional[str] = None) -> dict:
    """The ``sweep`` block from the sweep's runs so far: each setting's medians and ranges over its
    whole repeats, scored against ``doc``'s SLOs, solo figures and objective; every run and its
    wall time (for ``--resume``, a repeat's finished settings too) and each whole repeat's wall time
    (the sum of its runs')."""
    from mlxlab.studies.tune.slo import parse_slo

    slos = [parse_slo(s) for s in doc["slos"]]
    solos, tenants, objective = doc["solo"], doc["tenants"], doc["objective"]
    done = min((len(runs[s["label"]]) for s in grid), default=0)
    rows = []
    for s in grid:
        mine = runs[s["label"]][:done]
        if not mine:
            continue
        med = _medians(mine, tenants + ["all"])
        objs = [_objective(x, objective) for x in mine]
        checks, worst = check(med, slos, solos), _worst(mine, slos, solos)
        rows.append({**s, "checks": checks, "slo_ratio": worst_ratio(checks), "meets": all(c["met"] for c in checks),
                     "meets_worst": all(c["met"] for c in worst), "objective_s": statistics.median(objs),
                     "objective_range_s": [min(objs), max(objs)]})
    per_repeat = [sum(took[s["label"]][r] for s in grid if r < len(took[s["label"]])) for r in range(done)]
    out = {"rows": rows, "repeats": done, "repeats_planned": planned, "wall_s": sum(per_repeat),
           "repeat_wall_s": per_repeat, "runs": {k: list(v) for k, v in runs.items()},
           "run_wall_s": {k: list(v) for k, v in took.items()}}
    if done < planned:
        out["stopped"] = stopped or f"after {done} of {planned} repeats"
    return out
