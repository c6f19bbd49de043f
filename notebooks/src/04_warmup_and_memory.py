# %% [markdown]
# # 04 · Warm-up and memory limits
#
# **Claims (seed 000, iterations 1b and 4).** Without a warm-up, the first request after loading
# pays 200-1,000 ms of kernel compilation; a one-token "Hi" after load removes it. Setting Metal's
# allocator cache and memory limits removed out-of-memory panics in long sessions without
# changing throughput.
#
# **Questions.** Per model: cold vs warm first-request TTFT with warm-up off, one token, or the
# chunk and batch shapes the server will use. Which later shapes still compile on first use (a new
# chunk size, a new batch size)? Does the allocator cache limit change request-to-request latency
# or peak memory, and does raising it from 512 MB to 1 GB let the next request reuse a request's
# KV buffers? Every run here is a fresh process, so nothing is compiled before it starts.

# %% tags=["parameters"]
quick = True
platform = None
models = ["tiny"]                 # seed presets with 4-bit weights on a GPU
bits = None
prompt_tokens = 480
chunks = [512, 2048]
batches = [4, 8]
repeats = 5
cold_repeats = 5                  # fresh processes per warm-up mode (one first request each)
cache_limits_mb = [None, 0, 512, 1024]
memory_limit_mb = 2048            # set with a 512 MB cache limit, as the case study's server set both
alloc_limits_mb = [None, 0, 512, 1024]
alloc_scaled = [0.6, 1.2]         # x the request's own buffers: a pair twice apart that straddles them
alloc_rounds = 3
alloc_requests = 3
results_dir = None
figures_dir = None

# %%
import pandas as pd
import altair as alt
from mlxlab.notebook import nb, plots
from mlxlab.studies.warmup import run as W
from mlxlab.studies.prefill_step.run import fresh_process_run

S = nb.setup(quick, platform, results_dir, figures_dir)
if quick:
    prompt_tokens, chunks, batches, repeats, cold_repeats, cache_limits_mb = 128, [128, 512], [4], 3, 1, [None, 512]
    alloc_limits_mb, alloc_rounds, alloc_requests = [None, 512, 1024], 1, 3
parameters = dict(quick=quick, platform=platform, models=models, bits=bits, prompt_tokens=prompt_tokens, chunks=chunks,
                  batches=batches, repeats=repeats, cold_repeats=cold_repeats, cache_limits_mb=cache_limits_mb,
                  memory_limit_mb=memory_limit_mb,
                  alloc_limits_mb=alloc_limits_mb, alloc_scaled=alloc_scaled, alloc_rounds=alloc_rounds,
                  alloc_requests=alloc_requests)

# %% [markdown]
# ## Cold start and warm-up, per model

# %%
runs = []
for m in models:
    for k in range(cold_repeats):
        for mode in ("off", "token", "shapes"):
            r = fresh_process_run(m, warmup_mode=mode, prompt_tokens=prompt_tokens, chunks=chunks, batches=batches,
                                  repeats=repeats, bits=bits)
            for e in r["events"]:
                runs.append({"model": m, "warmup": mode, "process": k, "warmup_s": r["warmup_s"], **e})
ev = pd.DataFrame(runs)
cold = W.cold_table(ev)
cold

# %% [markdown]
# ## Which later shapes still compile on first use?
# The extra time of the first use of a new chunk size or batch size over its immediate repeat.

# %%
shapes = W.first_use_table(ev)
WARMUP_NAMES = {"off": "no warm-up", "token": "one token", "shapes": "the server's shapes"}
order = list(WARMUP_NAMES.values())
bars = shapes.assign(warm_up=[WARMUP_NAMES.get(w, w) for w in shapes.warmup])
chart = alt.Chart(bars, title="Extra time on the first use of a shape (fresh process)").mark_bar().encode(
    x=alt.X("median(extra_ms):Q", title="first use minus repeat (ms, median over processes)"), y=alt.Y("shape:N", title=None),
    color=alt.Color("warm_up:N", title="warm-up", sort=order), yOffset=alt.YOffset("warm_up:N", sort=order),
    row=alt.Row("model:N", title=None))
S.figure(chart, "warmup_first_use")
chart

# %% [markdown]
# ## Allocator limits: latency and memory, one fresh process per setting
# A cache limit, or a cache and a memory limit together, set before the model loads; warm requests
# after a one-token warm-up. The processes run one after another, so drift between them shows up
# as a difference: the in-process comparison below decides.

# %%
settings = [dict(cache_limit_mb=lim) for lim in cache_limits_mb]
if memory_limit_mb:
    settings.append(dict(cache_limit_mb=512, memory_limit_mb=memory_limit_mb))
lim_runs = [fresh_process_run(models[0], warmup_mode="token", prompt_tokens=prompt_tokens, chunks=chunks[:1],
                              batches=[], repeats=max(repeats, 3), bits=bits, **kw) for kw in settings]
mem = W.limits_table(lim_runs)
mem

# %% [markdown]
# ## Allocator cache 512 MB → 1 GB: are a request's buffers reused by the next?
# Request after request of one size in one fresh process, the settings round-robin: the cache
# held between requests, how much of the buffers a request keeps across steps (its KV cache) it
# took out of that cache, fresh memory the OS had to map, TTFT, ITL and latency. A small model's
# buffers are far below 512 MB, so the pair that decides is scaled to straddle them.

# %%
alloc_run = W.alloc_cache_run(models[0], prompt_tokens=prompt_tokens, chunk=chunks[0], limits_mb=alloc_limits_mb,
                              memory_limit_mb=memory_limit_mb, scaled=alloc_scaled, rounds=alloc_rounds,
                              requests=alloc_requests, bits=bits)
alloc = W.alloc_table(alloc_run)
print(f"one request's buffers: {alloc_run['request_buffers_mb']:.1f} MiB; mlx's default cache limit here: "
      f"{alloc_run['default_limit_mb']:.0f} MiB")
alloc

# %%
note = W.model_note(parameters)
verdicts = W.verdicts(cold, alloc, scaled=alloc_scaled, request_buffers_mb=alloc_run["request_buffers_mb"],
                      default_limit_mb=alloc_run["default_limit_mb"], fresh_limits=mem, model_note=note)
S.save("warmup_memory", {"models": models, "bits": bits, "events": ev.to_dict("records"), "cold": cold.to_dict("records"),
                         "first_use": shapes.to_dict("records"), "cache_limits": mem.to_dict("records"),
                         "alloc_cache": {k: v for k, v in alloc_run.items() if k != "rows"},
                         "alloc_requests": alloc_run["rows"], "alloc_table": alloc.to_dict("records")},
       verdicts=verdicts, parameters=parameters)

# %% [markdown]
# ## Verdict

# %%
nb.verdict_table(verdicts)
