"""probes/key_align_sim.py: a stored tune's stall_free settings simulated again on the tune's own
cost model, with coarser chunk alignments; the grid's settings as stored must come out as stored."""

import pytest

from mlxlab.core.costmodel import FEATURES, StepCostModel
from mlxlab.studies.tune.run import simulate_setting
from probes.key_align_sim import load_point, rows

COST = {"decode_step": 5e-3, "decode_batch": 3e-4, "prefill_chunks": 10e-3, "prefill_tokens": 15e-6,
        "cold_chunks": 60e-3}


def _doc(cold_key: str) -> dict:
    cm = StepCostModel.from_dict({"features": list(FEATURES), "coef": [COST.get(f, 0.0) for f in FEATURES],
                                  "cold_key": cold_key, "cold_capacity": 256})
    solo = {"chat": {"all": {"itl_s": {"p50": 0.006, "p90": 0.007, "p99": 0.01, "max": 0.02}},
                     "chat": {"itl_s": {"p50": 0.006, "p90": 0.007, "p99": 0.01, "max": 0.02}}}}
    doc = {"parameters": {"model": "tiny", "trace": "seed001_scene_tiny.jsonl", "length_scale": 4.0, "seed": 0},
           "profile": {"cost_model": cm.as_dict()}, "slos": ["chat.itl_p99<=3x"], "solo": solo,
           "objective": "batch.ttft_p50", "tenants": ["batch", "chat"],
           "grid": [{"label": "stall_free-256", "policy": "stall_free", "chunk_size": 2048,
                     "options": {"token_budget": 256}},
                    {"label": "interleave-256", "policy": "interleave", "chunk_size": 256, "options": {}}]}
    point = load_point(doc, "data/traces/samples")
    for g in doc["grid"]:  # the stored simulation, as tune writes it
        g["objective_s"] = simulate_setting({**point, "setting": g})["objective_s"]
    return doc


def test_the_stored_setting_comes_out_as_stored_and_a_coarser_alignment_meets_fewer_shapes():
    doc = _doc("shape")
    out = rows(doc, load_point(doc, "data/traces/samples"), "stall_free", [8, 128])
    assert [r["label"] for r in out] == ["stall_free-256"] * 3  # only the policy asked for
    stored, ka8, ka128 = out
    assert stored["as_stored"] and stored["objective_s"] == stored["stored_objective_s"]
    assert ka8["objective_s"] == stored["objective_s"]  # 8 is the default alignment
    # first uses cost 60 ms by shape: chunks ending on multiples of 128 repeat their shapes
    assert ka128["chat_itl_p50_s"] < 0.5 * ka8["chat_itl_p50_s"] and ka128["objective_s"] < ka8["objective_s"]


def test_a_tune_file_without_a_cost_model_or_trace_is_refused_with_what_to_do():
    doc = _doc("size")
    del doc["profile"]["cost_model"]
    with pytest.raises(ValueError, match="re-run mlxlab tune"):
        load_point(doc, "data/traces/samples")
    doc = _doc("size")
    doc["parameters"]["trace"] = None
    with pytest.raises(ValueError, match="--workload preset"):
        load_point(doc, "data/traces/samples")
