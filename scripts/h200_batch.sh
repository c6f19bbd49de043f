#!/usr/bin/env bash
# Every H200 measurement this project still needs, in one call of the device tool:
#   run(command="bash scripts/h200_batch.sh PART", carry=[".mlxcuda"], timeout_s=600)
# PART is one of: scheduling | singlereq | bench (singlereq less warm-up) | sched | all (all needs ~15 min: split it over two calls).
# Results are written to data/results/h200/ and copied to $OUT/h200/ to come back.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
H="bash scripts/h200.sh"
run() { echo "== $*"; timeout "${T:-300}" "$@" 2>&1 | tr '\r' '\n' | grep -v 'it/s\]$' | tail -40; }
if [ "$part" = scheduling ] || [ "$part" = all ]; then
  # issue 3: the stall, the gate, slo, stall_free and overlap beside BatchGenerator (coder-1.5b, 4-bit)
  T=420 run $H bench scheduling --model qwen2.5-coder-1.5b --bits 4 --repeats 2 --workers 1 2 4
  T=120 run env PYTHONPATH=.mlxcuda/site:. python3 scripts/overlap_probe.py --model qwen2.5-coder-1.5b --bits 4 --long-tokens 32000 --chunks 256,512,1024,2048,4096 --repeats 2
fi
if [ "$part" = sched ]; then
  # issue 3's study (with stall_free packed and back to back) and issue 4's KV probe/speed and restores
  T=420 run $H bench scheduling --model qwen2.5-coder-1.5b --bits 4 --repeats 2 --workers 1 2 4
  T=120 run env PYTHONPATH=.mlxcuda/site:. MLXLAB_PLATFORM=h200 PYTHONUNBUFFERED=1 python3 scripts/h200_singlereq.py --parts kv restore
fi
if [ "$part" = sched1 ]; then
  # issue 3's study, one repeat, with mlx's cuDNN attention off: cuDNN builds a graph for every new
  # (query, key) length and the first study run spent ~50 ms of every new chunk shape on it
  export MLX_CUDA_USE_CUDNN_SPDA=0
  T=330 run $H bench scheduling --model qwen2.5-coder-1.5b --bits 4 --repeats 1 --workers 1 2 4
fi
if [ "$part" = bench ]; then
  # issue 2 re-check and issue 4's KV probe/speed and prefix restores (warm-up already measured)
  T=270 run $H bench engine --models qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b --bits 4 --prompt-tokens 4096 --decode-tokens 256 --repeats 5
  T=240 run env PYTHONPATH=.mlxcuda/site:. MLXLAB_PLATFORM=h200 PYTHONUNBUFFERED=1 python3 scripts/h200_singlereq.py --parts kv restore
fi
if [ "$part" = singlereq ] || [ "$part" = all ]; then
  # issue 2 (re-check single-stream decode) and issue 4 (warm-up, KV probe, prefix restore) on the seed presets
  T=240 run $H bench engine --models qwen2.5-0.5b llama-3.2-1b qwen2.5-coder-1.5b --bits 4 --prompt-tokens 4096 --decode-tokens 256 --repeats 7
  T=300 run env PYTHONPATH=.mlxcuda/site:. MLXLAB_PLATFORM=h200 PYTHONUNBUFFERED=1 python3 scripts/h200_singlereq.py
fi
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/h200" && cp -r data/results/h200/. "$OUT/h200/" 2>/dev/null; fi
