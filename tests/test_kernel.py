"""The 'mlxlab' Jupyter kernel starts Python with the fast CPU BLAS loaded, so a notebook opened in
JupyterLab runs as fast as the CLI (a plain python3 kernel ran a prefill 12x slower)."""

import json
import sys

import pytest

from mlxlab.core.environment import find_openblas
from mlxlab.notebook.kernel import KERNEL_NAME, ensure_kernel, install_kernel, kernel_env

linux_openblas = pytest.mark.skipif(not sys.platform.startswith("linux") or find_openblas() is None,
                                    reason="needs Linux with a system OpenBLAS")


@linux_openblas
def test_the_spec_preloads_openblas(tmp_path):
    folder = install_kernel(prefix=str(tmp_path))
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / KERNEL_NAME / "kernel.json").read_text())
    assert str(tmp_path) in folder and spec["env"] == kernel_env() == {"LD_PRELOAD": find_openblas()}
    assert spec["argv"][0] == sys.executable and spec["argv"][-1] == "--IPKernelApp.log_level=ERROR"
    install_kernel(prefix=str(tmp_path))  # installing again keeps one copy of the option
    again = json.loads((tmp_path / "share" / "jupyter" / "kernels" / KERNEL_NAME / "kernel.json").read_text())
    assert again["argv"].count("--IPKernelApp.log_level=ERROR") == 1


@linux_openblas
def test_a_kernel_started_from_the_spec_runs_on_openblas():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=ensure_kernel(), startup_timeout=120)
    try:
        out = []
        kc.execute_interactive("from mlxlab.core.environment import blas_in_use; print(blas_in_use())", timeout=120,
                               output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert "openblas" in "".join(out)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_notebooks_name_the_mlxlab_kernel():
    from pathlib import Path
    books = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert books and {json.loads(b.read_text())["metadata"]["kernelspec"]["name"] for b in books} == {KERNEL_NAME}
