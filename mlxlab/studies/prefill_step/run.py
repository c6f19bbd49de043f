"""Single-request studies of the first case study: prefill step size, cold start and warm-up.

Each function measures the engine and mlx-lm's ``generate_step`` on the same model object and
returns a tidy table (one row per measurement) so notebooks only plot and judge;
:func:`verdicts` scores the step-size claims (``s000-step-*``) from those tables. The cold-start
measurements need a process where nothing is compiled yet: they run
:mod:`mlxlab.studies.fresh_process` in a subprocess.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import pandas as pd
from mlx_lm.generate import generate_step

from mlxlab.core.claims import claim, verdict
from mlxlab.core.environment import fast_blas_env
from mlxlab.core.presets import model_limits, module_of
from mlxlab.engine.loop import Engine
from mlxlab.engine.warmup import random_prompt
from mlxlab.studies.rules import noise_outcome, paired_band


def ttft_mlx_lm(model, prompt: List[int], step: int) -> float:
    """Seconds from call to the first token of ``generate_step`` (prefill + first decode)."""
    t0 = time.perf_counter()
    for _tok, _ in generate_step(mx.array(prompt), module_of(model), max_tokens=1, prefill_step_size=step):
        return time.perf_counter() - t0
    raise RuntimeError("generate_step produced no token")


def ttft_engine(model, prompt: List[int], step: int) -> float:
    """Seconds from submit to the first token on the engine with ``chunk_size=step``."""
    eng = Engine(model, chunk_size=step)
    req = eng.submit(prompt, 1)
    eng.run()
    return req.ttft_s


def prefill_sweep(model, prompt_lengths: Sequence[int], step_sizes: Sequence[int], *, repeats: int = 3,
                  seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """TTFT and prefill tok/s for every (prompt length, step size), engine and mlx-lm, warm
    (one untimed request per configuration first). Repeats are interleaved across
    configurations so drift spreads evenly. Columns: prompt_tokens, step, side, repeat,
    ttft_s, prefill_tok_s."""
    vocab = model_limits(model)[0]
    configs = [(n, s) for n in prompt_lengths for s in step_sizes]
    sides = {"mlxlab": ttft_engine, "mlx-lm": ttft_mlx_lm}
    for n, s in configs:  # warm every shape once: compilation is the warm-up study's subject
        for f in sides.values():
            f(model, random_prompt(n, vocab, seed), s)
    rows = []
    it = range(repeats)
    if progress:
        from tqdm.auto import tqdm  # notebook plumbing, optional
        it = tqdm(it, desc="prefill sweep", leave=False)
    for r in it:
        for n, s in configs:
            prompt = random_prompt(n, vocab, seed + r)
            for side, f in (sides.items() if r % 2 == 0 else reversed(list(sides.items()))):
                t = f(model, prompt, s)
                rows.append({"prompt_tokens": n, "step": s, "side": side, "repeat": r, "ttft_s": t,
                             "prefill_tok_s": n / t})
    return pd.DataFrame(rows)


def summarize_sweep(df: pd.DataFrame, base_step: int, new_step: int) -> pd.DataFrame:
    """Median TTFT per (side, prompt length, step) and the change from ``base_step`` to
    ``new_step``: prefill tok/s gain (%) and TTFT change (%)."""
    med = df.groupby(["side", "prompt_tokens", "step"], as_index=False)[["ttft_s", "prefill_tok_s"]].median()
    a = med[med.step == base_step].set_index(["side", "prompt_tokens"])
    b = med[med.step == new_step].set_index(["side", "prompt_tokens"])
    out = pd.DataFrame({
        f"ttft_s@{base_step}": a.ttft_s, f"ttft_s@{new_step}": b.ttft_s,
        "prefill_gain_pct": 100 * (b.prefill_tok_s / a.prefill_tok_s - 1),
        "ttft_change_pct": 100 * (b.ttft_s / a.ttft_s - 1),
    }).reset_index()
    return out


def greedy_mlx_lm(model, prompt: List[int], step: int, max_tokens: int) -> Dict:
    """Greedy ``generate_step`` with ``prefill_step_size=step``: TTFT, decode tok/s (tokens after
    the first over the time after it), the tokens, and the first token's log-probabilities."""
    t0 = time.perf_counter()
    times, tokens, first = [], [], None
    for tok, logprobs in generate_step(mx.array(prompt), module_of(model), max_tokens=max_tokens, prefill_step_size=step):
        times.append(time.perf_counter())
        tokens.append(int(tok))
        if first is None:
            first = logprobs
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")
    return {"ttft_s": times[0] - t0, "decode_tok_s": decode, "tokens": tokens, "first_logprobs": first}


def decode_by_step(model, prompt_tokens: int, steps: Sequence[int] = (512, 2048), *, decode_tokens: int = 64,
                   repeats: int = 5, seed: int = 0) -> pd.DataFrame:
    """Decode tok/s of one prompt of ``prompt_tokens`` after prefilling it at each step size
    (mlx-lm ``generate_step``), warm (one untimed run per step first), the step sizes alternating
    order from repeat to repeat. Columns: step, repeat, prompt_tokens, ttft_s, decode_tok_s."""
    prompt = random_prompt(prompt_tokens, model_limits(model)[0], seed)
    for s in steps:
        greedy_mlx_lm(model, prompt, s, 4)
    rows = []
    for r in range(repeats):
        for s in (steps if r % 2 == 0 else list(reversed(steps))):
            g = greedy_mlx_lm(model, prompt, s, decode_tokens)
            rows.append({"step": s, "repeat": r, "prompt_tokens": prompt_tokens, "ttft_s": g["ttft_s"],
                         "decode_tok_s": g["decode_tok_s"]})
    return pd.DataFrame(rows)


def step_accuracy(model, prompt_lengths: Sequence[int], steps: Sequence[int] = (512, 2048), *,
                  max_tokens: int = 32, seed: int = 0) -> pd.DataFrame:
    """Greedy tokens of the same prompts prefilled at each step size, compared exactly with the
    first step's. One row per (prompt, step): prompt_tokens, step, tokens, differing (positions
    whose token differs from the first step's), first_diff (index or None) and
    first_logprob_diff (largest difference of the first token's log-probabilities)."""
    vocab = model_limits(model)[0]
    rows = []
    for i, n in enumerate(prompt_lengths):
        prompt = random_prompt(n, vocab, seed + 1000 + i)
        base = None
        for s in steps:
            g = greedy_mlx_lm(model, prompt, s, max_tokens)
            if base is None:
                base = g
            diff = [j for j, (a, b) in enumerate(zip(g["tokens"], base["tokens"])) if a != b]
            diff += list(range(min(len(g["tokens"]), len(base["tokens"])), max(len(g["tokens"]), len(base["tokens"]))))
            lp = float(mx.max(mx.abs(g["first_logprobs"].astype(mx.float32) - base["first_logprobs"].astype(mx.float32))).item())
            rows.append({"prompt_tokens": n, "step": s, "tokens": len(g["tokens"]), "differing": len(diff),
                         "first_diff": diff[0] if diff else None, "first_logprob_diff": lp})
    return pd.DataFrame(rows)


def run_child(kind: str, args: dict, env: Optional[Dict], timeout_s: int, what: str):
    """Run ``python -m mlxlab.studies.fresh_process kind args`` and return its RESULT."""
    proc = subprocess.run([sys.executable, "-m", "mlxlab.studies.fresh_process", kind, json.dumps(args)],
                          capture_output=True, text=True, env=env or fast_blas_env(), timeout=timeout_s)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{what} subprocess failed:\n{proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT"):])


def seed_protocol(model_name: str, prompt_tokens: int = 480, order: Sequence[int] = (512, 2048), n: int = 3,
                  dtype: Optional[str] = None, bits: Optional[int] = None, env: Optional[Dict] = None) -> pd.DataFrame:
    """The case study's protocol in a fresh process: N requests at the first step size, then
    N at the second, first request cold. Returns one row per request (step, request, ttft_s,
    order). Run it with both orders to see whether a 'gain' follows the step size or the order."""
    args = {"model": model_name, "prompt_tokens": prompt_tokens, "order": list(order), "n": n,
            "dtype": dtype, "bits": bits}
    df = pd.DataFrame(run_child("seed-protocol", args, env, 900, "seed protocol"))
    df["order"] = " then ".join(map(str, order))
    return df


# ---------------------------------------------------------------- warm-up and memory


def fresh_process_run(model_name: str, *, warmup_mode: str = "off", prompt_tokens: int = 480,
                      chunks: Sequence[int] = (512, 2048), batches: Sequence[int] = (4,), repeats: int = 3,
                      cache_limit_mb: Optional[int] = None, memory_limit_mb: Optional[int] = None,
                      dtype: Optional[str] = None, bits: Optional[int] = None, timeout_s: int = 900) -> Dict:
    """Start a fresh Python process (nothing compiled yet), optionally set mlx's allocator
    cache and memory limits, warm up (``warmup_mode``), then time: the first request, warm
    repeats, the first use of each other chunk size and batch size and a repeat of each. Each
    event records TTFT, mean ITL and active / cache / peak memory in MiB."""
    args = {"model": model_name, "warmup": warmup_mode, "prompt_tokens": prompt_tokens,
            "chunks": list(chunks), "batches": list(batches), "repeats": repeats,
            "cache_limit_mb": cache_limit_mb, "memory_limit_mb": memory_limit_mb, "dtype": dtype, "bits": bits}
    out = run_child("cold-start", args, None, timeout_s, "fresh-process run")
    out.update({"model": model_name, "warmup": warmup_mode, "cache_limit_mb": cache_limit_mb,
                "memory_limit_mb": memory_limit_mb})
    return out


# ---------------------------------------------------------------- verdicts of the step-size claims


def sweep_noise_pct(df: pd.DataFrame) -> float:
    """Repeat-to-repeat spread of the sweep, in %: the median over configurations of the median
    absolute deviation of TTFT from its median, relative to that median."""
    spread = df.groupby(["side", "prompt_tokens", "step"]).ttft_s.agg(
        lambda s: float((s - s.median()).abs().median() / s.median()))
    return 100 * float(spread.median())


def protocol_gains(runs: pd.DataFrame, base: int, new: int) -> Dict[str, float]:
    """The case study's protocol (mean prefill tok/s over its N requests per step size) in each
    order: ``gain_base_first_pct`` (``base`` ran first, as when a default is changed),
    ``gain_new_first_pct`` (the reverse), and ``first_setting_slower_pct``: how much slower,
    averaged over both orders, the setting that ran first looks (mean TTFT ratio - 1)."""
    out, slower = {}, []
    for order, g in runs.groupby("order"):
        n = g.assign(tok_s=g.prompt_tokens / g.ttft_s) if "prompt_tokens" in g else g.assign(tok_s=1 / g.ttft_s)
        tok = n.groupby("step").tok_s.mean()
        first = int(g.step.iloc[0])
        key = "gain_base_first_pct" if first == base else "gain_new_first_pct"
        out[key] = 100 * float(tok[new] / tok[base] - 1)
        ttft = g.groupby("step").ttft_s.mean()
        slower.append(100 * float(ttft[first] / ttft[[s for s in ttft.index if s != first][0]] - 1))
    out["first_setting_slower_pct"] = float(sum(slower) / len(slower)) if slower else float("nan")
    return out


def _fairness(model_note: str, repeats: int) -> str:
    return (f"Same model object, both step sizes warm and interleaved over {repeats} repeats, in one process; "
            f"{model_note} The case study measured 0.5-1.5B 4-bit models on an M4 Pro with three requests per "
            f"setting.")


#: "unchanged" decode, resolved to this: a run whose band is wider could hide a change this large
DECODE_RESOLUTION_PCT = 5.0


def verdicts(sweep: pd.DataFrame, protocol: pd.DataFrame, decode: pd.DataFrame, accuracy: pd.DataFrame, *,
             base: int = 512, new: int = 2048, context: int = 480, model_note: str = "") -> List[Dict]:
    """The verdicts of s000-step-prefill-480, s000-step-ttft-long, s000-step-decode and
    s000-step-accuracy from :func:`prefill_sweep`, :func:`seed_protocol` (both orders),
    :func:`decode_by_step` and :func:`step_accuracy`. Decided on the mlx-lm side (the case
    study's server ran mlx-lm's prefill); the engine's figure is reported beside it.

    Measured keys. prefill-480: gain_pct, engine_gain_pct, noise_pct, band_pct,
    protocol_gain_pct, reversed_gain_pct, first_setting_slower_pct, context_tokens.
    ttft-long: ttft_change_median_pct, ttft_change_best_pct, ttft_change_worst_pct,
    engine_ttft_change_median_pct, lengths_tokens, noise_pct, band_pct. decode:
    decode_change_pct, band_pct, decode_tok_s_base, decode_tok_s_new, prompt_tokens, repeats.
    accuracy: prompts, tokens_compared, tokens_differing, prompts_differing, first_diff_index,
    max_first_logprob_diff."""
    change = summarize_sweep(sweep, base, new)
    noise = sweep_noise_pct(sweep)
    band = max(5.0, 3 * noise)
    repeats = int(sweep.repeat.nunique())
    fair = _fairness(model_note, repeats)
    ref, eng = change[change.side == "mlx-lm"], change[change.side == "mlxlab"]
    out = []

    # 1. the +33-71% prefill gain on a 480-token prompt
    low = float(claim("s000-step-prefill-480").published["low"])
    at = ref[ref.prompt_tokens == context]
    proto = protocol_gains(protocol, base, new)
    m = {"gain_pct": float(at.prefill_gain_pct.iloc[0]) if len(at) else None,
         "engine_gain_pct": float(eng[eng.prompt_tokens == context].prefill_gain_pct.iloc[0])
         if (eng.prompt_tokens == context).any() else None,
         "noise_pct": noise, "band_pct": band, "protocol_gain_pct": proto.get("gain_base_first_pct"),
         "reversed_gain_pct": proto.get("gain_new_first_pct"),
         "first_setting_slower_pct": proto.get("first_setting_slower_pct"), "context_tokens": context}
    g, pg, rg = m["gain_pct"], m["protocol_gain_pct"], m["reversed_gain_pct"]
    if g is None:
        v = "not measured"
    elif g > band:
        v = "reproduced" if g >= low else "not reproduced"
    elif pg is not None and rg is not None and pg > band and pg - rg > band:
        v = "artifact"
    else:
        v = "not reproduced"
    out.append(verdict(
        "s000-step-prefill-480", v, measured=m,
        rule=f"A gain counts only beyond band_pct = max(5, 3 x noise_pct). Reproduced when the warm gain at {context} "
             f"tokens exceeds the band and reaches the published {low:g}%; not reproduced when it is smaller; artifact "
             f"when the warm gain is within the band but the case study's protocol (mean of its N requests per setting, "
             f"{base} first in a fresh process) shows a gain beyond the band that shrinks by more than the band when "
             f"the order is reversed (the gain follows the order, not the step size).",
        fairness=fair + f" A {context}-token prompt is one chunk at either step size, so the compute is the same."))

    # 2. -7-22% TTFT on medium and long prompts
    hi = float(claim("s000-step-ttft-long").published["high"])  # -7: the smallest published cut
    long_, elong = ref[ref.prompt_tokens > base], eng[eng.prompt_tokens > base]
    m = {"ttft_change_median_pct": float(long_.ttft_change_pct.median()) if len(long_) else None,
         "ttft_change_best_pct": float(long_.ttft_change_pct.min()) if len(long_) else None,
         "ttft_change_worst_pct": float(long_.ttft_change_pct.max()) if len(long_) else None,
         "engine_ttft_change_median_pct": float(elong.ttft_change_pct.median()) if len(elong) else None,
         "lengths_tokens": ",".join(str(int(n)) for n in sorted(long_.prompt_tokens)),
         "noise_pct": noise, "band_pct": band}
    med = m["ttft_change_median_pct"]
    v = "not measured" if med is None else ("reproduced" if med <= hi and -med > band else "not reproduced")
    out.append(verdict(
        "s000-step-ttft-long", v, measured=m,
        rule=f"Over the swept prompts longer than {base} tokens (where {base} needs several chunks), reproduced when "
             f"the median TTFT change from step {base} to {new} is a cut of at least the published {-hi:g}% and "
             f"larger than band_pct = max(5, 3 x noise_pct); not reproduced otherwise.",
        fairness=fair + " The case study did not give its medium and long prompt lengths; these are the sweep's."))

    # 3. decode unchanged
    wide = decode.pivot(index="repeat", columns="step", values="decode_tok_s")
    paired = list(wide[new] / wide[base]) if {base, new} <= set(wide.columns) else []
    med_r, band_r = paired_band(paired, 0.02)
    m = {"decode_change_pct": 100 * (med_r - 1) if math.isfinite(med_r) else None,
         "band_pct": 100 * band_r if math.isfinite(band_r) else None,
         "decode_tok_s_base": float(wide[base].median()) if base in wide else None,
         "decode_tok_s_new": float(wide[new].median()) if new in wide else None,
         "prompt_tokens": int(decode.prompt_tokens.iloc[0]) if len(decode) else None, "repeats": len(paired)}
    if m["decode_change_pct"] is None:
        v = "not measured"
    elif abs(m["decode_change_pct"]) > m["band_pct"]:
        v = "not reproduced"  # a change beyond the noise
    else:  # no change the run can see: reproduced only if it could have seen one of DECODE_RESOLUTION_PCT
        out_n = noise_outcome(True, margin=DECODE_RESOLUTION_PCT, band=m["band_pct"], repeats=len(paired))
        v = out_n["verdict"]
        m.update({k: out_n[k] for k in ("within_noise", "repeats_to_resolve") if k in out_n})
    m.setdefault("within_noise", False if v == "not reproduced" else None)
    out.append(verdict(
        "s000-step-decode", v, measured=m,
        rule=f"decode_change_pct = median over repeats of the paired ratio decode tok/s at {new} / at {base} (same "
             f"prompt, prefilled at each step size), minus one, against band_pct = max(2%, 3 x MAD / sqrt(repeats)) "
             f"of the paired ratios. Not reproduced when the change is larger than the band; reproduced (no change) "
             f"when it is within a band of at most {DECODE_RESOLUTION_PCT:g}% (the run could have seen a change of "
             f"that size); inconclusive when it is within a band wider than that, where such a change would hide "
             f"(repeats_to_resolve: the repeats that would narrow the band to it).",
        fairness=fair + " The prompt is longer than one chunk, so the two runs prefill differently before decoding."))

    # 4. identical tokens
    cmp_ = accuracy[accuracy.step != accuracy.step.iloc[0]] if len(accuracy) else accuracy
    m = {"prompts": int(accuracy.prompt_tokens.nunique()) if len(accuracy) else 0,
         "tokens_compared": int(cmp_.tokens.sum()) if len(cmp_) else 0,
         "tokens_differing": int(cmp_.differing.sum()) if len(cmp_) else 0,
         "prompts_differing": int((cmp_.differing > 0).sum()) if len(cmp_) else 0,
         "first_diff_index": int(cmp_.first_diff.dropna().min()) if len(cmp_) and cmp_.first_diff.notna().any() else None,
         "max_first_logprob_diff": float(cmp_.first_logprob_diff.max()) if len(cmp_) else None}
    v = "not measured" if not m["tokens_compared"] else ("reproduced" if m["tokens_differing"] == 0 else "not reproduced")
    out.append(verdict(
        "s000-step-accuracy", v, measured=m,
        rule=f"Exact comparison: the greedy tokens of each prompt prefilled at step {new} against the same prompt "
             f"at step {base}; reproduced when no token differs, not reproduced otherwise (first_diff_index: the "
             f"first differing position; max_first_logprob_diff: how far the first token's log-probabilities moved).",
        fairness=fair + " Greedy decoding of random-token prompts; a different chunking changes the order of "
                        "floating-point sums, which can flip a near-tied token without any loss of accuracy."))
    return out


def _stored_args(doc: Dict) -> Dict:
    """The keyword arguments notebook 01 passed to :func:`verdicts`, from a saved document: base and
    new step from its ``change_<base>_to_<new>`` table, the context and the model note (the
    model's dtype, in files from before it was stored beside the model) from its stored verdicts,
    else the notebook's values."""
    steps = [m for k in doc if (m := re.fullmatch(r"change_(\d+)_to_(\d+)", k))]
    base, new = (int(steps[0][1]), int(steps[0][2])) if steps else (512, 2048)
    old = {v["claim"]: v for v in doc.get("verdicts") or []}
    context = ((old.get("s000-step-prefill-480") or {}).get("measured") or {}).get("context_tokens", 480)
    bits = doc.get("bits")
    note = (f"model {doc.get('model')} ({doc['dtype']}{f', {bits}-bit' if bits else ''})." if doc.get("dtype") else
            # files from before the dtype was stored: the note as the notebook wrote it into the fairness text
            next((m[1] for v in old.values() if (m := re.search(r"in one process; (.*?) The case study measured",
                                                                 v.get("fairness") or ""))), None))
    if note is None:
        note = f"model {doc.get('model')}{f' ({bits}-bit)' if bits else ''}."
    return {"base": base, "new": new, "context": int(context), "model_note": note}


def decide_stored(doc: Dict, path=None) -> List[Dict]:
    """The verdicts of a saved notebook-01 result (``prefill_step_size.json``) from its stored
    sweep, protocol, decode and accuracy tables (:class:`~mlxlab.studies.base.Study`'s ``decide``),
    with the arguments the notebook passed (:func:`_stored_args`)."""
    missing = [k for k in ("sweep", "protocol", "decode", "accuracy") if k not in doc]
    if missing:
        raise ValueError(f"{path or 'this document'} is not a notebook-01 result (no {', '.join(missing)}): "
                         "rescore a prefill_step_size.json")
    tables = [pd.DataFrame(doc[k]) for k in ("sweep", "protocol", "decode", "accuracy")]
    return verdicts(*tables, **_stored_args(doc))
