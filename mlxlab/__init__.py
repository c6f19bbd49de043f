"""mlxlab: measure and tune how LLMs are served on MLX.

Public API::

    from mlxlab import load_model, Engine, summarize
    model = load_model("tiny")                 # seeded random weights, or a local directory
    eng = Engine(model, policy="interleave", chunk_size=512)
    req = eng.submit(prompt_tokens, max_tokens=64, tenant="chat")
    eng.run()
    summarize(eng.requests)                    # TTFT / ITL / TPOT / e2e percentiles per tenant
"""

from .engine import Engine, Request, StepRecord
from .metrics import percentiles, request_table, summarize, timeline_table
from .models import LoadedModel, available_presets, load_model
from .runner import RunResult, run_workload
from .scheduler import POLICIES, Policy, SchedulerState, SeqView, StepPlan, make_policy

__version__ = "0.1.0"

__all__ = [
    "Engine", "Request", "StepRecord", "LoadedModel", "load_model", "available_presets",
    "summarize", "percentiles", "request_table", "timeline_table",
    "Policy", "POLICIES", "SchedulerState", "SeqView", "StepPlan", "make_policy",
    "run_workload", "RunResult",
]
