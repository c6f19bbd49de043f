"""Where mlxlab's data lives: presets, profiles, results, traces, corpus and weights."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project checkout: data/, paper/, notebooks/


def data_dir() -> Path:
    """The ``data/`` folder: ``$MLXLAB_DATA`` if set, else the one beside the package."""
    env = os.environ.get("MLXLAB_DATA")
    return Path(env) if env else ROOT / "data"
