"""How far does a relative SLO's bound move between tunes of the same model, trace and device?

``mlxlab tune`` sets an ``x`` bound (``chat.itl_p99<=3x``) at that many times the tenant's figure
alone on the engine, the median of its solo runs, measured anew in every tune. The figure is a tail
statistic of one tenant's gaps, itself thin on a short trace, and on mlx's CUDA backend the solo runs
open the process (until 12-07 #21 with no run before them). Tunes of the same model on the same trace
and device should find the same bound; where they do not, the settings that meet the SLO differ with
it, whatever the simulator does.

Per group of stored tune files (platform, model, trace, output scale, SLO), the solo figure each file
measured, its spread (largest over smallest) and, per file with an exhaustive sweep, how many of the
sweep's settings meet the SLO at the median of their runs under the file's own bound and under the
group's smallest and largest bound (each setting's median figure over each bound). History files
(``*_before_*``) count: they measured the same thing on older code.

Usage::

    python -m probes.solo_spread data/results/*/tune*.json [--save]

Prints a table and writes ``solo_spread.json`` to a new run folder, or with ``--save`` to
``data/results/sim-tune/`` (no device runs: it reads stored files).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from probes import common


def parse_args(argv=None):
    p = common.over_tunes(__doc__, "solo_spread", "tune.json files (those without a relative SLO are skipped)")
    return common.parse(p, argv)


def solo_of(doc: dict) -> list:
    """Per relative SLO of ``doc``: ``{"slo", "tenant", "metric", "times", "solo_s", "bound_s"}`` (the
    solo figure the bound is ``times`` of), and ``"runs_s"`` where the file kept each solo run's figure."""
    from mlxlab.studies.tune.slo import figure, parse_slo

    out = []
    for text in doc.get("slos") or []:
        s = parse_slo(text)
        if s.unit != "x":
            continue
        solo = (doc.get("solo") or {}).get(s.tenant)
        v = figure(solo, "all" if solo and s.tenant not in solo else s.tenant, s.metric) if solo else None
        if v is None:
            continue
        row = {"slo": text, "tenant": s.tenant, "metric": s.metric, "times": s.value, "solo_s": v,
               "bound_s": v * s.value}
        runs = ((doc.get("solo_runs") or {}).get(s.tenant) or {}).get("runs")
        if runs:
            row["runs_s"] = [r.get(s.metric) for r in runs]
        out.append(row)
    return out


def sweep_figures(doc: dict, slo: str) -> dict:
    """Each swept setting's median figure for ``slo`` over its sweep runs (seconds); empty without a sweep."""
    import math

    from mlxlab.studies.tune.slo import figure, parse_slo

    s = parse_slo(slo)
    out = {}
    for label, runs in ((doc.get("sweep") or {}).get("runs") or {}).items():
        vals = [v for v in (figure(r, s.tenant, s.metric) for r in runs) if v is not None and not math.isnan(v)]
        if vals:
            out[label] = statistics.median(vals)
    return out


def group_key(doc: dict, path: str, slo: str) -> str:
    """What tunes must share for their bounds to be the same: platform, model, bits, trace, its scales, SLO."""
    p = doc.get("parameters") or {}
    plat = (doc.get("environment") or {}).get("platform") or Path(path).parent.name
    scale = ",".join(f"{k}={v:g}" for k, v in sorted((p.get("output_scale") or {}).items()))
    return " | ".join(str(x) for x in (plat, p.get("model"), p.get("bits"), p.get("trace") or p.get("workload"),
                                       f"length x{p.get('length_scale', 1):g}", f"time x{p.get('time_scale', 1):g}",
                                       scale or "outputs as traced", slo))


def groups(files: list) -> list:
    """Files grouped by :func:`group_key` (groups of two or more): the bounds' spread and, per file with
    a sweep, how many settings meet the SLO at their sweep medians under its own, the smallest and the
    largest bound of the group."""
    by: dict = {}
    for f in files:
        for s in f["solo"]:
            by.setdefault(f["keys"][s["slo"]], []).append((f, s))
    out = []
    for key, members in sorted(by.items()):
        if len(members) < 2:
            continue
        bounds = [s["bound_s"] for _, s in members]
        lo, hi = min(bounds), max(bounds)
        rows = []
        for f, s in members:
            figs = f["sweep"].get(s["slo"]) or {}
            row = {"tune": f["tune"], "solo_s": s["solo_s"], "bound_s": s["bound_s"], "runs_s": s.get("runs_s")}
            if figs:
                row["sweep_settings"] = len(figs)
                row["meet"] = {name: sum(v <= b for v in figs.values())
                               for name, b in (("own", s["bound_s"]), ("smallest", lo), ("largest", hi))}
            rows.append(row)
        out.append({"group": key, "tunes": len(members), "bound_min_s": lo, "bound_max_s": hi,
                    "spread_x": hi / lo, "files": rows})
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    files = []
    for path, doc, solo in common.each_tune(args.tunes, lambda d, p: solo_of(d), "no relative SLO with a solo figure"):
        files.append({"tune": path, "solo": solo, "keys": {s["slo"]: group_key(doc, path, s["slo"]) for s in solo},
                      "sweep": {s["slo"]: sweep_figures(doc, s["slo"]) for s in solo}})
    found = groups(files)
    for g in found:
        print(f"{g['group']}: {g['tunes']} tunes, bound {g['bound_min_s'] * 1e3:.1f}-{g['bound_max_s'] * 1e3:.1f} ms "
              f"({g['spread_x']:.2f}x)")
        for r in g["files"]:
            m = r.get("meet")
            print(f"   {r['tune'][-60:]:60s} solo {r['solo_s'] * 1e3:6.1f} ms"
                  + (f"  sweep settings meeting it (own / smallest / largest bound): {m['own']} / {m['smallest']} / "
                     f"{m['largest']} of {r['sweep_settings']}" if m else ""))
    common.save_over_stored("solo_spread", {"parameters": {"tunes": args.tunes}, "groups": found},
                            "sim-tune" if args.save else "cpu", save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
