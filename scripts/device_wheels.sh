#!/usr/bin/env bash
# Fill the ignored folder .whl/ with the wheels the GPU machine's Python lacks, for one or more
# groups, so a device call can carry them (carry=[".whl", ...]; scripts/h200.sh installs them):
#   serve      mlxlab serve and its tests: starlette, uvicorn, sse-starlette, openai
#   notebooks  mlxlab reproduce: papermill, nbformat, nbclient, nbconvert, ipykernel, jupyter_client,
#              altair, vl-convert-python
# Usage (from anywhere in the checkout, where pip reaches the registry):
#   bash scripts/device_wheels.sh serve [notebooks]
# Each package is fetched with the download command of ../.library/device/README.md (CPython 3.12,
# manylinux x86-64, --no-deps), pinned to the version installed in this Python where it has one
# (what the tests ran with) and at the newest otherwise; its needs (Requires-Dist, markers read for
# Python 3.12 on Linux x86-64, extras skipped) follow, except those the GPU image already holds
# (IMAGE below). One version of each name is kept (a wheel of another version is removed). Then the script prints each group's and the folder's size, and fails (exit 1) when the
# tracked files (git ls-files) plus .mlxcuda/ plus .whl/ exceed a device call's 64 MiB.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ $# -ge 1 ] || { echo "usage: $0 GROUP... (serve, notebooks)" >&2; exit 2; }
PY=${PYTHON:-python3}
mkdir -p .whl
exec "$PY" - "$@" <<'EOF'
import os, re, subprocess, sys, zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

GROUPS = {
    "serve": ["starlette", "uvicorn", "sse-starlette", "openai"],
    "notebooks": ["papermill", "nbformat", "nbclient", "nbconvert", "ipykernel", "jupyter-client", "altair",
                  "vl-convert-python"],
    # the notebooks on the GPU machine: no vl-convert (32 MiB) and no nbconvert; figures come back as
    # Vega-Lite specs and executed notebooks as .ipynb, rendered here (`mlxlab figures render`)
    "notebooks-gpu": ["papermill", "nbformat", "nbclient", "ipykernel", "jupyter-client", "altair", "ipywidgets",
                      "anywidget"],
}
# Needs a group's packages declare but never import on a headless run, left out to fit a call's
# 64 MiB: ipykernel imports debugpy only when it is there (its debugger is off without it), IPython
# finds jedi (and jedi parso) only for tab completion, and widgetsnbextension is the classic
# Notebook's front end of ipywidgets (papermill has none). 10.5 MiB together.
SKIP = {"notebooks-gpu": {"debugpy", "jedi", "parso", "widgetsnbextension"}}
# The GPU image's Python packages ("Python packages already there" in ../.library/device/KINDS.md,
# as read on 2026-11-17): never fetched.
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp""".split()
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
LIMIT = 64 << 20
WHL = Path(".whl")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return norm(path.name.split("-")[0])


def fetch(name: str) -> Path:
    """Download ``name``'s wheel (pinned to this Python's version of it, if any); returns its path.
    A wheel of that name at another version is removed first: two versions stop the install there."""
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        version = None
    for old in [p for p in WHL.glob("*.whl") if wheel_name(p) == norm(name)]:
        if version is None or norm(old.name.split("-")[1]) != norm(version):
            old.unlink()
    spec = name if version is None else f"{name}=={version}"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(WHL), spec]
    if subprocess.run(cmd).returncode:
        sys.exit(f"pip found no wheel for {spec} (CPython 3.12, manylinux x86-64): add a --platform "
                 f"manylinux_2_N_x86_64 to PLATFORMS in {sys.argv[0]} (see ../.library/device/README.md)")
    return next(p for p in WHL.glob("*.whl") if wheel_name(p) == norm(name))


def needs(wheel: Path) -> list:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(TARGET):
                out.append(req.name)
    return out


image = {norm(n) for n in IMAGE}
sizes = {}
for group in sys.argv[1:]:
    if group not in GROUPS:
        sys.exit(f"unknown group {group!r}: choose from {', '.join(GROUPS)}")
    todo, seen, files = list(GROUPS[group]), set(), []
    while todo:
        name = norm(todo.pop(0))
        if name in seen or name in image or name in SKIP.get(group, ()):
            continue
        seen.add(name)
        wheel = fetch(name)
        files.append(wheel)
        todo.extend(needs(wheel))
    sizes[group] = sum(p.stat().st_size for p in files)
    print(f"{group}: {len(files)} wheels, {sizes[group] / 2**20:.1f} MiB: " + " ".join(sorted(p.name for p in files)))


def tree_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).is_dir() else 0


tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
tracked_bytes = sum(os.path.getsize(p) for p in tracked if p and os.path.isfile(p))
total = tracked_bytes + tree_bytes(".mlxcuda") + tree_bytes(".whl")
print(f".whl/ {tree_bytes('.whl') / 2**20:.1f} MiB; tracked files {tracked_bytes / 2**20:.1f} MiB, .mlxcuda/ "
      f"{tree_bytes('.mlxcuda') / 2**20:.1f} MiB: {total / 2**20:.1f} MiB of a device call's {LIMIT >> 20} MiB")
if total > LIMIT:
    sys.exit(f"over a device call's limit by {(total - LIMIT) / 2**20:.1f} MiB: carry fewer groups per call, "
             f"or empty .whl/ and fetch only the group this call needs")
EOF
