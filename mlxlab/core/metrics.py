"""Latency metrics: per-request TTFT/ITL/TPOT/e2e and per-tenant percentile summaries.

Names follow vLLM's metrics: TTFT is arrival to first token, ITL the gap between consecutive
tokens of one stream, TPOT the mean ITL of one request, e2e arrival to last token. Times in
seconds. Percentiles use linear interpolation (numpy's default).
"""

from __future__ import annotations

from typing import Dict, Iterable, Sequence

import numpy as np

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float], ps: Sequence[float] = PERCENTILES) -> Dict[str, float]:
    """``{"p50": ..., "p90": ..., "p99": ..., "max": ..., "n": ...}``; NaN when empty."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    out = {f"p{p:g}": (float(np.percentile(v, p)) if v.size else float("nan")) for p in ps}
    out["max"] = float(v.max()) if v.size else float("nan")
    out["mean"] = float(v.mean()) if v.size else float("nan")
    out["n"] = int(v.size)
    return out


def request_row(req) -> dict:
    """One request as a flat dict (the per-request table's row)."""
    itl = req.itl_s
    decode_s = (req.token_times_s[-1] - req.token_times_s[0]) if len(req.token_times_s) > 1 else None
    return {
        "id": req.id,
        "tenant": req.tenant,
        "arrival_s": req.arrival_s,
        "prompt_tokens": req.prompt_tokens,
        "output_tokens": len(req.output_tokens),
        "ttft_s": req.ttft_s,
        "tpot_s": float(np.mean(itl)) if itl else None,
        "itl_max_s": max(itl) if itl else None,
        "e2e_s": req.e2e_s,
        "prefill_tok_s": (req.prompt_tokens / req.ttft_s) if req.ttft_s else None,
        "decode_tok_s": ((len(req.token_times_s) - 1) / decode_s) if decode_s else None,
        "finish_reason": req.finish_reason,
    }


def summarize(requests: Iterable, by_tenant: bool = True):
    """The latency table of ``requests``: a pandas DataFrame with one row per tenant (and
    ``"all"``) and flat columns ``requests``, ``ttft_p50_s``/``p90``/``p99``, ``itl_*`` (pooled over
    every gap of every request), ``tpot_*``, ``e2e_*``, ``itl_max_s``, ``decode_tok_s`` (the stream
    rate a tenant sees: 1 / mean ITL) and ``prefill_tok_s`` (prompt tokens / TTFT summed); e.g.
    ``summarize(reqs).loc["chat", "ttft_p99_s"]``. :func:`tenant_summaries` has the same figures
    as nested dicts."""
    import pandas as pd  # tables are optional plumbing: the nested form needs no pandas

    rows = {}
    for tenant, s in tenant_summaries(requests, by_tenant).items():
        row = {"requests": s["requests"]}
        for metric in ("ttft", "itl", "tpot", "e2e"):
            for p in PERCENTILES:
                row[f"{metric}_p{p}_s"] = s[f"{metric}_s"][f"p{p}"]
        row.update(itl_max_s=s["itl_s"]["max"], decode_tok_s=s["decode_tok_s"], prefill_tok_s=s["prefill_tok_s"])
        rows[tenant] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "tenant"
    return table


def tenant_summaries(requests: Iterable, by_tenant: bool = True) -> Dict[str, dict]:
    """Percentiles of TTFT, ITL (pooled over every gap of every request), TPOT and e2e, per
    tenant (and ``"all"``). Each value is a :func:`percentiles` dict; ``decode_tok_s`` is the
    stream rate a tenant sees (1 / mean ITL) and ``prefill_tok_s`` prompt tokens / TTFT summed."""
    reqs = list(requests)
    groups: Dict[str, list] = {"all": reqs}
    if by_tenant:
        for r in reqs:
            groups.setdefault(r.tenant, []).append(r)
    out = {}
    for name, rs in groups.items():
        itl = [g for r in rs for g in r.itl_s]
        ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
        out[name] = {
            "requests": len(rs),
            "ttft_s": percentiles(ttft),
            "itl_s": percentiles(itl),
            "tpot_s": percentiles([float(np.mean(r.itl_s)) for r in rs if r.itl_s]),
            "e2e_s": percentiles([r.e2e_s for r in rs if r.e2e_s is not None]),
            "decode_tok_s": (1.0 / float(np.mean(itl))) if itl else float("nan"),
            "prefill_tok_s": (sum(r.prompt_tokens for r in rs if r.ttft_s) / sum(ttft)) if ttft and sum(ttft) > 0 else float("nan"),
        }
    return out


def request_table(requests: Iterable):
    """The per-request table as a pandas DataFrame."""
    import pandas as pd  # tables are optional: metrics work on plain lists without pandas

    return pd.DataFrame([request_row(r) for r in requests])


def timeline_table(steps: Iterable):
    """The step records as a pandas DataFrame (one row per step)."""
    import pandas as pd  # tables are optional: metrics work on plain lists without pandas

    return pd.DataFrame([s.as_dict() if hasattr(s, "as_dict") else dict(s) for s in steps])


def median_and_p99(samples: Sequence[float]) -> Dict[str, float]:
    """Median and p99 of repeated measurements (for benchmark repeats)."""
    v = np.asarray(samples, dtype=float)
    return {"median": float(np.median(v)), "p99": float(np.percentile(v, 99)), "min": float(v.min()),
            "max": float(v.max()), "n": int(v.size)}
