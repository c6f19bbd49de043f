"""Single-request studies of the first case study: prefill step size, cold start and warm-up.

Each function measures the engine and mlx-lm's ``generate_step`` on the same model object and
returns a tidy table (one row per measurement) so notebooks only plot and judge.
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

from mlxlab.engine.loop import Engine
from mlxlab.engine.warmup import random_prompt as _prompt


def ttft_mlx_lm(model, prompt: List[int], step: int) -> float:
    """Seconds from call to the first token of ``generate_step`` (prefill + first decode)."""
    module = getattr(model, "module", model)
    t0 = time.perf_counter()
    for _tok, _ in generate_step(mx.array(prompt), module, max_tokens=1, prefill_step_size=step):
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
    vocab = getattr(model, "vocab_size", None) or model.module.args.vocab_size
    configs = [(n, s) for n in prompt_lengths for s in step_sizes]
    sides = {"mlxlab": ttft_engine, "mlx-lm": ttft_mlx_lm}
    for n, s in configs:  # warm every shape once: compilation is the warm-up study's subject
        for f in sides.values():
            f(model, _prompt(n, vocab, seed), s)
    rows = []
    it = range(repeats)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="prefill sweep", leave=False)
    for r in it:
        for n, s in configs:
            prompt = _prompt(n, vocab, seed + r)
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


_PROTOCOL = r"""
import json, sys, time
from mlxlab.engine.models import load_model
from mlxlab.engine.warmup import random_prompt as _prompt
from mlxlab.studies.prefill import ttft_mlx_lm
a = json.loads(sys.argv[1])
model = load_model(a["model"], dtype=a.get("dtype"), bits=a.get("bits"))
out = []
for step in a["order"]:
    for i in range(a["n"]):
        t = ttft_mlx_lm(model, _prompt(a["prompt_tokens"], model.vocab_size, i), step)
        out.append({"step": step, "request": i, "ttft_s": t})
print("RESULT" + json.dumps(out))
"""


def seed_protocol(model_name: str, prompt_tokens: int = 480, order: Sequence[int] = (512, 2048), n: int = 3,
                  dtype: Optional[str] = None, bits: Optional[int] = None, env: Optional[Dict] = None) -> pd.DataFrame:
    """The case study's protocol in a fresh process: N requests at the first step size, then
    N at the second, first request cold. Returns one row per request (step, request, ttft_s,
    order). Run it with both orders to see whether a 'gain' follows the step size or the order."""
    from mlxlab.core.environment import fast_blas_env

    args = json.dumps({"model": model_name, "prompt_tokens": prompt_tokens, "order": list(order), "n": n,
                       "dtype": dtype, "bits": bits})
    proc = subprocess.run([sys.executable, "-c", _PROTOCOL, args], capture_output=True, text=True,
                          env=env or fast_blas_env(), timeout=900)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"seed protocol subprocess failed:\n{proc.stderr[-2000:]}")
    df = pd.DataFrame(json.loads(line[len("RESULT"):]))
    df["order"] = " then ".join(map(str, order))
    return df


# ---------------------------------------------------------------- warm-up and memory


_COLD = r"""
import json, sys, time
t_start = time.perf_counter()
import mlx.core as mx
from mlxlab.engine.models import load_model
from mlxlab.engine import Engine
from mlxlab.engine.warmup import random_prompt as _prompt, warmup
a = json.loads(sys.argv[1])
if a.get("cache_limit_mb") is not None:
    mx.set_cache_limit(int(a["cache_limit_mb"]) * 2**20)
if a.get("memory_limit_mb") is not None:
    mx.set_memory_limit(int(a["memory_limit_mb"]) * 2**20)
model = load_model(a["model"], dtype=a.get("dtype"), bits=a.get("bits"))
mx.reset_peak_memory()
out = {"load_s": time.perf_counter() - t_start}
t0 = time.perf_counter(); out["warmup_parts"] = warmup(lambda c: Engine(model, chunk_size=c), model.vocab_size, a["warmup"], chunk_sizes=a["chunks"][:1], batch_sizes=[1]); out["warmup_s"] = time.perf_counter() - t0
events = []
def request(label, n, chunk, batch=1, max_tokens=8):
    eng = Engine(model, chunk_size=chunk)
    reqs = [eng.submit(_prompt(n, model.vocab_size, 100 + len(events) + i), max_tokens) for i in range(batch)]
    eng.run()
    itl = [g for r in reqs for g in r.itl_s]
    events.append({"event": label, "prompt_tokens": n, "chunk": chunk, "batch": batch,
                   "ttft_s": max(r.ttft_s for r in reqs), "itl_s": sum(itl) / len(itl) if itl else None,
                   "active_mb": mx.get_active_memory() / 2**20, "cache_mb": mx.get_cache_memory() / 2**20,
                   "peak_mb": mx.get_peak_memory() / 2**20})
n, c = a["prompt_tokens"], a["chunks"][0]
request("first request", n, c)
for i in range(a["repeats"]):
    request("warm request", n, c)
for c2 in a["chunks"][1:]:
    request(f"first use of chunk {c2}", max(n, c2 + 1), c2)
    request(f"again chunk {c2}", max(n, c2 + 1), c2)
for b in a["batches"]:
    request(f"first use of batch {b}", n, c, batch=b)
    request(f"again batch {b}", n, c, batch=b)
out["events"] = events
print("RESULT" + json.dumps(out))
"""


def fresh_process_run(model_name: str, *, warmup_mode: str = "off", prompt_tokens: int = 480,
                      chunks: Sequence[int] = (512, 2048), batches: Sequence[int] = (4,), repeats: int = 3,
                      cache_limit_mb: Optional[int] = None, memory_limit_mb: Optional[int] = None,
                      dtype: Optional[str] = None, bits: Optional[int] = None, timeout_s: int = 900) -> Dict:
    """Start a fresh Python process (nothing compiled yet), optionally set mlx's allocator
    cache and memory limits, warm up (``warmup_mode``), then time: the first request, warm
    repeats, the first use of each other chunk size and batch size and a repeat of each. Each
    event records TTFT, mean ITL and active / cache / peak memory in MiB."""
    from mlxlab.core.environment import fast_blas_env

    args = json.dumps({"model": model_name, "warmup": warmup_mode, "prompt_tokens": prompt_tokens,
                       "chunks": list(chunks), "batches": list(batches), "repeats": repeats,
                       "cache_limit_mb": cache_limit_mb, "memory_limit_mb": memory_limit_mb,
                       "dtype": dtype, "bits": bits})
    proc = subprocess.run([sys.executable, "-c", _COLD, args], capture_output=True, text=True,
                          env=fast_blas_env(), timeout=timeout_s)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"fresh-process run failed:\n{proc.stderr[-2000:]}")
    out = json.loads(line[len("RESULT"):])
    out.update({"model": model_name, "warmup": warmup_mode, "cache_limit_mb": cache_limit_mb,
                "memory_limit_mb": memory_limit_mb})
    return out
