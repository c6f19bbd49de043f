"""Repeats of ``mlxlab bench http`` run in separate calls, pooled into one result.

One GPU call here is limited to ten minutes, and the HTTP scene takes 240-350 s for two repeats of
``mlx_lm.server`` and one mlxlab policy, so five repeats do not fit one call. Each call is then a
whole run (its own server processes and warm-ups) and :func:`merge_http` pools their repeats
server by server, recomputing the summaries (:func:`~mlxlab.studies.serving.against.summarize`)
and the verdicts as one run with that many repeats would. The repeats of different calls also
measure call-to-call variation (a new machine, new processes), which the spread then shows.

Runs that are not repeats of one measurement are refused: a different scene (any ``config``
field but ``repeats``), different servers, a different commit, device, mlx or mlx-lm version or
``MLX_*`` variables, or a file cut short (``*_partial.json``, which holds no verdicts).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

from mlxlab.studies.serving.against import against_verdicts, summarize

# environment fields that must agree for two calls' runs to count as repeats of one measurement
_SAME_ENV = ("mlx", "mlx_lm", "device_name", "platform", "mlx_env")


def _commit(env: Dict) -> str:
    return str(env.get("source_commit") or env.get("git_commit") or "?")


def merge_http(parts: Sequence[Dict]) -> Dict:
    """Pool saved ``bench http`` results (each with a ``source``, its file name) into one.

    Returns ``config`` (``repeats`` the pooled count), ``servers`` (each run tagged with its
    ``part``, a summary over all of them, the first part's command line), ``parts`` (each
    part's source, repeats, commit and when it was written) and ``verdicts``; the caller stores
    the first part's ``environment`` with the sources (the merge itself measures nothing).
    Raises ValueError naming the first part that is not a repeat of the first."""
    if len(parts) < 2:
        raise ValueError("--merge pools two or more saved bench http files (serve_http_*.json)")
    for p in parts:
        if "servers" not in p or "config" not in p:
            raise ValueError(f"{p.get('source')}: not a saved bench http results file")
        if p.get("partial"):
            raise ValueError(f"{p.get('source')}: a run cut short (its servers so far, no verdicts): rerun it whole")
    first, env0 = parts[0], parts[0].get("environment") or {}
    base = {k: v for k, v in first["config"].items() if k != "repeats"}
    for p in parts[1:]:
        src, env = p.get("source"), p.get("environment") or {}
        cfg = {k: v for k, v in p["config"].items() if k != "repeats"}
        if cfg != base:
            diff = sorted(k for k in set(cfg) | set(base) if cfg.get(k) != base.get(k))
            raise ValueError(f"{src}: a different scene from {first.get('source')} ({', '.join(diff)}): not repeats "
                             f"of one measurement")
        if set(p["servers"]) != set(first["servers"]):
            raise ValueError(f"{src}: servers {sorted(p['servers'])}, not {sorted(first['servers'])}")
        bad = [k for k in _SAME_ENV if env.get(k) != env0.get(k)]
        if _commit(env) != _commit(env0):
            bad.insert(0, "commit")
        if bad:
            raise ValueError(f"{src}: measured with a different {', '.join(bad)} from {first.get('source')}")
    servers = {}
    for label, s0 in first["servers"].items():
        runs: List[Dict] = [{**r, "part": i} for i, p in enumerate(parts) for r in p["servers"][label]["runs"]]
        plain = [{k: v for k, v in r.items() if k != "part"} for r in runs]  # the tag is no figure
        servers[label] = {"runs": runs, "summary": summarize(plain), "command": s0.get("command")}
    repeats = min(len(s["runs"]) for s in servers.values())
    doc = {"config": {**first["config"], "repeats": repeats}, "servers": servers,
           "parts": [{"source": p.get("source"), "repeats": p["config"].get("repeats"),
                      "commit": _commit(p.get("environment") or {}),
                      "written_at": (p.get("environment") or {}).get("written_at")} for p in parts]}
    doc["verdicts"] = against_verdicts(doc)
    return doc
