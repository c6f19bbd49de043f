import math

import pytest

from mlxlab.studies import roofline as rl

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
