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
# or peak memory? Every run here is a fresh process, so nothing is compiled before it starts.

# %% tags=["parameters"]
quick = True
platform = None
models = ["tiny"]                 # seed presets with bits=4 on a GPU
bits = None
prompt_tokens = 480
chunks = [512, 2048]
batches = [4, 8]
repeats = 3
cache_limits_mb = [None, 0, 64, 512]
results_dir = None
figures_dir = None

# %%
import pandas as pd
import altair as alt
from mlxlab.notebook import nb, plots
from mlxlab.studies.prefill import fresh_process_run

S = nb.setup(quick, platform, results_dir, figures_dir)
if quick:
    prompt_tokens, chunks, batches, repeats, cache_limits_mb = 128, [128, 512], [4], 2, [None, 0]

# %% [markdown]
# ## Cold start and warm-up, per model

# %%
runs = []
for m in models:
    for mode in ("off", "token", "shapes"):
        r = fresh_process_run(m, warmup_mode=mode, prompt_tokens=prompt_tokens, chunks=chunks, batches=batches,
                              repeats=repeats, bits=bits)
        for e in r["events"]:
            runs.append({"model": m, "warmup": mode, "warmup_s": r["warmup_s"], **e})
ev = pd.DataFrame(runs)
warm = ev[ev.event == "warm request"].groupby(["model", "warmup"]).ttft_s.median().rename("warm_ttft_s")
first = ev[ev.event == "first request"].set_index(["model", "warmup"]).ttft_s.rename("first_ttft_s")
cold = pd.concat([first, warm], axis=1).reset_index()
cold["first_minus_warm_ms"] = 1e3 * (cold.first_ttft_s - cold.warm_ttft_s)
cold

# %% [markdown]
# ## Which later shapes still compile on first use?
# The extra time of the first use of a new chunk size or batch size over its immediate repeat.

# %%
def first_use_cost(g):
    out = []
    for label in g.event:
        if label.startswith("first use of "):
            what = label[len("first use of "):]
            again = g[g.event == f"again {what}"].ttft_s
            t = g[g.event == label].ttft_s.iloc[0]
            out.append({"shape": what, "first_use_ttft_s": t, "repeat_ttft_s": float(again.iloc[0]),
                        "extra_ms": 1e3 * (t - float(again.iloc[0]))})
    return pd.DataFrame(out)
shapes = pd.concat([first_use_cost(g).assign(model=m, warmup=w) for (m, w), g in ev.groupby(["model", "warmup"])])
chart = alt.Chart(shapes, title="Extra time on the first use of a shape (fresh process)").mark_bar().encode(
    x=alt.X("extra_ms:Q", title="first use minus repeat (ms)"), y=alt.Y("shape:N", title=None),
    color="warmup:N", yOffset="warmup:N", row=alt.Row("model:N", title=None))
S.figure(chart, "warmup_first_use")
chart

# %% [markdown]
# ## Allocator cache limit: latency and memory

# %%
mem = []
for lim in cache_limits_mb:
    r = fresh_process_run(models[0], warmup_mode="token", prompt_tokens=prompt_tokens, chunks=chunks[:1],
                          batches=[], repeats=max(repeats, 3), cache_limit_mb=lim, bits=bits)
    w = pd.DataFrame(r["events"])
    w = w[w.event == "warm request"]
    mem.append({"cache_limit_mb": "default" if lim is None else lim, "ttft_p50_s": w.ttft_s.median(),
                "itl_p50_s": w.itl_s.median(), "peak_mb": w.peak_mb.max(), "cache_mb_after": w.cache_mb.iloc[-1]})
mem = pd.DataFrame(mem)
mem

# %%
S.save("warmup_memory", {"models": models, "bits": bits, "events": ev.to_dict("records"), "cold": cold.to_dict("records"),
                         "first_use": shapes.to_dict("records"), "cache_limits": mem.to_dict("records")})

# %% [markdown]
# ## Verdict

# %%
off = cold[cold.warmup == "off"]
tok = cold[cold.warmup == "token"]
base = mem.iloc[0]
rows = [
    {"claim": "first request pays 200-1,000 ms of compilation without warm-up", "published": "200-1,000 ms",
     "measured": ", ".join(f"{r.model}: {r.first_minus_warm_ms:.0f} ms" for r in off.itertuples()),
     "verdict": "reproduced" if (off.first_minus_warm_ms >= 200).all() else "not reproduced",
     "evidence": "fresh process, first minus median warm TTFT (on a CPU there is little to compile)"},
    {"claim": "a one-token warm-up removes the first-request penalty", "published": "removed",
     "measured": ", ".join(f"{r.model}: {r.first_minus_warm_ms:.0f} ms left" for r in tok.itertuples()),
     "verdict": "reproduced" if (tok.first_minus_warm_ms < 0.25 * off.first_minus_warm_ms.clip(lower=1).values).all() else "not reproduced",
     "evidence": "warm-up 'token' runs"},
    {"claim": "allocator cache limit does not change throughput", "published": "no throughput change",
     "measured": "; ".join(f"{r.cache_limit_mb}: TTFT {r.ttft_p50_s*1e3:.0f} ms, peak {r.peak_mb:.0f} MiB" for r in mem.itertuples()),
     "verdict": "reproduced" if (abs(mem.ttft_p50_s / base.ttft_p50_s - 1) < 0.15).all() else "not reproduced",
     "evidence": "fresh process per limit"},
]
nb.verdict_table(rows)
