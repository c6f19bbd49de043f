"""A profile refitted without what a fuller warm-up takes out of its first pass, and the stored tune's
grid simulated again on it.

Until 0decd22 the profile's warm-up ran decode batches 1 and 2 only, so on mlx's CUDA backend the
first pass met batches 8 and 4 for the first time at the smallest decode context: kernels compiled for
the new batch size (a 30 s first join of 8 rows on a fresh H200) and every mixed and packed step there ran
~60 ms slower than its second-pass twin, counted warm (no new chunk shape). Each of those cells is the
median of two passes, so half of it went into the fit. The warm-up now runs every decode batch size
(:func:`mlxlab.sim.measure._warm_up`); this asks what that changes in tune's ranking, with no device:
the stored profile's records less the first pass's steps at the smallest decode context (what the
warm-up now takes), refitted as the profile fits, calibrated on the tune's solo run as tune does, the
grid simulated from a cold start and scored against the stored sweep as ``mlx-tune-rank`` scores it.

A second refit (``low``) keeps every record but takes each cell's lower median (of a cell's two passes,
the faster): what the fit would see if every first use the rig does not count landed in one pass only.

Usage (each tune file with the profile it was simulated on, ``tune.json:profile.json``)::

    python -m probes.profile_warmup_refit \\
        data/results/h200/tune_qwen2.5-coder-1.5b_chat_x4.json:data/results/h200/profiles/qwen2.5-coder-1.5b-1b5e5daa66cda945.json

Prints a table and writes ``profile_warmup_refit.json`` to a new run folder
(``data/results/<platform>/runs/<time>/``, ignored by git).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from probes import common

FIRST_PASS_KINDS = ("mixed", "packed", "rebatch", "start", "join_chunk")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m probes.profile_warmup_refit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs", nargs="+", help="TUNE.json:PROFILE.json (the profile the tune's profile.path names)")
    p.add_argument("--traces", default="data/traces/samples", help="the folder holding the tunes' trace files")
    return common.parse(p, argv)


def warm_up_takes(profile: dict):
    """Whether a record is one the warm-up now runs before the first pass: that pass's mixed, packed and
    batch-change steps at the smallest decode context (their cells name it: ``... c32 ...``)."""
    c0 = min(profile["grid"]["decode_contexts"])

    def drop(r: dict) -> bool:
        return r.get("pass") == 0 and r.get("kind") in FIRST_PASS_KINDS and f" c{c0} " in r.get("cell", "") + " "
    return drop


def refit(profile: dict, drop):
    from mlxlab.sim.fit import cell_medians, fit_cost_model

    recs = [r for r in profile["records"] if not drop(r)]
    return fit_cost_model(cell_medians(recs), relative=profile["grid"].get("relative_fit", True),
                          source="profile refitted without the warm-up's share of its first pass")


def low_cells(records):
    """:func:`mlxlab.sim.fit.cell_medians` with each cell's duration its lower median
    (``statistics.median_low``: of two passes, the faster)."""
    import statistics

    from mlxlab.sim.fit import _cell, cell_medians

    groups = {}
    for r in records:
        if r.get("duration_s", 0) > 0:
            groups.setdefault(_cell(r), []).append(r["duration_s"])
    return [dict(c, duration_s=float(statistics.median_low(groups[_cell(c)]))) for c in cell_medians(records)]


def main(argv=None) -> int:
    from mlxlab.core.costmodel import FEATURES
    from mlxlab.studies.tune.calibrate import calibrate_from_solos
    from probes.key_align_sim import load_point
    from probes.warm_carry_sim import _row, _run, score

    args = parse_args(argv)
    out, plat = [], None
    print(f"{'tune':44s} {'model':8s} {'tau SLO':>8s} {'tau obj':>8s} {'err obj':>8s} {'err SLO':>8s} "
          f"{'chunk ms':>8s} {'dropped':>7s}")
    for pair in args.pairs:
        tpath, _, ppath = pair.partition(":")
        if not ppath:
            raise SystemExit(f"{pair}: give TUNE.json:PROFILE.json")
        doc, prof = json.loads(Path(tpath).read_text()), json.loads(Path(ppath).read_text())
        if Path(ppath).name != (doc.get("profile") or {}).get("path"):
            raise SystemExit(f"{tpath} was simulated on {(doc.get('profile') or {}).get('path')}, not {Path(ppath).name}")
        plat = plat or (doc.get("environment") or {}).get("platform")
        point = load_point(doc, args.traces)
        grid = [{k: g[k] for k in ("label", "policy", "chunk_size", "options")} for g in doc["grid"]]
        drop = warm_up_takes(prof)
        dropped = sum(map(drop, prof["records"]))
        from mlxlab.sim.fit import fit_cost_model

        low = fit_cost_model(low_cells(prof["records"]), relative=prof["grid"].get("relative_fit", True),
                             source="profile refitted on each cell's lower median")
        models = {"stored": point["cost_model"]}
        for way, fitted in (("warm-up", refit(prof, drop)), ("low", low)):
            models[way], _ = calibrate_from_solos(fitted, point["arrivals"], point["limits"], doc["solo"])
        scores = {}
        for way, m in models.items():
            pt = dict(point, cost_model=m)
            s = score(doc, [_row(pt, g, [_run(pt, g, None)]) for g in grid])
            scores[way] = {**s, "coefficients": dict(zip(FEATURES, map(float, m.coef)))}
            print(f"{Path(tpath).name:44s} {way:8s} {s['tau_slo']:8.2f} {s['tau_objective']:8.2f} "
                  f"{s['sim_error_objective']:8.0%} {s['sim_error_slo_ratio']:8.0%} "
                  f"{m.coef[FEATURES.index('prefill_chunks')] * 1e3:8.1f} {dropped if way == 'warm-up' else 0:7d}")
        out.append({"tune": tpath, "profile": ppath, "dropped_records": dropped, "scores": scores})
    common.save_over_stored("profile_warmup_refit", {"files": out}, plat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
