"""Single-request studies of the first case study: prefill step size, cold start and warm-up.

Each function measures the engine and mlx-lm's ``generate_step`` on the same model object and
returns a tidy table (one row per measurement) so notebooks only plot and judge. The cold-start
measurements need a process where nothing is compiled yet: they run
:mod:`mlxlab.studies.fresh_process` in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import mlx.core as mx
import pandas as pd
from mlx_lm.generate import generate_step

from mlxlab.core.environment import fast_blas_env
from mlxlab.core.presets import model_limits, module_of
from mlxlab.engine.loop import Engine
from mlxlab.engine.warmup import random_prompt


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


def _run_child(kind: str, args: dict, env: Optional[Dict], timeout_s: int, what: str):
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
    df = pd.DataFrame(_run_child("seed-protocol", args, env, 900, "seed protocol"))
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
    out = _run_child("cold-start", args, None, timeout_s, "fresh-process run")
    out.update({"model": model_name, "warmup": warmup_mode, "cache_limit_mb": cache_limit_mb,
                "memory_limit_mb": memory_limit_mb})
    return out
