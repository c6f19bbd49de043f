"""Where a measurement ran: platform names for result folders, the BLAS in use, fast-BLAS launch.

On Linux, mlx's CPU backend ships a reference BLAS; preloading OpenBLAS (Debian's
``libopenblas0-pthread``) makes float32 matrix products ~30x faster. ``LD_PRELOAD`` only works
if set before the process starts, so launchers (the CLI, the notebook runner, ``.ci/run``) call
:func:`fast_blas_env` or :func:`reexec_with_fast_blas`. Every CPU result records which BLAS ran.
"""

from __future__ import annotations

import os
import platform as _platform
import re
import sys
from pathlib import Path
from typing import Dict, Optional

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
)


def find_openblas() -> Optional[str]:
    """Path of a system OpenBLAS shared library, or None."""
    for p in OPENBLAS_CANDIDATES:
        if os.path.exists(p):
            return p
    return None


def fast_blas_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A copy of ``env`` (default: this process's) with OpenBLAS preloaded on Linux, if found."""
    env = dict(os.environ if env is None else env)
    lib = find_openblas()
    if sys.platform.startswith("linux") and lib and "openblas" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(x for x in (lib, env.get("LD_PRELOAD", "")) if x)
    return env


def blas_in_use() -> str:
    """The BLAS library mapped into this process ("openblas", "accelerate" or "bundled")."""
    if sys.platform == "darwin":
        return "accelerate"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    # "/libopenblas": numpy's own "libscipy_openblas64_" is mapped too and serves numpy only
    return "openblas" if "/libopenblas" in maps else "bundled"


def reexec_with_fast_blas() -> None:
    """Restart this process with OpenBLAS preloaded if that would change anything (Linux CPU
    only; a no-op when already loaded, unavailable, or ``MLXLAB_NO_REEXEC`` is set)."""
    if not sys.platform.startswith("linux") or os.environ.get("MLXLAB_NO_REEXEC"):
        return
    if blas_in_use() == "openblas" or find_openblas() is None:
        return
    env = fast_blas_env()
    env["MLXLAB_NO_REEXEC"] = "1"
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def device_summary() -> Dict[str, str]:
    """The default mlx device, its name, the BLAS, mlx and mlx-lm versions."""
    import mlx.core as mx
    import mlx_lm

    dev = mx.default_device()
    try:
        info = mx.device_info()
    except Exception:  # pragma: no cover - older mlx
        info = {}
    return {
        "device": "gpu" if dev.type == mx.DeviceType.gpu else "cpu",
        "device_name": str(info.get("device_name", _platform.processor() or "unknown")),
        "blas": blas_in_use() if dev.type == mx.DeviceType.cpu else "n/a",
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "python": _platform.python_version(),
        "os": f"{_platform.system()}-{_platform.machine()}",
    }


def platform_name() -> str:
    """Folder name for results: ``h200``/``h100`` on those GPUs, ``cpu`` on a CPU, otherwise a
    slug of the device name (``apple-m4-max``); ``MLXLAB_PLATFORM`` overrides."""
    if os.environ.get("MLXLAB_PLATFORM"):
        return os.environ["MLXLAB_PLATFORM"]
    s = device_summary()
    if s["device"] == "cpu":
        return "cpu"
    name = s["device_name"].lower()
    for tag in ("h200", "h100", "a100", "b200"):
        if tag in name:
            return tag
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"
