"""Where a measurement ran: platform names for result folders, the BLAS in use, fast-BLAS launch.

On Linux, mlx's CPU backend ships a reference BLAS; preloading OpenBLAS (Debian's
``libopenblas0-pthread``) makes float32 matrix products ~30x faster. ``LD_PRELOAD`` only works
if set before the process starts, so launchers (the CLI, the notebook runner, ``.ci/run``) call
:func:`fast_blas_env` or :func:`reexec_with_fast_blas`. Every CPU result records which BLAS ran.
"""

from __future__ import annotations

import difflib
import os
import platform as _platform
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
)


# Environment variables mlx reads (as of mlx 0.32: the names in libmlx of the CUDA build, and the
# Metal and TF32 switches of mlx's environment-variable docs). A name one typo away from these is almost
# certainly meant as one of them: mlx ignores it silently.
MLX_ENV_KNOWN = frozenset({
    "MLX_BFS_MAX_WIDTH", "MLX_CUDA_CONV_CACHE_SIZE", "MLX_CUDA_FFT_CACHE_SIZE", "MLX_CUDA_GRAPH_CACHE_SIZE",
    "MLX_CUDA_SDPA_BACKWARD_CACHE_SIZE", "MLX_CUDA_SDPA_CACHE_SIZE", "MLX_CUDA_USE_CUDNN_SDPA",
    "MLX_DISABLE_COMPILE", "MLX_ENABLE_CACHE_THRASHING_CHECK", "MLX_ENABLE_TF32", "MLX_HOSTFILE",
    "MLX_MAX_MB_PER_BUFFER", "MLX_MAX_OPS_PER_BUFFER", "MLX_METAL_FAST_SYNCH", "MLX_MPI_LIBNAME",
    "MLX_NCCL_TIMEOUT", "MLX_PTX_CACHE_DIR", "MLX_RANK", "MLX_RING_VERBOSE", "MLX_SAVE_CUDA_GRAPHS_DOT_FILE",
    "MLX_USE_CUDA_GRAPHS", "MLX_WORLD_SIZE",
})


def mlx_env(env: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, str], List[str]]:
    """The ``MLX_*`` settings of ``env`` (default: this process's), to store with a result, and a
    warning for each name that is not one mlx reads but is close to one (a misspelt switch
    changes nothing, and the result would claim it did)."""
    env = os.environ if env is None else env
    settings = {k: v for k, v in env.items() if k.startswith("MLX_")}
    warnings = []
    for k in sorted(settings):
        if k in MLX_ENV_KNOWN:
            continue
        near = difflib.get_close_matches(k, MLX_ENV_KNOWN, n=1, cutoff=0.85)
        if near:
            warnings.append(f"{k} is not a variable mlx reads, so it has no effect; did you mean {near[0]}?")
    return settings, warnings


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


def slow_blas_warning() -> Optional[str]:
    """The warning to give when mlx will run float32 matrix products on its bundled reference BLAS
    although a system OpenBLAS is installed but not loaded (about 12x slower prefill on ``small``
    here), saying the one command that fixes it; None otherwise (macOS, OpenBLAS already loaded,
    none installed)."""
    lib = find_openblas()
    if not sys.platform.startswith("linux") or lib is None or blas_in_use() != "bundled":
        return None
    return (f"mlx is using its bundled reference BLAS, and CPU runs will be many times slower: start Python with "
            f"LD_PRELOAD={lib} (e.g. `LD_PRELOAD={lib} python script.py`), or use the mlxlab command, `make lab` or "
            f"the 'mlxlab' Jupyter kernel, which preload it")


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
    import mlx.core as mx  # mlx: core imports without it; only a measurement's provenance needs it
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
