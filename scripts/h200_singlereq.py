"""The single-request measurements of issue 4 on a GPU, without papermill (the H200 image has
none): cold/warm first-request TTFT per preset in fresh processes, the KV-quantization probe and
speed sweep, and prefix restore vs prefill at 2k/8k/23k tokens. Writes
data/results/<platform>/{warmup_memory,kv_quantization,prefix_cache}.json.
Run through scripts/h200_batch.sh singlereq."""
import argparse

import pandas as pd

from mlxlab.engine.kvquant import probe_model, speed_sweep
from mlxlab.engine.models import load_model
from mlxlab.engine.prefix_cache import measure_restore, warm_vs_cold_ttft
from mlxlab.core.results import save_results
from mlxlab.studies.prefill import fresh_process_run

p = argparse.ArgumentParser()
p.add_argument("--presets", nargs="+", default=["qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"])
p.add_argument("--bits", type=int, default=4)
p.add_argument("--parts", nargs="+", default=["warmup", "kv", "restore"], choices=["warmup", "kv", "restore"])
a = p.parse_args()

runs = []
for m in (a.presets if "warmup" in a.parts else []):
    for mode in ("off", "token", "shapes"):
        r = fresh_process_run(m, warmup_mode=mode, prompt_tokens=480, chunks=(512, 2048), batches=(4, 8), repeats=3, bits=a.bits)
        runs.append(r)
        ev = pd.DataFrame(r["events"])
        print(m, mode, "first", round(ev.ttft_s.iloc[0], 3), "warm", round(ev[ev.event == "warm request"].ttft_s.median(), 3), flush=True)
if runs:
    save_results("warmup_memory", {"presets": a.presets, "bits": a.bits, "runs": runs})

model = load_model("qwen2.5-coder-1.5b", bits=a.bits)
if "kv" in a.parts:
    probes = {str(b): probe_model(model, b, 64) for b in (8, 4)}
    print("kv probes:", probes, flush=True)
    sweep = speed_sweep(model, [512, 2048, 8192, 16384], (None, 8, 4), decode_tokens=64, repeats=3, progress=False)
    print(sweep.groupby(["context_tokens", "kv_bits"], dropna=False).decode_tok_s.median(), flush=True)
    save_results("kv_quantization", {"model": "qwen2.5-coder-1.5b", "bits": a.bits, "probes": probes,
                                     "speed": sweep.to_dict("records")})

if "restore" in a.parts:
    restore = measure_restore(model, (2048, 8192, 23000), repeats=3)
    print(pd.DataFrame(restore), flush=True)
    turns = warm_vs_cold_ttft(model, (2048, 8192, 23000), turn_tokens=64, repeats=3)
    print(pd.DataFrame(turns), flush=True)
    save_results("prefix_cache", {"model": "qwen2.5-coder-1.5b", "bits": a.bits, "restore": restore,
                                  "warm_vs_cold": turns})
