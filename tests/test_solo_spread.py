"""probes/solo_spread.py: a relative SLO's bound per tune, grouped by what should make it the same, and
how many swept settings meet it under each bound of the group."""

from probes.solo_spread import group_key, groups, solo_of, sweep_figures
from tests.test_tune import _full_summary


def _doc(solo_p99, sweep_p99s, **params):
    return {"slos": ["chat.itl_p99<=3x", "batch.ttft_p50<=2s"], "solo": {"chat": _full_summary(solo_p99, 0.5)},
            "parameters": {"model": "m", "bits": 4, "trace": "t.jsonl", **params},
            "environment": {"platform": "h100"},
            "sweep": {"runs": {k: [_full_summary(v, 0.5) for v in vs] for k, vs in sweep_p99s.items()}}}


def _file(doc, path):
    solo = solo_of(doc)
    return {"tune": path, "solo": solo, "keys": {s["slo"]: group_key(doc, path, s["slo"]) for s in solo},
            "sweep": {s["slo"]: sweep_figures(doc, s["slo"]) for s in solo}}


def test_a_relative_bounds_spread_between_tunes_of_one_trace_and_the_settings_each_bound_lets_through():
    sweep = {"a": [0.020, 0.040, 0.030], "b": [0.050, 0.070], "c": [0.100]}  # medians 30, 60, 100 ms
    one, two = _doc(0.010, sweep), _doc(0.025, sweep)  # bounds 30 and 75 ms
    (s,) = solo_of(one)  # the absolute SLO has no solo figure
    assert s["slo"] == "chat.itl_p99<=3x" and abs(s["bound_s"] - 0.030) < 1e-12 and "runs_s" not in s
    other = _doc(0.010, sweep, output_scale={"chat": 4.0})  # another trace: another group
    assert group_key(one, "x/tune.json", s["slo"]) != group_key(other, "x/tune.json", s["slo"])
    (g,) = groups([_file(one, "one.json"), _file(two, "two.json"), _file(other, "other.json")])
    assert g["tunes"] == 2 and abs(g["spread_x"] - 2.5) < 1e-12
    first, second = g["files"]
    assert first["meet"] == {"own": 1, "smallest": 1, "largest": 2} and first["sweep_settings"] == 3
    assert second["meet"] == {"own": 2, "smallest": 1, "largest": 2}
    kept = {**one, "solo_runs": {"chat": {"warm_up_s": 1.0, "runs": [{"itl_p99": 0.009}, {"itl_p99": 0.011}]}}}
    assert solo_of(kept)[0]["runs_s"] == [0.009, 0.011]
