"""KV-cache quantization: can this backend run it, and a clear refusal when it cannot.

Reuses mlx-lm's ``QuantizedKVCache`` (through ``KVCache.to_quantized``) and its quantized
attention. A backend may lack quantized attention kernels for KV caches (mlx's CUDA backend
does), so :func:`probe_kv_quant` runs small quantized attentions at the model's shape once per
(device, bits, group, shape) and remembers the answer: the engine refuses a request up front
instead of crashing mid-batch. What quantization costs in speed and quality is measured in
:mod:`mlxlab.studies.kv_quant.run`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Dict, Optional, Tuple

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.base import quantized_scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

from mlxlab.core.presets import module_of

VALID_KV_BITS = (None, 4, 8)


# Context lengths before the probed step (the step adds 1 or 5 tokens: a decode step, a short
# chunk). A probe on fresh, aligned arrays can pass where a real decode fails: a cache's keys are
# a slice of a larger buffer, at unaligned lengths. So the probe goes through mlx-lm's own caches
# (KVCache -> to_quantized -> update_and_fetch, as generate_step does) at unaligned lengths, in
# the model's dtype and heads.
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
    module = module_of(model)
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


def _head_dim(model) -> int:
    hd = getattr(model, "head_dim", None)
    if hd:
        return int(hd)
    a = module_of(model).args
    return int(getattr(a, "head_dim", None) or a.hidden_size // a.num_attention_heads)
