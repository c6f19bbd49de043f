# %% [markdown]
# # 07 · Roofline, and the multi-tenant study at the case study's scale
#
# Decode reads every active weight once per step, plus every sequence's KV cache: its speed is
# bounded by memory bandwidth / bytes per step. This notebook computes the bytes from each
# preset's configuration, measures this machine's bandwidth with a copy kernel and one model's
# single-stream decode in the same run, places that decode against its ceiling (and against the
# committed runs of other machines), checks the per-token KV arithmetic against mlx-lm's cache, and
# rebuilds the case study's hardware table (decode ≈ 65 tok/s × bandwidth ratio). The second part
# runs the simulator with the cost model derived from the case study's published figures (M4 Max,
# 35B hybrid MoE) at a scale no machine here can run; the figures that derivation is fitted on are
# shown apart, as residuals, and only the ones it predicts get a verdict.

# %% tags=["parameters"]
quick = True
platform = None
bandwidth_bytes = 256 * 2**20      # copy-kernel buffer (large enough to leave the CPU caches)
bandwidth_repeats = 10
roof_model = "small"               # the model whose decode is placed against this machine's ceiling
roof_dtype = "float32"             # the same on every machine, so their runs compare one model
prompt_tokens = 128
decode_tokens = 64
decode_repeats = 5
kv_tokens = 512                    # a multiple of mlx-lm's 256-position cache step
results_dir = None
figures_dir = None
sim_model = "tiny"                 # the model of the engine-vs-simulator demo

# %%
import json
import pandas as pd
import altair as alt
from mlxlab.notebook import nb, plots, widgets
from mlxlab.core.presets import available_presets, preset_config
from mlxlab.studies.roofline import run as R
from mlxlab.studies.roofline import verdict as RV
from mlxlab.core.paths import data_dir

S = nb.setup(quick, platform, results_dir, figures_dir)
reps = 3 if quick else decode_repeats
n_decode = 32 if quick else decode_tokens
bw = R.measure_bandwidth(nbytes=bandwidth_bytes, repeats=bandwidth_repeats)
print(f"measured copy bandwidth: {bw['gb_s']:.1f} GB/s (best {bw['best_gb_s']:.1f}, CV {bw['cv']:.1%}) "
      f"on {bw['device_name']}")

# %% [markdown]
# ## Bytes per decode step, per preset

# %%
rows = []
for name in available_presets():
    cfg = preset_config(name)
    for b in (None, 8, 4):
        w = R.weight_bytes_per_decode_step(cfg, bits=b)
        rows.append({"preset": name, "bits": "bf16" if b is None else f"{b}-bit", "weight_MB": w / 1e6,
                     "kv_KB_per_token": R.kv_bytes_per_token(cfg) / 1e3,
                     "ceiling_tok_s_here": R.decode_ceiling_tok_s(bw["gb_s"] * 1e9, w)})
bytes_table = pd.DataFrame(rows)
bytes_table

# %% [markdown]
# ## This machine: measured decode against its ceiling, and the KV bytes per token
# One model, measured in this run beside the bandwidth: single-stream decode through mlx-lm's
# `generate_step` (prefill excluded, repeats after one warm-up), its bytes of weights per step from
# the config (checked against the arrays the model holds), and the KV bytes one token adds, from
# the config and from mlx-lm's cache after a forward pass.

# %%
from mlxlab import load_model

roof = load_model(roof_model, dtype=roof_dtype)
dec = R.measure_decode(roof, prompt_tokens=prompt_tokens, decode_tokens=n_decode, repeats=reps)
cache = R.measure_kv_cache(roof, kv_tokens)
kv = {"config_bytes_per_token": R.kv_bytes_per_token(roof.config, dtype_bytes=roof.dtype.size),
      "cache_bytes_per_token": cache["bytes_per_token"], "tokens": cache["tokens"], "cache": cache}
here = RV.decode_point(platform=S.platform, source="this run", commit=None,
                       preset=roof_model, config=roof.config, dtype=str(roof.dtype), bits=roof.bits,
                       bandwidth_gb_s=bw["gb_s"], bandwidth_source="measured copy kernel (this run)",
                       decode_tok_s=dec["median"], decode_cv=dec["cv"], bandwidth_cv=bw["cv"])
assert abs(here["weight_mb"] * 1e6 - roof.nbytes) < 1e-6 * roof.nbytes, "config bytes = the model's arrays"
print(f"{roof_model}: decode {dec['median']:.1f} tok/s (p99 {dec['p99']:.1f}, CV {dec['cv']:.1%}, n={dec['n']}); "
      f"ceiling {here['ceiling_tok_s']:.0f} tok/s; fraction {here['fraction']:.1%}; KV {kv['config_bytes_per_token']:.0f} "
      f"B/token from the config, {kv['cache_bytes_per_token']:.0f} from the cache")

# %% [markdown]
# ## Other machines: the committed runs
# Single-stream decode (mlx-lm's side) from the other platforms' committed `bench_engine*.json`
# files, against their ceilings: their measured copy bandwidth where a roofline run recorded one,
# else the datasheet figure (`data/hardware.csv`). Each row names the commit it ran at.

# %%
hw_rows = R.load_hardware_table()
others = RV.committed_points(data_dir() / "results", hw_rows, exclude_platform=S.platform)
points = pd.DataFrame([here] + others)
points[["platform", "source", "commit", "preset", "dtype", "bits", "weight_mb", "bandwidth_gb_s",
        "bandwidth_source", "decode_tok_s", "ceiling_tok_s", "fraction"]]

# %% [markdown]
# ## Explore: bandwidth and bytes per step
# The case study's rule of thumb: decode ≈ bandwidth / bytes per step × efficiency. Move the
# controls to see where each device of the hardware table lands.

# %%
hw = R.load_hardware_table(as_frame=True)


def build(weight_gb, efficiency):
    t = hw.copy()
    t["ceiling_tok_s"] = t.bandwidth_gb_s / weight_gb
    t["expected_tok_s"] = t.ceiling_tok_s * efficiency
    t["from_tok_s"] = 0.5  # a log axis has no zero: the bars start at 0.5 tok/s
    x = alt.X("expected_tok_s:Q", title="decode estimate (tok/s, log)", scale=alt.Scale(type="log", domainMin=0.5))
    base = alt.Chart(t, title=f"Decode estimate at {weight_gb:.1f} GB/step, {efficiency:.0%} of roofline")
    enc = dict(y=alt.Y("name:N", sort="x", title=None), color="vendor:N",
               tooltip=["name", "bandwidth_gb_s", "ceiling_tok_s", "expected_tok_s", "source"])
    bars = base.mark_bar(height=12).encode(x=x, x2="from_tok_s:Q", **enc)
    labels = base.mark_text(align="left", dx=4, fontSize=10).encode(
        x=x, y=enc["y"], text=alt.Text("expected_tok_s:Q", format=",.0f"))
    return (bars + labels).properties(width=420, height=360)

controls = {"weight_gb": widgets.float_slider(3.0, 0.2, 20.0, 0.1, "GB read per step"),
            "efficiency": widgets.float_slider(0.36, 0.05, 1.0, 0.01, "fraction of roofline")}
widgets.explorer(build, controls)

# %%
S.figure(build(3.0, 0.36), "hardware_decode_estimates")
estimates = RV.hardware_estimates(hw_rows)
pd.DataFrame(estimates)

# %% [markdown]
# ## Verdict (roofline)
# Computed from the numbers above, then stored with them in `roofline.json`.

# %%
verdicts = RV.roofline_verdicts(here, others, kv, bandwidth_times=bw["times_s"])
S.save("roofline", {"bandwidth": bw, "here": here, "decode": dec, "kv": kv, "others": others,
                    "bytes_per_step": bytes_table.to_dict("records"), "seed_arithmetic": RV.seed_arithmetic(),
                    "hardware_estimates": estimates},
       verdicts=verdicts,
       parameters=dict(quick=quick, bandwidth_bytes=bandwidth_bytes, bandwidth_repeats=bandwidth_repeats,
                       roof_model=roof_model, roof_dtype=roof_dtype, prompt_tokens=prompt_tokens,
                       decode_tokens=n_decode, decode_repeats=reps, kv_tokens=kv_tokens))
nb.verdict_table(verdicts)

# %% [markdown]
# ## The case study at its own scale (simulator, published profile)
#
# No machine here runs a 35B model on a 60k-token prompt. The simulator does, with the cost model
# derived from the case study's own figures (`mlxlab.sim.published.seed001_profile`: every coefficient
# with its provenance). The figures that derivation is fitted on (the 44 s floor, 65 tok/s at 23k,
# the 15% premium at 1,024) come back as residuals in the calibration table and are not scored; the
# ones it predicts get a verdict whose rule names the inputs it rests on. The study writes
# `seed_scale.json` (in full mode the file `mlxlab seed-scale` writes, with the same verdicts; a
# quick run draws fewer points of the plane, not the ones the verdicts read).

# %%
from mlxlab.sim.published import seed001_cost_model
from mlxlab.studies.sim_validation import charts as sim_charts
from mlxlab.studies.sim_validation import scoring as sim_scoring
from mlxlab.studies.sim_validation import run as sim_validation
from mlxlab.studies.seed_scale.run import QUICK, seed_scale_study

# a saved full run (`mlxlab reproduce --save`) writes the committed data/results/sim-seed001/ file
study = seed_scale_study(save=True, folder=None if S.committed else S.results_dir,
                         **(QUICK if quick else {}))
S.figure(sim_charts.seed_scale_chart(study), "seed_scale")  # the figure `mlxlab seed-scale` writes
pd.DataFrame(study["calibration"]["fitted"])

# %%
nb.verdict_table(study["verdicts"])

# %% [markdown]
# ## Explore: one long prompt beside a chat, at any chunk size
#
# A chat at 23k context is decoding when the 60k-token prompt arrives. Pick the policy and its
# chunk size (the token budget for `stall_free`): the simulator runs the pair on the published
# profile and places the result on the plane of the study above (grey).

# %%
from mlxlab.sim import simulate
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload

seed_cm = seed001_cost_model()
plane = pd.DataFrame(study["plane"])


def one_point(policy, chunk):
    wl = Workload([ChatTenant(sessions=1, turns=1, first_prompt_tokens=23_000, output_tokens=400, think_time_s=0.0),
                   BatchTenant(workers=1, requests=1, prompt_tokens=60_000, output_tokens=1, start_s=1.0)],
                  vocab_size=1000, max_context=262_144)
    opts = {"token_budget": chunk} if policy == "stall_free" else {}
    res = simulate(seed_cm, wl, policy=policy, chunk_size=chunk, **opts)
    req = res.requests
    long_ttft = float(req[req.tenant == "batch"].ttft_s.iloc[0])
    chat = res.summary["chat"]["itl_s"]
    return {"label": f"{policy} {chunk}", "long_ttft_s": long_ttft, "itl_p50_s": chat["p50"], "itl_p99_s": chat["p99"]}


def build(policy, chunk):
    pt = pd.DataFrame([one_point(policy, chunk)])
    axes = dict(x=alt.X("itl_p99_s:Q", scale=alt.Scale(type="log"), title="chat ITL p99 (s)"),
                y=alt.Y("long_ttft_s:Q", title="60k prompt TTFT (s)"))
    grey = alt.Chart(plane).mark_point(color="lightgray").encode(**axes, tooltip=["label"])
    here = alt.Chart(pt).mark_point(size=160, filled=True, color="crimson").encode(
        **axes, tooltip=["label", "long_ttft_s", "itl_p50_s", "itl_p99_s"])
    return (grey + here).properties(title=f"{policy}, chunk {chunk}: TTFT {pt.long_ttft_s[0]:.1f} s, "
                                          f"chat ITL p99 {pt.itl_p99_s[0]:.2f} s", width=420, height=300)


controls = {"policy": widgets.choice_slider(["interleave", "admission_gate", "stall_free"], "interleave", "policy"),
            "chunk": widgets.choice_slider([256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096], 1024, "chunk / budget")}
widgets.explorer(build, controls)

# %% [markdown]
# ## The same policies on the engine and on the simulator: one argument
#
# The engine and the simulator take the same policies and workloads and return the same tables,
# so a study switches executor with one argument. Here a small profile of `sim_model` is measured
# on this machine, then one workload runs on both.

# %%
from mlxlab import Engine, load_model
from mlxlab.sim.measure import profile_device
from mlxlab.core.runner import run_workload
from mlxlab.sim import Simulator

demo_model = load_model(sim_model, dtype="float32")
grid = dict(prefill_tokens=(16, 64, 128), contexts=(0, 384), decode_batches=(1, 2), decode_contexts=(32, 512),
            repeats=1, fill_chunk=128)
prof = profile_device(demo_model, **grid)
wl = sim_validation.validation_workloads(demo_model, scale=0.25)["chat+long"]
rows = []
for executor in (Engine(demo_model, policy="stall_free", chunk_size=128),
                 Simulator.for_model(demo_model, prof["cost_model"], policy="stall_free", chunk_size=128)):
    res = run_workload(executor, wl)
    rows += [{"executor": type(executor).__name__, **r} for r in res.summary_table().to_dict("records")]
pd.DataFrame(rows)[["executor", "tenant", "ttft_p50_s", "itl_p50_s", "itl_p99_s"]]

# %% [markdown]
# ## Simulator against engine: the committed validations
#
# `mlxlab validate-sim` runs the engine and the simulator on the same workloads, five repeats, with a
# profile measured in between (tolerance: 10% or three times the engine's own run-to-run spread).
# The tables below are the committed runs; `mlxlab validate-sim --rescore FILE` scores any of them
# again under the current cost model without a device. On the H200 the one comparison that misses
# in every run is a chat's ITL p50 whose steps are two-row decodes, and those run in one of two
# modes (last chart).

# %%
vals = []
for f in sorted((data_dir() / "results").glob("*/sim_validation*.json")):
    if "quick" in f.parts:
        continue
    d = json.loads(f.read_text())
    for metric, s in d["summary"].items():
        vals.append({"platform": f.parent.name, "file": f.stem, "metric": metric,
                     "median error": s["median_rel_error"], "within 10%": f"{s['within_10pct']}/{s['n']}",
                     "within noise rule": f"{s['passed']}/{s['n']}"})
latest = {f.parent.name: json.loads(f.read_text()) for f in (data_dir() / "results").glob("*/sim_validation.json")}
for plat, d in sorted(latest.items()):
    display(sim_charts.validation_chart(d["table"], title=f"simulator against engine ({plat})"))
pd.DataFrame(vals)

# %%
h200 = data_dir() / "results" / "h200"
modes = {}
for f in sorted(h200.glob("sim_validation*.json")):
    d = json.loads(f.read_text())
    if f.stem.endswith("_rescored") or "chat+batch/interleave" not in d.get("steps", {}).get("runs", {}):
        continue
    modes[f.stem] = sim_scoring.decode_periods(d, "chat+batch/interleave", 2, max_context=6000, profile_cell="decode b2 c32")
sim_charts.decode_periods_chart(modes, title="two-row decodes on the H200: engine runs and profile shares") if modes else "no H200 validation on file"

# %% [markdown]
# ## Verdicts
# Every verdict this notebook stored: the roofline's (in `roofline.json`) and the case study's at its
# own scale (in `seed_scale.json`).

# %%
nb.verdict_table(verdicts + study["verdicts"])
