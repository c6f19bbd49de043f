# %% [markdown]
# # 06 · Prefix cache: warm turns, capacity and the disk tier
#
# **Claims (seed 001, fix 1 and the SSD tier).** A bigger prefix cache kept ~6 agent sessions
# warm: a 23k-token prefix restored in under a second instead of tens of seconds of prefill.
# Restoring a 23k prefix (~460 MB of KV) from SSD costs well under 100 ms.
#
# **Here.** (1) Restore time from memory and from the disk tier against prefilling the same
# prefix, at prefix lengths scaled to this machine. (2) Multi-turn chat sessions on the engine
# with a prefix cache of growing capacity: how many sessions stay warm, and what a warm turn's
# TTFT is against a cold one. Each turn re-sends the whole conversation, as an agent does.

# %% tags=["parameters"]
quick = True
platform = None
model_name = "tiny"                  # small on a CPU; a seed preset with bits=4 on a GPU
bits = None
prefix_lengths = [1024, 4096, 8192]  # 2048, 8192, 23000 on a GPU
sessions = 6
turns = 4
first_prompt_tokens = 512
turn_tokens = 64
output_tokens = 16
capacities_sessions = [0, 2, 4, 6, 8]  # cache capacity, in sessions' worth of final prefix
repeats = 3
results_dir = None
figures_dir = None

# %%
import pandas as pd
import altair as alt
from mlxlab import load_model, Engine
from mlxlab.notebook import nb, plots
from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.studies.prefix_cache import measure_restore
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import Workload, ChatTenant

S = nb.setup(quick, platform, results_dir, figures_dir)
if quick:
    prefix_lengths, sessions, turns, first_prompt_tokens, capacities_sessions, repeats = [256, 1024], 3, 3, 128, [0, 1, 3], 1
model = load_model(model_name, bits=bits)

# %% [markdown]
# ## Restore against prefill

# %%
restore = pd.DataFrame(measure_restore(model, prefix_lengths, repeats=repeats))
restore["disk_GB_s"] = restore.kv_bytes / restore.restore_disk_s / 1e9
long = restore.melt(id_vars=["prefix_tokens"], value_vars=["prefill_s", "restore_memory_s", "restore_disk_s"],
                    var_name="how", value_name="seconds")
chart = plots.lines(long, "prefix_tokens", "seconds", "how", log_x=True, log_y=True,
                    title="Prefill a prefix, or restore its KV", x_title="prefix tokens", y_title="seconds (median)")
S.figure(chart, "prefix_restore_vs_prefill")
restore

# %% [markdown]
# ## Sessions kept warm, by capacity
# `sessions` chat sessions take turns; the cache holds `capacity` sessions' worth of tokens (LRU).

# %%
final_prefix = first_prompt_tokens + (turns - 1) * (turn_tokens + output_tokens)
rows = []
for cap in capacities_sessions:
    pc = PrefixCache(max_tokens=max(1, cap * final_prefix)) if cap else None
    wl = Workload([ChatTenant(sessions=sessions, turns=turns, first_prompt_tokens=first_prompt_tokens,
                              turn_tokens=turn_tokens, output_tokens=output_tokens, think_time_s=0.0, stagger_s=0.0)],
                  vocab_size=model.vocab_size, seed=0)
    res = run_workload(Engine(model, chunk_size=512, prefix_cache=pc), wl)
    req = res.requests
    later = req[req["index"] > 0]
    hit = [r.cached_tokens > 0 for r in res.submitted if r.id in set(later.id)]
    rows.append({"capacity_sessions": cap, "warm_turn_fraction": sum(hit) / max(1, len(hit)),
                 "ttft_p50_later_turns_s": later.ttft_s.median(), "ttft_p50_first_turns_s": req[req["index"] == 0].ttft_s.median(),
                 "hits": pc.stats.hits if pc else 0, "evictions": pc.stats.evictions if pc else 0})
cap = pd.DataFrame(rows)
cap

# %%
c1 = alt.Chart(cap, title="Warm turns and their TTFT against cache capacity").mark_line(point=True).encode(
    x=alt.X("capacity_sessions:Q", title="capacity (sessions' worth of prefix)"),
    y=alt.Y("warm_turn_fraction:Q", title="turns that restored a prefix", axis=alt.Axis(format="%")))
c2 = plots.lines(cap, "capacity_sessions", "ttft_p50_later_turns_s", title="TTFT p50 of turns 2+",
                 x_title="capacity (sessions' worth of prefix)", y_title="seconds")
S.figure(c1 | c2, "prefix_capacity")
c1 | c2

# %%
S.save("prefix_cache", {"model": model_name, "bits": bits, "restore": restore.to_dict("records"),
                        "capacity": cap.to_dict("records"), "final_prefix_tokens": final_prefix})

# %% [markdown]
# ## Verdict

# %%
big = restore.iloc[-1]
seed_kv = 460e6
disk_at_seed = seed_kv / (restore.disk_GB_s.median() * 1e9)
full = cap[cap.capacity_sessions >= sessions]
rows = [
    {"claim": "a restored prefix costs a small fraction of its prefill", "published": "23k: < 1 s vs tens of seconds",
     "measured": f"{int(big.prefix_tokens)} tokens: restore {big.restore_memory_s*1e3:.1f} ms vs prefill {big.prefill_s:.2f} s ({big.speedup_memory:.0f}x)",
     "verdict": "reproduced" if big.speedup_memory > 10 else "not reproduced", "evidence": "measure_restore medians"},
    {"claim": "the disk tier restores ~460 MB of KV well under 100 ms", "published": "< 100 ms (SSD)",
     "measured": f"{restore.disk_GB_s.median():.1f} GB/s here -> {disk_at_seed*1e3:.0f} ms for 460 MB (page cache: a lower bound)",
     "verdict": "reproduced" if disk_at_seed < 0.1 else "not reproduced", "evidence": "read + checksum + copy of a safetensors entry"},
    {"claim": "a cache big enough for every session keeps them all warm", "published": "~6 sessions warm",
     "measured": "; ".join(f"capacity {int(r.capacity_sessions)}: {r.warm_turn_fraction:.0%} warm" for r in cap.itertuples()),
     "verdict": "reproduced" if len(full) and (full.warm_turn_fraction >= 0.99).all() else "not reproduced",
     "evidence": "engine runs of round-robin chat sessions"},
]
nb.verdict_table(rows)
