"""One forward pass for a decode step and prefill chunks together (the stall-free step packed).

mlx-lm's model ``__call__`` takes one cache per call, and the decode rows (a left-padded
``BatchKVCache``, one query each) and a prompt chunk (its own ``KVCache``, many causal queries)
cannot share one cache. So mlx-lm can only run them back to back: every weight is read twice
per step. This module walks the *same* mlx-lm modules (embedding, norms, projections, rope,
MLP, head) of a llama or qwen2 model itself and packs every token of the step through the linear
layers at once, while attention runs per segment on that segment's own cache and mask, through
mlx-lm's own ``scaled_dot_product_attention`` (so a quantized cache still works). It is a
twin of those two families' ``__call__`` and nothing more: no weights or caches of its own.

Only families whose layer is exactly ``h + attn(norm(h)); h + mlp(norm(h))`` with full
attention everywhere are accepted (:func:`can_fuse`); anything else runs back to back.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

FUSABLE_TYPES = ("llama", "qwen2")
SDPA_CACHE_DEFAULT = 256  # mlx's MLX_CUDA_SDPA_CACHE_SIZE default (cuDNN attention graphs kept)


def cudnn_attention() -> bool:
    """Whether the default device is mlx's CUDA backend with cuDNN attention on (its default;
    ``MLX_CUDA_USE_CUDNN_SDPA=0`` turns it off, read once by mlx at its first attention)."""
    import os

    cuda = getattr(mx, "cuda", None)
    if mx.default_device() != mx.gpu or cuda is None or not cuda.is_available():
        return False
    return os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "1") != "0"


def packs_well() -> Tuple[bool, str]:
    """``(True, "")`` where a packed step is the faster way to run a step's decode beside a chunk on
    the default device, else ``(False, why)``. On mlx's CUDA backend with cuDNN attention on (its
    default; ``MLX_CUDA_USE_CUDNN_SDPA=0`` turns it off) it is not: the H200's scheduling study
    measured a packed ``stall_free`` step at 102 ms against 36 ms for the same step back to back
    (46 ms packed with cuDNN attention off; ``data/results/h200/scheduling_cudnn.json`` and
    ``scheduling.json``), and the H100 tunes ran packed ``stall_free`` settings several times slower
    than their simulation (``data/results/h100/tune_*_before_unpacked.json``). The CPU and Metal pack as before."""
    if not cudnn_attention():
        return True, ""
    return False, ("mlx's CUDA backend with cuDNN attention on (MLX_CUDA_USE_CUDNN_SDPA unset): a packed step "
                   "measured several times slower than its decode and chunk back to back")


def cold_keying() -> Tuple[str, Optional[int], str]:
    """How the default device keys the work it prepares for a chunk on first use, as
    :class:`mlxlab.core.costmodel.WarmShapes` counts cold chunks: ``("shape", capacity, why)`` on
    mlx's CUDA backend with cuDNN attention on, which builds one cuDNN graph per exact query, key
    and value shape (and stride) and keeps ``MLX_CUDA_SDPA_CACHE_SIZE`` of them (256 by default:
    ``mlx/backend/cuda/scaled_dot_product_attention.cpp``), else ``("size", None, "")``: a chunk is
    warm once its token count ran."""
    import os

    if not cudnn_attention():
        return "size", None, ""
    raw = os.environ.get("MLX_CUDA_SDPA_CACHE_SIZE", "")
    capacity = int(raw) if raw.strip().isdigit() and int(raw) > 0 else SDPA_CACHE_DEFAULT
    return "shape", capacity, (f"mlx's CUDA backend with cuDNN attention on: one attention graph per (query, key) "
                               f"shape, {capacity} kept")


def shape_alignment(policy: str, options: dict) -> Optional[int]:
    """The ``key_align`` a device that prepares attention per exact shape (:func:`cold_keying`)
    wants for ``policy`` with ``options``: half ``stall_free``'s token budget (its chunk follows
    the decode batch, so its key length would land somewhere new nearly every step), and
    :data:`mlxlab.core.plan.SLO_KEY_ALIGN_SHAPES` for ``slo`` (its chunk is chosen anew each step);
    None for policies whose chunks have a fixed size. On an H100 the first rule took coder-1.5b's
    ``stall_free-256`` chat ITL p99 from 215 to 43 ms (``data/results/h100/tune_qwen2.5-coder-1.5b*.json``)."""
    import inspect

    from mlxlab.core.plan import KEY_ALIGN, SLO_KEY_ALIGN_SHAPES

    if policy == "stall_free":
        from mlxlab.policies.stall_free import StallFree

        budget = options.get("token_budget", inspect.signature(StallFree).parameters["token_budget"].default)
        return max(KEY_ALIGN, int(budget) // 2)
    return SLO_KEY_ALIGN_SHAPES if policy == "slo" else None


def alignment_warning(policy: str, options: dict) -> str:
    """What ``mlxlab serve`` warns of when ``policy`` runs without a ``key_align`` of its own on a
    device that keys attention by shape; "" otherwise (a fixed chunk size, another device, or an
    alignment the user chose)."""
    key, _, why = cold_keying()
    want = shape_alignment(policy, options)
    if key != "shape" or want is None or "key_align" in options:
        return ""
    return (f"{policy}'s chunks end on a new key length nearly every step, and on {why}: each new shape is built "
            f"on first use; --policy-option key_align={want} ends them on fewer key lengths (as mlxlab tune's grid "
            f"runs {policy} here)")


def can_fuse(module) -> Tuple[bool, str]:
    """``(True, "")`` if :func:`packed_forward` can run ``module`` (an mlx-lm model), else
    ``(False, why)``."""
    mtype = getattr(getattr(module, "args", None), "model_type", None)
    if mtype not in FUSABLE_TYPES:
        return False, f"model_type {mtype!r} is not one of {FUSABLE_TYPES}"
    inner = getattr(module, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers:
        return False, "no model.layers"
    if any(getattr(layer, "use_sliding", False) for layer in layers):
        return False, "sliding-window layers need their own masks"
    if getattr(inner, "pipeline_size", 1) > 1:
        return False, "pipeline-parallel models are not packed"
    for name in ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp"):
        if not hasattr(layers[0], name):
            return False, f"layer has no {name}"
    return True, ""


def packing_warning(fuses: bool) -> str:
    """What ``mlxlab serve`` warns of when its engine packs steps (``fuses``) on a device where
    :func:`packs_well` says no; "" otherwise."""
    ok, why = packs_well()
    if not fuses or ok:
        return ""
    return (f"this policy packs each step's decode and chunk into one forward, and on {why}; "
            "--policy-option fuse=false runs them back to back (as mlxlab tune's grid does here)")


def _heads(x, rows: int, n_heads: int):
    """(1, rows * L, n_heads * d) -> (rows, n_heads, L, d), as mlx-lm's attention lays it out."""
    return x.reshape(rows, x.shape[1] // rows, n_heads, -1).transpose(0, 2, 1, 3)


def _store(attn, k, v, cache, rows: int):
    """Rope and write a segment's keys and values to its cache; returns what the cache holds.
    Alone, for a chunk in the last layer, whose attention output would feed nothing."""
    k = attn.rope(_heads(k, rows, attn.n_kv_heads), offset=cache.offset)
    return cache.update_and_fetch(k, _heads(v, rows, attn.n_kv_heads))


def _attend(attn, q, k, v, cache, mask, rows: int):
    """Attention of one segment. ``q``/``k``/``v`` are (1, rows * L, features) slices of the
    packed projections; ``rows`` > 1 means a decode batch (one query per row)."""
    q = attn.rope(_heads(q, rows, attn.n_heads), offset=cache.offset)  # before the cache moves on
    k, v = _store(attn, k, v, cache, rows)
    out = scaled_dot_product_attention(q, k, v, cache=cache, scale=attn.scale, mask=mask)
    return out.transpose(0, 2, 1, 3).reshape(1, q.shape[0] * q.shape[2], -1)


def packed_forward(module, decode_inputs: mx.array, decode_cache: list,
                   chunks: Sequence[Tuple[mx.array, list]]) -> mx.array:
    """Run ``decode_inputs`` (B,) one token per row of ``decode_cache`` (a per-layer list of
    ``BatchKVCache``, or of ``KVCache`` when B is 1) and each ``(tokens, cache)`` chunk of
    ``chunks`` through the model in one pass: the linear layers see all B + sum(chunk) tokens
    at once. Returns the decode rows' logits, shape (B, vocab); the chunks' keys and values are
    in their caches (their logits are never computed, as in a prefill)."""
    inner = module.model
    B = int(decode_inputs.shape[0])
    tokens = mx.concatenate([decode_inputs.astype(mx.uint32)] + [t.astype(mx.uint32) for t, _ in chunks])
    h = inner.embed_tokens(tokens)[None]
    sizes = [B] + [int(t.shape[0]) for t, _ in chunks]
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    caches: List[list] = [decode_cache] + [c for _, c in chunks]
    masks = [create_attention_mask(h[:, :1], decode_cache[0])]
    masks += [create_attention_mask(h[:, :n], c[0]) for n, c in zip(sizes[1:], caches[1:])]
    rows = [B] + [1] * len(chunks)
    last = len(inner.layers) - 1
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        k, v = attn.k_proj(x), attn.v_proj(x)
        if i < last:
            q = attn.q_proj(x)
            outs = [_attend(attn, q[:, a:b], k[:, a:b], v[:, a:b], cache[i], mask, r)
                    for a, b, cache, mask, r in zip(bounds, bounds[1:], caches, masks, rows)]
            h = h + attn.o_proj(mx.concatenate(outs, axis=1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        else:
            # Last layer: the chunks only need their keys and values cached (a prefill never
            # reads their outputs), so query, attention, o_proj and MLP run for the decode rows
            # alone: packing the chunks through them too would cost a layer's worth of chunk
            # compute for outputs nothing reads, enough to make a packed step slower than the
            # two back to back.
            for a, b, cache, r in zip(bounds[1:], bounds[2:], caches[1:], rows[1:]):
                _store(attn, k[:, a:b], v[:, a:b], cache[i], r)
            hd = h[:, :B]
            out = _attend(attn, attn.q_proj(x[:, :B]), k[:, :B], v[:, :B], caches[0][i], masks[0], B)
            hd = hd + attn.o_proj(out)
            h = hd + layer.mlp(layer.post_attention_layernorm(hd))
    out = inner.norm(h[0, :B])
    if getattr(module.args, "tie_word_embeddings", False):
        return inner.embed_tokens.as_linear(out)
    return module.lm_head(out)
