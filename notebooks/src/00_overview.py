# %% [markdown]
# # 00 · Overview: the engine against mlx-lm
#
# mlxlab's engine is only worth measuring with if it is as correct and as fast as mlx-lm itself.
# This notebook checks both on the model you choose: greedy tokens equal to `generate_step`'s,
# single-stream prefill and decode against `generate_step`, and 8-stream decode against
# `BatchGenerator`, all on the same model object in the same run. It also gathers the committed
# benchmark results of every platform (`data/results/*/bench_engine.json`) into one figure.

# %% tags=["parameters"]
quick = True            # small sizes, few repeats (CI and `mlxlab reproduce --quick`)
platform = None         # results folder name; None = detected (cpu, h200, ...)
model_name = "tiny"     # preset or local model directory
bits = None             # quantize weights (e.g. 4) for GPU runs
repeats = 5
results_dir = None      # None: data/results/PLATFORM (quick runs: .../quick)
figures_dir = None      # None = paper/figures (full) or build/figures (quick)

# %%
import json, random
import pandas as pd
import mlx.core as mx
from mlx_lm.generate import generate_step
import mlxlab
from mlxlab import load_model, Engine
from mlxlab.notebook import nb, plots
from mlxlab.studies.bench import bench_engine
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
from mlxlab.studies.roofline import param_counts
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
# Four requests of different lengths arrive at different steps; each one's tokens must equal
# what `generate_step` produces for it alone.

# %%
rng = random.Random(0)
prompts = [[rng.randrange(1, model.vocab_size) for _ in range(n)] for n in (7, 40, 90, 3)]
eng = Engine(model, chunk_size=16)
reqs = []
for p in prompts:
    reqs.append(eng.submit(p, 12)); eng.step(); eng.step()
eng.run()
ref = [[t for t, _ in generate_step(mx.array(p), model.module, max_tokens=12)] for p in prompts]
exact = [r.output_tokens == t for r, t in zip(reqs, ref)]
print("greedy tokens equal generate_step's:", exact)

# %% [markdown]
# ## Speed, side by side

# %%
sizes = dict(prompt_tokens=128, decode_tokens=32, repeats=2) if quick else dict(prompt_tokens=512, decode_tokens=128, repeats=repeats)
res = bench_engine(model, **sizes)
S.save("overview_bench", {"model": model_name, "bits": bits, **res})
live = pd.DataFrame([{"metric": k, "mlxlab": res[k]["mlxlab"]["median"], "mlx-lm": res[k]["mlx_lm"]["median"],
                      "ratio": res[k]["ratio"]} for k in ("single_prefill_tok_s", "single_decode_tok_s", "batched_decode_tok_s")])
live

# %% [markdown]
# ## Every platform's committed benchmark
# `mlxlab bench engine` writes `data/results/<platform>/bench_engine.json`; this collects them.

# %%
rows = []
for f in sorted((data_dir() / "results").glob("*/bench_engine.json")):
    d = json.loads(f.read_text())
    for preset, r in d["presets"].items():
        for k in ("single_prefill_tok_s", "single_decode_tok_s", "batched_decode_tok_s"):
            rows.append({"platform": f.parent.name, "model": f"{f.parent.name}: {preset}", "metric": k,
                         "ratio": r[k]["ratio"], "mlxlab": r[k]["mlxlab"]["median"], "mlx_lm": r[k]["mlx_lm"]["median"]})
committed = pd.DataFrame(rows)
if len(committed):
    chart = plots.ratio_bars(committed, "model", "ratio", color="metric",
                             title="Engine throughput relative to mlx-lm (same model object, same run)")
    S.figure(chart, "bench_engine_ratios")
    display(chart)
committed

# %% [markdown]
# ## Verdict

# %%
def judge(ok):
    return "reproduced" if ok else "not reproduced"
rows = [
    {"claim": "engine greedy tokens equal generate_step's", "published": "exact (our requirement)",
     "measured": f"{sum(exact)}/{len(exact)} requests equal", "verdict": judge(all(exact)),
     "evidence": "tokens compared above"},
]
for k, target, vs in (("single_prefill_tok_s", 0.95, "generate_step"), ("single_decode_tok_s", 0.95, "generate_step"),
                      ("batched_decode_tok_s", 1.0, "BatchGenerator")):
    sub = committed[committed.metric == k] if len(committed) else committed
    worst = sub.ratio.min() if len(sub) else res[k]["ratio"]
    rows.append({"claim": f"{k}: engine at least {target}x {vs}", "published": f">= {target}x (our target)",
                 "measured": f"live {res[k]['ratio']:.2f}x; committed min {worst:.2f}x",
                 "verdict": judge(worst >= target), "evidence": "data/results/*/bench_engine.json"})
nb.verdict_table(rows)
