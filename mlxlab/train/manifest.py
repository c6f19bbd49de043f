"""What identifies trained model folders whose weights are not committed (the H200's larger
speculative-decoding target, ~96 MB): their checksums, sizes and training records. Standard
library only, so a device's bare Python writes it (scripts/h200_spec_pair.sh)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def weights_manifest(dirs) -> dict:
    """What identifies trained model folders when their weights are not committed: per folder,
    the sha256 and size of ``model.safetensors`` and the ``mlxlab`` block of its config.json
    (recipe, corpus sha256, held-out perplexity, training time), with the architecture."""
    out = {}
    for d in map(Path, dirs):
        w = d / "model.safetensors"
        if not w.is_file():
            raise FileNotFoundError(f"{d} holds no model.safetensors: train it first (mlxlab train-tiny)")
        h = hashlib.sha256()
        with w.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        cfg = json.loads((d / "config.json").read_text())
        out[d.name] = {"sha256": h.hexdigest(), "bytes": w.stat().st_size, "trained": cfg.get("mlxlab", {}),
                       "architecture": {k: v for k, v in cfg.items() if k not in ("mlxlab", "_source")}}
    return out
