"""The ``mlxlab`` Jupyter kernel: this Python with the system OpenBLAS preloaded.

mlx's Linux CPU wheel runs float32 matrix products on a slow reference BLAS unless OpenBLAS is
preloaded (``LD_PRELOAD``), which only works when a process starts. The CLI and ``make`` restart
themselves with it; a JupyterLab kernel cannot, so the kernel spec carries it in its environment
(a 1,024-token prefill on ``small`` took 14.6 s on a plain ``python3`` kernel against 1.23 s).
``make setup`` installs the spec into the virtual environment; the notebooks name it, and
``mlxlab reproduce`` installs it first if it is missing. On macOS (Accelerate) or without a
system OpenBLAS the kernel is plain ``python -m ipykernel_launcher``.

Usage::

    python -m mlxlab.notebook.kernel      # install (or refresh) the spec under sys.prefix
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, Optional

from mlxlab.core.environment import find_openblas

KERNEL_NAME = "mlxlab"
DISPLAY_NAME = "mlxlab (Python, fast CPU BLAS)"
QUIET = "--IPKernelApp.log_level=ERROR"


def kernel_env() -> Dict[str, str]:
    """The environment the kernel starts with: ``LD_PRELOAD`` of the system OpenBLAS on Linux."""
    lib = find_openblas()
    return {"LD_PRELOAD": lib} if sys.platform.startswith("linux") and lib else {}


def install_kernel(prefix: Optional[str] = None) -> str:
    """Install the ``mlxlab`` kernel spec under ``prefix`` (default: this Python's ``sys.prefix``,
    i.e. the virtual environment); returns the spec's folder."""
    from ipykernel.kernelspec import install  # Jupyter plumbing: only when installing

    folder = install(kernel_name=KERNEL_NAME, display_name=DISPLAY_NAME, prefix=prefix or sys.prefix,
                     env=kernel_env() or None)
    # the kernel application's own log at ERROR: its warning that a local kernel talks over TCP
    # unencrypted went to stderr once per notebook, inside `mlxlab reproduce`'s progress bar
    # (cells' own warnings still reach their outputs)
    spec_file = Path(folder) / "kernel.json"
    spec = json.loads(spec_file.read_text())
    if QUIET not in spec["argv"]:
        spec["argv"].append(QUIET)
        spec_file.write_text(json.dumps(spec, indent=1))
    return folder


def ensure_kernel() -> str:
    """The kernel's name, installing its spec first if Jupyter cannot find it."""
    from jupyter_client.kernelspec import KernelSpecManager

    if KERNEL_NAME not in KernelSpecManager().find_kernel_specs():
        install_kernel()
    return KERNEL_NAME


if __name__ == "__main__":
    path = install_kernel()
    print(f"installed the {KERNEL_NAME!r} kernel in {path}" + (f" with {kernel_env()}" if kernel_env() else ""))
