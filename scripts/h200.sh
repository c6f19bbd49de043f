#!/usr/bin/env bash
# Run an mlxlab command on an NVIDIA H200 machine that has no package registry, with the
# mlx CUDA bundle built here by ../shared/tools/mlx-cuda-bundle (carried as .mlxcuda/).
# Usage (from the project root on the GPU machine):  bash scripts/h200.sh bench engine --models ...
# Results land in a new run folder data/results/h200/runs/TIME/, or with --save (the committed
# H200 results) in data/results/h200/; when $OUT is set, what this call wrote is copied to
# $OUT/h200/ too.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d .mlxcuda/site/mlx ]; then
  mkdir -p .mlxcuda/site && tar xJf .mlxcuda/mlx-cuda-sm90.tar.xz -C .mlxcuda/site
fi
MARK=$(mktemp) && touch "$MARK"  # results newer than this are this call's
export PYTHONPATH="$PWD/.mlxcuda/site:$PWD" PYTHONUNBUFFERED=1 MLXLAB_PLATFORM=${MLXLAB_PLATFORM:-h200}
# wheels the machine's Python lacks (the notebook stack of `mlxlab reproduce`: papermill, nbclient,
# nbformat, nbconvert, ipykernel, altair, vl-convert-python and their needs), carried as .whl/
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:$PWD/.whl/site"
fi
python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info().get("device_name"))'
python3 -m mlxlab.cli "$@"
if [ -n "${OUT:-}" ] && [ "${1:-}" != campaign ]; then  # a campaign packs its own archive into $OUT
  # the committed files as $OUT/PLATFORM/NAME; run folders (runs/TIME/) stay behind: three folders down never comes back
  mkdir -p "$OUT/$MLXLAB_PLATFORM"
  if [ -d "data/results/$MLXLAB_PLATFORM" ]; then
    (cd "data/results/$MLXLAB_PLATFORM" && find . -path ./runs -prune -o -type f -newer "$MARK" -exec cp --parents {} "$OUT/$MLXLAB_PLATFORM/" \;)
  fi
  if ls data/profiles/h200-*.json >/dev/null 2>&1; then mkdir -p "$OUT/profiles" && cp data/profiles/h200-*.json "$OUT/profiles/"; fi
fi
