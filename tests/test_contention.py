"""The contention benchmark (mlxlab.studies.contention.run, contention_verdict, contention_charts and
``mlxlab bench contention``): every branch of the three verdicts on synthetic results, the summary
arithmetic on hand-made runs, the label placement, one small real run on tiny, and the command's
parser and plumbing."""

import json
import math
import shutil
from pathlib import Path

import pytest

from mlxlab.cli import build_parser
from mlxlab.core.claims import check_verdicts
from mlxlab.studies.contention import run as ct
from mlxlab.studies.contention import verdict as cv


# ---------------------------------------------------------------------------------- synthetic results
def _row(itl_x, ttft_x, *, executor="engine", policy="interleave", options=None, itl_ms=None, ttft_s=None,
         first_itl_ms=None, warmup_s=1.0):
    """One setting's summary as run_contention writes it (only the fields the verdicts read)."""
    itl_ms = 10.0 * itl_x if itl_ms is None else itl_ms
    return {"executor": executor, "policy": policy, "policy_options": options or {}, "chat_itl_p99_over_solo": itl_x,
            "doc_ttft_over_best_alone": ttft_x, "chat_itl_p99_ms": itl_ms,
            "doc_ttft_s": ttft_x if ttft_s is None else ttft_s, "warmup_s": warmup_s,
            "first_run": {"chat_itl_p99_ms": itl_ms if first_itl_ms is None else first_itl_ms}}


def _preset(settings, warmup="policy", repeats=3):
    return {"settings": settings, "config": {"warmup": warmup, "repeats": repeats}}


def _by_claim(vs):
    check_verdicts(vs, experiment="contention")  # known claims, the contention experiment's
    return {v["claim"]: v for v in vs}


# ---------------------------------------------------------------------------------- frontier
def test_frontier_is_reproduced_when_every_preset_has_an_engine_setting_in_the_target():
    presets = {"a": _preset({"interleave-512": _row(1.8, 1.1), "interleave-2048": _row(9.0, 1.0)}),
               "b": _preset({"stall_free-256": _row(1.5, 1.19), "slo": _row(3.0, 1.5, policy="slo")})}
    v = cv.frontier_verdict(presets)
    assert v["verdict"] == "reproduced"
    assert v["measured"]["a"] == {"setting": "interleave-512", "chat_itl_p99_over_solo": 1.8,
                                  "doc_ttft_over_best_alone": 1.1, "passing": ["interleave-512"]}
    assert v["measured"]["b"]["setting"] == "stall_free-256"


def test_frontier_fails_when_one_preset_only_passes_through_mlx_lm_and_picks_the_closest_setting():
    presets = {"a": _preset({"interleave-512": _row(1.0, 1.0)}),
               "b": _preset({"mlx_lm-2048": _row(1.0, 1.0, executor="mlx_lm"),  # not an engine setting
                             "interleave-512": _row(2.2, 1.0),  # max(1.1, 0.83) = 1.1: the closest
                             "interleave-2048": _row(1.0, 1.5)})}  # max(0.5, 1.25) = 1.25
    v = cv.frontier_verdict(presets)
    assert v["verdict"] == "not reproduced"
    assert v["measured"]["b"]["setting"] == "interleave-512" and v["measured"]["b"]["passing"] == []


def test_frontier_reads_ttft_over_the_best_alone_not_the_settings_own_alone():
    row = _row(1.0, 1.5)
    row["doc_ttft_over_alone"] = 1.0  # slow alone, so fine against itself; too slow against the best
    assert cv.frontier_verdict({"a": _preset({"interleave-512": row})})["verdict"] == "not reproduced"


def test_frontier_is_not_measured_without_engine_figures_and_lists_unmeasured_presets():
    empty = {"a": _preset({"mlx_lm-2048": _row(1.0, 1.0, executor="mlx_lm")}),
             "b": _preset({"interleave-512": _row(float("nan"), 1.0)})}
    v = cv.frontier_verdict(empty)
    assert v["verdict"] == "not measured" and v["measured"] == {"not_measured": ["a", "b"]}
    assert cv.frontier_verdict({})["verdict"] == "not measured"
    part = cv.frontier_verdict({**empty, "c": _preset({"overlap-512": _row(1.2, 1.1)})})
    assert part["verdict"] == "reproduced" and part["measured"]["not_measured"] == ["a", "b"]


def _runs_preset(settings, solo_p99_ms=10.0, best_alone_s=1.0):
    """A preset whose settings carry warm runs: each ``(row, itl_runs_x, ttft_runs_x)`` gets a cold
    first run and one warm run per figure pair (every gap at that multiple of the solo p99)."""
    out = {}
    for label, (row, itl_x, ttft_x) in settings.items():
        row["runs"] = [{"gaps_ms": [1.0], "ttft_s": 9.0}] + [
            {"gaps_ms": [i * solo_p99_ms] * 50, "ttft_s": t * best_alone_s} for i, t in zip(itl_x, ttft_x)]
        out[label] = row
    return {**_preset(out), "solo": {"itl_p99_ms": solo_p99_ms}, "best_alone_ttft_s": best_alone_s}


def test_frontier_near_its_bound_within_the_runs_noise_is_inconclusive():
    # chat ITL p99 at 1.9x solo (bound 2x), warm runs at 1.5x, 1.9x and 2.3x: band 3 x 0.4 / sqrt(3) = 0.69
    wide = {"a": _runs_preset({"interleave-512": (_row(1.9, 1.0), [1.5, 1.9, 2.3], [1.0, 1.0, 1.0])})}
    v = cv.frontier_verdict(wide)
    assert v["verdict"] == "inconclusive"
    assert v["measured"]["a"]["unresolved"] == ["interleave-512"]
    assert v["measured"]["a"]["noise_band_x"]["itl"] == pytest.approx(3 * 0.4 / math.sqrt(3), abs=1e-3)
    tight = {"a": _runs_preset({"interleave-512": (_row(1.9, 1.0), [1.89, 1.9, 1.91], [1.0, 1.0, 1.0])})}
    assert cv.frontier_verdict(tight)["verdict"] == "reproduced"
    # a preset whose every setting misses beyond its band fails the claim, whatever another leaves open
    miss = _runs_preset({"interleave-512": (_row(3.0, 1.0), [2.9, 3.0, 3.1], [1.0, 1.0, 1.0])})
    assert cv.frontier_verdict({**wide, "b": miss})["verdict"] == "not reproduced"
    # one setting passing beyond its band settles its preset, however open another is
    both = _runs_preset({"interleave-512": (_row(1.9, 1.0), [1.5, 1.9, 2.3], [1.0, 1.0, 1.0]),
                         "stall_free-256": (_row(1.2, 1.1), [1.19, 1.2, 1.21], [1.1, 1.1, 1.1])})
    assert cv.frontier_verdict({"a": both})["measured"]["a"]["outcome"] == "reproduced"


# ---------------------------------------------------------------------------------- slo defaults
def test_slo_defaults_reproduced_when_no_fixed_engine_setting_beats_it_on_both():
    presets = {"a": _preset({"slo": _row(2.0, 1.1, policy="slo"),
                             "interleave-512": _row(1.5, 1.3),  # lower ITL, higher TTFT
                             "interleave-2048": _row(5.0, 1.0),  # lower TTFT, higher ITL
                             "stall_free-256": _row(2.0, 1.0, policy="stall_free"),  # equal ITL: not strictly
                             "mlx_lm-2048": _row(1.0, 1.0, executor="mlx_lm")})}  # not an engine setting
    v = cv.slo_defaults_verdict(presets)
    assert v["verdict"] == "reproduced"
    assert v["measured"] == {"dominating": [], "count": 0, "lower_pooled": [], "within_noise": False,
                             "slo": {"a": {"chat_itl_p99_over_solo": 2.0, "doc_ttft_over_best_alone": 1.1}}}


def _runs(itl_p99s, ttfts):
    """Stored runs whose window gaps have these p99s (every gap equal), run 1 first (not warm)."""
    return [{"gaps_ms": [999.0] * 3, "ttft_s": 99.0}] + [{"gaps_ms": [p] * 5, "ttft_s": t}
                                                         for p, t in zip(itl_p99s, ttfts)]


def test_slo_defaults_count_a_setting_as_dominating_only_beyond_the_spread_of_the_warm_runs():
    """Pooled figures lower on both axes, but one warm run of the other setting is no better than
    one of slo's: the repeats cannot tell, so inconclusive, never "not dominated" (listed under
    lower_pooled). Apart runs dominate; run 1 is ignored (its 999 ms gaps would otherwise overlap
    everything)."""
    slo = {**_row(2.0, 1.1, policy="slo", itl_ms=20.0, ttft_s=1.0), "runs": _runs([18.0, 22.0], [0.98, 1.02]),
           "ran_as": {"overlap": True}}
    twin = {**_row(1.9, 1.0, itl_ms=19.0, ttft_s=0.99), "runs": _runs([12.0, 19.0], [0.97, 0.99])}
    apart = {**_row(1.0, 0.9, itl_ms=10.0, ttft_s=0.9), "runs": _runs([9.0, 11.0], [0.89, 0.91])}
    v = cv.slo_defaults_verdict({"a": _preset({"slo": slo, "overlap-twin": twin})})
    assert v["verdict"] == "inconclusive" and v["measured"]["lower_pooled"] == ["a:overlap-twin"]
    assert v["measured"]["within_noise"] is True
    assert v["measured"]["slo"]["a"]["ran_as"] == {"overlap": True}
    v = cv.slo_defaults_verdict({"a": _preset({"slo": slo, "overlap-twin": twin, "overlap-apart": apart})})
    assert v["verdict"] == "not reproduced" and v["measured"]["dominating"] == ["a:overlap-apart"]


def test_slo_defaults_not_reproduced_lists_the_dominating_settings():
    presets = {"a": _preset({"slo": _row(2.0, 1.1, policy="slo"), "overlap-512": _row(1.5, 1.0)}),
               "b": _preset({"slo": _row(2.0, 1.1, policy="slo"), "admission_gate": _row(1.9, 1.05,
                                                                                         policy="admission_gate")})}
    v = cv.slo_defaults_verdict(presets)
    assert v["verdict"] == "not reproduced"
    assert v["measured"]["dominating"] == ["a:overlap-512", "b:admission_gate"] and v["measured"]["count"] == 2


def test_slo_defaults_not_measured_without_a_default_slo_setting():
    tuned = _row(2.0, 1.1, policy="slo", options={"itl_target_s": 0.02})  # slo with options is not the claim's
    v = cv.slo_defaults_verdict({"a": _preset({"slo-tuned": tuned, "interleave-512": _row(1.0, 1.0)})})
    assert v["verdict"] == "not measured" and v["measured"] is None


# ---------------------------------------------------------------------------------- first run
def test_first_run_reproduced_reports_the_worst_ratio_its_setting_and_warmup():
    presets = {"a": _preset({"interleave-512": _row(1.0, 1.0, itl_ms=10.0, first_itl_ms=11.0, warmup_s=2.0),
                             "overlap-512": _row(1.0, 1.0, itl_ms=10.0, first_itl_ms=11.5, warmup_s=3.0),
                             "mlx_lm-2048": _row(1.0, 1.0, executor="mlx_lm", itl_ms=10.0, first_itl_ms=90.0)})}
    v = cv.first_run_verdict(presets)
    assert v["verdict"] == "reproduced"
    assert v["measured"] == {"worst_ratio": 1.15, "setting": "a:overlap-512", "warmup_s": 3.0,
                             "warm_run_p99_ms": [10.0, 10.0], "warmup_s_total": 5.0, "settings": 2, "warmup": "policy"}
    assert "this run used" not in v["fairness"]


def test_first_run_not_reproduced_and_a_different_warmup_is_named():
    presets = {"a": _preset({"slo": _row(1.0, 1.0, policy="slo", itl_ms=10.0, first_itl_ms=15.0)}, warmup="shapes")}
    v = cv.first_run_verdict(presets)
    assert v["verdict"] == "not reproduced" and v["measured"]["worst_ratio"] == 1.5
    assert "this run used shapes" in v["fairness"]


def test_first_run_not_measured_without_engine_ratios():
    presets = {"a": _preset({"mlx_lm-2048": _row(1.0, 1.0, executor="mlx_lm"),
                             "interleave-512": _row(1.0, 1.0, itl_ms=float("nan"))})}
    v = cv.first_run_verdict(presets)
    assert v["verdict"] == "not measured" and v["measured"] is None


def test_verdicts_decide_the_three_contention_claims():
    vs = _by_claim(cv.verdicts({"a": _preset({"slo": _row(1.5, 1.1, policy="slo")})}))
    assert set(vs) == {"mlx-contention-frontier", "mlx-slo-contention-defaults", "mlx-first-run-warm"}
    assert {v["verdict"] for v in vs.values()} == {"reproduced"}


# ---------------------------------------------------------------------------------- summaries
def _run(ttft, alone, gaps, n_in=2, tok_s=5.0, warmup_s=0.5):
    return {"ttft_s": ttft, "alone_ttft_s": alone, "gaps": gaps, "chat_tokens_in_window": n_in, "chat_tok_s": tok_s,
            "warmup_s": warmup_s}


def test_summarize_splits_the_first_run_from_the_warm_ones_and_uses_the_best_alone_of_any_setting():
    specs = {"mlx_lm-2048": ct.SETTINGS["mlx_lm-2048"], "interleave-512": ct.SETTINGS["interleave-512"]}
    raw = {"mlx_lm-2048": [_run(9.0, 9.0, [0.5]), _run(2.0, 1.0, [0.02]), _run(2.2, 1.0, [0.02])],
           "interleave-512": [_run(5.0, 4.0, [0.04], warmup_s=1.5), _run(3.0, 2.0, [0.01, 0.03]),
                              _run(3.4, 2.0, [0.02])]}
    solo = {"itl_p50_ms": 10.0, "itl_p99_ms": 10.0}
    out = ct.summarize(specs, raw, solo)
    assert out["best_alone_setting"] == "mlx_lm-2048" and out["best_alone_ttft_s"] == 1.0
    r = out["settings"]["interleave-512"]
    assert r["executor"] == "engine" and r["label"] == "interleave-512" and r["repeats"] == 3
    assert r["alone_ttft_s"] == 2.0 and r["doc_ttft_s"] == pytest.approx(3.2)  # warm medians (runs 2, 3)
    assert r["doc_ttft_over_alone"] == pytest.approx(1.6) and r["doc_ttft_over_best_alone"] == pytest.approx(3.2)
    assert r["chat_itl_p50_ms"] == pytest.approx(20.0) and r["chat_worst_gap_ms"] == pytest.approx(30.0)
    assert r["chat_itl_p99_over_solo"] == pytest.approx(r["chat_itl_p99_ms"] / 10.0)
    f = r["first_run"]  # run 1, against the warm alone TTFTs
    assert f["doc_ttft_s"] == 5.0 and f["doc_ttft_over_alone"] == pytest.approx(2.5) and f["alone_ttft_s"] == 4.0
    assert r["first_over_warm_itl_p99"] == pytest.approx(40.0 / r["chat_itl_p99_ms"])
    assert r["warmup_s"] == 1.5 and [x["ttft_s"] for x in r["runs"]] == [5.0, 3.0, 3.4]
    assert r["runs"][1]["gaps_ms"] == [10.0, 30.0]


def test_solo_summary_pools_the_warm_repeats_and_keeps_every_runs_gaps():
    s = ct.solo_summary([{"gaps": [1.0], "warmup_s": 0.3}, {"gaps": [0.01, 0.02], "warmup_s": 0.0},
                         {"gaps": [0.03], "warmup_s": 0.0}])
    assert s["n"] == 3 and s["itl_max_ms"] == pytest.approx(30.0) and s["itl_p50_ms"] == pytest.approx(20.0)
    assert s["warmup_s"] == 0.3 and s["gaps_ms"] == [[1000.0], [10.0, 20.0], [30.0]]


def test_settings_resolve_by_label_or_mapping_and_unknown_labels_are_refused():
    assert list(ct.resolve_settings(None)) == list(ct.SETTINGS)
    assert list(ct.resolve_settings(["slo", "mlx_lm-2048", "slo"])) == ["slo", "mlx_lm-2048"]
    custom = ct.resolve_settings({"interleave-64": {"chunk_size": 64}})
    assert custom["interleave-64"]["policy"] == "interleave" and custom["interleave-64"]["chunk_size"] == 64
    with pytest.raises(ValueError, match="unknown contention setting"):
        ct.resolve_settings(["interleave-999"])
    with pytest.raises(ValueError, match="no contention settings"):
        ct.resolve_settings([])
    labels = {"mlx_lm-2048", "interleave-512", "interleave-2048", "stall_free-256", "stall_free-512",
              "stall_free-1024", "overlap-256", "overlap-512", "overlap-2048", "overlap-512-pipelined",
              "overlap-2048-pipelined", "overlap-2048-jobs4", "overlap-2048-pace1.6", "overlap-2048-pipelined-pace1.6",
              "overlap-2048-pipelined-jobs4", "overlap-2048-pipelined-jobs16", "overlap-2048-pipelined-jobs4-pace1.6",
              "overlap-2048-pipelined-jobs4-pace2.2", "overlap-2048-jobs16", "overlap-4096-pipelined-jobs8",
              "overlap-8192-pipelined-jobs4", "slo", "slo-overlap",
              "admission_gate", "interleave-2048-compiled", "slo-compiled"}
    assert set(ct.SETTINGS) == labels
    assert ct.SETTINGS["slo-compiled"]["compile_decode"] and not ct.SETTINGS["slo"]["compile_decode"]
    assert ct.SETTINGS["overlap-512-pipelined"]["overlap_sync"] == "pipelined"
    assert ct.learns(ct.SETTINGS["slo"]) and not ct.learns(ct.SETTINGS["stall_free-512"])
    assert not ct.learns(ct.SETTINGS["mlx_lm-2048"])
    assert ct.SETTINGS["stall_free-256"]["policy_options"] == {"token_budget": 256}
    assert ct.SETTINGS["overlap-2048"]["overlap"] and ct.SETTINGS["slo"]["policy_options"] == {}
    assert ct.SETTINGS["overlap-2048-pace1.6"]["overlap_pace_x"] == 1.6 and ct.SETTINGS["overlap-2048"]["overlap_pace_x"] is None


# ---------------------------------------------------------------------------------- the figure
def test_labels_of_clustered_points_do_not_overlap_and_stay_in_the_panel():
    from mlxlab.notebook.labels import CHAR_W, LINE_H, place_labels
    from mlxlab.studies.contention.charts import HEIGHT, WIDTH

    pts = [(300.0 + i, 150.0 + 0.5 * i) for i in range(8)]
    texts = [f"setting number {i}" for i in range(8)]
    spots = place_labels(pts, texts, WIDTH, HEIGHT)
    boxes = []
    for s, t in zip(spots, texts):
        w = CHAR_W * len(t) + 2
        x0 = s["x"] if s["align"] == "left" else s["x"] - w
        boxes.append((x0, s["y"] - LINE_H / 2, x0 + w, s["y"] + LINE_H / 2))
    for i, a in enumerate(boxes):
        assert a[0] >= 0 and a[2] <= WIDTH and a[1] >= 0 and a[3] <= HEIGHT
        for b in boxes[i + 1:]:
            assert min(a[2], b[2]) <= max(a[0], b[0]) or min(a[3], b[3]) <= max(a[1], b[1])
    assert any(s["moved"] for s in spots) and not spots[0]["moved"]
    # another mark where the label would go (right of its point) sends it to the left (the tune figure's
    # simulated points and sweep squares are such marks)
    alone = place_labels([(200.0, 150.0)], ["a label"], WIDTH, HEIGHT)[0]
    blocked = place_labels([(200.0, 150.0)], ["a label"], WIDTH, HEIGHT, obstacles=[(215.0, 150.0)])[0]
    assert alone["align"] == "left" and blocked["align"] == "right" and not blocked["moved"]


def test_frontier_chart_has_a_panel_per_preset_and_skips_unmeasured_settings():
    from mlxlab.studies.contention.charts import TARGET, frontier_chart

    rows = {"interleave-512": {**_row(1.5, 1.1), "name": "interleave, chunk 512"},
            "slo": {**_row(float("nan"), 1.0, policy="slo"), "name": "slo (defaults)"}}
    spec = frontier_chart({"a": _preset(rows), "b": _preset(rows)}, "cpu").to_dict()
    text = json.dumps(spec, ensure_ascii=False)
    assert len(spec["hconcat"]) == 2 and TARGET in text
    assert "interleave, chunk 512" in text and "slo (defaults)" not in text


# ---------------------------------------------------------------------------------- a real run
def _warmup_mode() -> str:
    from mlxlab.engine.warmup import WARMUP_MODES

    return "policy" if "policy" in WARMUP_MODES else "shapes"


def test_a_small_real_run_measures_the_chat_during_the_documents_prefill(tiny):
    # stall_free at a 256-token chunk: the "policy" warm-up's document is twice the chunk size
    settings = {"mlx_lm-2048": ct.SETTINGS["mlx_lm-2048"], "overlap-512": ct.SETTINGS["overlap-512"],
                "stall_free-128": {"policy": "stall_free", "chunk_size": 256, "policy_options": {"token_budget": 128}}}
    labels = list(settings)
    res = ct.run_contention(tiny, doc_tokens=300, chat_context=64, repeats=2, settings=settings,
                            warmup=_warmup_mode(), progress=False, chat_tokens=24)
    assert list(res["settings"]) == labels and res["best_alone_setting"] in labels
    assert res["solo"]["n"] == 24 and len(res["solo"]["gaps_ms"]) == 2
    keys = ("chat_itl_p99_over_solo", "chat_itl_p50_over_solo", "chat_worst_gap_ms", "chat_tok_s_during_prefill",
            "doc_ttft_s", "doc_ttft_over_alone", "doc_ttft_over_best_alone")
    for label, r in res["settings"].items():
        for part in (r, r["first_run"]):
            for k in keys:
                assert math.isfinite(part[k]) and part[k] > 0, (label, k, part[k])
            assert part["chat_tokens_during_prefill"] >= 1  # the chat streamed while the document prefilled
        assert r["doc_ttft_over_best_alone"] >= r["doc_ttft_over_alone"] * (1 - 1e-9)  # best alone <= own alone
        assert len(r["runs"]) == 2 and all(run["gaps_ms"] for run in r["runs"])
    assert res["settings"]["mlx_lm-2048"]["warmup_s"] == 0.0 and res["settings"]["overlap-512"]["warmup_s"] > 0
    with pytest.raises(ValueError, match="repeats must be at least 2"):
        ct.run_contention(tiny, doc_tokens=300, chat_context=64, repeats=1, progress=False)
    _by_claim(cv.verdicts({"tiny": res}))
    assert "mlx_lm-2048" in ct.format_table("tiny", res)


# ---------------------------------------------------------------------------------- the command
def test_the_command_parses_its_options_and_shows_the_defaults(capsys):
    args = build_parser().parse_args(["bench", "contention", "--models", "tiny", "small", "--dtype", "float32",
                                      "--doc-tokens", "300", "--chat-context", "64", "--repeats", "2", "--settings",
                                      "mlx_lm-2048", "slo", "--warmup", "shapes", "--platform", "scratch",
                                      "--name", "contention_x", "--bits", "4", "--seed", "3"])
    assert (args.models, args.doc_tokens, args.chat_context, args.repeats, args.settings, args.warmup,
            args.platform, args.name, args.bits, args.seed) == (["tiny", "small"], 300, 64, 2, ["mlx_lm-2048", "slo"],
                                                               "shapes", "scratch", "contention_x", 4, 3)
    d = build_parser().parse_args(["bench", "contention"])
    assert (d.models, d.doc_tokens, d.chat_context, d.repeats, d.settings, d.warmup, d.name) == (
        ["small"], 4096, 1536, 3, list(ct.SETTINGS), "policy", "contention")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "contention", "--settings", "interleave-999"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "contention", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 4096)", "(default: 1536)", "(default: 3)", "(default: policy)", "(default: contention)"):
        assert default in out


def test_the_command_saves_results_with_verdicts_and_the_figure(tmp_path, monkeypatch, capsys):
    import mlxlab.cli.studies as cli_studies
    import mlxlab.studies.sim_validation.charts as sim_charts

    rows = {"interleave-512": {**_row(1.5, 1.1), "name": "interleave, chunk 512", "label": "interleave-512"},
            "slo": {**_row(2.5, 1.0, policy="slo"), "name": "slo (defaults)", "label": "slo"}}
    for r in rows.values():
        r.update(chat_itl_p50_ms=5.0, chat_itl_p50_over_solo=1.0, chat_worst_gap_ms=30.0, chat_tok_s_during_prefill=9.0,
                 alone_ttft_s=1.0, doc_ttft_over_alone=1.0, first_over_warm_itl_p99=1.0)
        r["first_run"].update(chat_itl_p99_over_solo=1.0, doc_ttft_over_best_alone=1.0)
    fake = {"solo": {"itl_p50_ms": 5.0, "itl_p99_ms": 10.0, "n": 40}, "settings": rows, "best_alone_ttft_s": 1.0,
            "best_alone_setting": "slo", "config": {"warmup": "policy", "repeats": 2, "doc_tokens": 300,
                                                    "chat_context": 64}}
    calls = []
    monkeypatch.setattr(ct, "run_contention", lambda model, **kw: calls.append(kw) or json.loads(json.dumps(fake)))
    saved = []
    real_save = cli_studies.save_results
    monkeypatch.setattr(cli_studies, "save_results", lambda name, payload, **kw: saved.append(name) or real_save(
        name, payload, **kw))
    data = Path(__file__).resolve().parent.parent / "data"  # the model preset and the claims the verdicts name
    shutil.copytree(data / "claims", tmp_path / "claims")
    (tmp_path / "models").mkdir()
    shutil.copy(data / "models" / "tiny.json", tmp_path / "models")
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    monkeypatch.setattr(sim_charts, "FIGURES", tmp_path / "figures")
    args = build_parser().parse_args(["bench", "contention", "--models", "tiny", "--dtype", "float32",
                                      "--repeats", "2", "--settings", "interleave-512", "slo", "--platform", "scratch"])
    assert args.func(args) == 0
    assert calls[0]["settings"] == ["interleave-512", "slo"] and calls[0]["repeats"] == 2 and saved == ["contention"]
    # without --save: the results and the figure in a new run folder, nothing in paper/figures/
    (run,) = (tmp_path / "results" / "scratch" / "runs").iterdir()
    doc = json.loads((run / "contention.json").read_text())
    assert doc["parameters"]["settings"] == ["interleave-512", "slo"]
    assert doc["presets"]["tiny"]["model"]["preset"] == "tiny"
    assert {v["claim"] for v in doc["verdicts"]} == {"mlx-contention-frontier", "mlx-slo-contention-defaults",
                                                     "mlx-first-run-warm"}
    assert (run / "contention_scratch.png").stat().st_size > 0 and not (tmp_path / "figures").exists()
    out = capsys.readouterr().out
    assert "interleave-512" in out and "[reproduced] mlx-contention-frontier" in out


def test_append_keeps_earlier_presets_with_their_provenance(tmp_path):
    import json

    from mlxlab.cli.studies import _earlier_presets
    path = tmp_path / "contention.json"
    assert _earlier_presets(path, ["a"]) == {}
    path.write_text(json.dumps({"environment": {"git_commit": "abc"}, "presets": {"a": {"x": 1}, "b": {"x": 2}}}))
    kept = _earlier_presets(path, ["a"])
    assert list(kept) == ["b"] and kept["b"]["environment"] == {"git_commit": "abc"} and kept["b"]["x"] == 2
