"""Profile files: a step-time cost model with the evidence it came from.

A profile is a :class:`mlxlab.core.costmodel.StepCostModel` plus its records, grid and fit
(measured: :func:`mlxlab.sim.measure.profile_device`) or its figures and derivation (published:
:mod:`mlxlab.sim.published`), saved as ``data/profiles/<platform>-<model>.json``. The simulator
loads a cost model given as a path or a name through :func:`load_profile`. No MLX.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

from mlxlab.core.costmodel import StepCostModel
from mlxlab.core.environment import platform_name
from mlxlab.core.paths import data_dir
from mlxlab.core.results import jsonable, environment_block

# the grid a measured profile covers (profile_device's keyword arguments), full and quick
PROFILE_DEFAULTS = dict(prefill_tokens=(64, 256, 1024), contexts=(0, 1024, 4096),
                        decode_batches=(1, 2, 4, 8), decode_contexts=(64, 512, 2048), repeats=3)
QUICK_DEFAULTS = dict(prefill_tokens=(32, 128, 512), contexts=(0, 512), decode_batches=(1, 2, 4),
                      decode_contexts=(32, 512), repeats=2)


def profiles_dir() -> Path:
    """``data/profiles/`` (follows ``MLXLAB_DATA``)."""
    return data_dir() / "profiles"


def profile_path(platform: str, model_name: str) -> Path:
    """``data/profiles/<platform>-<model>.json`` (a model path keeps only its last part)."""
    stem = Path(str(model_name)).name or str(model_name)
    return profiles_dir() / f"{platform}-{stem}.json"


def _jsonable(profile: dict) -> dict:
    out = dict(profile)
    cm = out.get("cost_model")
    if isinstance(cm, StepCostModel):
        out["cost_model"] = cm.as_dict()
    return jsonable(out)


def save_profile(profile: dict, platform: Optional[str] = None, model_name: Optional[str] = None,
                 path: Optional[Union[str, Path]] = None) -> Path:
    """Write ``profile`` (measured or published) as JSON to ``path`` or
    ``data/profiles/<platform>-<model>.json``; returns the path. A measured profile (``kind``
    "profile") gets the environment it ran in (:func:`mlxlab.core.results.environment_block`)."""
    if platform is None and (path is None or profile.get("kind") == "profile"):
        platform = platform_name()
    if path is None:
        if model_name is None:
            model_name = (profile.get("model") or {}).get("name") or "model"
        path = profile_path(platform, model_name)
    path = Path(path)
    doc = _jsonable(profile)
    if doc.get("kind") == "profile":
        doc["environment"] = environment_block(platform)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def cost_model_from_dict(doc: dict) -> StepCostModel:
    """The cost model of a profile document (or of a bare ``StepCostModel.as_dict()``)."""
    cm = doc.get("cost_model", doc)
    if isinstance(cm, StepCostModel):
        return cm
    return StepCostModel.from_dict(cm)


def load_profile(path_or_name: Union[str, Path]) -> StepCostModel:
    """The cost model saved in a profile: a path to a JSON file, or a name under
    ``data/profiles/`` (``"cpu-small"``, ``"seed001-m4max-35b"``)."""
    p = Path(path_or_name)
    if not p.is_file():
        cand = profiles_dir() / (p.name if p.suffix == ".json" else f"{p.name}.json")
        if not cand.is_file():
            have = sorted(q.stem for q in profiles_dir().glob("*.json")) if profiles_dir().is_dir() else []
            raise ValueError(f"no profile {str(path_or_name)!r}; saved profiles: {', '.join(have) or 'none'}")
        p = cand
    return cost_model_from_dict(json.loads(p.read_text()))
