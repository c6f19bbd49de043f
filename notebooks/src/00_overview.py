# %% [markdown]
# # 00 · Overview: the engine against mlx-lm
#
# mlxlab's engine is only worth measuring with if it is as correct and as fast as mlx-lm itself.
# This notebook checks both on the model you choose: greedy tokens equal to `generate_step`'s,
# single-stream prefill and decode against `generate_step`, and 8-stream decode against
# `BatchGenerator`, all on the same model object in the same run, and what one batched decode
# step costs against a single stream's (seed 001: "decode sharing is cheap"). Its figure shows this
# run's ratios, and apart from them, labelled as committed references, the benchmark results of
# every platform (`data/results/*/bench_engine.json`).

# %% tags=["parameters"]
quick = True            # small sizes, few repeats (CI and `mlxlab reproduce --quick`)
platform = None         # results folder name; None: detected (cpu, h200, ...)
model_name = "tiny"     # preset or local model directory
bits = None             # quantize weights (e.g. 4) for GPU runs
repeats = 5
results_dir = None      # None: data/results/PLATFORM (quick runs: .../quick)
figures_dir = None      # None: paper/figures (full) or build/figures (quick)

# %%
import json
import pandas as pd
from mlxlab import load_model
from mlxlab.notebook import nb, plots
from mlxlab.studies.engine_bench import run as bench
from mlxlab.core.paths import data_dir

S = nb.setup(quick, platform, results_dir, figures_dir)
model = load_model(model_name, bits=bits)
print(f"{model.name}: {model.num_params/1e6:.1f}M parameters, {model.nbytes/2**20:.1f} MiB, {model.dtype}")

# %% [markdown]
# ## Presets
# Architectures are stored as JSON under `data/models/`; weights are random and seeded (throughput
# does not depend on their values).

# %%
from mlxlab.core.presets import available_presets, preset_config
from mlxlab.studies.roofline.run import param_counts
rows = []
for name in available_presets():
    cfg = preset_config(name)
    rows.append({"preset": name, "type": cfg["model_type"], "layers": cfg["num_hidden_layers"],
                 "hidden": cfg["hidden_size"], "heads": cfg["num_attention_heads"],
                 "kv_heads": cfg["num_key_value_heads"], "vocab": cfg["vocab_size"],
                 "params_M": round(param_counts(cfg)["total"] / 1e6, 1)})
pd.DataFrame(rows)

# %% [markdown]
# ## Exactness: greedy tokens against `generate_step`
# Four requests of different lengths arrive two engine steps apart; each one's tokens must equal
# what `generate_step` produces for it alone. Where two streams part, the reference's gap between
# its two best log-probabilities says whether rounding could have chosen the token.

# %%
exact = bench.exactness_check(model)
pd.DataFrame(exact["requests"])

# %% [markdown]
# ## Speed, side by side
# Single-stream prefill and decode against `generate_step`, 8-stream decode against
# `BatchGenerator`, and one stream of that batch decoding alone (what a batched step costs
# against a single one). Ratios are mlxlab / mlx-lm, paired per repeat.

# %%
sizes = dict(prompt_tokens=128, decode_tokens=32, repeats=2) if quick else dict(prompt_tokens=512, decode_tokens=128, repeats=repeats)
res = bench.bench_engine(model, **sizes)
verdicts = bench.verdicts({model_name: {**res, "model": {"dtype": str(model.dtype)}}}, exact)
S.save("overview_bench", {"model": model_name, "bits": bits, "dtype": str(model.dtype), "exactness": exact, **res},
       verdicts=verdicts, parameters=dict(dict(quick=quick, platform=platform, model_name=model_name, bits=bits,
                                               repeats=repeats), **sizes))
METRIC_NAMES = {"single_prefill_tok_s": "prefill, one stream", "single_decode_tok_s": "decode, one stream",
                "batched_decode_tok_s": "decode, eight streams"}
live = pd.DataFrame([{"metric": name, "mlxlab tok/s": res[k]["mlxlab"]["median"], "mlx-lm tok/s": res[k]["mlx_lm"]["median"],
                      "ratio": res[k]["ratio"], "paired ratio": res[k]["paired_ratio_median"]}
                     for k, name in METRIC_NAMES.items()])
cost = res["batch_step_cost"]
print(f"batch-{cost['batch']} decode step {cost['step_ms_batch']['median']:.2f} ms vs one stream "
      f"{cost['step_ms_b1']['median']:.2f} ms: {cost['ratio_x']:.2f}x the cost for {cost['batch']} streams")
live

# %% [markdown]
# ## This run beside every platform's committed benchmark
# The figure's top panel is this run (the ratios above); below it, apart and labelled as such,
# the committed reference results: `mlxlab bench engine` writes
# `data/results/<platform>/bench_engine.json` (with these same verdicts), and this collects them.
# A quick run's bars are its own, on the quick sizes; the references are full runs.

# %%
import altair as alt

from mlxlab.studies.rules import paired_band

mode = "quick mode" if quick else "full mode"


def paired(r: dict) -> dict:
    """What the speed verdict decides on: the median of the repeats' paired ratios, and its noise band."""
    med, band = paired_band(r.get("paired_ratios") or [r["ratio"]], 0.0)
    return {"ratio": med, "lowest": med - band, "highest": med + band, "repeats": len(r.get("paired_ratios") or [1])}


mine = pd.DataFrame([{"model": f"this run: {S.platform}, {model_name}", "metric": name, **paired(res[k])}
                     for k, name in METRIC_NAMES.items()])
rows = []
for f in sorted((data_dir() / "results").glob("*/bench_engine.json")):
    d = json.loads(f.read_text())
    for preset, r in d["presets"].items():
        for k, name in METRIC_NAMES.items():
            rows.append({"platform": f.parent.name, "model": f"{f.parent.name}: {preset}", "metric": name,
                         **paired(r[k]), "mlxlab": r[k]["mlxlab"]["median"], "mlx_lm": r[k]["mlx_lm"]["median"]})
committed = pd.DataFrame(rows)
sub = "the median of the repeats' paired ratios (each repeat runs both sides); black: its noise band, 3 x MAD / sqrt(repeats)"
chart = plots.ratio_bars(mine, "model", "ratio", color="metric", spread=("lowest", "highest"), title=alt.TitleParams(
    f"This run ({mode}): the engine against mlx-lm", subtitle=["same model object, same run", sub]))
if len(committed):
    reference = plots.ratio_bars(committed, "model", "ratio", color="metric", spread=("lowest", "highest"),
                                 title=alt.TitleParams("Committed reference results, not this run",
                                                       subtitle=["full runs: data/results/*/bench_engine.json", sub]))
    chart = alt.vconcat(chart, reference).resolve_scale(x="shared")
S.figure(chart, "bench_engine_ratios")
display(chart)
committed

# %% [markdown]
# ## Verdict
# Decided from this run's measurements above (stored in `overview_bench.json`); each committed
# `bench_engine.json` stores its own.

# %%
nb.verdict_table(verdicts)
