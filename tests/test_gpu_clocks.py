"""probes/gpu_clocks.py: the GPU's clock log (nvidia-smi CSV) set against a process probe's runs."""

from datetime import datetime, timedelta, timezone

import pytest

from probes.gpu_clocks import by_run, read_log, reasons, summarize

HEAD = ("timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], temperature.gpu, power.draw [W], "
        "utilization.gpu [%], clocks_throttle_reasons.active")
T0 = datetime(2026, 12, 7, 20, 0, 0, tzinfo=timezone.utc)


def _line(t, sm, temp, mask="0x0000000000000000", power="250.10 W"):
    return f"{t.strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {sm} MHz, 2619 MHz, {temp}, {power}, 90 %, {mask}"


def test_the_log_reads_with_header_lines_anywhere_and_names_each_throttle_reason():
    text = "\n".join([HEAD, _line(T0, 1980, 40), HEAD, _line(T0 + timedelta(seconds=5), 1755, 62, "0x0000000000000024",
                                                             "[N/A]")])
    got = read_log(text)
    assert [s["sm_mhz"] for s in got] == [1980.0, 1755.0] and got[1]["power_w"] is None
    assert got[1]["t"] - got[0]["t"] == timedelta(seconds=5) and got[0]["t"].tzinfo is not None
    assert reasons(got[1]["throttle"]) == ["sw_power_cap", "sw_thermal_slowdown"] and reasons(0x200) == ["0x200"]
    with pytest.raises(ValueError, match="not an nvidia-smi timestamp"):
        read_log("19:00:01, 1980 MHz, 2619 MHz, 40, 250 W, 0x0")


def _doc(itls):
    """Runs of one setting 10 s each, back to back from T0, with these ITL p50s."""
    runs = [{"itl_p50_s": v, "objective_s": 1.0, "slo_ratio": 0.5, "wall_s": 10.0,
             "started_utc": (T0 + timedelta(seconds=10 * i)).isoformat()} for i, v in enumerate(itls)]
    return {"phases": [{"phase": "start", "runs": {"a": runs[:2]}}, {"phase": "again", "runs": {"a": runs[2:]}}]}


def test_each_run_gets_the_samples_inside_it_and_slower_runs_on_lower_clocks_correlate_negatively():
    # the clock falls run on run (samples at 2 s and 7 s of each run), the runs slow: rho -1
    samples = read_log("\n".join(_line(T0 + timedelta(seconds=10 * i + d), 1980 - 50 * i, 40 + 5 * i,
                                       "0x20" if i == 3 else "0x0") for i in range(4) for d in (2, 7)))
    rows = by_run(_doc([0.010, 0.011, 0.012, 0.013]), samples)
    assert [r["samples"] for r in rows] == [2, 2, 2, 2]
    assert [r["sm_mhz"] for r in rows] == [1980, 1930, 1880, 1830] and rows[3]["throttle"] == ["sw_thermal_slowdown"]
    s = summarize(rows)
    assert s["itl_vs_sm_clock"]["rho"] == pytest.approx(-1.0) and s["itl_vs_temperature"]["rho"] == pytest.approx(1.0)
    assert s["throttle_seen"] == ["sw_thermal_slowdown"] and s["sm_mhz_range"] == [1830, 1980]
    # clocks held: no correlation to report (the clock does not vary)
    flat = by_run(_doc([0.010, 0.011, 0.012, 0.013]), read_log("\n".join(
        _line(T0 + timedelta(seconds=10 * i + 2), 1980, 40) for i in range(4))))
    assert summarize(flat)["itl_vs_sm_clock"] is None and summarize(flat)["throttle_seen"] == []


def test_runs_without_start_times_say_they_cannot_be_placed():
    doc = _doc([0.01, 0.01, 0.01, 0.01])
    del doc["phases"][0]["runs"]["a"][0]["started_utc"]
    with pytest.raises(ValueError, match="keep no started_utc"):
        by_run(doc, [])
