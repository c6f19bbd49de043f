"""Notebook 05's workload over HTTP: the seed-001 mix (a chat session beside benchmark workers) run
on an in-process :class:`mlxlab.Engine` and through :class:`mlxlab.serve.client.HttpExecutor`
against ``mlxlab serve``, with the same policy and chunk size, and the same metrics tables side by
side (issue 18: the case study's tenants reached their engine through a server).

``server_url``: the base URL of a running server (its served model name is read from
``/v1/models``), or ``"local"``: a server on a free loopback port, on the same model object and
engine options, started and stopped here (:func:`mlxlab.serve.start_background`). The in-process
run goes first, then the HTTP one, never both at once. Importing this module loads no MLX.
"""

from __future__ import annotations

from typing import Optional

LOCAL = "local"  # server_url that starts a background server on the notebook's own model


def http_workload(model, *, quick: bool, max_context: Optional[int] = None):
    """The seed-001 mix at this machine's scale: :func:`mlxlab.core.workload.workload_preset`
    ``"chat+batch"`` (one agent session beside two benchmark workers) at 1/32 of the seed's
    lengths (eight chat turns, eight prompts between the workers); quick: at 1/256, three turns
    and four prompts (the chat's think time is not scaled: it sets the run's length)."""
    from mlxlab.core.presets import model_limits
    from mlxlab.core.workload import workload_preset

    vocab, context = model_limits(model)
    small = {"chat": {"turns": 3}, "batch": {"requests": 4}} if quick else {}
    return workload_preset("chat+batch", vocab_size=vocab, scale=1 / 256 if quick else 1 / 32,
                           max_context=max_context or context, **small)


def run_over_http(model, server_url: str, *, quick: bool, model_name: str, max_wall_s: Optional[float] = 600) -> dict:
    """Notebook 05's comparison: :func:`http_workload` under the admission gate at a chunk of 64
    tokens (quick) or 128 (a prompt longer than one chunk is big), through
    :func:`compare_over_http`."""
    chunk = 64 if quick else 128
    return compare_over_http(model, http_workload(model, quick=quick), server_url, policy="admission_gate",
                             chunk_size=chunk, model_name=model_name, max_wall_s=max_wall_s,
                             big_prompt_tokens=chunk)


def served_model(url: str, timeout_s: float = 10.0) -> str:
    """The model name a server at ``url`` serves (the first of ``/v1/models``)."""
    import httpx

    r = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise ValueError(f"the server at {url} lists no model under /v1/models")
    return data[0]["id"]


def compare_over_http(model, workload, server_url: str, *, policy: str = "admission_gate", chunk_size: int = 512,
                      model_name: str = "model", max_wall_s: Optional[float] = None, **engine_options) -> dict:
    """Run ``workload`` in-process and through the server at ``server_url`` (or ``"local"``, see
    the module docstring) and return ``{"url", "model", "policy", "chunk_size", "table"
    (rows: path, then :meth:`RunResult.summary_table`'s columns), "same_tokens" (every request's
    output equal on both paths, by tenant and prompt: greedy decoding), "complete", "errors"
    (messages of requests the server refused), "wall_s"}``. A remote server runs its own policy:
    only ``"local"`` guarantees the same one."""
    import pandas as pd

    from mlxlab import serve
    from mlxlab.core.presets import model_limits
    from mlxlab.core.runner import run_workload
    from mlxlab.engine.loop import Engine
    from mlxlab.serve.client import HttpExecutor

    if not isinstance(server_url, str) or not server_url:
        raise ValueError(f"server_url must be a URL such as http://127.0.0.1:8000 or {LOCAL!r}, got {server_url!r}")
    local = run_workload(Engine(model, policy=policy, chunk_size=chunk_size, **engine_options), workload,
                         max_wall_s=max_wall_s)
    stop = None
    if server_url == LOCAL:
        srv = serve.build(model, model_name=model_name, policy=policy, chunk_size=chunk_size, **engine_options)
        url, stop = serve.start_background(srv)
    else:
        url = server_url.rstrip("/")
    try:
        name = served_model(url)
        ex = HttpExecutor(url, name, vocab_size=model_limits(model)[0])
        http = run_workload(ex, workload, max_wall_s=max_wall_s)
    finally:
        if stop is not None:
            stop()

    def outputs(res):
        return sorted((r.tenant, tuple(r.prompt), tuple(r.output_tokens)) for r in res.submitted)

    table = pd.concat([local.summary_table().assign(path="in-process"), http.summary_table().assign(path="http")])
    table = table[["path"] + [c for c in table.columns if c != "path"]]
    return {"url": url, "model": name, "policy": policy, "chunk_size": chunk_size,
            "table": table.to_dict("records"), "same_tokens": outputs(local) == outputs(http),
            "complete": bool(local.complete and http.complete), "errors": dict(ex.errors),
            "wall_s": {"in_process": local.wall_s, "http": http.wall_s}}


def side_by_side(result: dict, metric_columns=("requests", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                                               "itl_max_s", "decode_tok_s")):
    """:func:`compare_over_http`'s table with a row per tenant and the two paths side by side
    for each metric (columns ``(metric, path)``)."""
    import pandas as pd

    df = pd.DataFrame(result["table"])
    wide = df.pivot(index="tenant", columns="path", values=list(metric_columns))
    return wide.reindex(columns=pd.MultiIndex.from_product([list(metric_columns), ["in-process", "http"]]))
