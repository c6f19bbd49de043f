"""The scheduling study (mlxlab.studies.scheduling) on the tiny model: structure, not speed.

No wall-clock thresholds: the numbers depend on the machine. The tests check that every claim is
there with finite numbers, that the ratios are computed from the runs' real token gaps, and that
only the asked policies run and make claims.
"""

import json
import math
import shutil
from pathlib import Path

import pytest

from mlxlab import Engine, load_model
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import Workload
from mlxlab.studies import scheduling as ex
from mlxlab.studies.scheduling_metrics import aggregate, run_metrics
from mlxlab.studies.scheduling_plan import batch_tenant, chat_tenant, default_scale

CLAIM_KEYS = {"name", "goal", "measured", "passed", "status", "evidence"}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


@pytest.fixture(scope="module")
def study(tiny):
    return ex.scheduling_study(tiny, platform_scale=1 / 64, chunk_sizes=(128, 512), workers=(1, 2),
                               repeats=1, warmup=False)


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_run_metrics_from_real_gaps(tiny):
    wl = Workload([chat_tenant(16, 40), batch_tenant(2, (200, 300), 2, 0.02)], vocab_size=tiny.vocab_size, seed=1)
    res = run_workload(Engine(tiny, chunk_size=128), wl)
    m = run_metrics(res, 128)
    chat = [r for r in res.submitted if r.tenant == "chat"][0]
    batch = [r for r in res.submitted if r.tenant == "batch"]
    assert m["chat_gaps_s"] == chat.itl_s and m["chat_worst_gap_s"] == max(chat.itl_s)
    assert set(m["contended_gaps_s"]) <= set(chat.itl_s) and m["contended_gaps_s"]
    assert m["long_ttft_s"] == max(r.ttft_s for r in batch)
    # one chunk time: a step that ran a single long-prompt chunk, read from the step records
    one = [s for s in res.executor.steps if len({p[0] for p in s.prefill} & {r.id for r in batch}) == 1]
    assert min(s.duration_s for s in one) <= m["chunk_time_s"] <= m["chunk_time_max_s"] == max(s.duration_s for s in one)
    agg = aggregate([m, m])
    assert agg["repeats"] == 2 and agg["chat_worst_gap_s"] == m["chat_worst_gap_s"]
    assert agg["pooled_gaps"] == 2 * len(m["contended_gaps_s"])


def test_study_structure(study):
    json.dumps(study)  # JSON-able (NaN allowed; save_results writes null)
    names = {c["name"] for c in study["claims"]}
    expected = {"stall_interleave", "stall_mlx_lm", "interleave_matches_mlx_lm", "admission_gate_bounded",
                "slo_chat_itl", "slo_alone_ttft", "slo_not_dominated", "stall_free_chat_itl", "stall_free_fusion",
                "slo_packed_chat_itl"}
    assert expected <= names
    fusion = next(c for c in study["claims"] if c["name"] == "stall_free_fusion")
    # tiny is a qwen2 model: both the packed and the back-to-back runs had mixed steps to time
    assert fusion["evidence"]["fusable_model"] and finite(fusion["measured"]) and fusion["measured"] > 0
    assert {"overlap_ttft", "overlap_chat_itl"} <= names
    for c in study["claims"]:
        assert CLAIM_KEYS <= set(c), c
        assert c["status"] in ("measured", "skipped")
        if c["status"] == "measured":
            assert isinstance(c["passed"], bool), c
    refs = study["references"]
    assert finite(refs["solo_itl_s"]) and refs["solo_itl_s"] > 0
    assert finite(refs["alone_ttft_2048_s"]) and refs["alone_ttft_2048_s"] > 0
    lo, hi = study["config"]["long_prompt_tokens"]
    assert (lo, hi) == (256, 512)


def test_stall_ratio_is_worst_gap_over_solo_itl(study):
    claims = {c["name"]: c for c in study["claims"]}
    rows = {r["config"]: r for r in study["table"]}
    solo = study["references"]["solo_itl_s"]
    c = claims["stall_interleave"]
    row = rows["stall/interleave/w2"]
    assert finite(c["measured"]) and c["measured"] == pytest.approx(row["chat_worst_gap_s"] / solo)
    assert row["chat_worst_gap_s"] == row["chat_worst_gap_runs_s"][0]  # one repeat: the run's own max gap
    # the worst gap is one of the chat's gaps: at least the median of those the long prompts contended
    assert row["chat_worst_gap_s"] >= row["pooled_itl_p50_s"] > 0
    assert row["pooled_gaps"] > 0
    gate = claims["admission_gate_bounded"]["evidence"]
    for w in (1, 2):
        assert finite(gate["worst_gap_s"][w]) and finite(gate["chunk_time_s"][w])
    slo = claims["slo_chat_itl"]["evidence"]
    for k in ("chat_itl_p50_s", "chat_itl_p99_s", "chat_itl_max_s", "long_ttft_s", "long_ttft_over_alone_2048"):
        assert finite(slo[k]), k
    assert slo["itl_target_s"] == pytest.approx(2 * solo)
    text = ex.format_table(study)
    assert "stall_interleave" in text and "gate/admission_gate/w2" in text


def test_only_the_asked_policies_run_and_claim(tiny):
    s = ex.scheduling_study(tiny, platform_scale=1 / 128, policies=("interleave", "slo"),
                            chunk_sizes=(256,), workers=(1,), repeats=1, warmup=False)
    claims = {c["name"]: c for c in s["claims"]}
    assert set(claims) == {"stall_interleave", "slo_chat_itl", "slo_packed_chat_itl", "slo_alone_ttft",
                           "slo_not_dominated"}
    assert all(c["status"] == "measured" and isinstance(c["passed"], bool) for c in claims.values())
    assert claims["stall_interleave"]["status"] == "measured"
    assert s["config"]["policies_run"] == ["interleave", "slo"]
    scenarios = {r["config"].split("/")[0] for r in s["table"]}
    assert scenarios == {"solo", "alone", "stall", "tradeoff", "contended"}
    assert not any("mlx_lm" in r["config"] or "overlap" in r["config"] for r in s["table"])
    with pytest.raises(ValueError):
        ex.scheduling_study(tiny, policies=("nope",), repeats=1)


def test_default_scale_follows_the_device_and_the_models_context(tiny):
    import mlx.core as mx

    device = 1.0 if mx.default_device().type == mx.DeviceType.gpu else 1 / 16
    assert default_scale(tiny) == min(device, tiny.max_context / 32768)
    short = {"vocab_size": 256, "max_position_embeddings": 1024}
    assert default_scale(short) == 1024 / 32768  # lowered so the longest long prompt fits the context


def test_the_study_warms_every_contention_executor_and_records_how_long_it_took(tiny, study):
    # on the H200 the first run of a new shape class held one step for 40 s: the study warms the
    # executors it will measure, and keeps the warm-up times (a backend's first-use cost)
    assert study["warmup_s"] == {}  # warmup=False
    s = ex.scheduling_study(tiny, platform_scale=1 / 128, policies=("interleave", "slo"), chunk_sizes=(256,),
                            workers=(1,), repeats=1, warmup=True)
    assert set(s["warmup_s"]) == {"executors", "contention"}
    assert all(v > 0 for v in s["warmup_s"].values()) and sum(s["warmup_s"].values()) < s["wall_s"]


def test_cli_writes_results(tiny, tmp_path, monkeypatch):
    from mlxlab.cli import build_parser

    root = Path(__file__).resolve().parent.parent / "data" / "models"
    (tmp_path / "models").mkdir()
    shutil.copy(root / "tiny.json", tmp_path / "models" / "tiny.json")
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    args = build_parser().parse_args(["bench", "scheduling", "--model", "tiny", "--quick", "--repeats", "1",
                                      "--scale", str(1 / 128), "--workers", "1", "--chunk-sizes", "256",
                                      "--policies", "interleave", "mlx_lm", "--platform", "test", "--quiet"])
    assert args.func(args) == 0
    doc = json.loads((tmp_path / "results" / "test" / "scheduling.json").read_text())
    assert {"environment", "config", "claims", "table", "references"} <= set(doc)
    assert doc["config"]["quick"] is True and doc["model"]["preset"] == "tiny"
    # every finished run is also on disk as it ends, one JSON line each, so a cut run keeps them
    lines = (tmp_path / "results" / "test" / "scheduling_runs.jsonl").read_text().splitlines()
    assert len(lines) == len(doc["table"]) and all(json.loads(x)["config"] for x in lines)
