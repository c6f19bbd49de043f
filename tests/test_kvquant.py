"""KV quantization: the backend probe and clear refusals (engine.kvquant); speed, crossover
arithmetic and quality (studies.kv_quant)."""

import random
from unittest import mock

import pandas as pd
import pytest

from mlxlab import load_model
from mlxlab.engine import kvquant as K
from mlxlab.studies.kv_quant import run as KS


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def test_probe_passes_on_the_cpu_backend():
    assert K.probe_kv_quant(4) == (True, "")
    assert K.probe_kv_quant(None) == (True, "")


@pytest.mark.parametrize("bits, group, match", [(3, 64, "kv_bits must be one of"), (4, 48, "does not divide")])
def test_check_kv_bits_refuses_with_what_to_do(bits, group, match):
    with pytest.raises(ValueError, match=match):
        K.check_kv_bits(bits, group, 64)


def test_a_backend_without_quantized_attention_is_refused_not_crashed():
    K._probe.cache_clear()
    with mock.patch.object(K, "quantized_scaled_dot_product_attention",
                           side_effect=RuntimeError("[quantized_matmul] No implementation for problem shape")):
        with pytest.raises(ValueError, match="Use kv_bits=None"):
            K.check_kv_bits(4, 64, 64)
    K._probe.cache_clear()
    K.check_kv_bits(4, 64, 64)  # the real backend again


def test_crossover_interpolates_between_measured_contexts():
    rows = []
    for c, none, q4 in ((256, 100, 70), (1024, 80, 72), (2048, 60, 66)):
        rows += [{"context_tokens": c, "kv_bits": "none", "decode_tok_s": none, "error": ""},
                 {"context_tokens": c, "kv_bits": "4", "decode_tok_s": q4, "error": ""}]
    x = KS.crossover(pd.DataFrame(rows), "4")
    assert 1024 < x < 2048
    assert KS.crossover(pd.DataFrame(rows), "8") is None


def test_eight_bit_kv_is_closer_to_full_precision_than_four_bit(tiny):
    rng = random.Random(0)
    toks = [rng.randrange(1, tiny.vocab_size) for _ in range(100)]
    q8 = KS.quality(tiny, toks, 8, prefix_tokens=64)
    q4 = KS.quality(tiny, toks, 4, prefix_tokens=64)
    assert 0 <= q8["kl_mean"] < q4["kl_mean"]
    assert q8["greedy_agreement"] >= q4["greedy_agreement"]


def test_decode_speed_reports_smaller_caches_for_fewer_bits(tiny):
    full = KS.decode_speed(tiny, 300, None, decode_tokens=4)
    four = KS.decode_speed(tiny, 300, 4, decode_tokens=4)
    assert four["kv_bytes"] < full["kv_bytes"] / 3
    assert full["decode_tok_s"] > 0 and four["decode_tok_s"] > 0


def test_a_shape_the_probe_missed_becomes_a_row_not_a_lost_sweep(tiny):
    """On the H200 the old probe passed and a real decode then failed at 513 keys: the sweep must
    keep every other measurement and say what failed."""
    real = KS.decode_speed

    def flaky(model, c, b, **kw):
        if b == 4:
            raise RuntimeError("[quantized_matmul] No implementation for problem shape: 1x513x128x12")
        return real(model, c, b, **kw)

    with mock.patch.object(KS, "decode_speed", side_effect=flaky):
        df = KS.speed_sweep(tiny, [64], (None, 4), decode_tokens=2, repeats=1, progress=False)
    ok, bad = df[df.kv_bits == "none"], df[df.kv_bits == "4"]
    assert len(ok) == 1 and ok.decode_tok_s.iloc[0] > 0 and ok.error.iloc[0] == ""
    assert len(bad) == 1 and "No implementation" in bad.error.iloc[0] and bad.decode_tok_s.isna().all()


def test_the_probe_tries_the_models_own_shape(tiny):
    shape = K.kv_shape(tiny)
    assert shape == {"head_dim": tiny.head_dim, "n_heads": tiny.config["num_attention_heads"],
                     "n_kv_heads": tiny.num_kv_heads, "dtype": "float32"}
    K._probe.cache_clear()
    with mock.patch.object(K, "quantized_scaled_dot_product_attention",
                           side_effect=RuntimeError("no kernel")) as q:
        ok, why = K.probe_model(tiny, 8)
    K._probe.cache_clear()
    assert not ok and "no kernel" in why and "context" in why
    queries = q.call_args.args[0]
    assert queries.shape[1] == shape["n_heads"] and queries.shape[-1] == shape["head_dim"]


def test_every_cache_decodes_from_one_prefill_left_unchanged(tiny):
    import mlx.core as mx

    pre = KS.prefill(tiny, 300, seed=0)
    keys, offsets = [mx.array(c.keys) for c in pre[0]], [c.offset for c in pre[0]]
    full = KS.decode_speed(tiny, 300, None, decode_tokens=4, prefilled=pre)
    KS.decode_speed(tiny, 300, 4, decode_tokens=4, prefilled=pre)
    assert [c.offset for c in pre[0]] == offsets
    assert all(mx.array_equal(k, c.keys).item() for k, c in zip(keys, pre[0]))
    assert full["kv_bytes"] == KS.decode_speed(tiny, 300, None, decode_tokens=4)["kv_bytes"]
