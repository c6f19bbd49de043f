"""Seed 001 at its own scale: which published figures the profile is fitted on (they come back
as residuals, never as verdicts) and the verdict rules on hand-made curves, every branch; the
saved file keeps the verdicts and the parameters. No MLX."""

import json
import math

import pytest

from mlxlab.core.claims import check_verdicts
from mlxlab.sim.published import (
    _derive,
    calibration_inputs,
    seed001_figures,
    seed001_profile,
)
from mlxlab.studies.seed_scale.run import save_study
from mlxlab.studies.seed_scale.verdict import calibration_block, seed_scale_verdicts

INPUTS = calibration_inputs()


def test_the_calibration_inputs_are_what_the_derivation_reads():
    assert {"floor_60k_s", "decode_tok_s", "premium_point", "weight_gb_per_step", "kv_kb_per_token"} <= set(INPUTS)
    # the figures the study scores are not among them
    assert not {"chunk_2048_s", "chat_gap_512_1024_s", "chat_gap_2048_s", "crawl_tok_s"} & set(INPUTS)
    # a figure outside the inputs changes no coefficient; an input does
    v = {k: f["value"] for k, f in seed001_figures().items()}
    base = _derive(v)
    assert _derive({**v, "crawl_tok_s": 99.0, "chat_gap_2048_s": 9.0}) == base
    assert _derive({**v, "floor_60k_s": 50.0})["per_token"] != base["per_token"]


def test_the_saved_profile_is_the_derived_one():
    from mlxlab.sim.published import seed001_cost_model

    assert seed001_cost_model().coef.tolist() == pytest.approx(seed001_profile()["cost_model"].coef.tolist())


def curve(c, premium, p50, mean=None, mx=None):
    mean = p50 if mean is None else mean
    return {"chunk_size": c, "premium": premium, "itl_p50_s": p50, "itl_mean_s": mean,
            "itl_max_s": mx or 1.5 * p50, "tok_s": 1.0 / mean}


GOOD = [curve(512, 0.29, 0.5), curve(1024, 0.15, 0.8), curve(2048, 0.07, 1.5)]


def verdicts(curves=GOOD, chunk=(1.2, 1.6), inputs=INPUTS, floor_s=44.1):
    recs = seed_scale_verdicts(floor_s=floor_s, solo_itl_s=1 / 65, curves=curves,
                               chunk_doc_s={10_000: chunk[0], 25_000: chunk[1]}, inputs=inputs)
    return {r["claim"]: r for r in check_verdicts(recs, experiment="seed_scale")}


def test_seed_scale_verdicts_reach_every_branch():
    v = verdicts()
    # the chunk time, the 2,048 gap and the crawl follow from the fitted floor: residuals, never scored
    assert {c: r["verdict"] for c, r in v.items()} == {
        "s001-chunk-time": "not measured", "s001-prefill-floor": "not measured", "s001-chunk-2048-gap": "not measured",
        "s001-stall-crawl": "not measured", "s001-sweet-spot": "reproduced"}
    for c in ("s001-chunk-time", "s001-chunk-2048-gap", "s001-stall-crawl"):
        assert v[c]["measured"]["calibration_residual"] is True and v[c]["measured"]["consistent_with_published"]
        assert "calibration residual, not a prediction" in v[c]["rule"]
    assert {r["source"] for r in v.values()} == {"simulation"}  # never a measurement
    assert "calibration input" in v["s001-prefill-floor"]["rule"]
    assert v["s001-prefill-floor"]["measured"]["residual_pct"] == pytest.approx(100 * 0.1 / 44)
    # the premium at the calibration chunk is shown, not scored: far off, still reproduced
    off = [curve(512, 0.29, 0.5), curve(1024, 0.90, 0.8), curve(2048, 0.07, 1.5)]
    sweet = verdicts(off)["s001-sweet-spot"]
    assert sweet["verdict"] == "reproduced" and sweet["measured"]["premium_1024_pct"] == pytest.approx(90)
    assert "calibration input" in sweet["rule"] and "rests on" in sweet["rule"].lower()
    # predictions out of band
    assert verdicts(chunk=(0.5, 1.0))["s001-chunk-time"]["measured"]["consistent_with_published"] is False
    slow = [curve(512, 0.29, 0.5), curve(1024, 0.15, 0.8), curve(2048, 0.07, 3.0)]
    v = verdicts(slow)
    assert v["s001-chunk-2048-gap"]["measured"]["consistent_with_published"] is False
    assert v["s001-stall-crawl"]["measured"]["consistent_with_published"] is False
    assert v["s001-stall-crawl"]["measured"]["chat_tok_s"] == pytest.approx(1 / 3.0)
    assert verdicts([curve(512, 0.60, 0.5), *GOOD[1:]])["s001-sweet-spot"]["verdict"] == "not reproduced"
    assert verdicts([curve(512, 0.29, 2.0), *GOOD[1:]])["s001-sweet-spot"]["verdict"] == "not reproduced"
    # a chunk size missing from the curves, or no number: not measured
    v = verdicts(GOOD[:2], chunk=(float("nan"), 1.0))
    assert v["s001-chunk-2048-gap"]["verdict"] == v["s001-stall-crawl"]["verdict"] == "not measured"
    assert v["s001-chunk-time"]["verdict"] == "not measured"
    # a profile not fitted on the floor: then the floor is a prediction and is scored
    no_floor = {k: f for k, f in INPUTS.items() if k != "floor_60k_s"}
    assert verdicts(inputs=no_floor)["s001-prefill-floor"]["verdict"] == "reproduced"
    assert verdicts(inputs=no_floor, floor_s=60.0)["s001-prefill-floor"]["verdict"] == "not reproduced"


def test_calibration_block_gives_each_fitted_input_its_residual():
    cal = calibration_block(INPUTS, floor_s=44.0 * 1.01, solo_itl_s=1 / 65, premium_at={1024: 0.15 * 0.9})
    fitted = {f["figure"]: f for f in cal["fitted"]}
    assert set(fitted) == {"floor_60k_s", "decode_tok_s", "premium_point"}
    assert fitted["floor_60k_s"]["residual_pct"] == pytest.approx(1.0)
    assert fitted["decode_tok_s"]["residual_pct"] == pytest.approx(0.0, abs=1e-9)
    assert fitted["premium_point"]["residual_pct"] == pytest.approx(-10.0)
    assert {i["figure"] for i in cal["inputs"]} == set(INPUTS)
    missing = calibration_block(INPUTS, floor_s=44.0, solo_itl_s=1 / 65, premium_at={})
    assert [f["residual_pct"] for f in missing["fitted"] if f["figure"] == "premium_point"] == [None]


def test_save_study_stores_verdicts_and_parameters(tmp_path):
    out = {"verdicts": list(verdicts().values()), "config": {"chunk_sizes": [512]}, "curves": GOOD,
           "calibration": {"fitted": []}, "floor_s": 44.1}
    paths = save_study(out, folder=tmp_path)
    doc = json.loads((tmp_path / "seed_scale.json").read_text())
    assert paths["results"].endswith("seed_scale.json")
    assert doc["parameters"] == {"chunk_sizes": [512]} and len(doc["verdicts"]) == 5
    assert doc["environment"]["platform"] == "sim-seed001" and "paths" not in doc
    assert math.isclose(doc["floor_s"], 44.1)
