import math

import pytest

from mlxlab.studies.roofline import run as rl

TINY = dict(model_type="qwen2", hidden_size=256, num_hidden_layers=4, intermediate_size=512,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024,
            tie_word_embeddings=True, rms_norm_eps=1e-6)

# Hand count for TINY (tied, qwen2 has q/k/v biases):
#   embedding 1024*256 = 262,144 (also the lm_head)
#   attention/layer q 256*256 + k 256*128 + v 256*128 + o 256*256 = 196,608; x4 = 786,432
#   mlp/layer 3*256*512 = 393,216; x4 = 1,572,864
#   other: biases (256+128+128)*4 = 2,048 + norms (2*4+1)*256 = 2,304 -> 4,352
MATRIX = 262_144 + 786_432 + 1_572_864  # 2,621,440 quantizable weights
OTHER = 4_352


def test_bytes_per_param():
    assert rl.bytes_per_param() == 2
    assert rl.bytes_per_param(4) == 0.5 + 4 / 64  # 0.5625
    assert rl.bytes_per_param(8, group_size=32) == 1 + 4 / 32


def test_param_counts_tiny():
    p = rl.param_counts(TINY)
    assert p["embedding"] == 262_144 and p["lm_head"] == 0
    assert p["attention"] == 786_432 and p["mlp"] == 1_572_864 and p["other"] == OTHER
    assert p["total"] == p["active"] == 2_625_792


def test_weight_bytes_tiny_bf16_and_4bit():
    assert rl.weight_bytes_per_decode_step(TINY) == MATRIX * 2 + OTHER * 2 == 5_251_584
    assert rl.weight_bytes_per_decode_step(TINY, bits=4) == MATRIX * 0.5625 + OTHER * 2 == 1_483_264


def test_weight_bytes_match_mlx_lm_model():
    """The hand count equals the bytes of the real mlx-lm model, bf16 and 4-bit quantized."""
    mx = pytest.importorskip("mlx.core")
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    model = qwen2.Model(qwen2.ModelArgs.from_dict(TINY))
    model.set_dtype(mx.bfloat16)
    nbytes = lambda: sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    assert nbytes() == rl.weight_bytes_per_decode_step(TINY)
    nn.quantize(model, group_size=64, bits=4)
    assert nbytes() == rl.weight_bytes_per_decode_step(TINY, bits=4)


HYBRID_MOE = dict(model_type="qwen3_next", hidden_size=128, num_hidden_layers=8, intermediate_size=256,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_value_heads=4,
                  linear_num_key_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
                  linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
                  shared_expert_intermediate_size=128, mlp_only_layers=[], moe_intermediate_size=64,
                  rms_norm_eps=1e-6, vocab_size=512, rope_theta=1e4, partial_rotary_factor=0.25,
                  max_position_embeddings=4096, tie_word_embeddings=False, full_attention_interval=4)


def test_hybrid_moe_counts_match_mlx_lm_and_active_is_smaller():
    pytest.importorskip("mlx.core")
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_next

    model = qwen3_next.Model(qwen3_next.ModelArgs.from_dict(HYBRID_MOE))
    p = rl.param_counts(HYBRID_MOE)
    assert p["total"] == sum(v.size for _, v in tree_flatten(model.parameters()))
    # 2 of 8 routed experts per token: 6 experts x 3*128*64 per layer x 8 layers are not read
    assert p["total"] - p["active"] == 8 * 6 * 3 * 128 * 64


def test_kv_bytes_dense_and_hybrid():
    assert rl.kv_bytes_per_token(TINY) == 2 * 4 * 2 * 64 * 2  # 2,048 B/token
    assert rl.kv_bytes_per_token(TINY, kv_bits=8) == 2 * 4 * 2 * 64 * (1 + 4 / 64)
    dense = dict(TINY, num_hidden_layers=8)
    by_interval = dict(dense, full_attention_interval=4)
    by_types = dict(dense, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2)
    assert rl.kv_bytes_per_token(by_interval) == rl.kv_bytes_per_token(dense) / 4
    assert rl.kv_bytes_per_token(by_types) == rl.kv_bytes_per_token(dense) / 4
    sliding = dict(dense, layer_types=["sliding_attention"] * 5 + ["full_attention"] * 3)
    assert rl.kv_bytes_per_token(sliding) == rl.kv_bytes_per_token(dense) * 3 / 8


def test_seed001_arithmetic():
    ref = rl.seed001_reference()
    assert all(v["source"] for v in ref.values())
    bw, w = ref["bandwidth_gb_s"]["value"] * 1e9, ref["weight_gb_per_step"]["value"] * 1e9
    ceiling = rl.decode_ceiling_tok_s(bw, w)
    assert ceiling == pytest.approx(182, abs=0.5)
    assert ceiling == pytest.approx(ref["ceiling_tok_s"]["value"], rel=0.02)
    kv = ref["kv_kb_per_token"]["value"] * 1e3
    assert kv * 23_000 / 1e9 == pytest.approx(ref["kv_gb_at_23k"]["value"])
    assert kv * 130_000 / 1e9 == pytest.approx(ref["kv_gb_at_130k"]["value"])
    # KV reads lower the ceiling; batching raises the aggregate rate
    assert rl.decode_ceiling_tok_s(bw, w, kv * 23_000) == pytest.approx(546 / 3.46, rel=1e-6)
    assert rl.decode_ceiling_tok_s(bw, w, kv * 23_000, batch=4) > ceiling


def test_decode_estimate_matches_seed_table():
    assert rl.decode_estimate(546) == 65
    assert rl.decode_estimate(120) == pytest.approx(14, abs=0.5)
    assert rl.decode_estimate(4800) == pytest.approx(570, abs=2)


def test_measure_bandwidth_cpu_small():
    mx = pytest.importorskip("mlx.core")
    with mx.stream(mx.cpu):
        r = rl.measure_bandwidth(nbytes=8 * 2**20, repeats=3)
    assert math.isfinite(r["gb_s"]) and r["gb_s"] > 0
    assert r["best_gb_s"] >= r["gb_s"] and len(r["times_s"]) == 3
    assert r["device"]


def test_hardware_table():
    rows = rl.load_hardware_table()
    assert rows and all(r["source"].strip() for r in rows)
    names = {r["name"]: r for r in rows}
    m4 = next(r for n, r in names.items() if n.startswith("Apple M4 ("))
    assert m4["bandwidth_gb_s"] == 120
    h200 = names["NVIDIA H200"]
    assert h200["bandwidth_gb_s"] == 4800 and h200["memory_gb"] == 141
    assert max(r["bandwidth_gb_s"] for r in rows) == 80_000  # Groq SRAM
    assert all(r["bandwidth_gb_s"] > 0 for r in rows)


# ----------------------------------------------------------------------------- verdicts
from mlxlab.core.claims import check_verdicts  # noqa: E402
from mlxlab.studies.roofline import verdict as rv  # noqa: E402

SMALL = dict(TINY, hidden_size=512, num_hidden_layers=8, intermediate_size=1536, num_attention_heads=8,
             vocab_size=8192)


def point(decode_tok_s, bandwidth_gb_s=40.0, platform="here", preset="small", dtype="float32", bits=None, **kw):
    return rv.decode_point(platform=platform, source="t", commit="abc1234", preset=preset, config=SMALL,
                           dtype=dtype, bits=bits, bandwidth_gb_s=bandwidth_gb_s, bandwidth_source="test",
                           decode_tok_s=decode_tok_s, **kw)


def by_claim(records):
    return {r["claim"]: r for r in check_verdicts(records, experiment="roofline")}


def test_seed_arithmetic_recomputes_the_published_divisions():
    a = rv.seed_arithmetic()
    assert a["ceiling_tok_s"] == pytest.approx(182, abs=0.1) and a["fraction"] == pytest.approx(0.357, abs=0.001)
    assert a["kv_gb_23k"] == pytest.approx(0.46) and a["kv_gb_130k"] == pytest.approx(2.6)
    assert a["ssd_ceiling_tok_s"] == pytest.approx(4.67, abs=0.01)


def test_decode_point_divides_bandwidth_by_the_config_bytes():
    p = point(50.0, bandwidth_gb_s=40.0)
    w = rl.weight_bytes_per_decode_step(SMALL, dtype_bytes=4)
    assert p["weight_mb"] == pytest.approx(w / 1e6)
    assert p["ceiling_tok_s"] == pytest.approx(40e9 / w) and p["fraction"] == pytest.approx(50.0 / (40e9 / w))


def test_roofline_verdicts_reach_every_branch():
    kv_ok = {"config_bytes_per_token": 8192, "cache_bytes_per_token": 8192.0, "tokens": 512}
    ceiling = point(1.0)["ceiling_tok_s"]
    at = lambda frac, **kw: point(frac * ceiling, decode_cv=0.01, bandwidth_cv=0.01, **kw)  # noqa: E731

    # a third of the ceiling, no other machine: ceiling and fraction reproduced, scaling not measured
    v = by_claim(rv.roofline_verdicts(at(0.35), [], kv_ok))
    assert set(v) == {"s001-decode-ceiling", "s001-decode-fraction", "s001-kv-read", "s001-ssd-weights",
                      "s001-hardware-scaling"}
    assert v["s001-decode-ceiling"]["verdict"] == "reproduced"
    assert v["s001-decode-fraction"]["verdict"] == "reproduced"
    assert v["s001-decode-fraction"]["measured"]["fraction_here"] == pytest.approx(0.35)
    assert v["s001-kv-read"]["verdict"] == "reproduced" and v["s001-kv-read"]["measured"]["kv_rel_error"] == 0
    assert v["s001-ssd-weights"]["verdict"] == "not measured"
    assert v["s001-hardware-scaling"]["verdict"] == "not measured"

    # 10% of the ceiling: fraction not reproduced; decode above the ceiling: the bound fails
    assert by_claim(rv.roofline_verdicts(at(0.10), [], kv_ok))["s001-decode-fraction"]["verdict"] == "not reproduced"
    assert by_claim(rv.roofline_verdicts(at(1.5), [], kv_ok))["s001-decode-ceiling"]["verdict"] == "not reproduced"
    # outside the band but within 3x the repeats' spread (0.21 x 1.18 reaches 0.238): too noisy to say
    noisy = by_claim(rv.roofline_verdicts(point(0.21 * ceiling, decode_cv=0.06), [], kv_ok))
    assert noisy["s001-decode-fraction"]["verdict"] == "inconclusive"
    assert noisy["s001-decode-fraction"]["measured"]["spread_pct"] == pytest.approx(6.0)
    assert by_claim(rv.roofline_verdicts(point(1.1 * ceiling, decode_cv=0.06), [], kv_ok))[
        "s001-decode-ceiling"]["verdict"] == "inconclusive"
    # one outlying copy timing no longer widens the band: the spread is robust and in quadrature
    times = [1.0, 1.02, 0.98, 1.01, 0.99, 3.5]
    assert rv.robust_cv(times) < 0.05 < rv.statistics.stdev(times) / rv.statistics.median(times)
    assert rv.combined_spread({"decode_cv": 0.03, "bandwidth_cv": 0.3}, times) == pytest.approx(
        (0.03 ** 2 + rv.robust_cv(times) ** 2) ** 0.5)
    assert [rv.place(x, 1.0, 2.0, 0.05) for x in (1.5, 0.9, 0.5, 2.2, 3.0)] == [
        "inside", "unclear", "outside", "unclear", "outside"]

    # the cache holding other bytes than the config says: not reproduced; no cache measured: not measured
    bad = dict(kv_ok, cache_bytes_per_token=9000.0)
    assert by_claim(rv.roofline_verdicts(at(0.35), [], bad))["s001-kv-read"]["verdict"] == "not reproduced"
    assert by_claim(rv.roofline_verdicts(at(0.35), [], None))["s001-kv-read"]["verdict"] == "not measured"

    # other machines: the same fraction of a 10x ceiling scales, a tenth of it does not; the same
    # model is preferred over others and the committed runs are named
    same = point(0.35 * ceiling * 10, bandwidth_gb_s=400.0, platform="gpu")
    other_model = point(0.02 * ceiling * 10, bandwidth_gb_s=400.0, platform="gpu", preset="tiny")
    v = by_claim(rv.roofline_verdicts(at(0.35), [same, other_model], kv_ok))["s001-hardware-scaling"]
    assert v["verdict"] == "reproduced" and v["measured"]["same_model"] is True
    assert v["measured"]["other_points"] == 1 and "gpu/t@abc1234" in v["rule"]
    assert v["measured"]["bandwidth_ratio_x"] == pytest.approx(10)
    v = by_claim(rv.roofline_verdicts(at(0.35), [other_model], kv_ok))["s001-hardware-scaling"]
    assert v["verdict"] == "not reproduced" and v["measured"]["same_model"] is False
    assert v["measured"]["efficiency_ratio_x"] == pytest.approx(0.02 / 0.35)

    # nothing measured here: every measured claim says so
    v = by_claim(rv.roofline_verdicts(None, [same], None))
    assert {c: r["verdict"] for c, r in v.items()} == {c: "not measured" for c in v}


def test_committed_points_read_other_platforms_with_their_commit(tmp_path):
    import json

    hw = [{"name": "NVIDIA H200", "bandwidth_gb_s": 4800.0}]
    bench = {"environment": {"git_commit": "efc8fa9", "device_name": "NVIDIA H200"},
             "presets": {"small": {"model": {"dtype": "mlx.core.bfloat16", "bits": 4},
                                   "single_decode_tok_s": {"mlx_lm": {"median": 300.0}}},
                         "not-a-preset": {"model": {}, "single_decode_tok_s": {"mlx_lm": {"median": 1.0}}}}}
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "bench_engine.json").write_text(json.dumps(bench))
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "bench_engine.json").write_text(json.dumps(dict(bench, environment={"device_name": "?"})))
    pts = rv.committed_points(tmp_path, hw, exclude_platform="here")
    assert len(pts) == 1  # the cpu file names no known device and has no roofline.json: left out
    p = pts[0]
    assert (p["platform"], p["commit"], p["preset"], p["dtype"], p["bits"]) == ("h200", "efc8fa9", "small",
                                                                              "bfloat16", 4)
    assert p["bandwidth_gb_s"] == 4800 and "datasheet" in p["bandwidth_source"]
    # a roofline run on that platform: its measured bandwidth replaces the datasheet, its own point joins
    here = point(100.0, bandwidth_gb_s=3000.0, platform="h200")
    (tmp_path / "h200" / "roofline.json").write_text(json.dumps(
        {"environment": {"git_commit": "1234567"}, "bandwidth": {"gb_s": 3000.0}, "here": here}))
    pts = rv.committed_points(tmp_path, hw, exclude_platform="cpu")
    assert [(p["source"], p["bandwidth_gb_s"]) for p in pts] == [("roofline.json", 3000.0),
                                                                 ("bench_engine.json", 3000.0)]
    assert pts[0]["commit"] == "1234567"
    assert rv.committed_points(tmp_path, hw, exclude_platform="h200") == []


def test_hardware_estimates_follow_the_seed_rule():
    est = {r["name"]: r["decode_estimate_tok_s"] for r in rv.hardware_estimates(rl.load_hardware_table())}
    assert est["Apple M4 Max"] == 65 and est["NVIDIA H200"] == pytest.approx(571, abs=1)


def test_measure_decode_and_kv_cache_on_tiny():
    pytest.importorskip("mlx.core")
    from mlxlab import load_model

    m = load_model("tiny", dtype="float32")
    d = rl.measure_decode(m, prompt_tokens=16, decode_tokens=8, repeats=2)
    assert d["n"] == 2 and len(d["tok_s"]) == 2 and all(x > 0 for x in d["tok_s"]) and d["cv"] >= 0
    kv = rl.measure_kv_cache(m, 256)
    assert kv["allocated_tokens"] == 256
    assert kv["bytes_per_token"] == rl.kv_bytes_per_token(m.config, dtype_bytes=4) == m.kv_bytes_per_token()
