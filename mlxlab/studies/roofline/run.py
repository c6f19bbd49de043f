"""Bandwidth roofline for decode: bytes read per step, KV bytes per token, tok/s ceilings.

Decode is memory-bound: every step reads the active weights once, plus the KV cache of every
sequence in the batch. The functions here work on a plain Hugging Face style ``config.json``
dict, so they need no model download. Units: bytes, bytes/s, tokens/s unless a name says GB
(decimal, 1e9 bytes) or GB/s.

Counting rules (approximations, stated once):
* matrices (embeddings, projections, experts, routers) take ``bytes_per_param(bits)``; norms,
  biases and conv kernels stay at ``dtype_bytes`` (mlx quantizes Linear/Embedding only);
* hybrid layers: ``layer_types`` wins, else ``full_attention_interval`` k marks layers
  k-1, 2k-1, ... as full attention; linear-attention layers use the Qwen3-Next ``linear_*`` keys;
* only full-attention layers grow a per-token KV cache. Linear-attention layers keep a
  fixed-size state and sliding-window layers a cache capped at the window, so neither is
  counted in ``kv_bytes_per_token``.
"""
from __future__ import annotations

import csv
import statistics
import time
from pathlib import Path

from mlxlab.core.paths import data_dir


def _cfg(config: dict) -> dict:
    """Flatten VLM-style configs whose language model sits under ``text_config``."""
    return {**config, **config.get("text_config", {})} if "text_config" in config else config


def bytes_per_param(bits=None, group_size=64, dtype_bytes=2) -> float:
    """Bytes per weight: ``dtype_bytes`` unquantized, else bits/8 + one scale and one bias
    (each ``dtype_bytes``) per ``group_size`` weights. 4-bit, g64, bf16 -> 0.5625 B."""
    if bits is None:
        return float(dtype_bytes)
    return bits / 8 + 2 * dtype_bytes / group_size


def layer_kinds(config: dict) -> list[str]:
    """Per-layer attention kind: 'full_attention', 'linear_attention' or 'sliding_attention'."""
    c = _cfg(config)
    n = c["num_hidden_layers"]
    if c.get("layer_types"):
        return list(c["layer_types"])[:n]
    k = c.get("full_attention_interval")
    if k:
        return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]
    return ["full_attention"] * n


def param_counts(config: dict) -> dict:
    """Parameter counts (numbers of weights, not bytes).

    Keys: embedding, lm_head (0 if tied), attention, mlp (all experts + routers + shared),
    other (norms, biases, conv kernels: never quantized), total, active (read per token:
    routed experts limited to ``num_experts_per_tok``), active_matrix (active quantizable part
    excluding embedding/lm_head).
    """
    c = _cfg(config)
    h, n_layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    tied = c.get("tie_word_embeddings", True)
    mt = c.get("model_type", "")
    gated = c.get("attn_output_gate", mt.startswith(("qwen3_next", "qwen3_5")))
    q_out = heads * hd * (2 if gated else 1)
    full_attn = h * q_out + 2 * h * kv * hd + heads * hd * h
    attn_bias = c.get("attention_bias", mt == "qwen2")
    qk_norm = 2 * hd if mt.startswith("qwen3") else 0
    full_other = (q_out + 2 * kv * hd) * bool(attn_bias) + qk_norm
    if "linear_num_value_heads" in c:  # Qwen3-Next style gated delta net
        kd = c["linear_num_key_heads"] * c["linear_key_head_dim"]
        vd = c["linear_num_value_heads"] * c["linear_value_head_dim"]
        lin_attn = h * (2 * kd + 2 * vd) + h * 2 * c["linear_num_value_heads"] + vd * h
        conv = (2 * kd + vd) * c.get("linear_conv_kernel_dim", 4)
        lin_other = conv + 2 * c["linear_num_value_heads"] + c["linear_value_head_dim"]
    else:
        lin_attn, lin_other = full_attn, full_other
    kinds = layer_kinds(c)
    n_lin = sum(k == "linear_attention" for k in kinds)
    attention = (n_layers - n_lin) * full_attn + n_lin * lin_attn
    other = (n_layers - n_lin) * full_other + n_lin * lin_other + (2 * n_layers + 1) * h

    n_exp = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts") or 0
    if n_exp:
        moe_i = c.get("moe_intermediate_size") or c["intermediate_size"]
        shared_i = c.get("shared_expert_intermediate_size") or (c.get("n_shared_experts") or 0) * moe_i
        per_exp, shared = 3 * h * moe_i, 3 * h * shared_i + (h if shared_i else 0)
        router = h * n_exp
        mlp = n_layers * (n_exp * per_exp + shared + router)
        mlp_active = n_layers * (c.get("num_experts_per_tok", 1) * per_exp + shared + router)
    else:
        mlp = mlp_active = n_layers * 3 * h * c["intermediate_size"]

    embedding, lm_head = vocab * h, 0 if tied else vocab * h
    total = embedding + lm_head + attention + mlp + other
    return dict(embedding=embedding, lm_head=lm_head, attention=attention, mlp=mlp, other=other,
                total=total, active=total - mlp + mlp_active, active_matrix=attention + mlp_active)


def weight_bytes_per_decode_step(config: dict, bits=None, group_size=64, dtype_bytes=2) -> float:
    """Bytes of weights read by one decode step (batch 1), in bytes.

    Active layer weights + the output projection (vocab x hidden). The input embedding lookup
    reads one row; when tied, that row lies inside the lm_head matrix already counted, when
    untied one extra row of ``hidden_size`` weights is added.
    """
    c, p = _cfg(config), param_counts(config)
    head = c["vocab_size"] * c["hidden_size"] + (0 if p["lm_head"] == 0 else c["hidden_size"])
    return (p["active_matrix"] + head) * bytes_per_param(bits, group_size, dtype_bytes) + p["other"] * dtype_bytes


def kv_bytes_per_token(config: dict, kv_bits=None, group_size=64, dtype_bytes=2) -> float:
    """KV cache bytes added per token of context: 2 (K and V) x full-attention layers x
    kv heads x head_dim x bytes per element. Linear- and sliding-attention layers excluded."""
    c = _cfg(config)
    kv = c.get("num_key_value_heads") or c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    n_full = sum(k == "full_attention" for k in layer_kinds(c))
    return 2 * n_full * kv * hd * bytes_per_param(kv_bits, group_size, dtype_bytes)


def decode_ceiling_tok_s(bandwidth_bytes_s, weight_bytes, kv_bytes=0, batch=1) -> float:
    """Upper bound on decode tokens/s (all sequences together): each step reads the weights once
    plus ``kv_bytes`` per sequence (bytes of one sequence's KV cache) and emits ``batch`` tokens."""
    return batch * bandwidth_bytes_s / (weight_bytes + batch * kv_bytes)


def measure_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 10) -> dict:
    """Achieved memory bandwidth of an elementwise copy kernel (``x = x + 1``, float32) in mlx
    on the default device. Each pass reads and writes ``nbytes``: 2 * nbytes / time, in GB/s.

    Rebinding ``x`` lets mlx donate the input buffer to the output, so every pass runs in place:
    no fresh allocation, no page faults, and no hidden write-allocate read (a separate output
    buffer would cost ~3 * nbytes of traffic on a CPU). One untimed warm-up pass.
    Returns gb_s (median over ``repeats``), best_gb_s, cv (std / mean of the per-pass rates),
    device, device_name, nbytes, times_s.
    """
    import mlx.core as mx  # mlx only inside the measuring functions: the rest is arithmetic on configs

    x = mx.zeros((max(nbytes // 4, 1),), dtype=mx.float32)
    mx.eval(x)
    x = x + 1  # warm-up: kernel, first touch of the pages
    mx.eval(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x = x + 1
        mx.eval(x)
        times.append(time.perf_counter() - t0)
    moved = 2 * x.nbytes
    try:
        name = mx.device_info().get("device_name", "")
    except Exception:  # older mlx
        name = ""
    rates = [moved / t for t in times]
    cv = statistics.stdev(rates) / statistics.mean(rates) if len(rates) > 1 else float("nan")
    return dict(gb_s=moved / statistics.median(times) / 1e9, best_gb_s=moved / min(times) / 1e9, cv=cv,
                device=str(mx.default_device()), device_name=name, nbytes=x.nbytes, times_s=times)


def measure_decode(model, *, prompt_tokens: int = 128, decode_tokens: int = 64, repeats: int = 5,
                   seed: int = 0) -> dict:
    """Single-stream decode tok/s of a loaded model through mlx-lm's ``generate_step`` (the
    reference implementation), on one random prompt of ``prompt_tokens``: per repeat,
    (tokens - 1) / (last token time - first token time), so the prefill is not counted. One
    untimed run of the same shapes first. Returns tok_s (per repeat), median, p99, min, max, n,
    cv (std / mean over repeats), prompt_tokens, decode_tokens and context_tokens_mean (the
    mean context a decode step reads)."""
    import numpy as np  # with mlx: only when measuring

    from mlxlab.core.metrics import median_and_p99
    from mlxlab.core.presets import model_limits
    from mlxlab.engine.warmup import random_prompt
    from mlxlab.studies.engine_bench.run import mlx_lm_single

    vocab, _ = model_limits(model)
    prompt = random_prompt(prompt_tokens, vocab, seed)
    mlx_lm_single(model, prompt, decode_tokens, prefill_step_size=max(prompt_tokens, 1))  # warm-up
    rates = []
    for _ in range(repeats):
        t = mlx_lm_single(model, prompt, decode_tokens, prefill_step_size=max(prompt_tokens, 1))["times"]
        rates.append((len(t) - 1) / (t[-1] - t[0]))
    v = np.asarray(rates)
    return {**median_and_p99(rates), "tok_s": rates,
            "cv": float(v.std(ddof=1) / v.mean()) if v.size > 1 else float("nan"),
            "prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens,
            "context_tokens_mean": prompt_tokens + decode_tokens / 2}


def measure_kv_cache(model, tokens: int = 512, seed: int = 0) -> dict:
    """The bytes mlx-lm's prompt cache holds after one forward pass over ``tokens`` random tokens:
    the sum of every layer cache's ``nbytes``, over the positions allocated (mlx-lm's ``KVCache``
    grows in steps of 256, so a multiple of 256 allocates exactly ``tokens``). Returns nbytes,
    tokens, allocated_tokens and bytes_per_token (nbytes / allocated_tokens)."""
    import mlx.core as mx  # only when measuring
    from mlx_lm.models.cache import make_prompt_cache

    from mlxlab.core.presets import model_limits, module_of
    from mlxlab.engine.warmup import random_prompt

    module = module_of(model)
    cache = make_prompt_cache(module)
    logits = module(mx.array(random_prompt(tokens, model_limits(model)[0], seed))[None], cache=cache)
    mx.eval(logits, [a for c in cache for a in (getattr(c, "keys", None), getattr(c, "values", None))
                     if isinstance(a, mx.array)])
    nbytes = sum(int(getattr(c, "nbytes", 0)) for c in cache)
    allocated = max((int(c.keys.shape[2]) for c in cache if getattr(c, "keys", None) is not None), default=tokens)
    return {"nbytes": nbytes, "tokens": tokens, "allocated_tokens": allocated,
            "bytes_per_token": nbytes / allocated if allocated else float("nan")}


def load_hardware_table(path=None, as_frame: bool = False):
    """Rows of ``data/hardware.csv`` as dicts (bandwidth_gb_s, memory_gb as float or None);
    a pandas DataFrame if ``as_frame``."""
    path = Path(path) if path else data_dir() / "hardware.csv"
    if as_frame:
        import pandas as pd  # optional: only for a DataFrame
        return pd.read_csv(path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("bandwidth_gb_s", "memory_gb"):
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
    return rows


def decode_estimate(bandwidth_gb_s, reference_tok_s=65, reference_bandwidth_gb_s=546) -> float:
    """Indicative decode tok/s at another bandwidth: a measured rate scaled by the bandwidth
    ratio (same model, batch 1, software efficiency held fixed), the seed-001 table's rule."""
    return reference_tok_s * bandwidth_gb_s / reference_bandwidth_gb_s


def seed001_reference() -> dict:
    """Published seed-001 figures this module checks: name -> {value, unit, source}."""
    src = "seeds/seed-001 (Apple Silicon serving case study), "
    figs = {
        "bandwidth_gb_s": (546, "GB/s", "setup: M4 Max, 128 GB unified memory"),
        "weight_gb_per_step": (3, "GB", "setup: ~3B active params, mxfp8, ~3 GB touched per token"),
        "ceiling_tok_s": (180, "tok/s", "'Two jobs': 546 GB/s / ~3 GB per step"),
        "measured_decode_tok_s": (65, "tok/s", "'Two jobs': measured 60-70 tok/s, ~36% of roofline"),
        "kv_kb_per_token": (20, "KB", "'Two jobs': hybrid, ~1/4 full-attention layers"),
        "kv_gb_at_23k": (0.46, "GB", "'Two jobs': 23k tokens x 20 KB"),
        "kv_gb_at_130k": (2.6, "GB", "'resident KV-cache overhead': 130k tokens x 20 KB"),
    }
    return {k: dict(value=v, unit=u, source=src + s) for k, (v, u, s) in figs.items()}
