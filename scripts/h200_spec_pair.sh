#!/usr/bin/env bash
# Issue 20 item 3: speculative decoding with a pair that predicts something at a realistic cost
# ratio. On the H200, train byte-target-large (~48M parameters) and two drafts meant to cost
# about a third (byte-draft-third, 4 layers) and a tenth (byte-draft-tenth, 1 layer) of its
# decode step, on the committed corpus split, then measure acceptance and speedup against the
# analytic model at k = 1..8 for each pair (mlxlab bench speculation, mlx-lm's
# speculative_generate_step beside it).
#
# The device's Python is not the one data/corpus/split.json was recorded with, and the corpus is
# the interpreter's own standard library, so the split travels as a pack. Here, first:
#   python -m mlxlab.cli train-tiny --pack-corpus build/corpus.tar.xz
# and carry it:
#   run(command="bash scripts/h200_spec_pair.sh PART", carry=[".mlxcuda", "build/corpus.tar.xz"], timeout_s=600)
# PART:
#   train   train whichever of the three models build/weights/ lacks (GPU_RECIPES in mlxlab/train/tiny.py)
#   bench   both pairs at k = 1..8 (needs the trained models: call it while the machine is still warm
#           after `train`, whose ignored build/weights/ then stays there)
#   all     train, then bench
# What comes back in $OUT: spec_pair/manifest.json (each model's sha256, size, recipe and held-out
# perplexity: the target's ~96 MB of float16 weights cannot come back or be committed), the drafts'
# weights (under 16 MiB each), the training log, and h200/speculation_large_{third,tenth}.json.
# TRAIN_ARGS and SPEC_ARGS (e.g. "--steps 2" or "--prompts 2") go after each command's own
# arguments, so a rehearsal on a CPU with a stub scripts/h200.sh can run the whole chain small.
# SPEC_DTYPE (default float16): the first run (2026-12-02) used the GPU default bfloat16, whose tied
# logits made every draft length's output leave the target's (scripts/spec_exactness.py measured
# it: 12/16 prompts identical in bfloat16, 16/16 in float16 and float32).
# Commit the results to data/results/h200/, the manifest and log to data/results/h200/spec_pair/,
# and the drafts to data/weights/.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?give a PART: train | bench | all}
PACK=build/corpus.tar.xz
W=build/weights
MODELS="byte-target-large byte-draft-third byte-draft-tenth"
export MLX_CUDA_USE_CUDNN_SDPA=${MLX_CUDA_USE_CUDNN_SDPA:-0}
[ -f "$PACK" ] || { echo "no $PACK: run 'python -m mlxlab.cli train-tiny --pack-corpus $PACK' here and carry it" >&2; exit 2; }
rc=0
# each part stops itself this many seconds after the call began, so the copy into $OUT below still
# runs inside the device's 600 s: a model is saved when its training ends, so a stopped `train`
# keeps the ones before it and the next `train` call picks up the rest
LIMIT_S=${LIMIT_S:-540}
START=$SECONDS
left() { local l=$((LIMIT_S - (SECONDS - START))); [ "$l" -gt 5 ] && echo "$l" || echo 5; }

train() {
  local todo=""
  for m in $MODELS; do [ -f "$W/$m/model.safetensors" ] || todo="$todo $m"; done
  if [ -z "$todo" ]; then echo "== all three models are in $W"; return 0; fi
  echo "== train-tiny$todo"
  timeout "$(left)" bash scripts/h200.sh train-tiny --corpus "$PACK" --models $todo --out "$W" --eval-every 250 ${TRAIN_ARGS:-} || rc=$?
}

bench() {
  for m in $MODELS; do
    [ -f "$W/$m/model.safetensors" ] || { echo "no $W/$m: the machine went cold after train; run 'all'" >&2; rc=3; return; }
  done
  for d in third tenth; do
    echo "== bench speculation: byte-target-large with byte-draft-$d"
    timeout "$(left)" bash scripts/h200.sh bench speculation --target "$W/byte-target-large" --draft "$W/byte-draft-$d" \
      --corpus "$PACK" --ks 1 2 3 4 5 6 7 8 --repeats ${SPEC_REPEATS:-5} --dtype ${SPEC_DTYPE:-float16} --name "speculation_large_$d" --save ${SPEC_ARGS:-} || rc=$?
  done
}

case "$part" in
  train) train ;;
  bench) bench ;;
  all) train; [ "$rc" = 0 ] && bench ;;
  *) echo "unknown PART $part" >&2; exit 2 ;;
esac

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/spec_pair"
  present=""
  for m in $MODELS; do [ -f "$W/$m/model.safetensors" ] && present="$present $W/$m"; done
  if [ -n "$present" ]; then
    PYTHONPATH="$PWD" python3 -c "import json, sys; from mlxlab.train.manifest import weights_manifest; \
print(json.dumps(weights_manifest(sys.argv[1:]), indent=1))" $present > "$OUT/spec_pair/manifest.json" || rc=$?
  fi
  for d in third tenth; do
    if [ -f "$W/byte-draft-$d/model.safetensors" ]; then
      cp "$W/byte-draft-$d/model.safetensors" "$OUT/spec_pair/byte-draft-$d.safetensors"
      cp "$W/byte-draft-$d/config.json" "$OUT/spec_pair/byte-draft-$d.config.json"
    fi
  done
  [ -f "$W/train_log.jsonl" ] && cp "$W/train_log.jsonl" "$OUT/spec_pair/train_log.jsonl"
fi
exit $rc
