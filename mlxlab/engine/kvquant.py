"""KV-cache quantization: can this backend run it, what it costs in speed, what it costs in quality.

Reuses mlx-lm's ``QuantizedKVCache`` (through ``KVCache.to_quantized``) and its quantized
attention. mlx's CUDA backend has no quantized attention kernel for KV caches, so
:func:`probe_kv_quant` runs small quantized attentions at the model's shape once per (device,
bits, group, shape) and remembers the answer: callers refuse a request up front instead of
crashing mid-batch.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
import pandas as pd
from mlx.utils import tree_flatten
from mlx_lm.models.base import quantized_scaled_dot_product_attention
from mlx_lm.models.cache import KVCache, make_prompt_cache

VALID_KV_BITS = (None, 4, 8)


# Context lengths before the probed step (the step adds 1 or 5 tokens: a decode step, a short
# chunk). The H200 run of 2026-11-29 passed a probe on fresh 32-key arrays and then failed in a
# real decode at a 513-token context with "[quantized_matmul] No implementation for problem
# shape: 1x513x128x12" (bfloat16, 8 bits): the cache's keys are a slice of a larger buffer and
# unaligned. So the probe goes through mlx-lm's own caches (KVCache -> to_quantized ->
# update_and_fetch, as generate_step does) at unaligned lengths, in the model's dtype and heads.
PROBE_CONTEXTS = (32, 255, 512)
PROBE_QUERIES = (1, 5)


@lru_cache(maxsize=None)
def _probe(device: str, bits: int, group_size: int, head_dim: int, n_heads: int, n_kv_heads: int,
           dtype: str) -> Tuple[bool, str]:
    dt = getattr(mx, dtype)
    rand = lambda *shape: mx.random.normal(shape).astype(dt)  # noqa: E731
    for ctx in PROBE_CONTEXTS:
        for lq in PROBE_QUERIES:
            try:
                cache = KVCache()
                cache.update_and_fetch(rand(1, n_kv_heads, ctx, head_dim), rand(1, n_kv_heads, ctx, head_dim))
                qcache = cache.to_quantized(group_size=group_size, bits=bits)
                k, v = qcache.update_and_fetch(rand(1, n_kv_heads, lq, head_dim), rand(1, n_kv_heads, lq, head_dim))
                out = quantized_scaled_dot_product_attention(rand(1, n_heads, lq, head_dim), k, v,
                                                             scale=head_dim ** -0.5, mask=None,
                                                             group_size=group_size, bits=bits)
                mx.eval(out)
            except Exception as exc:  # the backend's own words go into the error we raise later
                return False, (f"{type(exc).__name__} at a {ctx + lq}-token context, {lq} new token(s): "
                               f"{str(exc).splitlines()[0][:300]}")
    return True, ""


def kv_shape(model) -> Dict:
    """The attention shape the probe must try for ``model``: head_dim, query and KV heads, and
    the activation dtype (a LoadedModel or an mlx-lm module)."""
    module = getattr(model, "module", model)
    a = module.args
    n_heads = int(a.num_attention_heads)
    dtype = next((p.dtype for _, p in tree_flatten(module.parameters()) if mx.issubdtype(p.dtype, mx.floating)),
                 mx.float32)
    return {"head_dim": _head_dim(model), "n_heads": n_heads,
            "n_kv_heads": int(getattr(a, "num_key_value_heads", None) or n_heads),
            "dtype": str(dtype).split(".")[-1]}


def probe_kv_quant(bits: Optional[int], group_size: int = 64, head_dim: int = 64, *, n_heads: int = 2,
                   n_kv_heads: int = 1, dtype: str = "float32") -> Tuple[bool, str]:
    """``(True, "")`` if the default device runs quantized attention at these settings, else
    ``(False, reason)``: a decode step and a short chunk through mlx-lm's quantized cache at
    unaligned context lengths (see :data:`PROBE_CONTEXTS`). Pass the model's shape (:func:`kv_shape`). Cached per
    device and setting."""
    if bits is None:
        return True, ""
    return _probe(str(mx.default_device()), int(bits), int(group_size), int(head_dim), int(n_heads),
                  int(n_kv_heads), str(dtype))


def probe_model(model, bits: Optional[int], group_size: int = 64) -> Tuple[bool, str]:
    """:func:`probe_kv_quant` at ``model``'s own attention shape and dtype."""
    return probe_kv_quant(bits, group_size, **kv_shape(model))


def check_kv_bits(bits: Optional[int], group_size: int, head_dim: int, **shape) -> None:
    """Raise ``ValueError`` saying what to do if ``bits``/``group_size`` cannot run here
    (``shape``: n_heads, n_kv_heads, dtype, as :func:`kv_shape` gives them)."""
    if bits not in VALID_KV_BITS:
        raise ValueError(f"kv_bits must be one of {VALID_KV_BITS}, got {bits!r}")
    if bits is None:
        return
    if not isinstance(group_size, int) or group_size <= 0 or head_dim % group_size:
        raise ValueError(f"kv_group_size {group_size!r} does not divide the model's head_dim {head_dim}; "
                         f"use a group size that divides it (e.g. 32 or 64)")
    ok, why = probe_kv_quant(bits, group_size, head_dim, **shape)
    if not ok:
        raise ValueError(f"kv_bits={bits} cannot run on {mx.default_device()}: its quantized attention failed "
                         f"({why}). Use kv_bits=None on this backend.")


def _quantize_cache(cache: List, bits: Optional[int], group_size: int) -> List:
    if bits is None:
        return cache
    return [c.to_quantized(group_size=group_size, bits=bits) if isinstance(c, KVCache) else c for c in cache]


def kv_bytes(cache: List) -> int:
    return int(sum(c.nbytes for c in cache))


def decode_speed(model, context_tokens: int, kv_bits: Optional[int], *, decode_tokens: int = 32,
                 group_size: int = 64, seed: int = 0, chunk: int = 2048) -> Dict:
    """Decode tok/s at a context: prefill ``context_tokens`` random tokens, quantize the cache
    (as ``generate_step`` does past ``quantized_kv_start``), then time ``decode_tokens``
    greedy steps, pipelined like ``generate_step``. Also returns the cache's bytes."""
    module = getattr(model, "module", model)
    vocab = module.args.vocab_size
    rng = np.random.default_rng(seed)
    prompt = mx.array(rng.integers(1, vocab, size=context_tokens).tolist())
    cache = make_prompt_cache(module)
    for i in range(0, context_tokens, chunk):
        module(prompt[None, i:i + chunk], cache=cache)
        mx.eval([c.state for c in cache])
    cache = _quantize_cache(cache, kv_bits, group_size)
    mx.eval([c.state for c in cache])
    y = mx.array([[int(prompt[-1].item())]])

    def step(y):
        return mx.argmax(module(y, cache=cache)[:, -1, :], axis=-1)[:, None]

    y = step(y)
    mx.eval(y)  # first step outside the clock
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        nxt = step(y)
        mx.async_eval(nxt)
        y.item()
        y = nxt
    y.item()
    dt = time.perf_counter() - t0
    return {"context_tokens": context_tokens, "kv_bits": "none" if kv_bits is None else str(kv_bits),
            "decode_tok_s": decode_tokens / dt, "kv_bytes": kv_bytes(cache)}


def speed_sweep(model, contexts: Sequence[int], bits: Sequence[Optional[int]] = (None, 8, 4), *,
                decode_tokens: int = 32, repeats: int = 3, group_size: int = 64, progress: bool = True) -> pd.DataFrame:
    """:func:`decode_speed` over contexts x bits x repeats (bits the backend cannot run are
    skipped with a row saying why). Columns: context_tokens, kv_bits, repeat, decode_tok_s,
    kv_bytes, error."""
    rows = []
    runnable = []
    for b in bits:
        ok, why = probe_model(model, b, group_size)
        if ok:
            runnable.append(b)
        else:
            rows.append({"context_tokens": None, "kv_bits": str(b), "repeat": None, "decode_tok_s": None,
                         "kv_bytes": None, "error": why})
    it = [(r, c, b) for r in range(repeats) for c in contexts for b in runnable]
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="kv speed", leave=False)
    for r, c, b in it:
        try:
            row = decode_speed(model, c, b, decode_tokens=decode_tokens, group_size=group_size, seed=r)
        except RuntimeError as exc:  # a shape the probe did not try: a row saying so, not a lost sweep
            row = {"context_tokens": c, "kv_bits": "none" if b is None else str(b), "decode_tok_s": None,
                   "kv_bytes": None, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            rows.append({**row, "repeat": r})
            continue
        rows.append({**row, "repeat": r, "error": ""})
    return pd.DataFrame(rows)


def crossover(df: pd.DataFrame, bits: str) -> Optional[float]:
    """The smallest measured context at which ``bits`` decodes at least as fast as unquantized
    (medians), linearly interpolated between measured contexts; None if it never does."""
    med = df[df.error == ""].groupby(["kv_bits", "context_tokens"]).decode_tok_s.median().unstack(0)
    if "none" not in med or bits not in med:
        return None
    ratio = (med[bits] / med["none"]).dropna()
    xs, ys = ratio.index.to_numpy(dtype=float), ratio.to_numpy()
    for i, y in enumerate(ys):
        if y >= 1.0:
            if i == 0:
                return float(xs[0])
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return float(x0 + (1.0 - y0) * (x1 - x0) / (y1 - y0))
    return None


def quality(model, tokens: Sequence[int], kv_bits: int, *, prefix_tokens: int, group_size: int = 64) -> Dict:
    """Teacher-forced comparison after a ``prefix_tokens`` prefix: both caches hold the same
    prefix, one quantized; then each following token is fed to both and the next-token
    distributions compared. Returns mean/max KL(full || quantized) in nats, greedy agreement,
    and both perplexities over the continuation."""
    module = getattr(model, "module", model)
    toks = mx.array(list(tokens))
    ref, q = make_prompt_cache(module), make_prompt_cache(module)
    module(toks[None, :prefix_tokens], cache=ref)
    module(toks[None, :prefix_tokens], cache=q)
    q = _quantize_cache(q, kv_bits, group_size)
    kls, agree, nll_ref, nll_q = [], [], [], []
    for i in range(prefix_tokens, len(tokens) - 1):
        x = toks[None, i:i + 1]
        lr = module(x, cache=ref)[0, -1].astype(mx.float32)
        lq = module(x, cache=q)[0, -1].astype(mx.float32)
        pr, pq = lr - mx.logsumexp(lr), lq - mx.logsumexp(lq)
        kl = mx.sum(mx.exp(pr) * (pr - pq))
        nxt = toks[i + 1]
        mx.eval(kl, pr, pq)
        kls.append(float(kl.item()))
        agree.append(int(mx.argmax(pr).item()) == int(mx.argmax(pq).item()))
        nll_ref.append(-float(pr[nxt].item()))
        nll_q.append(-float(pq[nxt].item()))
    return {"kv_bits": kv_bits, "prefix_tokens": prefix_tokens, "positions": len(kls),
            "kl_mean": float(np.mean(kls)), "kl_max": float(np.max(kls)),
            "greedy_agreement": float(np.mean(agree)),
            "ppl_full": float(np.exp(np.mean(nll_ref))), "ppl_quantized": float(np.exp(np.mean(nll_q)))}


def _head_dim(model) -> int:
    hd = getattr(model, "head_dim", None)
    if hd:
        return int(hd)
    a = getattr(model, "module", model).args
    return int(getattr(a, "head_dim", None) or a.hidden_size // a.num_attention_heads)
