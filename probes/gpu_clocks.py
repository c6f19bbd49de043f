"""Did the card itself slow while the runs did? The GPU's clock log set against a process probe's runs.

``scripts/h200_batch.sh`` logs the GPU's SM and memory clocks, temperature, power, use and active throttle reasons
every 5 s beside each call (``logs/gpu_PART.csv``, nvidia-smi's CSV, times in UTC). ``probes/process_state.py``
keeps when each run started (UTC) and how long it took. This puts the two together: per run, the samples that fell
inside it (median SM clock, median power and use, the hottest temperature, every throttle reason seen), and over
all runs the Spearman correlation of a run's chat ITL p50 (over its setting's median, so settings pool) with its
median SM clock and with its temperature. A negative ITL-clock correlation with falling clocks says the card slowed;
none says the runs slowed with the clocks held.

Usage::

    python -m probes.gpu_clocks data/results/h200/process_state_qwen2.5-coder-1.5b.json \\
        data/results/h200/logs_DATE/gpu_process.csv [--save]

``--save`` writes the result into the process-state file under ``gpu_log`` (else it prints it). No MLX.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, List, Optional

#: nvidia-smi's clocks_throttle_reasons.active bits
THROTTLE = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
            0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
            0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
FIELDS = ("sm_mhz", "mem_mhz", "temp_c", "power_w", "util_pct")


def _num(text: str) -> Optional[float]:
    word = text.strip().split(" ")[0]
    try:
        return float(word)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def reasons(mask: int) -> List[str]:
    """The names of the throttle reasons set in ``mask`` (unknown bits as hex)."""
    out = [name for bit, name in THROTTLE.items() if mask & bit]
    rest = mask & ~sum(THROTTLE)
    return out + ([hex(rest)] if rest else [])


def read_log(text: str) -> List[dict]:
    """nvidia-smi's CSV (``timestamp, clocks.sm, clocks.mem, temperature.gpu, power.draw, utilization.gpu,
    clocks_throttle_reasons.active``; header lines anywhere, as two processes of one part append to one file)
    as samples ``{"t": datetime (UTC), sm_mhz, mem_mhz, temp_c, power_w, util_pct, "throttle": int}``. A log
    without the use column (before 2026-12-07 #25) reads with ``util_pct`` None."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or cells[0].startswith("timestamp"):
            continue
        try:
            t = datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc)
        except ValueError:
            raise ValueError(f"not an nvidia-smi timestamp: {cells[0]!r} in line {line!r}") from None
        nums = [_num(c) for c in cells[1:-1]]
        if len(nums) == 4:
            nums.append(None)
        mask = cells[-1]
        out.append({"t": t, **dict(zip(FIELDS, nums)), "throttle": int(mask, 16) if mask.startswith("0x") else 0})
    return out


def during(samples: List[dict], start: datetime, end: datetime) -> dict:
    """What the samples between ``start`` and ``end`` say: how many, the median SM and memory clock, power and use,
    the hottest temperature and every throttle reason seen (``samples`` 0 and Nones where none fell inside)."""
    inside = [s for s in samples if start <= s["t"] <= end]
    med = lambda k: statistics.median(v) if (v := [s[k] for s in inside if s[k] is not None]) else None  # noqa: E731
    temps = [s["temp_c"] for s in inside if s["temp_c"] is not None]
    mask = 0
    for s in inside:
        mask |= s["throttle"]
    return {"samples": len(inside), "sm_mhz": med("sm_mhz"), "mem_mhz": med("mem_mhz"), "power_w": med("power_w"),
            "util_pct": med("util_pct"), "temp_c_max": max(temps) if temps else None, "throttle": reasons(mask)}


def by_run(doc: dict, samples: List[dict]) -> List[dict]:
    """Per run of a process-state file (phase order, then setting, then round): its ITL p50 and objective, and
    :func:`during` its time. Runs without ``started_utc`` (files before 2026-12-07 #25) cannot be placed: an
    error says so."""
    rows = []
    for ph in doc["phases"]:
        for label, runs in ph["runs"].items():
            med = statistics.median(r["itl_p50_s"] for p in doc["phases"] for r in p["runs"][label])
            for i, r in enumerate(runs):
                if "started_utc" not in r:
                    raise ValueError("the runs keep no started_utc (the probe before 2026-12-07 #25): they cannot be "
                                     "set against the clock log; re-run probes/process_state.py")
                t0 = datetime.fromisoformat(r["started_utc"])
                rows.append({"phase": ph["phase"], "setting": label, "round": i, "started_utc": r["started_utc"],
                             "wall_s": r["wall_s"], "itl_p50_s": r["itl_p50_s"], "itl_over_setting": r["itl_p50_s"] / med,
                             "objective_s": r["objective_s"], **during(samples, t0, t0 + timedelta(seconds=r["wall_s"]))})
    return rows


def summarize(rows: List[dict]) -> dict:
    """Over the runs with samples: the Spearman correlation of ITL (over its setting's median) with the median SM
    clock and with the hottest temperature (scipy; None where a side does not vary), the first and last run's SM
    clock and temperature, and every throttle reason any run saw."""
    from scipy.stats import spearmanr

    have = [r for r in rows if r["samples"] and r["sm_mhz"] is not None]

    def rho(k: str) -> Optional[dict]:
        xs, ys = [r[k] for r in have], [r["itl_over_setting"] for r in have]
        if len(have) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
            return None
        res = spearmanr(xs, ys)
        return {"rho": float(res.statistic), "p": float(res.pvalue), "n": len(have)}

    seen = sorted({t for r in rows for t in r["throttle"]})
    ends = {"first": have[0], "last": have[-1]} if have else {}
    return {"runs": len(rows), "runs_with_samples": len(have), "itl_vs_sm_clock": rho("sm_mhz"),
            "itl_vs_temperature": rho("temp_c_max"), "throttle_seen": seen,
            **{f"{k}_sm_mhz": v["sm_mhz"] for k, v in ends.items()},
            **{f"{k}_temp_c": v["temp_c_max"] for k, v in ends.items()},
            "sm_mhz_range": [min(r["sm_mhz"] for r in have), max(r["sm_mhz"] for r in have)] if have else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m probes.gpu_clocks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("state", help="a process_state_*.json whose runs keep started_utc")
    p.add_argument("log", help="the call's logs/gpu_PART.csv")
    p.add_argument("--save", action="store_true", help="write the result into the state file under gpu_log")
    args = p.parse_args(argv)
    path = Path(args.state)
    doc = json.loads(path.read_text())
    try:
        rows = by_run(doc, read_log(Path(args.log).read_text()))
    except ValueError as e:
        p.error(str(e))
    out = {"log": Path(args.log).as_posix().split("data/results/", 1)[-1], "summary": summarize(rows), "runs": rows}
    s = out["summary"]
    for r in rows:
        print(f"{r['phase']:9s} {r['setting']:16s} ITL x{r['itl_over_setting']:.3f}  SM {r['sm_mhz']} MHz  "
              f"{r['temp_c_max']} C  {r['power_w']} W  {'+'.join(r['throttle']) or '-'}")
    print(json.dumps(s, indent=1))
    if args.save:
        doc["gpu_log"] = out
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote gpu_log into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
