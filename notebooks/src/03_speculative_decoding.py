# %% [markdown]
# # 03 · Speculative decoding: when does a draft model pay?
#
# **Claim (seed 000, iteration 3).** A 0.5B draft for a 1.5B coder target with
# `num_draft_tokens=4` on code prompts gave +1% decode tok/s: within noise.
#
# **Question.** Random weights accept no drafts, so this notebook uses the byte-level target/draft
# pair mlxlab trained on the Python standard library (`mlxlab train-tiny`), prompts cut from
# held-out files. It measures the acceptance rate, tokens per target pass and end-to-end speedup
# against the target alone, and compares them with the analytic model: expected tokens per pass
# E = (1-a^(k+1))/(1-a) and speedup E/(k·c + v), with c the draft/target step-cost ratio measured
# here and v the cost of the (k+1)-token verification pass in target steps (1 in the textbook
# formula). The sliders explore that surface. No 7B target runs here: for the claim about large
# targets the analytic model, with the acceptance measured here, says for which cost ratios
# speculation would pay.

# %% tags=["parameters"]
quick = True
platform = None
target_path = "../data/weights/byte-target"
draft_path = "../data/weights/byte-draft"
ks = [1, 2, 3, 4, 6, 8]
prompts = 16
prompt_len = 96
max_tokens = 64
repeats = 5
results_dir = None
figures_dir = None

# %%
import numpy as np
import pandas as pd
from mlxlab import load_model
from mlxlab.notebook import nb, widgets
from mlxlab.studies.speculation import charts as speculation_charts
from mlxlab.studies.speculation.run import speculation_study, verdicts
from mlxlab.train.corpus import build_corpus, heldout_prompts

S = nb.setup(quick, platform, results_dir, figures_dir)
if quick:
    ks, prompts, max_tokens, repeats = [1, 2, 4], 4, 32, 3
target, draft = load_model(target_path), load_model(draft_path)
held = build_corpus(verify=False)["heldout"]
ps = heldout_prompts(prompts, length=prompt_len, seed=1, data=held, midline=True)
print(f"target {target.num_params/1e6:.2f}M, draft {draft.num_params/1e6:.2f}M parameters; {len(ps)} held-out code prompts")

# %% [markdown]
# ## Measured, beside the target alone (same prompts, interleaved)

# %%
study = speculation_study(target, draft, ps, ks=ks, max_tokens=max_tokens, repeats=repeats, mlx_lm=not quick)
study["models"] = {"target": target.name, "draft": draft.name,
                   "target_params": target.num_params, "draft_params": draft.num_params}
rows = pd.DataFrame(study["rows"])
c_measured = study["cost"]["c"]
print(f"c = {c_measured:.3f} (draft step / target step); every output identical to the target's: {bool(rows.identical.all())}")
rows[["k", "acceptance_rate", "a_hat", "tokens_per_pass", "tokens_per_pass_analytic", "v", "speedup",
      "speedup_analytic", "speedup_analytic_v"]]

# %% [markdown]
# ## Explore the analytic surface
# Speedup against draft length for the chosen acceptance rate and cost ratio; dots are this
# notebook's measurements (with their own a and c), the dashed line is no speedup.

# %%
def build(a, c, v):
    return speculation_charts.speedup_vs_k_chart(a, c, v, rows)

a0 = float(np.nanmedian(rows.a_hat))
controls = {"a": widgets.float_slider(round(a0, 2), 0.0, 0.99, 0.01, "acceptance a"),
            "c": widgets.float_slider(round(c_measured, 2), 0.0, 1.0, 0.01, "cost ratio c"),
            "v": widgets.float_slider(1.0, 1.0, 3.0, 0.05, "verify cost v")}
widgets.explorer(build, controls)

# %% [markdown]
# ## Where speculation pays
# The best speedup over k for each acceptance rate and cost ratio (v = 1). Above the black
# break-even line no draft length is faster than the target alone (grey-blue cells); the cross is
# this run's pair.

# %%
S.figure(build(a0, c_measured, 1.0), "speculative_speedup_vs_k")
heat = speculation_charts.where_it_pays_chart(np.linspace(0, 0.95, 20), np.linspace(0.02, 0.6, 20),
                                              measured={"a": a0, "c": c_measured})
S.figure(heat, "speculative_where_it_pays")
heat

# %% [markdown]
# ## Verdict
# Computed from the study above before anything is saved, and stored with it (`mlxlab bench
# speculation` stores the same verdicts).

# %%
vs = verdicts(study, k=4)
S.save("speculation", {"study": study, "prompts": len(ps), "max_tokens": max_tokens}, verdicts=vs,
       parameters=dict(quick=quick, target_path=target_path, draft_path=draft_path, ks=ks, prompts=prompts,
                       prompt_len=prompt_len, max_tokens=max_tokens, repeats=repeats))
nb.verdict_table(vs)
