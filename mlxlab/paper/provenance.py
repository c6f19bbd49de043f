"""The reproducibility section: where and with what each results file the paper used was made.

One row per file, from the ``environment`` block :func:`mlxlab.core.results.save_results` stores:
platform, device, commit and dirty flag, mlx and mlx-lm versions, BLAS, the ``MLX_*`` variables,
the date, and the command that makes the file again. The command is the stored command line where
the file has one (``mlxlab ...`` or ``python -m probes....``); a notebook's file (named in an
``S.save`` of ``notebooks/src``) is re-made by ``mlxlab reproduce --only NN``; for older files
that stored no command line, the command is inferred from the file's name and marked so. On an NVIDIA machine the command runs through ``scripts/h200.sh``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Dict, List, Optional

from mlxlab.core.paths import ROOT
from mlxlab.paper.context import ResultsStore, is_history

#: results-file name (or its prefix before ``_``) -> the command that writes it, where no
#: notebook and no stored command line says so
COMMANDS = {"bench_engine": "mlxlab bench engine --name {stem}",
            "scheduling": "mlxlab bench scheduling --name {stem}",
            "sim_validation": "mlxlab validate-sim --name {stem}",
            "seed_scale": "mlxlab seed-scale",
            "speculation": "mlxlab bench speculation",
            "chunk_probe": "python -m probes.chunk_probe", "decode_probe": "python -m probes.decode_probe",
            "presize_probe": "python -m probes.presize_probe", "rebatch_probe": "python -m probes.rebatch_probe",
            "align_ab": "python -m probes.align_ab", "decode_modes": "python -m probes.decode_modes",
            "overlap_probe": "python -m probes.overlap_probe", "shape_probe": "python -m probes.shape_probe",
            "tail_steps": "python -m probes.tail_steps", "fused_step_bench": "python -m probes.fused_step_bench",
            "solo_calibrate_sim": "python -m probes.solo_calibrate_sim --save"}
GPU_WRAPPER = "bash scripts/h200.sh"
MIN_REPEATS = 5  # the repeats every quoted timing should have (issue 20: medians with their spread)
INFERRED = " (inferred: the file stores no command line)"


@functools.lru_cache(maxsize=4)
def notebook_saves(notebooks: Path = ROOT / "notebooks" / "src") -> Dict[str, str]:
    """results-file name -> number of the notebook that saves it (``S.save("name", ...)`` in
    the notebook sources)."""
    out: Dict[str, str] = {}
    for src in sorted(notebooks.glob("[0-9][0-9]_*.py")):
        for name in re.findall(r"""S\.save\(\s*["']([^"']+)["']""", src.read_text()):
            out.setdefault(name, src.name[:2])
    return out


def _from_argv(argv: List[str]) -> Optional[str]:
    if not argv:
        return None
    exe = Path(argv[0]).name
    if exe in ("mlxlab", "__main__.py") or argv[0].endswith(("mlxlab/cli/__main__.py", "mlxlab/cli")):
        return "mlxlab " + " ".join(argv[1:])
    if "probes" in Path(argv[0]).parts:
        return f"python -m probes.{Path(argv[0]).stem} " + " ".join(argv[1:])
    return None


def rerun_command(store: ResultsStore, path: Path, doc: Dict) -> str:
    """The command that writes ``path`` again (see the module docstring)."""
    env = doc.get("environment") or {}
    platform = env.get("platform") or path.parent.name
    gpu = env.get("device") == "gpu"
    cmd = _from_argv(env.get("argv") or [])
    # a file older than the stored command line; a notebook's argv is null (a kernel) by design
    inferred = "argv" not in env
    if cmd is None and doc.get("source"):  # a re-scoring (validate-sim --rescore): no device, no run
        return f"mlxlab validate-sim --rescore {doc['source']}"
    if cmd is None:
        nb = notebook_saves().get(path.stem)
        if nb:
            cmd = f"mlxlab reproduce --only {nb}" + (f" --platform {platform}" if platform != "cpu" else "")
        else:
            key = next((k for k in sorted(COMMANDS, key=len, reverse=True)
                        if path.stem == k or path.stem.startswith(k + "_")), None)
            if key is None:
                return "not recorded"
            cmd = COMMANDS[key].format(stem=path.stem)
    if gpu and cmd.startswith("mlxlab "):
        cmd = f"{GPU_WRAPPER} {cmd[len('mlxlab '):]}"
    elif gpu and cmd.startswith("python -m probes"):
        cmd = f"PYTHONPATH=.mlxcuda/site:. MLXLAB_PLATFORM={platform} python3 {cmd[len('python '):]}"
    return cmd + (INFERRED if inferred else "")


def repeats_of(doc: Dict) -> Dict[str, int]:
    """The repeat counts a results file stores: every integer ``*repeats`` key of its
    ``parameters``, ``config``, ``grid`` or top level, and ``--repeats N`` on its command line."""
    found: Dict[str, int] = {}
    for src in (doc.get("parameters"), doc.get("config"), doc.get("grid"), doc):
        if isinstance(src, dict):
            for k, v in src.items():
                if k.endswith("repeats") and isinstance(v, int) and not isinstance(v, bool):
                    found.setdefault(k, v)
    argv = (doc.get("environment") or {}).get("argv") or []
    if "--repeats" in argv[:-1] and str(argv[argv.index("--repeats") + 1]).isdigit():
        found.setdefault("repeats", int(argv[argv.index("--repeats") + 1]))
    return found


def _repeats_text(found: Dict[str, int]) -> str:
    if not found:
        return "not stored"
    main = found.get("repeats", min(found.values()))
    rest = [f"{k.removesuffix('_repeats').replace('_', ' ')} {v}" for k, v in found.items() if k != "repeats"]
    text = "; ".join([str(main)] * ("repeats" in found) + rest)
    return text + (f" (under {MIN_REPEATS})" if min(found.values()) < MIN_REPEATS else "")


def provenance_rows(store: ResultsStore, paths: Optional[Dict[str, Path]] = None) -> List[Dict]:
    """One dict per results file (default: every file the build used), sorted by file."""
    rows = []
    for label, path in sorted((paths if paths is not None else store.used).items()):
        doc = store.load(path, use=False)
        env = doc.get("environment") or {}
        mlx_env = env.get("mlx_env")
        device = " ".join(str(x) for x in (env.get("device_name"), f"({env['device']})" if env.get("device") else None) if x)
        rows.append({
            "file": label, "platform": env.get("platform") or path.parent.name, "device": device or "not recorded",
            # a device copy has no .git of its own: the commit its caller declared (MLXLAB_SOURCE_COMMIT)
            "commit": (env.get("source_commit") or "")[:9] or env.get("git_commit") or "not recorded",
            "dirty": "declared" if env.get("source_commit") else
                     {True: "yes", False: "no"}.get(env.get("git_dirty"), "not recorded"),
            "mlx": env.get("mlx") or "?", "mlx_lm": env.get("mlx_lm") or "?", "blas": env.get("blas") or "?",
            "mlx_env": (", ".join(f"{k}={v}" for k, v in sorted(mlx_env.items())) or "none") if isinstance(mlx_env, dict)
                       else "not recorded",
            "date": env.get("written_at") or "not recorded",
            "command": rerun_command(store, path, doc),
            "repeats": _repeats_text(repeats_of(doc)),
        })
    return rows


def _when(date: str) -> str:
    return date[:16].replace("T", " ") if date and date[:4].isdigit() else date


def provenance_markdown(rows: List[Dict]) -> str:
    """The rows as one table: file, device, commit (dirty?), mlx / mlx-lm / BLAS, MLX_*
    variables, date, repeats (:func:`repeats_of`; those under :data:`MIN_REPEATS` are listed under
    the table), and the command to re-run; a command inferred from the file's name is
    marked with a dagger and explained under the table."""
    head = ["File (data/results/)", "Device", "Commit (tree dirty?)", "mlx / mlx-lm / BLAS", "MLX_* variables",
            "Written (UTC)", "Repeats", "Command to re-run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    esc = lambda t: str(t).replace("|", "&#124;")  # noqa: E731
    inferred = False
    for r in rows:
        cmd = r["command"]
        mark = ""
        if cmd.endswith(INFERRED):
            cmd, mark, inferred = cmd[: -len(INFERRED)], " †", True
        cmd = f"`{cmd}`{mark}" if cmd != "not recorded" else cmd
        name = r["file"].split("data/results/", 1)[-1]
        lines.append("| " + " | ".join([
            f"`{name}`", r["device"], f"`{r['commit']}` ({r['dirty']})", f"{r['mlx']} / {r['mlx_lm']} / {r['blas']}",
            esc(r["mlx_env"]), _when(r["date"]), r.get("repeats", "not stored"), esc(cmd)]) + " |")
    few = [r["file"].split("data/results/", 1)[-1] for r in rows if r.get("repeats", "").endswith(f"(under {MIN_REPEATS})")]
    history = [f for f in few if is_history(f)]
    few = [f for f in few if f not in history]
    if few:
        lines += ["", f"{len(few)} of these {len(rows)} files ran some setting fewer than {MIN_REPEATS} times "
                      f"(\"under {MIN_REPEATS}\" above); their medians and spreads rest on fewer repeats than the "
                      f"project's rule asks: " + ", ".join(f"`{f}`" for f in few) + "."]
    if history:
        lines += ["", f"Named history under {MIN_REPEATS} repeats (kept to show what a change moved, not as the "
                      f"current evidence): " + ", ".join(f"`{f}`" for f in history) + "."]
    if inferred:
        lines += ["", "† The file stores no command line (it predates the results format that does); the "
                      "command is the one that writes a file of that name now."]
    return "\n".join(lines) + "\n"
