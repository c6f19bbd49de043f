# %% [markdown]
# # 06 · Prefix cache: warm turns, capacity, the disk tier and a quantized KV cache
#
# **Claims (seed 001).** A bigger prefix cache kept ~6 agent sessions warm: turn N+1 restored
# its ~23k-token prefix in under a second instead of tens of seconds of prefill
# (`s001-prefix-restore`, `s001-prefix-sessions`). Restoring that prefix (~460 MB of KV) from
# an SSD tier costs well under 100 ms (`s001-ssd-restore`). On the author's mlx-vlm a quantized
# KV cache and the prefix cache did not compose, so one had to be given up (`s001-kvquant-apc`).
#
# **Here.** (1) A chat turn through the engine, cold (prefill it all) and warm (restore the
# prefix, prefill the new tokens), up to the longest prefix the model's context allows; the
# restore alone from memory and from the disk tier. (2) Six chat sessions on engines whose
# prefix cache holds a growing number of sessions' worth of tokens. (3) The disk restore at the
# seed's size (23k tokens x 20 KB of seed-shaped KV), split into read, verify and copy, with the
# page cache dropped before each read. (4) A quantized-KV chat turn stored in and restored from
# the prefix cache, checked token for token against the same turn without it.

# %% tags=["parameters"]
quick = True
platform = None
model_name = "tiny"                 # small on a CPU; a seed preset with 4-bit weights on a GPU
bits = None
prefix_lengths = None               # None: 1024, 2048, 4096 and the longest the context allows
turn_tokens = 64                    # new tokens of the timed chat turn
sessions = 6                        # the seed's six agent sessions
turns = 4
first_prompt_tokens = 512
session_turn_tokens = 64
output_tokens = 16
capacities_sessions = [0, 2, 4, 5, 6, 8]  # cache capacity, in sessions' worth of final prefix
disk_tokens = 23000                 # the seed's prefix (x 20,480 bytes per token: 471 MB)
kv_bits = 8
repeats = 5
results_dir = None
figures_dir = None

# %%
import pandas as pd
from mlxlab import load_model
from mlxlab.core.presets import model_limits
from mlxlab.notebook import nb
from mlxlab.studies.prefix_cache import charts as prefix_charts
from mlxlab.studies.prefix_cache import verdict as prefix_verdict
from mlxlab.studies.prefix_cache.run import longest_prefix, restore_vs_prefill, session_capacity
from mlxlab.studies.prefix_cache.disk import seed_disk_read
from mlxlab.studies.prefix_cache.kvquant import kvquant_composition

S = nb.setup(quick, platform, results_dir, figures_dir)
kvq = dict(prefix_tokens=1024, turn_tokens=64, output_tokens=16, chunk_size=512)
if quick:
    prefix_lengths, turns, first_prompt_tokens, capacities_sessions = [256, 1024], 2, 128, [0, 3, 6]
    disk_tokens, repeats, kvq = 2300, 2, dict(prefix_tokens=256, turn_tokens=32, output_tokens=8, chunk_size=256)
model = load_model(model_name, bits=bits)
vocab, max_context = model_limits(model)
if prefix_lengths is None:
    prefix_lengths = [1024, 2048, 4096, longest_prefix(model, turn_tokens)]
env = S.environment
setting = (f"model {model_name} ({len(model.module.layers)} layers, {str(model.dtype).split('.')[-1]}, bits={bits}) on "
           f"{env['device']} ({env['device_name']}), mlx {env['mlx']}" + (" (quick mode)" if quick else ""))
parameters = dict(quick=quick, model_name=model_name, bits=bits, prefix_lengths=list(prefix_lengths),
                  turn_tokens=turn_tokens, sessions=sessions, turns=turns, first_prompt_tokens=first_prompt_tokens,
                  session_turn_tokens=session_turn_tokens, output_tokens=output_tokens,
                  capacities_sessions=list(capacities_sessions), disk_tokens=disk_tokens, kv_bits=kv_bits,
                  repeats=repeats, kvquant_protocol=kvq)

# %% [markdown]
# ## Restore against prefill, and the warm turn against the cold one

# %%
restore = restore_vs_prefill(model, prefix_lengths, turn_tokens=turn_tokens, repeats=repeats)
chart = prefix_charts.restore_chart(restore)
S.figure(chart, "prefix_restore_vs_prefill")
cols = ["prefix_tokens", "chunk_tokens", "prefill_s", "restore_memory_s", "restore_disk_s", "disk_read_s",
        "disk_read_gb_s", "page_cache_resident", "cold_ttft_s", "warm_ttft_s", "speedup_memory", "ttft_speedup",
        "restored_tokens", "same_first_token"]
chart

# %%
pd.DataFrame(restore)[cols]

# %% [markdown]
# ## Sessions kept warm, by capacity
# `sessions` chat sessions take their turns at once; the cache holds `capacity` sessions' worth
# of tokens (LRU). Capacity 0: no prefix cache.

# %%
capacity = session_capacity(model, capacities_sessions, sessions=sessions, turns=turns,
                            first_prompt_tokens=first_prompt_tokens, turn_tokens=session_turn_tokens,
                            output_tokens=output_tokens)
S.figure(prefix_charts.capacity_chart(capacity, sessions), "prefix_capacity")
pd.DataFrame(capacity)

# %% [markdown]
# ## The disk tier at the seed's size: read, verify, copy

# %%
disk = seed_disk_read(disk_tokens, repeats=repeats)
S.figure(prefix_charts.disk_chart(disk), "prefix_disk_restore")
pd.DataFrame({mode: {k: v for k, v in disk[mode].items() if not k.endswith("_all_s")} for mode in ("cold", "cached")})

# %% [markdown]
# ## A quantized KV cache through the prefix cache

# %%
kvquant = kvquant_composition(model, kv_bits, **kvq)
pd.DataFrame(kvquant.get("runs", []))

# %% [markdown]
# ## Verdict

# %%
verdicts = [
    prefix_verdict.restore_verdict(restore, max_context_tokens=max_context, setting=setting),
    prefix_verdict.sessions_verdict(capacity, sessions=sessions, setting=setting),
    prefix_verdict.ssd_verdict(disk, setting=setting),
    prefix_verdict.kvquant_verdict(kvquant, setting=setting),
]
S.save("prefix_cache", {"model": model_name, "bits": bits, "max_context_tokens": max_context, "restore": restore,
                        "capacity": capacity, "disk": disk, "kvquant": kvquant}, verdicts=verdicts, parameters=parameters)
nb.verdict_table(verdicts)
