"""The package's layout rules: no import circles inside ``mlxlab/``, no module over 500 lines, and
the MLX-free parts (policies, cost model, workload, runner, metrics, simulator) importing and
running in a Python where ``mlx`` cannot be imported."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mlxlab"


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> dict:
    """mlxlab module -> the mlxlab modules it imports (anywhere in its body, function-local too)."""
    mods = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        package = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else (node.module or "")
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {n for n in names if n in mods and n != m}
    return graph


def find_cycle(graph: dict):
    """One import cycle as a list of modules, or None (a package importing its own submodules
    is not a cycle: ``mlxlab.sim`` re-exports ``mlxlab.sim.simulator``)."""
    def edges(m):
        return [n for n in graph[m] if not n.startswith(m + ".") and not m.startswith(n + ".")]

    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in edges(m):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_find_cycle_sees_a_cycle_and_ignores_package_reexports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"p": {"p.x"}, "p.x": {"p"}}) is None
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_inside_mlxlab():
    assert find_cycle(import_graph()) is None


def test_no_module_over_500_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}
    assert {f: n for f, n in sizes.items() if n > 500} == {}


# Importing these (and running a simulation through them) must not need mlx or mlx_lm.
MLX_FREE = ["mlxlab", "mlxlab.policies", "mlxlab.core.plan", "mlxlab.core.request", "mlxlab.core.costmodel",
            "mlxlab.core.workload", "mlxlab.core.runner", "mlxlab.core.metrics", "mlxlab.core.presets",
            "mlxlab.core.executor", "mlxlab.core.bookkeeping",
            "mlxlab.sim", "mlxlab.sim.profiles", "mlxlab.sim.fit", "mlxlab.sim.published",
            "mlxlab.studies.sim_validation.scoring", "mlxlab.studies.seed_scale.run",
            "mlxlab.studies.scheduling.verdict", "mlxlab.studies.sim_validation.verdict"]

_BLOCK_MLX = """
import sys
class _NoMLX:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlx", "mlx_lm"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _NoMLX())
"""


def _run_without_mlx(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCK_MLX + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_mlx_blocker_blocks_mlx():
    out = _run_without_mlx("import mlx.core")
    assert out.returncode != 0 and "blocked" in out.stderr


def test_policies_cost_model_workload_runner_metrics_and_simulator_need_no_mlx():
    code = f"""
import importlib
for name in {MLX_FREE!r}:
    importlib.import_module(name)
from mlxlab import run_workload
from mlxlab.core.costmodel import StepCostModel
from mlxlab.core.workload import workload_preset
from mlxlab.sim import Simulator
cm = StepCostModel.from_coefficients({{"decode_step": 0.01, "prefill_tokens": 1e-4}})
res = run_workload(Simulator(cm, policy="stall_free", vocab_size=256, max_context=4096),
                   workload_preset("chat+batch", vocab_size=256, scale=0.05))
assert all(r.done for r in res.executor.requests), "the simulated run did not finish"
assert not any(m.split(".")[0] in ("mlx", "mlx_lm") for m in sys.modules)
print("ok", len(res.requests))
"""
    out = _run_without_mlx(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_import_mlxlab_is_lazy():
    out = subprocess.run([sys.executable, "-c", "import sys, mlxlab; print(sorted(m for m in sys.modules "
                          "if m.startswith('mlxlab') or m.split('.')[0] in ('mlx', 'mlx_lm')))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['mlxlab']"
