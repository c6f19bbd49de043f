"""One results format: JSON under ``data/results/<platform>/`` with the environment attached."""

from __future__ import annotations

import datetime as _dt
import json
import math
import subprocess
from pathlib import Path
from typing import Any, Optional

from mlxlab.core.environment import device_summary, platform_name
from mlxlab.core.paths import data_dir


def results_dir(platform: Optional[str] = None) -> Path:
    return data_dir() / "results" / (platform or platform_name())


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def _clean(x: Any) -> Any:
    # JSON has no NaN: write null so other tools can read the file
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return _clean(x.item())
    return x


def save_results(name: str, payload: dict, platform: Optional[str] = None) -> Path:
    """Write ``payload`` with an ``environment`` block to ``data/results/<platform>/<name>.json``;
    returns the path."""
    path = results_dir(platform) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"environment": {**device_summary(), "platform": platform or platform_name(),
                           "git_commit": _git_commit(),
                           "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
           **payload}
    path.write_text(json.dumps(_clean(doc), indent=2) + "\n")
    return path


def load_results(name: str, platform: Optional[str] = None) -> dict:
    return json.loads((results_dir(platform) / f"{name}.json").read_text())
