"""What KV-cache quantization costs: decode speed by context length, the context where it starts
to pay, and quality against the full-precision cache.

Quantizes caches the way mlx-lm's ``generate_step`` does past ``quantized_kv_start``
(``KVCache.to_quantized``); bits the backend cannot run are found by
:func:`mlxlab.engine.kvquant.probe_model` first.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import numpy as np
import pandas as pd
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxlab.core.presets import module_of
from mlxlab.engine.kvquant import probe_model
from mlxlab.engine.warmup import random_prompt


def quantize_cache(cache: List, bits: Optional[int], group_size: int) -> List:
    """``cache`` with every plain ``KVCache`` layer quantized to ``bits`` (None: unchanged)."""
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
    module = module_of(model)
    prompt = mx.array(random_prompt(context_tokens, module.args.vocab_size, seed))
    cache = make_prompt_cache(module)
    for i in range(0, context_tokens, chunk):
        module(prompt[None, i:i + chunk], cache=cache)
        mx.eval([c.state for c in cache])
    cache = quantize_cache(cache, kv_bits, group_size)
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
    return {"context_tokens": context_tokens, "kv_bits": _label(kv_bits),
            "decode_tok_s": decode_tokens / dt, "kv_bytes": kv_bytes(cache)}


def _label(bits: Optional[int]) -> str:
    return "none" if bits is None else str(bits)


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
        from tqdm.auto import tqdm  # notebook plumbing, optional
        it = tqdm(it, desc="kv speed", leave=False)
    for r, c, b in it:
        try:
            row = {**decode_speed(model, c, b, decode_tokens=decode_tokens, group_size=group_size, seed=r),
                   "error": ""}
        except RuntimeError as exc:  # a shape the probe did not try: a row saying so, not a lost sweep
            row = {"context_tokens": c, "kv_bits": _label(b), "decode_tok_s": None, "kv_bytes": None,
                   "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        rows.append({**row, "repeat": r})
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
    module = module_of(model)
    toks = mx.array(list(tokens))
    ref, q = make_prompt_cache(module), make_prompt_cache(module)
    module(toks[None, :prefix_tokens], cache=ref)
    module(toks[None, :prefix_tokens], cache=q)
    q = quantize_cache(q, kv_bits, group_size)
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
