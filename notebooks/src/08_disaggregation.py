# %% [markdown]
# # 08 · Disaggregation: prefill and decode on their own compute
#
# **Claim (seed 001).** After the admission gate and a bigger prefix cache brought the chat back,
# the case study names the long-run answer: give workloads of different character their own
# compute, as DistServe and Splitwise put prefill and decode on separate machines
# (`s001-own-compute`).
#
# **Here**, measured: the contention benchmark's chat decodes while a long document arrives, once
# on one engine and once with a prefill worker and a decode worker in two processes
# (`mlx.launch --backend ring -n 2` on loopback; the prefill worker sends each prompt's KV and
# first token over `mx.distributed`). Three of mlxlab's own claims follow from the runs: the
# greedy tokens are the single engine's (`mlx-disagg-exact`), the second process at least halves
# the chat's ITL p99 in every repeat (`mlx-disagg-chat-itl`, the document's TTFT beside it), and
# the simulator's two-executor topology predicts the split run (`mlx-disagg-sim`). On one host
# the two processes share its cores, so a second process is not a second machine: the case
# study's question at its own scale (the 35B MoE on the M4 Max, four benchmark prompts beside an
# agent chat) is answered on the simulator, the KV moving over the transfer line measured here.

# %% tags=["parameters"]
quick = True
platform = None
model_name = None              # None: tiny (quick) or small (full)
dtype = "float32"
doc_tokens = None              # None: 1,024 (quick) or 2,048 (full)
chat_context = None            # None: 128 (quick) or 256 (full)
chunk_size = None              # None: 256 (quick) or 512 (full)
repeats = None                 # None: 2 (quick) or 3 (full); the settings alternate within each
rounds = 2                     # workload rounds per process; the last (warm) is measured
settings = ["single", "disagg"]
profile_name = None            # the simulator's profile; None: data/profiles/PLATFORM-MODEL, else one measured here
results_dir = None
figures_dir = None

# %%
import pandas as pd
from mlxlab.notebook import nb, widgets
from mlxlab.studies.disagg import charts as DC
from mlxlab.studies.disagg import verdict as DV
from mlxlab.studies.disagg.run import format_table, run_study

S = nb.setup(quick, platform, results_dir, figures_dir)
model_name = model_name or ("tiny" if quick else "small")
config = dict(model=model_name, dtype=dtype, doc_tokens=doc_tokens or (1024 if quick else 2048),
              chat_context=chat_context or (128 if quick else 256), chunk_size=chunk_size or (256 if quick else 512),
              repeats=repeats or (2 if quick else 3), rounds=rounds, settings=settings)
config

# %% [markdown]
# ## The runs
# Every repeat launches each setting in fresh processes (one OpenBLAS thread each), one engine first.

# %%
res = run_study(**config)
print(format_table(res))

# %% [markdown]
# ## The simulator's profile
# The topology is scored on the platform's committed profile for the model; without one, a small
# profile of this model is measured here (the run's chunk and contexts) and stored with the
# results, so a later `mlxlab bench disagg --rescore` scores the file on the same cost model.

# %%
from mlxlab.sim.profiles import load_profile, profiles_dir

if profile_name:
    res["profile"] = {"name": profile_name, "cost_model": load_profile(profile_name).as_dict()}
elif not (profiles_dir() / f"{S.platform}-{model_name}.json").is_file():
    from mlxlab import load_model
    from mlxlab.sim.measure import profile_device

    prof = profile_device(load_model(model_name, dtype=dtype), **DV.profile_grid(res["config"]))
    res["profile"] = {"name": f"{model_name}, measured in this run", "cost_model": prof["cost_model"].as_dict(),
                      "grid": DV.profile_grid(res["config"])}
print(res.get("profile", {}).get("name") or f"committed profile {S.platform}-{model_name}")

# %% [markdown]
# ## Verdicts, then the figure
# Decided from the runs (and the simulations they feed) before saving, and stored with them.

# %%
verdicts = DV.verdicts(res, platform=S.platform)
S.save("disagg", res, verdicts=verdicts, parameters=dict(quick=quick, platform=platform, profile_name=profile_name,
                                                         **config))
chart = DC.disagg_chart({**res, "verdicts": verdicts}, S.platform)
S.figure(chart, "disagg")
chart

# %% [markdown]
# The case study's scene at its own scale, every setting (simulated, the published profile):

# %%
seed = next(v for v in verdicts if v["claim"] == "s001-own-compute")["measured"]
pd.DataFrame(seed["settings"]).T if seed else "no disaggregated run with a KV transfer: nothing to simulate"

# %% [markdown]
# ## Explore: the link between the machines, the chunk size, the workers
# The seed-scale scene again with another link (the measured line's latency, another bandwidth),
# chunk size and number of benchmark prompts (10-25k tokens each): does a second machine still
# buy the chat its solo ITL, and what does the warm turn pay for its KV's trip?

# %%
import numpy as np
from mlxlab.studies.disagg.seed import SCENE, seed_disagg_study
from mlxlab.studies.disagg.sim import fit_transfer

line = fit_transfer([t for r in res["runs"]["disagg"] for t in r["transfers"].values() if t.get("transfer_s")])
measured_gb_s = 1e-9 / line["s_per_byte"] if line["s_per_byte"] > 0 else float("inf")
links = [(f"{g:.3g} GB/s" + (" (measured)" if g == measured_gb_s else ""), g) for g in sorted({measured_gb_s, 1.0, 10.0, 40.0})]


def build(link_gb_s, chunk, workers):
    sizes = tuple(int(n) for n in np.linspace(10_000, 25_000, workers))  # the case study's 10-25k prompts
    out = seed_disagg_study({"latency_s": line["latency_s"], "s_per_byte": 1e-9 / link_gb_s},
                            settings=("one machine, gate + prefix cache", "two machines", "two machines + prefix cache"),
                            chunk_size=chunk, batch_prompt_tokens=sizes)
    return DC.seed_chart(out).properties(title=f"{workers} benchmark prompts, chunk {chunk}, link {link_gb_s:.3g} GB/s")


widgets.explorer(build, {"link_gb_s": widgets.choice_slider(links, value=measured_gb_s, description="link"),
                         "chunk": widgets.choice_slider([512, 1024, 2048, 4096], value=SCENE["chunk_size"],
                                                        description="chunk"),
                         "workers": widgets.choice_slider([1, 2, 4, 8], value=4, description="benchmark prompts")})

# %% [markdown]
# ## Verdicts
# Stored in `disagg.json` with the runs.

# %%
nb.verdict_table(verdicts)
