"""What KV-cache quantization costs: decode speed by context length, time to first token at short
prompts, the context where it starts to pay, memory, and quality against the full-precision cache;
and the verdicts on seed 000's claims about it (:func:`verdicts`).

Quantizes caches the way mlx-lm's ``generate_step`` does past ``quantized_kv_start``
(``KVCache.to_quantized``); bits the backend cannot run are found by
:func:`mlxlab.engine.kvquant.probe_model` first.
"""

from __future__ import annotations

import copy
import json
import re
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np
import pandas as pd
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxlab.core.claims import claim, load_claims, verdict
from mlxlab.core.results import results_dir

from mlxlab.core.presets import module_of
from mlxlab.engine.kvquant import probe_model
from mlxlab.engine.warmup import random_prompt
from mlxlab.studies.rules import repeats_to_resolve


def quantize_cache(cache: List, bits: Optional[int], group_size: int) -> List:
    """``cache`` with every plain ``KVCache`` layer quantized to ``bits`` (None: unchanged)."""
    if bits is None:
        return cache
    return [c.to_quantized(group_size=group_size, bits=bits) if isinstance(c, KVCache) else c for c in cache]


def kv_bytes(cache: List) -> int:
    return int(sum(c.nbytes for c in cache))


def prefill(model, context_tokens: int, *, seed: int = 0, chunk: int = 2048) -> Tuple[List, int]:
    """A full-precision cache holding ``context_tokens`` random tokens (evaluated), and the last
    token, to start decoding from."""
    module = module_of(model)
    prompt = mx.array(random_prompt(context_tokens, module.args.vocab_size, seed))
    cache = make_prompt_cache(module)
    for i in range(0, context_tokens, chunk):
        module(prompt[None, i:i + chunk], cache=cache)
        mx.eval([c.state for c in cache])
    return cache, int(prompt[-1].item())


def _copy(cache: List) -> List:
    """An independent copy of a cache (decoding writes into a KV buffer in place)."""
    out = []
    for c in cache:
        n = copy.copy(c)
        n.keys, n.values = mx.array(c.keys), mx.array(c.values)
        out.append(n)
    mx.eval([c.state for c in out])
    return out


def decode_speed(model, context_tokens: int, kv_bits: Optional[int], *, decode_tokens: int = 32,
                 group_size: int = 64, seed: int = 0, chunk: int = 2048, prefilled: Optional[tuple] = None) -> Dict:
    """Decode tok/s at a context: prefill ``context_tokens`` random tokens (or start from
    ``prefilled``, a :func:`prefill` result, left unchanged), quantize the cache (as
    ``generate_step`` does past ``quantized_kv_start``), then time ``decode_tokens`` greedy steps,
    pipelined like ``generate_step``. Also returns the cache's bytes."""
    module = module_of(model)
    base, last = prefilled or prefill(model, context_tokens, seed=seed, chunk=chunk)
    cache = quantize_cache(base, kv_bits, group_size) if kv_bits is not None else _copy(base)
    mx.eval([c.state for c in cache])
    y = mx.array([[last]])

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


def ttft(model, context_tokens: int, kv_bits: Optional[int], *, group_size: int = 64, seed: int = 0,
         prefill_step_size: int = 2048) -> Dict:
    """Time to the first token of a ``context_tokens`` random prompt through mlx-lm's
    ``generate_step`` with ``kv_bits`` and ``quantized_kv_start=0`` (a server whose default is a
    quantized cache: each prefill chunk's cache is quantized, and the step that samples the first
    token attends over it). Returns context_tokens, kv_bits and ttft_ms."""
    module = module_of(model)
    prompt = mx.array(random_prompt(context_tokens, module.args.vocab_size, seed))
    t0 = time.perf_counter()
    gen = generate_step(prompt, module, max_tokens=1, kv_bits=kv_bits, kv_group_size=group_size,
                        quantized_kv_start=0, prefill_step_size=prefill_step_size)
    next(gen)
    dt = time.perf_counter() - t0
    gen.close()
    return {"context_tokens": context_tokens, "kv_bits": _label(kv_bits), "ttft_ms": dt * 1e3}


def _runnable(model, bits, group_size, columns) -> Tuple[list, list]:
    """The bits the backend can run, and a row per bits it cannot (with the probe's reason)."""
    runnable, rows = [], []
    for b in bits:
        ok, why = probe_model(model, b, group_size)
        if ok:
            runnable.append(b)
        else:
            rows.append({"context_tokens": None, "kv_bits": str(b), "repeat": None,
                         **dict.fromkeys(columns), "error": why})
    return runnable, rows


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"


def speed_sweep(model, contexts: Sequence[int], bits: Sequence[Optional[int]] = (None, 8, 4), *,
                decode_tokens: int = 32, repeats: int = 3, group_size: int = 64, progress: bool = True) -> pd.DataFrame:
    """:func:`decode_speed` over contexts x bits x repeats (bits the backend cannot run are
    skipped with a row saying why). Within a repeat every bits decodes from one prefill of the
    same prompt (quantized or copied, so the arms differ only in the cache); repeats are the
    outer loop, and the order of the bits is reversed every other repeat, so a drifting machine
    load falls on every setting alike. Columns: context_tokens, kv_bits, repeat, decode_tok_s,
    kv_bytes, error."""
    runnable, rows = _runnable(model, bits, group_size, ("decode_tok_s", "kv_bytes"))
    it = [(r, c) for r in range(repeats) for c in contexts]
    if progress:
        from tqdm.auto import tqdm  # notebook plumbing, optional
        it = tqdm(it, desc="kv speed", leave=False)
    for r, c in it:
        rows += _decode_group(model, c, runnable if r % 2 == 0 else runnable[::-1], r, decode_tokens, group_size)
    return pd.DataFrame(rows)


def _decode_group(model, c: int, bits: Sequence[Optional[int]], r: int, decode_tokens: int,
                  group_size: int) -> List[Dict]:
    """One repeat at one context: one prefill, then a decode per bits, in the order given."""
    pre = prefill(model, c, seed=r)
    rows = []
    for b in bits:
        try:
            row = {**decode_speed(model, c, b, decode_tokens=decode_tokens, group_size=group_size, seed=r,
                                  prefilled=pre), "error": ""}
        except RuntimeError as exc:  # a shape the probe did not try: a row saying so, not a lost sweep
            row = {"context_tokens": c, "kv_bits": _label(b), "decode_tok_s": None, "kv_bytes": None,
                   "error": _error(exc)}
        rows.append({**row, "repeat": r})
    return rows


def ttft_sweep(model, contexts: Sequence[int], bits: Sequence[Optional[int]] = (None, 4), *, repeats: int = 5,
               group_size: int = 64, progress: bool = True) -> pd.DataFrame:
    """:func:`ttft` over contexts x bits x repeats, warm: every (context, bits) shape runs once
    untimed first. The same prompt for every bits within a repeat (a new one each repeat), and
    the order of the bits reversed every other repeat. Columns: context_tokens, kv_bits, repeat,
    ttft_ms, error."""
    runnable, rows = _runnable(model, bits, group_size, ("ttft_ms",))
    for c in contexts:
        for b in runnable:
            try:
                ttft(model, c, b, group_size=group_size, seed=10_000 + c)
            except RuntimeError:
                pass  # the timed run records the error
    it = [(r, c, b) for r in range(repeats) for c in contexts for b in (runnable if r % 2 == 0 else runnable[::-1])]
    if progress:
        from tqdm.auto import tqdm  # notebook plumbing, optional
        it = tqdm(it, desc="kv ttft", leave=False)
    for r, c, b in it:
        try:
            row = {**ttft(model, c, b, group_size=group_size, seed=r), "error": ""}
        except RuntimeError as exc:
            row = {"context_tokens": c, "kv_bits": _label(b), "ttft_ms": None, "error": _error(exc)}
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


# --------------------------------------------------------------------------- summaries and verdicts

#: The noise band when only one repeat ran (no spread to scale): an effect inside +-5% is no effect.
NOISE_FALLBACK_PCT = 5.0
#: Model and backend differ from the case study's, so its magnitudes hold "in scaled terms" when
#: the measured effect lies within this factor of the published band either way.
MAGNITUDE_FACTOR = 2.0


def noise_band_pct(spread_pct: float) -> float:
    """3x the repeat-to-repeat spread, or :data:`NOISE_FALLBACK_PCT` where it is unknown."""
    return 3.0 * spread_pct if spread_pct == spread_pct else NOISE_FALLBACK_PCT


def scaled_band(published) -> Tuple[float, float]:
    """The published ``low``..``high`` widened by :data:`MAGNITUDE_FACTOR` either way."""
    lo, hi, f = float(published["low"]), float(published["high"]), MAGNITUDE_FACTOR
    return min(lo * f, lo / f), max(hi * f, hi / f)


def paired(df: pd.DataFrame, value: str, bits: str, context) -> Optional[Dict]:
    """``value`` of ``bits`` against ``none`` at ``context``, paired by repeat: each arm's median,
    the median of the per-repeat ratios, and ``spread_pct`` = 100 x their standard deviation /
    median (NaN with one repeat). None when either arm has no measurement there."""
    ok = df[(df.error == "") & (df.context_tokens == context)]
    ok = ok.assign(**{value: pd.to_numeric(ok[value])})
    piv = ok.pivot_table(index="repeat", columns="kv_bits", values=value, aggfunc="median")
    if "none" not in piv or bits not in piv:
        return None
    piv = piv[["none", bits]].dropna()
    if piv.empty:
        return None
    ratios = (piv[bits] / piv["none"]).to_list()
    med = statistics.median(ratios)
    return {"none": float(piv["none"].median()), "quant": float(piv[bits].median()), "ratio": med,
            "spread_pct": 100 * statistics.stdev(ratios) / med if len(ratios) > 1 else float("nan"),
            "repeats": len(ratios)}


def _contexts(df: pd.DataFrame, value: str, bits: str) -> List[int]:
    """Contexts where both ``bits`` and ``none`` were measured, ascending."""
    return [int(c) for c in sorted(df[df.error == ""].context_tokens.dropna().unique())
            if paired(df, value, bits, c) is not None]


def memory(df: pd.DataFrame) -> List[Dict]:
    """The KV cache's size per bits and context (MiB) and what it saves against ``none`` (%)."""
    med = df[df.error == ""].groupby(["context_tokens", "kv_bits"]).kv_bytes.median().unstack(1)
    rows = []
    for c, r in med.iterrows():
        for b, nbytes in r.dropna().items():
            rows.append({"context_tokens": int(c), "kv_bits": b, "kv_mb": nbytes / 2**20,
                         "saved_pct": 100 * (1 - nbytes / r["none"]) if "none" in r else float("nan")})
    return rows


def _r(x, n=2):
    return None if x is None or x != x else round(float(x), n)


def _unmeasurable(ids, bits: str, why: str, fairness: str, backend: Optional[str] = None) -> List[Dict]:
    rule = (f"The backend ({backend or mx.default_device()}) failed a quantized attention at the model's own shape "
            f"with kv_bits={bits}, so no kv_bits={bits} run could be timed; the probe's error is in measured.")
    return [verdict(i, "not measurable on this backend", measured={"kv_bits": int(bits), "probe_error": why},
                    rule=rule, fairness=fairness) for i in ids]


def verdicts(speed: pd.DataFrame, ttft_df: pd.DataFrame, probes: Dict, *, bits: str = "4",
             model: str = "the speed model", backend: Optional[str] = None) -> List[Dict]:
    """The verdicts on s000-kv4-decode, s000-kv4-ttft and s000-kv4-crossover from the decode
    sweep (:func:`speed_sweep`), the TTFT sweep (:func:`ttft_sweep`) and the probes
    (``{bits: (ok, why)}``); ``model`` names the model in the fairness notes, ``backend`` the device
    in a "not measurable" rule (default: this process's).

    ``measured`` keys: decode: context_tokens, decode_tok_s_none, decode_tok_s_kv4,
    decode_change_pct, spread_pct, noise_band_pct, repeats. ttft: contexts_min_tokens,
    contexts_max_tokens, ttft_ms_none, ttft_ms_kv4 (at the smallest context), ttft_change_pct
    (median over contexts), ttft_change_low_pct, ttft_change_high_pct, spread_pct,
    noise_band_pct, repeats. crossover: crossover_tokens (null if none), crossover_found,
    range_min_tokens, range_max_tokens, ratio_at_max_x, spread_pct_at_max, noise_band_pct.
    Where the backend cannot run the bits: kv_bits and probe_error."""
    ids = ("s000-kv4-decode", "s000-kv4-ttft", "s000-kv4-crossover")
    same = (f"One {model} object for both caches, in one run; repeats paired (same prompt for both caches "
            f"in a repeat, order alternated); a far smaller model and another backend than the case study's "
            f"0.5-1.5B models on Metal, quantized from the first token (quantized_kv_start=0).")
    ok, why = probes.get(bits, (False, "not probed"))
    if not ok:
        return _unmeasurable(ids, bits, why, same, backend)
    errs = speed[(speed.kv_bits == bits) & (speed.error != "")].error
    if not _contexts(speed, "decode_tok_s", bits):
        return _unmeasurable(ids, bits, errs.iloc[0] if len(errs) else "no run", same, backend)
    return [_decode_verdict(speed, bits, same), _ttft_verdict(ttft_df, bits, same, backend),
            _crossover_verdict(speed, bits, same)]


def _blind(measured: Dict, change: float, band: float, published, repeats) -> str:
    """For a change that did not reproduce: "inconclusive" when the noise band reaches from it to
    the published range (the run cannot tell whether the effect is there), else "not reproduced";
    notes within_noise (and the repeats that would narrow the band to that distance)."""
    low, high = sorted((float(published["low"]), float(published["high"])))
    dist = 0.0 if low <= change <= high else min(abs(change - low), abs(change - high))
    blind = bool(band == band and change == change and band >= dist)
    measured["within_noise"] = blind
    if blind:
        measured["repeats_to_resolve"] = repeats_to_resolve(band, dist, repeats)
    return "inconclusive" if blind else "not reproduced"


def _decode_verdict(speed, bits, fairness) -> Dict:
    c = claim("s000-kv4-decode")
    short = _contexts(speed, "decode_tok_s", bits)[0]
    p = paired(speed, "decode_tok_s", bits, short)
    change, band = 100 * (p["ratio"] - 1), noise_band_pct(p["spread_pct"])
    lo, hi = scaled_band(c.published)
    measured = {"context_tokens": short, "decode_tok_s_none": _r(p["none"], 1), "decode_tok_s_kv4": _r(p["quant"], 1),
                "decode_change_pct": _r(change, 1), "spread_pct": _r(p["spread_pct"]),
                "noise_band_pct": _r(band), "repeats": p["repeats"]}
    v = "reproduced" if change < -band and lo <= change <= hi else _blind(measured, change, band, c.published, p["repeats"])
    rule = (f"Median of the per-repeat kv{bits}/none decode tok/s ratios at the shortest context measured: reproduced "
            f"if 4-bit is slower by more than the noise band (3x the repeat spread, {NOISE_FALLBACK_PCT:g}% with one "
            f"repeat) and the change lies within {lo:g}..{hi:g}% (the published band widened {MAGNITUDE_FACTOR:g}x "
            f"either way); inconclusive when the noise band reaches from the change to the published range (the run "
            f"cannot tell whether the effect is there); otherwise not reproduced.")
    return verdict(c.id, v, measured=measured, rule=rule, fairness=fairness)


def _ttft_verdict(ttft_df, bits, fairness, backend=None) -> Dict:
    c = claim("s000-kv4-ttft")
    ctxs = _contexts(ttft_df, "ttft_ms", bits) if len(ttft_df) else []
    rule_tail = ("Per context, the median of the per-repeat kv4/none TTFT ratios; reproduced if their median over "
                 "contexts rises by more than the noise band (3x the median per-context repeat spread, "
                 f"{NOISE_FALLBACK_PCT:g}% with one repeat) and lies within {{lo:g}}..{{hi:g}}% (the published band "
                 f"widened {MAGNITUDE_FACTOR:g}x either way); inconclusive when the noise band reaches from the change to "
                 "the published range (the run cannot tell whether the effect is there); otherwise not reproduced.")
    lo, hi = scaled_band(c.published)
    errs = ttft_df[(ttft_df.kv_bits == bits) & (ttft_df.error != "")].error if len(ttft_df) else []
    if not ctxs and len(errs):  # the probe passed, but the first-token step failed at a shape it missed
        return _unmeasurable([c.id], bits, errs.iloc[0], fairness, backend)[0]
    if not ctxs:
        return verdict(c.id, "not measured", measured=None, fairness=fairness,
                       rule="No TTFT sweep with both caches ran. " + rule_tail.format(lo=lo, hi=hi))
    ps = [paired(ttft_df, "ttft_ms", bits, x) for x in ctxs]
    changes = [100 * (p["ratio"] - 1) for p in ps]
    spreads = [p["spread_pct"] for p in ps if p["spread_pct"] == p["spread_pct"]]
    spread = statistics.median(spreads) if spreads else float("nan")
    change, band = statistics.median(changes), noise_band_pct(spread)
    measured = {"contexts_min_tokens": ctxs[0], "contexts_max_tokens": ctxs[-1],
                "ttft_ms_none": _r(ps[0]["none"]), "ttft_ms_kv4": _r(ps[0]["quant"]),
                "ttft_change_pct": _r(change, 1), "ttft_change_low_pct": _r(min(changes), 1),
                "ttft_change_high_pct": _r(max(changes), 1), "spread_pct": _r(spread),
                "noise_band_pct": _r(band), "repeats": min(p["repeats"] for p in ps)}
    v = "reproduced" if change > band and lo <= change <= hi else _blind(measured, change, band, c.published, measured["repeats"])
    return verdict(c.id, v, measured=measured, rule=rule_tail.format(lo=lo, hi=hi),
                   fairness=fairness + " Warm: each prompt length ran once untimed first; TTFT through mlx-lm's "
                                       "generate_step (prefill step 2048).")


def _crossover_verdict(speed, bits, fairness) -> Dict:
    c = claim("s000-kv4-crossover")
    ctxs = _contexts(speed, "decode_tok_s", bits)
    top = paired(speed, "decode_tok_s", bits, ctxs[-1])
    band = noise_band_pct(top["spread_pct"])
    x = crossover(speed, bits)
    real = x is not None and 100 * (top["ratio"] - 1) > band  # still faster, beyond noise, at the top
    lo, hi = float(c.published["low"]), float(c.published["high"])
    found = (f"at {x:.0f} tokens" if real else
             f"none within the range measured ({ctxs[0]}-{ctxs[-1]} tokens)")
    measured = {"crossover_tokens": _r(x, 0) if real else None, "crossover_found": found,
                "range_min_tokens": ctxs[0], "range_max_tokens": ctxs[-1], "ratio_at_max_x": _r(top["ratio"], 3),
                "spread_pct_at_max": _r(top["spread_pct"]), "noise_band_pct": _r(band)}
    if ctxs[-1] < lo:
        v = "not measured"
    elif real and lo <= x <= hi:
        v = "reproduced"
    else:
        v = "not reproduced"
    rule = (f"The crossover is where the median kv{bits}/none decode ratio first reaches 1 (interpolated between "
            f"measured contexts); it counts only if {bits}-bit is still faster by more than the noise band at the "
            f"largest context. Reproduced if it lies within the guessed {lo:g}-{hi:g} tokens; not reproduced if "
            f"elsewhere or none within the range; not measured if the range stops short of {lo:g} tokens.")
    return verdict(c.id, v, measured=measured, rule=rule, fairness=fairness)


def _stored_model(doc: Dict) -> str:
    """The ``model`` notebook 02 passed to :func:`verdicts` (name, parameters, dtype), as it wrote
    it into the stored fairness notes; else the stored model name."""
    notes = (v.get("fairness") or "" for v in doc.get("verdicts") or [])
    found = next((m[1] for f in notes if (m := re.match(r"One (.*?) object for both caches", f))), None)
    return found or str((doc.get("parameters") or {}).get("model_name", doc.get("model", "the speed model")))


def decide_stored(doc: Dict, path=None) -> List[Dict]:
    """The verdicts of a saved notebook-02 result (``kv_quantization.json``) from its stored decode
    sweep, TTFT sweep and probes, as the notebook passed them (:class:`~mlxlab.studies.base.Study`'s
    ``decide``); the model note from :func:`_stored_model`, the backend the run's stored device."""
    missing = [k for k in ("speed", "ttft", "probes") if k not in doc]
    if missing:
        raise ValueError(f"{path or 'this document'} is not a notebook-02 result (no {', '.join(missing)}): "
                         "rescore a kv_quantization.json")
    device = (doc.get("environment") or {}).get("device")
    return verdicts(pd.DataFrame(doc["speed"]), pd.DataFrame(doc["ttft"]), doc["probes"], model=_stored_model(doc),
                    backend=f"Device({device}, 0)" if device else None)


#: what each claim's CPU stand-in row shows (a measured key of its verdict, and its unit)
STAND_IN_KEYS = {"s000-kv4-decode": ("decode_change_pct", "% decode tok/s at the shortest context"),
                 "s000-kv4-ttft": ("ttft_change_pct", "% TTFT (median over contexts)"),
                 "s000-kv4-crossover": ("crossover_found", "")}


def stand_ins(here: Sequence[Dict], platform: str = "cpu") -> pd.DataFrame:
    """Where this backend could not run a quantized KV cache: one row per such claim with the
    error, the committed ``platform`` result that stands in for it (its verdict, the measured
    figure and the commit it ran at) and the case study's published figure from its Apple
    (Metal) run. Empty when every verdict here was measured. Raises FileNotFoundError, naming
    the command that makes it, when the stand-in platform has no committed results file."""
    missing = [v for v in here if v["verdict"] == "not measurable on this backend"]
    if not missing:
        return pd.DataFrame()
    path = results_dir(platform) / "kv_quantization.json"
    if not path.is_file():
        raise FileNotFoundError(f"no {platform} results at {path}: run notebook 02 there with --save "
                                f"(mlxlab reproduce --only 02 --save) for a stand-in")
    doc = json.loads(path.read_text())
    theirs = {v["claim"]: v for v in doc.get("verdicts", [])}
    claims = load_claims()
    rows = []
    for v in missing:
        key, unit = STAND_IN_KEYS.get(v["claim"], (None, ""))
        t = theirs.get(v["claim"], {})
        value = (t.get("measured") or {}).get(key)
        rows.append({"claim": v["claim"], "here": v["verdict"], "error": (v.get("measured") or {}).get("probe_error", ""),
                     f"{platform} verdict": t.get("verdict", "not run"),
                     f"{platform} measured": "" if value is None else f"{value} {unit}".strip(),
                     f"{platform} commit": doc.get("environment", {}).get("git_commit"),
                     "published (Apple, Metal)": claims[v["claim"]].published_text()})
    return pd.DataFrame(rows)
