# %% [markdown]
# # 09 · Tune for your workload
#
# **The question users bring.** Seed 001 ends on "draw the two curves for your own box and pick the
# sweet spot on purpose". Here the box is yours and so is the traffic: a trace your server recorded
# (`mlxlab serve --record FILE.jsonl`), or a public one (a Mooncake JSONL, an Azure LLM-inference
# CSV), and the SLOs you need (`chat.itl_p99<=2x`: twice what the chat gets alone).
#
# **Here**: the trace is read and checked, the device profiled for the model (cached), a grid of
# policies, chunk sizes and token budgets simulated on the trace, the best settings confirmed on
# the engine beside mlx-lm's `BatchGenerator`, and a setting chosen with the `mlxlab serve` line
# that runs it (`mlxlab.studies.tune`). The slider below moves the SLO's bound over the simulated
# grid: it works in the exported HTML too, without a kernel.

# %% tags=["parameters"]
quick = True
platform = None
model_name = None              # None: tiny (quick) or small (full)
bits = None                    # quantize the weights (4 on a GPU)
dtype = "float32"              # None: the device's default
trace = None                   # a trace file; None: the committed sample data/traces/samples/seed001_scene_tiny.jsonl
trace_format = "auto"          # auto, mlxlab, mooncake or azure
split_tokens = None            # an imported trace: prompts of this many tokens or more are "batch", the rest "chat"
length_scale = 1.0             # an imported trace's lengths x this
time_scale = 1.0               # its arrival times x this
slo_tenant = "chat"            # the SLO is slo_tenant.slo_metric at most slo_bound (ms, s, or x: times the tenant alone)
slo_metric = "itl_p99"
slo_bound = "3x"
objective = None               # None: batch.ttft_p50 where the trace has a batch tenant
top_k = None                   # None: 1 (quick) or 3 (full)
repeats = None                 # None: 2 (quick) or 3 (full)
sweep = False                  # also run every grid setting on the engine (regret, rank, speed)
grid = "standard"              # standard, or wide: each policy's own knob varied too (quick keeps the small grid)
results_dir = None
figures_dir = None

# %%
from pathlib import Path

import pandas as pd
from mlxlab import load_model
from mlxlab.core.paths import data_dir
from mlxlab.core.presets import model_limits
from mlxlab.core.traces import read_trace, scale_trace, to_arrivals
from mlxlab.notebook import nb, plots
from mlxlab.studies.tune import charts as TC
from mlxlab.studies.tune.confirm import race_text
from mlxlab.studies.tune.run import serve_command, sweep as tune_sweep, tune
from mlxlab.studies.tune.slo import parse_slo
from mlxlab.studies.tune.verdict import tune_verdicts

S = nb.setup(quick, platform, results_dir, figures_dir)
model_name = model_name or ("tiny" if quick else "small")
model = load_model(model_name, bits=bits, dtype=dtype)
path = Path(trace) if trace else data_dir() / "traces" / "samples" / "seed001_scene_tiny.jsonl"
tr = read_trace(path, trace_format, split_tokens=split_tokens)
if length_scale != 1.0 or time_scale != 1.0:
    tr = scale_trace(tr, time_scale=time_scale, length_scale=length_scale)
vocab, ctx = model_limits(model)
arrivals = to_arrivals(tr, vocab)
slos = [f"{slo_tenant}.{slo_metric}<={slo_bound}"]
pd.DataFrame([tr.summary()]).T

# %% [markdown]
# ## Tune
# The profile comes from the cache when this model, dtype, device, mlx and BLAS were profiled
# before; the engine then replays the trace for the solo figures and the confirmed settings.

# %%
doc = tune(model, arrivals, [parse_slo(s) for s in slos], objective=objective, top_k=top_k or (1 if quick else 3),
           repeats=repeats or (2 if quick else 3), quick=quick, grid_name=grid)
doc["trace"] = tr.summary()
doc["parameters"] = {"model": model_name}
if sweep:
    doc["sweep"] = tune_sweep(model, arrivals, doc, repeats=repeats or (2 if quick else 3))
print(doc["choice"]["why"])
print(race_text(doc.get("race")) or "the confirmation ran every repeat")
print(serve_command(doc, model_name, bits=bits, dtype=dtype) or "no setting to serve")
pd.DataFrame([{"setting": r["label"], "repeats": r["repeats"], "objective_ms": r["objective_s"] * 1e3,
               "worst_slo_ratio": r["slo_ratio"], "simulated_objective_ms": r.get("sim_objective_s", float("nan")) * 1e3}
              for r in doc["confirmed"]]).round(2)

# %% [markdown]
# ## The frontier
# Hollow: simulated; filled: measured on the engine (bars: the repeats); ringed: the choice.

# %%
verdicts = tune_verdicts(doc) if sweep else None
S.save("tune", doc, verdicts=verdicts, parameters=dict(quick=quick, model_name=model_name, trace=path.name,
                                                       slos=slos, objective=objective, sweep=sweep))
chart = TC.tune_chart(doc)
S.figure(chart, "tune")
chart

# %% [markdown]
# ## Explore: move the SLO's bound
# A Vega-Lite parameter over the simulated grid: the slider works in this notebook's exported HTML
# as well (`tune_explorer.html` beside the figures is the same chart, self-contained).

# %%
explorer = TC.explorer_chart(doc)
plots.save_explorer(explorer, Path(S.figures_dir) / "tune_explorer.html")
explorer

# %% [markdown]
# ## Verdicts
# With `sweep=True` the exhaustive engine sweep decides the regret, the rank and the speed claims.

# %%
nb.verdict_table(verdicts) if verdicts else "run with sweep=True for the regret, rank and speed verdicts"
