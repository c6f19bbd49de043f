"""mlxlab: measure and tune how LLMs are served on MLX.

Public API::

    from mlxlab import load_model, Engine, summarize
    model = load_model("tiny")                 # seeded random weights, or a local directory
    eng = Engine(model, policy="interleave", chunk_size=512)
    req = eng.submit(prompt_tokens, max_tokens=64, tenant="chat")
    eng.run()
    summarize(eng.requests)                    # TTFT / ITL / TPOT / e2e percentiles per tenant

The names below are imported on first use, so ``import mlxlab`` (and every MLX-free part:
policies, cost model, workload, runner, metrics, simulator) works without MLX.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_PUBLIC = {  # name -> module that defines it
    "Engine": "mlxlab.engine.loop",
    "LoadedModel": "mlxlab.engine.models", "load_model": "mlxlab.engine.models",
    "available_presets": "mlxlab.core.presets",
    "Request": "mlxlab.core.request", "StepRecord": "mlxlab.core.request",
    "summarize": "mlxlab.core.metrics", "percentiles": "mlxlab.core.metrics",
    "request_table": "mlxlab.core.metrics", "timeline_table": "mlxlab.core.metrics",
    "run_workload": "mlxlab.core.runner", "RunResult": "mlxlab.core.runner",
    "Executor": "mlxlab.core.executor",
    "Policy": "mlxlab.policies", "POLICIES": "mlxlab.policies", "make_policy": "mlxlab.policies",
    "SchedulerState": "mlxlab.core.plan", "SeqView": "mlxlab.core.plan", "StepPlan": "mlxlab.core.plan",
    "Simulator": "mlxlab.sim",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mlxlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
