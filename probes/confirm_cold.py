"""Is tune's confirmation measured cold? Its repeats against the exhaustive sweep's runs of the same
settings, on stored tune files.

``mlxlab tune`` confirms its top settings on the engine right after the profile and the solo runs, in
the same process, so the confirmation's first repeat is the first time that process meets each
candidate's schedule. On mlx's CUDA backend with cuDNN attention each new (query, key) shape builds an
attention graph on first use (~66 ms on an H100: ``data/results/h100/shape_probe_*.json``), and a chat's
ITL p99 that rests on ~40 gaps moves when more of them meet such a step. The sweep (``--sweep``) runs
the same settings later, most of them after others warmed the process.

Per file with a sweep and a two-repeat confirmation (the median of two runs is their mean, so the
run that was not the worst is ``2 x median - worst``), per confirmed setting and the binding SLO:
the confirmation's worst and other run against the sweep's runs, and whether the worst lies above
every sweep run. A cold confirmation shows as worst runs above the sweep's largest on the devices
that key their first uses by shape, and not on the CPU.

Usage::

    python -m probes.confirm_cold data/results/*/tune*.json [--save]

Prints a table and writes ``confirm_cold.json`` to a new run folder, or with ``--save`` to
``data/results/sim-tune/`` (no device runs: it reads stored files).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from probes import common


def parse_args(argv=None):
    p = common.over_tunes(__doc__, "confirm_cold", "tune.json files (those without a sweep or with other than 2 "
                                                  "confirmation repeats are skipped, said so)")
    return common.parse(p, argv)


def settings_of(doc: dict) -> list:
    """Per confirmed setting of ``doc`` (a tune file with a sweep and a two-repeat confirmation): the
    binding SLO's figure in the confirmation's worst and other run and in each sweep run, in seconds.
    Empty where the file has no sweep, or a confirmed setting ran other than twice or not in the sweep."""
    from mlxlab.studies.tune.slo import figure, parse_slo

    sweep = (doc.get("sweep") or {}).get("runs") or {}
    binding = (doc.get("choice") or {}).get("binding") or doc["slos"][0]
    slo = parse_slo(binding)
    same = doc.get("same_schedule") or {}
    out = []
    for row in doc.get("confirmed") or []:
        label = same.get(row["label"], row["label"])
        worst = next((c for c in row.get("checks_worst") or [] if c["slo"] == binding), None)
        if row.get("repeats") != 2 or worst is None or label not in sweep:
            continue
        median = figure(row["summary"], slo.tenant, slo.metric)
        runs = [v for v in (figure(s, slo.tenant, slo.metric) for s in sweep[label]) if v is not None]
        if median is None or not runs:
            continue
        other = 2 * median - worst["figure_s"]
        out.append({"label": row["label"], "confirm_worst_s": worst["figure_s"], "confirm_other_s": other,
                    "sweep_s": runs, "worst_over_sweep_max": worst["figure_s"] / max(runs),
                    "worst_above_sweep": worst["figure_s"] > max(runs),
                    "other_within_sweep": min(runs) <= other <= max(runs),
                    # a file from after tune kept each run's ratio, in the order they ran: which repeat was worst
                    **({"repeat_ratios": row["repeat_ratios"]} if row.get("repeat_ratios") else {}),
                    **({"warmed_up": True} if doc.get("confirm_warm_up") else {})})
    return out


def device_of(doc: dict, path: str) -> tuple:
    """``(platform, device kind)`` of a tune file: ``cuda`` for the GPUs, else the platform, with
    ``_warmed_up`` after it where tune ran each candidate once, not kept, before the confirmation
    (``confirm_warm_up``): those are counted apart from the cold ones."""
    plat = (doc.get("environment") or {}).get("platform") or Path(path).parent.name
    device = "cuda" if plat in ("h100", "h200") else plat
    return plat, device + ("_warmed_up" if doc.get("confirm_warm_up") else "")


def by_device(files: list) -> dict:
    """Per device kind (``cuda``: mlx's CUDA backend with cuDNN attention, which builds a graph per
    attention shape; else the platform; ``_warmed_up`` after it where tune ran each candidate once
    before the confirmation): confirmed settings, how many had their worst confirmation run
    above every sweep run, how many would by chance (``by_chance``: were the two confirmation runs and
    the n sweep runs of a setting alike, the largest of them would be a confirmation run 2 / (n + 2) of
    the time), and the median of worst over the sweep's largest."""
    out: dict = {}
    for f in files:
        d = out.setdefault(f["device"], {"files": 0, "settings": 0, "worst_above_sweep": 0, "by_chance": 0.0,
                                         "ratios": []})
        d["files"] += 1
        for s in f["settings"]:
            d["settings"] += 1
            d["worst_above_sweep"] += int(s["worst_above_sweep"])
            d["by_chance"] += 2 / (len(s["sweep_s"]) + 2)
            d["ratios"].append(s["worst_over_sweep_max"])
    for d in out.values():
        d["median_worst_over_sweep_max"] = statistics.median(d.pop("ratios")) if d["settings"] else None
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    files = []
    for path, doc, rows in common.each_tune(args.tunes, lambda d, p: "_before_" not in Path(p).name and settings_of(d),
                                            "no sweep, no two-repeat confirmation, or named history"):
        plat, device = device_of(doc, path)
        files.append({"tune": path, "platform": plat, "device": device, "settings": rows})
        for s in rows:
            print(f"{path[-48:]:48s} {s['label']:24s} worst {s['confirm_worst_s'] * 1e3:7.1f} ms  other "
                  f"{s['confirm_other_s'] * 1e3:7.1f} ms  sweep {min(s['sweep_s']) * 1e3:6.1f}-{max(s['sweep_s']) * 1e3:6.1f} ms"
                  + ("  worst above the sweep" if s["worst_above_sweep"] else ""))
    summary = by_device(files)
    for dev, d in summary.items():
        print(f"{dev}: {d['worst_above_sweep']} of {d['settings']} confirmed settings in {d['files']} files ran their "
              f"worst confirmation repeat above every sweep run, {d['by_chance']:.1f} by chance (median worst / sweep max {d['median_worst_over_sweep_max']:.2f})")
    common.save_over_stored("confirm_cold", {"parameters": {"tunes": args.tunes}, "files": files, "by_device": summary},
                            "sim-tune" if args.save else "cpu", save=args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
