"""What ``mlxlab bench soak`` concludes (:mod:`mlxlab.studies.serving.soak`): its per-minute table
from the client records and the server's samples, its end-of-run checks, and the verdict of
``mlx-serve-soak``, decided from the stored document alone. No MLX here.

The tolerances, stated once:

* **KV and in-flight**: after the load drains, the server holds 0 KV bytes and 0 requests in
  flight (exactly).
* **MLX active memory** (the engine's arrays) returns to its post-warm-up level within
  :data:`ACTIVE_TOL` of it plus :data:`ACTIVE_SLACK_BYTES`: once every request is finished or
  cancelled only the weights and the warm-up's small buffers stay live, so more is a leak.
* **Process RSS** after the load is at most :data:`RSS_TOL` above the highest RSS of the load's
  first half: the allocator's cache, Python's heap and the engine's bounded history of finished
  requests reach their plateau early, and a leak keeps climbing past it (RSS itself never returns
  to the post-warm-up level: freed memory stays with the allocator for reuse).
* **Open file descriptors and OS threads** after the load at most :data:`FD_SLACK` and
  :data:`THREAD_SLACK` above their post-warm-up counts (a descriptor or thread per request would
  leave thousands).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

ACTIVE_TOL, ACTIVE_SLACK_BYTES = 0.02, 16 << 20
RSS_TOL = 0.10
FD_SLACK, THREAD_SLACK = 8, 8
#: the request kinds the scene sends (well-formed; their latencies are the ones reported)
SCENE = ("chat", "document")
SAMPLE_KEYS = ("in_flight", "kv_bytes", "active_bytes", "peak_bytes", "cache_bytes", "rss_bytes", "fds", "threads")


def _pct(xs: Sequence[float], p: float) -> Optional[float]:
    return float(np.percentile(xs, p)) if len(xs) else None


def _ms(x: Optional[float]) -> Optional[float]:
    return None if x is None else 1e3 * x


def latencies(records: Sequence[Dict]) -> Dict:
    """TTFT and ITL p50/p99 (ms) of the well-formed requests that finished: TTFT from the
    request to its first chunk, ITL each chunk's gap split evenly over its tokens."""
    from mlxlab.studies.serving.against import token_gaps

    done = [r for r in records if r.get("well_formed") and r["outcome"] == "finished" and r.get("arrivals")]
    ttft = [r["arrivals"][0] - r["sent"] for r in done]
    gaps = [g for r in done for g in token_gaps(r)]
    return {"ttft_p50_ms": _ms(_pct(ttft, 50)), "ttft_p99_ms": _ms(_pct(ttft, 99)),
            "itl_p50_ms": _ms(_pct(gaps, 50)), "itl_p99_ms": _ms(_pct(gaps, 99)), "latency_requests": len(done)}


def counts(records: Sequence[Dict]) -> Dict:
    """Requests by kind and outcome, refusals by ``"<status> <error code>"``, 5xx and stream errors."""
    by_kind: Dict[str, Dict[str, int]] = {}
    refused: Dict[str, int] = {}
    for r in records:
        k = by_kind.setdefault(r["kind"], {})
        k[r["outcome"]] = k.get(r["outcome"], 0) + 1
        if r["outcome"] == "refused":
            key = f"{r['status']} {r.get('error_code')}"
            refused[key] = refused.get(key, 0) + 1
    out = {o: sum(r["outcome"] == o for r in records) for o in ("finished", "refused", "cancelled")}
    return {"sent": len(records), **out, "http_5xx": sum(r["outcome"] == "server_error" for r in records),
            "stream_errors": sum(r["outcome"] == "stream_error" for r in records),
            "refused_by": dict(sorted(refused.items())), "by_kind": dict(sorted(by_kind.items()))}


def per_minute(records: Sequence[Dict], samples: Sequence[Dict], t0: float, interval_s: float = 60.0) -> List[Dict]:
    """One row per ``interval_s`` from ``t0``: the requests sent in it (:func:`counts`, the
    latencies of its well-formed ones), the server's requests cancelled in it (its counter's
    rise), and its last sample of the server (memory, KV, RSS, fds, threads) with the highest
    KV and RSS seen in it."""
    ends = [r["sent"] for r in records] or [s["t"] for s in samples]  # the load's span (not the drain after it)
    n = int(np.ceil((max(ends, default=t0) - t0 + 1e-9) / interval_s)) or 1
    rows, prev = [], None
    for i in range(n):
        lo, hi = t0 + i * interval_s, t0 + (i + 1) * interval_s
        rs = [r for r in records if lo <= r["sent"] < hi]
        ss = [s for s in samples if lo <= s["t"] < hi and s.get("rss_bytes") is not None]
        row = {"minute": i + 1, **{k: v for k, v in counts(rs).items() if k != "by_kind"}, **latencies(rs)}
        if ss:
            last = ss[-1]
            row.update({k: last.get(k) for k in SAMPLE_KEYS})
            row["kv_bytes_max"] = max(s.get("kv_bytes") or 0 for s in ss)
            row["rss_bytes_max"] = max(s["rss_bytes"] for s in ss)
            if prev is not None and last.get("server_cancelled") is not None:
                row["server_cancelled"] = last["server_cancelled"] - prev["server_cancelled"]
            prev = last
        rows.append(row)
    return rows


def end_checks(warm: Dict, after: Dict, samples: Sequence[Dict], t0: float, t1: float, records: Sequence[Dict]) -> Dict:
    """The end-of-run checks (see the module docstring) from the post-warm-up sample ``warm``,
    the sample ``after`` the load drained, the samples taken during the load (``t0`` to ``t1``)
    and the client records."""
    c = counts(records)
    half = [s["rss_bytes"] for s in samples if t0 <= s["t"] <= (t0 + t1) / 2 and s.get("rss_bytes")]
    rss_half = max(half) if half else warm.get("rss_bytes")
    admitted = int((after.get("admitted") or 0) - (warm.get("admitted") or 0))
    finished = int((after.get("finished") or 0) - (warm.get("finished") or 0))
    wf_errors = sum(1 for r in records if r.get("well_formed") and r["outcome"] == "stream_error")
    lost = max(admitted - finished, int(after.get("in_flight") or 0)) + wf_errors  # admitted, never finished
    checks = {
        "admitted": admitted, "finished_or_cancelled": finished,
        "server_finished_by_reason": {k: int(v - warm.get("by_reason", {}).get(k, 0))
                                      for k, v in after.get("by_reason", {}).items()},
        "in_flight_after": after.get("in_flight"), "kv_bytes_after": after.get("kv_bytes"),
        "well_formed_stream_errors": wf_errors, "lost": lost, "http_5xx": c["http_5xx"],
        "active_bytes_warm": warm.get("active_bytes"), "active_bytes_after": after.get("active_bytes"),
        "active_limit_bytes": None if warm.get("active_bytes") is None
        else warm["active_bytes"] * (1 + ACTIVE_TOL) + ACTIVE_SLACK_BYTES,
        "peak_bytes_after": after.get("peak_bytes"), "rss_bytes_warm": warm.get("rss_bytes"),
        "rss_bytes_first_half_max": rss_half, "rss_bytes_after": after.get("rss_bytes"),
        "rss_limit_bytes": None if rss_half is None else rss_half * (1 + RSS_TOL),
        "rss_bytes_max": max([s["rss_bytes"] for s in samples if s.get("rss_bytes")] or [0]) or None,
        "fds_warm": warm.get("fds"), "fds_after": after.get("fds"),
        "threads_warm": warm.get("threads"), "threads_after": after.get("threads")}
    checks["kv_freed"] = checks["in_flight_after"] == 0 and checks["kv_bytes_after"] == 0
    checks["active_back"] = _le(checks["active_bytes_after"], checks["active_limit_bytes"])
    checks["rss_bounded"] = _le(checks["rss_bytes_after"], checks["rss_limit_bytes"])
    checks["fds_back"] = _le(checks["fds_after"], None if checks["fds_warm"] is None else checks["fds_warm"] + FD_SLACK)
    checks["threads_back"] = _le(checks["threads_after"],
                                 None if checks["threads_warm"] is None else checks["threads_warm"] + THREAD_SLACK)
    checks["memory_bounded"] = all(checks[k] for k in ("active_back", "rss_bounded", "fds_back", "threads_back"))
    return checks


def _le(x, limit) -> bool:
    return x is not None and limit is not None and x <= limit


# ----------------------------------------------------------------------------- the verdict
def soak_verdict(doc: Dict) -> Dict:
    """``mlx-serve-soak`` from a stored ``serve_soak`` document: reproduced when the run sent
    every fault kind, answered no request with a 5xx, lost none (in flight 0, KV 0, every
    admitted request finished or cancelled, no well-formed stream cut), its memory stayed bounded
    (:func:`end_checks`), SIGTERM drained it cleanly and the sampled greedy outputs equal a fresh
    engine's; not reproduced when any of those fails; not measured without a run."""
    from mlxlab.core.claims import verdict
    from mlxlab.studies.serving.soak_faults import FAULTS

    c = doc.get("config") or {}
    rule = (f"Over the whole run (warm-up excluded): no 5xx; nothing lost (after the load drains 0 requests in "
            f"flight and 0 KV bytes held, as many requests finished or cancelled as the engine admitted, and no "
            f"well-formed stream ended without its finish); memory bounded (MLX active memory back within "
            f"{ACTIVE_TOL:.0%} + {ACTIVE_SLACK_BYTES >> 20} MiB of its post-warm-up level, RSS at most {RSS_TOL:.0%} "
            f"above the highest RSS of the load's first half, open fds and threads within {FD_SLACK} and "
            f"{THREAD_SLACK} of their post-warm-up counts); every fault kind drawn at least once; on SIGTERM the "
            f"server exits 0 and every open stream ends with its finish reason; the sampled greedy outputs equal "
            f"a fresh in-process engine's (up to the first near-tie of mlx-lm's top-two log-probabilities, as the "
            f"test oracle rules) where the model runs in float32; in bfloat16 or float16 they are compared and "
            f"reported but do not decide (on the H200 a lone bfloat16 stream run twice parts by itself: "
            f"h200/determinism_probe.json, so no exact oracle exists there). Reproduced when all hold, not "
            f"reproduced when one fails.")
    fair = (f"One mlxlab serve process on loopback ({c.get('model')}, policy {c.get('policy')}, --max-in-flight "
            f"{c.get('max_in_flight')}), {c.get('minutes')} minute(s) or {c.get('max_requests')} requests, seed "
            f"{c.get('seed')}: one chat after another beside {c.get('workers')} document clients, and a fault about "
            f"every {c.get('fault_gap_s')} s from a seeded generator; the server sampled every {c.get('sample_s')} s "
            f"through /metrics and /proc. One run: a leak slower than the run's length, or a fault the mix never "
            f"drew, is not seen.")
    end, totals = doc.get("end"), doc.get("totals")
    if not end or not totals:
        return verdict("mlx-serve-soak", "not measured", measured=None, rule=rule, fairness=fair)
    sig, eq = doc.get("sigterm") or {}, doc.get("outputs") or {}
    drawn = {k for k, n in (doc.get("faults_by_kind") or {}).items() if n}
    measured = {"requests": totals.get("sent"), "http_5xx": end.get("http_5xx"), "lost": end.get("lost"),
                "kv_freed": end.get("kv_freed"), "memory_bounded": end.get("memory_bounded"),
                "active_mib_warm": _mib(end.get("active_bytes_warm")), "active_mib_after": _mib(end.get("active_bytes_after")),
                "rss_mib_warm": _mib(end.get("rss_bytes_warm")), "rss_mib_after": _mib(end.get("rss_bytes_after")),
                "fault_kinds_missing": sorted(set(FAULTS) - drawn), "sigterm_clean": sig.get("clean"),
                "outputs_equal": eq.get("equal"), "outputs_compared": eq.get("compared"),
                "outputs_identical": eq.get("identical"), "outputs_decide": _exact_dtype(eq.get("dtype"))}
    ok = (measured["http_5xx"] == 0 and totals.get("http_5xx") == 0 and measured["lost"] == 0
          and measured["kv_freed"] is True and measured["memory_bounded"] is True and not measured["fault_kinds_missing"]
          and (sig.get("clean") is True or not sig)
          and (eq.get("equal") is True if measured["outputs_decide"] else bool(eq.get("compared"))))
    return verdict("mlx-serve-soak", "reproduced" if ok else "not reproduced", measured=measured, rule=rule,
                   fairness=fair)


def _exact_dtype(dtype) -> bool:
    """Whether greedy outputs in ``dtype`` (the reference engine's, as stored) have an exact oracle:
    float32, or a file that names none (the rule then holds it to equality); not bfloat16 or float16."""
    return not any(h in str(dtype or "") for h in ("bfloat16", "float16"))


def _mib(x) -> Optional[float]:
    return None if x is None else round(x / 2 ** 20, 1)


def soak_verdicts(doc: Dict) -> List[Dict]:
    return [soak_verdict(doc)]
