"""probes/confirm_cold.py: a two-repeat confirmation's runs told apart from its medians and set against
the sweep's runs of the same setting, per device kind."""

from probes.confirm_cold import by_device, device_of, settings_of
from tests.test_tune import _full_summary


def _doc(worst_s, median_s, sweep_s):
    return {"slos": ["chat.itl_p99<=3x"], "choice": {"binding": "chat.itl_p99<=3x"},
            "confirmed": [{"label": "a", "repeats": 2, "summary": _full_summary(median_s, 0.5),
                           "checks_worst": [{"slo": "chat.itl_p99<=3x", "figure_s": worst_s}]},
                          {"label": "b", "repeats": 3, "summary": _full_summary(median_s, 0.5),
                           "checks_worst": [{"slo": "chat.itl_p99<=3x", "figure_s": worst_s}]}],
            "sweep": {"runs": {"a": [_full_summary(v, 0.5) for v in sweep_s], "b": [_full_summary(0.01, 0.5)]}}}


def test_the_confirmations_other_run_is_twice_the_median_less_the_worst_and_a_cold_worst_lies_above_the_sweep():
    # worst 0.09 and median 0.07: the other run was 0.05; the sweep ran 0.06 and 0.07
    (row,) = settings_of(_doc(0.09, 0.07, [0.06, 0.07]))  # b ran 3 repeats: its other runs are not known
    assert row["label"] == "a" and abs(row["confirm_other_s"] - 0.05) < 1e-12
    assert row["worst_above_sweep"] and not row["other_within_sweep"]
    assert abs(row["worst_over_sweep_max"] - 0.09 / 0.07) < 1e-12
    (warm,) = settings_of(_doc(0.065, 0.0625, [0.06, 0.07]))
    assert not warm["worst_above_sweep"] and warm["other_within_sweep"]
    files = [{"device": "cuda", "settings": [row]}, {"device": "cpu", "settings": [warm]}]
    summary = by_device(files)
    assert summary["cuda"]["worst_above_sweep"] == 1 and summary["cpu"]["worst_above_sweep"] == 0
    assert summary["cpu"]["settings"] == summary["cuda"]["settings"] == 1
    assert summary["cuda"]["by_chance"] == 0.5  # two confirmation runs beside two sweep runs: the largest, 2 in 4
    assert settings_of({**_doc(0.09, 0.07, [0.06]), "sweep": {}}) == []  # no sweep: nothing to set against


def test_a_warmed_up_confirmation_is_counted_apart_from_the_cold_ones_of_its_device():
    doc = {"environment": {"platform": "h100"}}
    assert device_of(doc, "data/results/h100/tune.json") == ("h100", "cuda")
    assert device_of({**doc, "confirm_warm_up": {"wall_s": 1.0}}, "x/tune.json") == ("h100", "cuda_warmed_up")
    assert device_of({"confirm_warm_up": None}, "data/results/cpu/tune.json") == ("cpu", "cpu")
