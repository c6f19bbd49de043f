"""Model presets (``data/models/<name>.json``, Hugging Face style configs) and a model's limits.

Pure Python, no MLX: the one place that knows the presets, the default context and how to read a
model's vocabulary and context, for loaded models and the simulator alike.
"""

from __future__ import annotations

import json
from typing import Tuple

from mlxlab.core.paths import data_dir

DEFAULT_MAX_CONTEXT = 131072  # positions of a model whose config names none (mlx-lm's llama default)


def available_presets() -> list[str]:
    """Sorted preset names (the stems of ``data/models/*.json``)."""
    d = data_dir() / "models"
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def preset_config(name: str) -> dict:
    """The architecture config dict of preset ``name`` (a fresh copy).

    Raises ValueError naming the valid presets when ``name`` is unknown.
    """
    path = data_dir() / "models" / f"{name}.json"
    if not path.is_file():
        raise ValueError(
            f"unknown model {name!r}: not a preset and not a model directory; "
            f"valid presets: {', '.join(available_presets())}"
        )
    return json.loads(path.read_text())


def module_of(model):
    """The mlx-lm ``nn.Module`` of a :class:`mlxlab.engine.models.LoadedModel`, or ``model`` itself."""
    return getattr(model, "module", model)


def model_limits(model) -> Tuple[int, int]:
    """``(vocab_size, max_context)`` of a loaded model, an mlx-lm module or a config dict."""
    if isinstance(model, dict) and not callable(model):  # an mlx nn.Module is a dict too
        return int(model["vocab_size"]), int(model.get("max_position_embeddings") or DEFAULT_MAX_CONTEXT)
    module = module_of(model)
    vocab = getattr(model, "vocab_size", None) or module.args.vocab_size
    ctx = getattr(model, "max_context", None)
    if ctx is None:
        ctx = getattr(module.args, "max_position_embeddings", None) or DEFAULT_MAX_CONTEXT
    return int(vocab), int(ctx)
