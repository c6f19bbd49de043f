"""The figures say what their marks are: reference lines carry their labels, plane points their
chunk sizes, the speculation map its break-even contour, legends readable names, log axes ticks
that do not collide. Asserted on the charts' Vega-Lite specs (``to_dict()``), not on pixels."""

import numpy as np
import pandas as pd
import pytest

from mlxlab.notebook import plots
from mlxlab.studies.admission_gate import charts as gate_charts
from mlxlab.studies.prefix_cache import charts as prefix_charts
from mlxlab.studies.sim_validation import charts as sim_charts


def _marks(spec, datasets=None, data=None):
    """Every unit spec under ``spec`` (layers, concats, facets), with the rows of its data (its
    own, or the nearest parent's)."""
    datasets = spec.get("datasets", {}) if datasets is None else datasets
    data = spec.get("data", data) or {}
    if "mark" in spec:
        rows = datasets.get(data.get("name"), data.get("values", []))
        mark = spec["mark"] if isinstance(spec["mark"], str) else spec["mark"]["type"]
        yield {"mark": mark, "spec": spec, "rows": rows}
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for sub in spec.get(key, []):
            yield from _marks(sub, datasets, data)
    if isinstance(spec.get("spec"), dict):
        yield from _marks(spec["spec"], datasets, data)


def _texts(chart):
    """The strings the chart's text marks write, from their ``text`` field."""
    out = []
    for m in _marks(chart.to_dict()):
        if m["mark"] == "text":
            field = m["spec"]["encoding"]["text"]["field"]
            out += [str(r[field]) for r in m["rows"]]
    return out


def _axis_values(chart, channel):
    return [m["spec"]["encoding"][channel]["axis"]["values"] for m in _marks(chart.to_dict())
            if "values" in (m["spec"].get("encoding", {}).get(channel, {}).get("axis") or {})]


def test_log_ticks_thin_out_with_the_range_and_refuse_nonpositive_bounds():
    assert plots.log_ticks(150, 1400) == [100, 200, 500, 1000, 2000, 5000, 10000]
    assert plots.log_ticks(0.0015, 12) == [0.001, 0.01, 0.1, 1, 10, 100]  # five decades: powers of ten
    assert plots.log_ticks(0.3, 0.9) == [0.1, 0.2, 0.3, 0.5, 0.7, 1.0]
    with pytest.raises(ValueError, match="positive"):
        plots.log_ticks(0, 10)
    with pytest.raises(ValueError, match="positive"):
        plots.log_axis([float("nan"), -1.0])


def test_lines_takes_a_readable_legend_title_and_ticks_a_log_x_at_its_settings():
    df = pd.DataFrame({"prompt_tokens": [96, 480, 1024] * 2, "prefill_tok_s": [1.0, 2.0, 3.0] * 2,
                       "step": [256] * 3 + [2048] * 3})
    spec = plots.lines(df, "prompt_tokens", "prefill_tok_s", "step", log_x=True, color_title="prefill step (tokens)").to_dict()
    assert spec["encoding"]["color"]["title"] == "prefill step (tokens)"
    assert spec["encoding"]["x"]["axis"]["values"] == [96, 480, 1024]


def test_ratio_bars_draw_the_repeats_range_across_each_bar_only_when_asked():
    df = pd.DataFrame({"model": ["cpu: small"] * 2, "metric": ["prefill", "decode"], "ratio": [1.0, 1.04],
                       "lowest": [0.95, 1.02], "highest": [1.07, 1.06]})
    plain = [m["mark"] for m in _marks(plots.ratio_bars(df, "model", "ratio", color="metric").to_dict())]
    assert plain.count("rule") == 1  # the reference rule alone
    marks = list(_marks(plots.ratio_bars(df, "model", "ratio", color="metric", spread=("lowest", "highest")).to_dict()))
    whisk = [m for m in marks if m["mark"] == "rule" and "x2" in m["spec"]["encoding"]]
    assert len(whisk) == 1
    enc = whisk[0]["spec"]["encoding"]
    assert (enc["x"]["field"], enc["x2"]["field"], enc["yOffset"]["field"]) == ("lowest", "highest", "metric")
    assert [(r["lowest"], r["highest"]) for r in whisk[0]["rows"]] == [(0.95, 1.07), (1.02, 1.06)]


def test_reference_lines_carry_their_label():
    assert _texts(plots.vrule(6, "6 sessions: all of them fit")) == ["6 sessions: all of them fit"]
    assert _texts(plots.marker(1024, "slider: 1,024 tokens")) == ["slider: 1,024 tokens"]
    assert _texts(plots.marker(1024)) == []  # no label asked for, no text mark
    right = plots.hline(1.0, "1 = as fast as the target alone", align="right").to_dict()
    text = [m for m in _marks(right) if m["mark"] == "text"][0]
    assert text["spec"]["encoding"]["x"] == {"value": "width"}
    with pytest.raises(ValueError, match="align"):
        plots.hline(1.0, "x", align="middle")


def test_capacity_chart_ticks_the_capacities_measured_and_labels_the_sessions_rule():
    rows = [{"capacity_sessions": c, "warm_turn_fraction": f, "restored_fraction": f, "ttft_p50_later_turns_s": t,
             "evictions": 0} for c, f, t in ((0, 0.0, 1.5), (3, 0.66, 0.3), (6, 1.0, 0.1))]
    chart = prefix_charts.capacity_chart(rows, 6)
    assert "6 sessions: all of them fit" in _texts(chart)
    assert [0, 3, 6] in _axis_values(chart, "x")


def _gate_table():
    rows = []
    for policy in ("interleave", "admission_gate", "stall_free"):
        for w in (1, 2):
            for chunk in (128, 256, 512):
                rows.append({"kind": "cell", "prompt_tokens": 1024, "policy": policy, "workers": w, "chunk_size": chunk,
                             "ttft_over_floor_pct": 20.0, "ttft_over_floor_pct_lo": 10.0, "ttft_over_floor_pct_hi": 30.0,
                             "chat_itl_p99_pooled_s": chunk / 1e3, "chat_itl_p99_s_lo": chunk / 2e3,
                             "chat_itl_p99_s_hi": chunk / 5e2, "chat_worst_gap_s": chunk / 4e2, "long_ttft_s": 1.0})
    return rows


def test_plane_points_are_labelled_with_their_chunk_size_and_the_subtitle_says_so():
    chart = gate_charts.plane_chart(_gate_table())
    texts = [m for m in _marks(chart.to_dict()) if m["mark"] == "text"]
    assert texts and all(m["spec"]["encoding"]["text"]["field"] == "chunk_size" for m in texts)
    assert "chunk size" in chart.to_dict()["title"]["subtitle"]


def test_tradeoff_bands_are_labelled_and_the_itl_axis_is_ticked_by_decades():
    chart = gate_charts.tradeoff_chart(_gate_table(), ref_chunk=512)
    texts = _texts(chart)
    assert any("sweet spot" in t and "128-256" in t for t in texts)
    assert any("+15-30%" in t for t in texts)
    # the ticks span the repeats' bars (64-1,024 ms), not only the pooled p99 (128-512 ms)
    assert [10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] in _axis_values(chart, "y")


def test_seed_scale_chart_explains_the_floor_and_names_its_statistics():
    curves = [{"chunk_size": c, "long_ttft_s": 44 + 4096 / c, "itl_p50_s": c / 2000, "itl_p99_s": c / 1000,
               "itl_mean_s": c / 1800} for c in (256, 512, 1024, 2048)]
    plane = [{"policy": "interleave", "label": f"interleave {c}", "chunk_size": c, "long_ttft_s": 44 + 4096 / c,
              "itl_p50_s": c / 2000, "itl_p99_s": c / 1000} for c in (256, 512)]
    plane.append({"policy": "stall_free", "label": "stall_free 512", "chunk_size": 4096, "options": {"token_budget": 512},
                  "long_ttft_s": 50.0, "itl_p99_s": 0.5, "itl_p50_s": 0.4})
    chart = sim_charts.seed_scale_chart({"curves": curves, "plane": plane})
    texts = _texts(chart)
    assert any(t.startswith("published floor 44 s") and "calibration input" in t for t in texts)
    assert "512" in texts  # stall_free's point says its token budget, not its chunk_size field
    stats = {r["stat"] for m in _marks(chart.to_dict()) for r in m["rows"] if "stat" in r}
    assert stats == {"p50", "p99", "mean"}


def test_validation_chart_shows_metric_names_not_field_names_and_labels_its_diagonal():
    rows = [{"workload": "w", "policy": "interleave", "tenant": "chat", "metric": m, "engine": 0.02, "sim": 0.021,
             "rel_error": 0.05, "noise": 0.1, "passed": True} for m in ("ttft_p50_s", "itl_p99_s")]
    chart = sim_charts.validation_chart(rows)
    metrics = {r["metric"] for m in _marks(chart.to_dict()) for r in m["rows"] if "metric" in r}
    assert metrics == {"TTFT p50", "ITL p99"}
    assert any("within 10%" in t for t in _texts(chart))


def test_where_it_pays_marks_the_break_even_contour_and_the_cells_that_do_not_pay():
    from mlxlab.engine.speculative import analytic_speedup
    from mlxlab.studies.speculation import charts as SC

    a_values, c_values = np.linspace(0, 0.95, 20), np.linspace(0.02, 0.6, 20)
    chart = SC.where_it_pays_chart(a_values, c_values, measured={"a": 0.77, "c": 0.32})
    marks = list(_marks(chart.to_dict()))
    contour = [m for m in marks if m["mark"] == "line"]
    assert len(contour) == 1 and contour[0]["rows"]
    for r in contour[0]["rows"]:  # on the contour the best k breaks even exactly
        best = max(analytic_speedup(r["a"], k, r["c"]) for k in range(1, 17))
        assert best == pytest.approx(1.0, abs=1e-9)
    cells = {(round(r["a"], 6), round(r["c"], 6)): r for m in marks if m["mark"] == "rect" for r in m["rows"]}
    assert len(cells) == 400
    for r in cells.values():  # a cell is drawn apart exactly where no k pays
        pays = any(analytic_speedup(r["a"], k, r["c"]) > 1 for k in range(1, 17))
        assert (r["region"] == SC.NO_PAY) == (not pays)
    texts = _texts(chart)
    assert "speedup = 1 (break-even)" in texts and any(t.startswith("measured here") for t in texts)
    with pytest.raises(ValueError, match="two"):
        SC.where_it_pays_chart([0.5], c_values)


def test_speedup_vs_k_names_the_model_and_the_measurements_and_labels_break_even():
    from mlxlab.studies.speculation import charts as SC

    measured = pd.DataFrame({"k": [1, 2, 4], "speedup": [1.05, 0.98, 1.1], "a_hat": [0.7, 0.7, 0.7]})
    chart = SC.speedup_vs_k_chart(0.7, 0.3, 1.0, measured)
    spec = chart.to_dict()
    domains = [m["spec"]["encoding"]["color"]["scale"]["domain"] for m in _marks(spec)
               if "color" in m["spec"].get("encoding", {})]
    assert ["analytic model", "measured here (own a, c)"] in domains
    assert "1 = as fast as the target alone" in _texts(chart)
