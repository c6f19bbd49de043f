# %% [markdown]
# # 01 · Prefill step size: where does 512 → 2,048 help?
#
# **Claim (seed 000, iteration 1).** Raising `prefill_step_size` from 512 to 2,048 gave +33-71%
# prefill tok/s on a 480-token context and -7-22% TTFT on medium and long prompts, with no change
# to decode.
#
# **The puzzle.** A 480-token prompt fits in one 512-token chunk, so the step size cannot change
# the work done for it. This notebook sweeps prompt length × step size on the engine and on
# mlx-lm's `generate_step` (same model object, warm, interleaved repeats), then replays the case
# study's protocol (N=3 per setting, the first request of a fresh process cold) in both orders to
# see whether the 480-token "gain" follows the step size or the order of the runs. It then checks
# the other two halves of the claim on one prompt longer than a chunk: decode speed after
# prefilling at 512 and at 2,048, and whether the greedy tokens are identical.

# %% tags=["parameters"]
quick = True
platform = None
model_name = "tiny"          # small on a CPU; a seed preset with 4-bit weights on a GPU
bits = None
prompt_lengths = [128, 480, 1024, 2048, 4096]
step_sizes = [256, 512, 1024, 2048]
repeats = 5
protocol_n = 3               # the case study's requests per setting
decode_prompt_tokens = 1024  # decode and accuracy: a prompt of several 512-token chunks
decode_tokens = 64
accuracy_lengths = [480, 1024, 2048]
accuracy_tokens = 32
results_dir = None
figures_dir = None

# %%
import pandas as pd
from mlxlab import load_model
from mlxlab.notebook import nb, plots
from mlxlab.studies.prefill_step import run as prefill
from mlxlab.studies.prefill_step.run import prefill_sweep, summarize_sweep, seed_protocol

S = nb.setup(quick, platform, results_dir, figures_dir)
if quick:
    prompt_lengths, step_sizes, repeats = [96, 480, 1024], [256, 512, 2048], 2
    decode_prompt_tokens, decode_tokens, accuracy_lengths, accuracy_tokens = 600, 24, [480, 1024], 16
parameters = dict(quick=quick, platform=platform, model_name=model_name, bits=bits, prompt_lengths=prompt_lengths,
                  step_sizes=step_sizes, repeats=repeats, protocol_n=protocol_n,
                  decode_prompt_tokens=decode_prompt_tokens, decode_tokens=decode_tokens,
                  accuracy_lengths=accuracy_lengths, accuracy_tokens=accuracy_tokens)
model = load_model(model_name, bits=bits)

# %% [markdown]
# ## The sweep (warm, both sides, same model)

# %%
df = prefill_sweep(model, prompt_lengths, step_sizes, repeats=repeats)
med = df.groupby(["side", "prompt_tokens", "step"], as_index=False)[["ttft_s", "prefill_tok_s"]].median()
labels = dict(x_title="prompt tokens", y_title="prefill tok/s (median)", color_title="prefill step (tokens)")
chart = plots.lines(med[med.side == "mlx-lm"], "prompt_tokens", "prefill_tok_s", "step", log_x=True,
                    title="Prefill throughput by prompt length and step size (mlx-lm generate_step)", **labels) | \
        plots.lines(med[med.side == "mlxlab"], "prompt_tokens", "prefill_tok_s", "step", log_x=True,
                    title="... and on the mlxlab engine", **labels)
S.figure(chart, "prefill_step_sweep")
chart

# %%
change = summarize_sweep(df, 512, 2048)
change

# %% [markdown]
# ## The case study's protocol, in both orders
# Each run is a fresh process: three requests at one step size, then three at the other, on a
# 480-token prompt. If the first setting looks slower only when it runs first, the "gain" is the
# cold start, not the step size.

# %%
runs = pd.concat([seed_protocol(model_name, 480, order, protocol_n, bits=bits) for order in ((512, 2048), (2048, 512))])
proto = runs.groupby(["order", "step"], as_index=False).ttft_s.agg(["mean", "median", "max"]).reset_index()
proto

# %% [markdown]
# ## Decode and output after each step size
# One prompt of several 512-token chunks, prefilled at 512 and at 2,048 with `generate_step`, then
# decoded (warm, the two alternating over the repeats); and a few prompts whose greedy tokens at
# 2,048 are compared with those at 512, token by token.

# %%
decode = prefill.decode_by_step(model, decode_prompt_tokens, (512, 2048), decode_tokens=decode_tokens, repeats=repeats)
accuracy = prefill.step_accuracy(model, accuracy_lengths, (512, 2048), max_tokens=accuracy_tokens)
display(decode.groupby("step").decode_tok_s.describe())
accuracy

# %%
verdicts = prefill.verdicts(df, runs, decode, accuracy, base=512, new=2048, context=480,
                            model_note=f"model {model_name} ({model.dtype}{f', {bits}-bit' if bits else ''}).")
S.save("prefill_step_size", {"model": model_name, "bits": bits, "dtype": str(model.dtype), "sweep": df.to_dict("records"),
                             "change_512_to_2048": change.to_dict("records"), "protocol": runs.to_dict("records"),
                             "decode": decode.to_dict("records"), "accuracy": accuracy.to_dict("records")},
       verdicts=verdicts, parameters=parameters)

# %% [markdown]
# ## Verdict

# %%
nb.verdict_table(verdicts)
