# %% [markdown]
# # 05 · The stall, the admission gate and the chunk-size trade-off
#
# **Claims (seed 001).** While long benchmark prompts prefilled beside an interactive chat, the
# chat collapsed from 65 to 0.67 tok/s (`s001-stall-crawl`). An admission gate (one big prefill
# at a time, a decode step held between its chunks) bounded the chat's worst gap at about one
# chunk time however deep the queue (`s001-gate-worst-gap`) and let it stream at its full
# 60-70 tok/s in the windows between chunks (`s001-gate-window-rate`). Chunks of 512-1,024 tokens
# were the sweet spot: gaps of 0.4-0.8 s for a 15-30% TTFT premium over the prompt's floor
# (`s001-sweet-spot`). Chunked prefill with admission control approximates Sarathi-Serve's
# stall-free batching (`s001-gate-vs-stall-free`).
#
# **Here**, on the real engine: one chat streams while 1, 2 or 4 batch workers each send a long
# prompt. `interleave` (one decode step, then a chunk of every waiting prompt: mlx-lm's
# `BatchGenerator`), `admission_gate`, `stall_free` (token budget = the chunk) and the gate with a
# decode window held open (`admission_gate_window`) run the same seeded workloads at the same
# chunk sizes, the repeats outermost and the configurations shuffled within each. The chunk that
# stands for the seed's 2,048 is `ref_chunk`; the sweep is its 1/8, 1/4, 1/2 and 1 (the seed's
# 256-2,048), and every verdict compares ratios (to the chat's solo rate, to the gap at
# `ref_chunk`, to the prompt's floor) rather than the seed's seconds.

# %% tags=["parameters"]
quick = True
platform = None
model_name = None              # None: tiny (quick) or small (full) on a CPU; qwen2.5-coder-1.5b with 4-bit weights on a GPU
bits = None
executor = "engine"            # or "sim" (needs a profile: mlxlab profile --model ...)
profile_name = None
ref_chunk = None               # the seed's 2,048 here; None: 512 on a CPU, 2048 on a GPU
prompt_chunks = 2              # each long prompt is this many ref_chunk chunks
workers = None                 # None: 1, 2, 4 (quick: 1, 2)
repeats = None                 # None: 5 (quick: 1)
server_url = None              # also run the seed-001 mix through mlxlab serve: a URL, or "local" (a server on this model)
results_dir = None
figures_dir = None

# %%
from pathlib import Path

import pandas as pd
from mlxlab import load_model
from mlxlab.notebook import nb, plots, widgets
from mlxlab.studies.admission_gate import charts as gate_charts
from mlxlab.studies.admission_gate.run import executor_factory, gate_study, plan_gate
from mlxlab.studies.admission_gate.http import run_over_http, side_by_side
from mlxlab.studies.admission_gate.verdict import verdicts as gate_verdicts

S = nb.setup(quick, platform, results_dir, figures_dir)
model_name = model_name or ("tiny" if quick else "small")
model = load_model(model_name, bits=bits)
cost_model = None
if executor == "sim":
    from mlxlab.sim.profiles import load_profile
    cost_model = load_profile(profile_name or f"{S.platform}-{model_name}")
plan = plan_gate(model, quick=quick, ref_chunk=ref_chunk, prompt_chunks=prompt_chunks, workers=workers, repeats=repeats)
print(f"ref_chunk {plan.ref_chunk}, chunks {plan.chunks}, long prompts of {plan.prompt_tokens} tokens, workers "
      f"{plan.workers}, {len(plan.cells)} configurations x {plan.repeats} repeat(s), "
      f"{plan.prompt_tokens_per_repeat():,} prompt tokens per repeat")

# %% [markdown]
# ## The runs
# Every repeat measures its own references (the chat alone; one long prompt alone at each chunk
# size) beside the contention runs, in a seeded shuffled order.

# %%
result = gate_study(model, plan, make_executor=executor_factory(model, executor, cost_model), progress=True)
timelines = result.pop("timelines")
cols = ["config", "chat_prefill_tok_s", "chat_window_tok_s", "chat_itl_p50_pooled_s", "chat_itl_p99_pooled_s",
        "chat_worst_gap_s", "longest_step_s", "long_ttft_s", "ttft_premium_pct", "ttft_over_floor_pct",
        "covered_fraction"]
table = pd.DataFrame(result["table"]).sort_values(["workers", "chunk_size", "policy"])
print(f"{result['wall_s']:.0f} s; solo chat {result['references']['solo_tok_s']:.1f} tok/s, floor "
      f"{result['references']['floor_s']:.3f} s at chunk {result['references']['floor_chunk']}")
table[cols].round(4)

# %% [markdown]
# ## The chunk-size trade-off, per worker count
# Left: what the long prompts pay (TTFT over the floor, W floors for W prompts). Right: what the
# chat pays (ITL p99). The green band is the counterpart of the seed's 512-1,024 sweet spot, the
# grey band the seed's 15-30% premium.

# %%
tradeoff = gate_charts.tradeoff_chart(result["table"], ref_chunk=plan.ref_chunk)
S.figure(tradeoff, "chunk_tradeoff_engine")
tradeoff

# %% [markdown]
# ### Pick a chunk size
# The same measurements with a chunk-size menu and a choice of long prompts that work without a
# kernel (Vega-Lite parameters over the table above): they move in this notebook's exported HTML
# too, and in `chunk_explorer.html` beside the figures. The paper embeds the same chart, drawn
# from the committed results.

# %%
chunk_explorer = gate_charts.chunk_explorer_chart(result["table"], ref_chunk=plan.ref_chunk)
plots.save_explorer(chunk_explorer, Path(S.figures_dir) / "chunk_explorer.html")
chunk_explorer

# %%
plane = gate_charts.plane_chart(result["table"])
S.figure(plane, "ttft_itl_plane_engine")
plane

# %% [markdown]
# ## The chat's rate during the prefill
# Filled: over the whole prefill window (the seed's 0.67 tok/s metric). Open: over the decode
# windows between chunks (the seed's 60-70 tok/s), which only the gate with a window has.

# %%
rates = gate_charts.rate_chart(result["table"], result["references"], ref_chunk=plan.ref_chunk)
S.figure(rates, "gate_chat_rate_engine")
rates

# %% [markdown]
# Move the sliders to see the chat's tokens (repeat 0) under each policy and chunk size.

# %%
def build(policy, chunk, workers):
    key = f"{policy}/c{chunk}/w{workers}"
    rows = timelines.get(key)
    if rows is None:
        return gate_charts.timeline_chart([{"stream": "not run", "t_s": 0.0}], title=f"{key}: not in this plan")
    return gate_charts.timeline_chart(rows, title=f"chat tokens, {key}")

widgets.explorer(build, {"policy": widgets.choice_slider(list(gate_charts.ORDER), value="interleave",
                                                        description="policy"),
                         "chunk": widgets.choice_slider(list(plan.chunks), description="chunk"),
                         "workers": widgets.choice_slider(list(plan.workers), value=1, description="workers")})

# %% [markdown]
# ## The same workload through a server
# With `server_url` set, the seed-001 mix (an agent's chat session beside two benchmark workers,
# at this machine's scale) runs on an in-process engine under the admission gate, then through
# `mlxlab serve` (the HTTP executor: every request streams over loopback as a tenant's would):
# `"local"` starts a server on this notebook's model object with the same policy and chunk, a URL
# drives a server you started (`mlxlab serve --policy admission_gate ...`). The metrics tables sit
# side by side; with greedy decoding both paths give the same tokens.

# %%
over_http = None
if server_url:
    over_http = run_over_http(model, server_url, quick=quick, model_name=model_name)
    print(f"{over_http['url']} ({over_http['model']}), {over_http['policy']} at chunk {over_http['chunk_size']}: "
          f"same tokens {over_http['same_tokens']}, complete {over_http['complete']}, wall s {over_http['wall_s']}")
    display(side_by_side(over_http).round(4))
else:
    print("server_url is None: the HTTP run is skipped (set it to 'local' or a server's URL)")

# %% [markdown]
# ## Verdicts
# Computed from the same table that is saved, before saving.

# %%
verdicts = gate_verdicts(result)
S.save("admission_gate", {"model": model_name, "bits": bits, "executor": executor, **result, "over_http": over_http},
       verdicts=verdicts,
       parameters=dict(quick=quick, platform=platform, model_name=model_name, bits=bits, executor=executor,
                       profile_name=profile_name, ref_chunk=plan.ref_chunk, prompt_chunks=prompt_chunks,
                       workers=list(plan.workers), repeats=plan.repeats, server_url=server_url))
nb.verdict_table(verdicts)
