"""The checkout's commit and whether its code is dirty, for provenance (results) and for the
commit that decided a verdict (claims). No MLX."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout if out.returncode == 0 else None
    except Exception:
        return None


def _git_commit() -> Optional[str]:
    out = _git("rev-parse", "--short", "HEAD")
    return out.strip() if out else None


def _git_dirty() -> Optional[bool]:
    """Whether tracked code differed from the commit when the result was written (results and
    figures under data/ and paper/ do not count: a run that rewrites them is not a dirty run)."""
    # pathspecs from the top of the checkout: git runs in mlxlab/core/, where "." is that folder only
    out = _git("status", "--porcelain", "--untracked-files=no", "--", ":(top)", ":(top,exclude)data",
               ":(top,exclude)paper")
    return None if out is None else bool(out.strip())
