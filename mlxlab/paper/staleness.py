"""Which results files the paper used are older than the code that makes and decides them.

A results file stores the commit that measured it (``environment.source_commit`` for a device
copy, else ``git_commit``) and, per verdict, the commit that decided it (``decided_by``). The
study that owns the file (:func:`mlxlab.studies.study_for`) names the code behind it: its package
(``mlxlab/studies/<name>/``) measures, less the modules that only draw or decide (``*charts.py``,
``*verdict.py``: :data:`NOT_MEASURING`), and its ``decide`` module and the shared rules decide. A
file is *measured by older code* when that measuring code changed in a commit that came after the
one that measured it (a redrawn figure or a new rule does not make a measurement old), and *decided by older rules* when its decide module or the shared rules changed
after the commit that decided its verdicts (``tests/test_rederive.py`` keeps such verdicts equal
to today's rules, so this names where the rules moved since, not a wrong verdict). The build
prints the list and the reproducibility section shows it. Git answers both questions; without a
git history (an archive) the report says so. No MLX.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mlxlab.core.paths import ROOT

#: code every study's verdicts go through
SHARED_RULES = ("mlxlab/studies/rules.py", "mlxlab/core/claims.py")
#: a study package's modules that draw or decide from stored results and measure nothing
NOT_MEASURING = ("*charts.py", "*verdict.py")


def measuring_paths(study_name: str) -> tuple:
    """The git pathspecs of a study's measuring code: its package less :data:`NOT_MEASURING`."""
    pkg = f"mlxlab/studies/{study_name}"
    return (pkg, *(f":(exclude){pkg}/{pat}" for pat in NOT_MEASURING))


def _git(*args: str) -> Optional[subprocess.CompletedProcess]:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=None)
def has_history() -> bool:
    out = _git("rev-parse", "--is-inside-work-tree")
    return bool(out and out.returncode == 0 and out.stdout.strip() == "true")


@functools.lru_cache(maxsize=None)
def last_change(paths: Sequence[str]) -> Optional[str]:
    """The newest commit that changed any of ``paths`` (full hash), None without history."""
    out = _git("log", "-1", "--format=%H", "--", *paths)
    return out.stdout.strip() or None if out and out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def full_commit(commit: str) -> Optional[str]:
    out = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    return out.stdout.strip() or None if out and out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def older(commit: str, than: str) -> Optional[bool]:
    """Whether ``commit`` is a strict ancestor of ``than`` (None: not in this history)."""
    a, b = full_commit(commit), full_commit(than)
    if a is None or b is None:
        return None
    if a == b:
        return False
    out = _git("merge-base", "--is-ancestor", a, b)
    return None if out is None or out.returncode not in (0, 1) else out.returncode == 0


def _clean(commit: Optional[str]) -> Optional[str]:
    return commit.split("-")[0] if commit else None  # "5340483-dirty" -> "5340483"


def _module_file(ref: str) -> str:
    return ref.partition(":")[0].replace(".", "/") + ".py"


def file_status(path: Path, doc: Dict) -> Dict:
    """One results file: the commits that measured and decided it, and what code changed after."""
    from mlxlab.studies import study_for

    env = doc.get("environment") or {}
    made = _clean(env.get("source_commit") or env.get("git_commit"))
    decided = sorted({_clean(v.get("decided_by")) for v in doc.get("verdicts") or [] if v.get("decided_by")})
    row = {"file": path, "made": made, "decided": decided, "measured_by_older_code": None,
           "decided_by_older_rules": None, "study_changed": None, "rules_changed": None}
    try:
        study = study_for(path)
    except ValueError:
        return row  # a probe's or a tool's file: no study owns its code
    code = last_change(measuring_paths(study.name))
    row["study_changed"] = code
    if made and code:
        row["measured_by_older_code"] = older(made, code)
    if study.decide and decided:
        rules = last_change((_module_file(study.decide), *SHARED_RULES))
        row["rules_changed"] = rules
        flags = [older(d, rules) for d in decided] if rules else []
        row["decided_by_older_rules"] = any(f for f in flags) if flags and None not in flags else None
    return row


def staleness_rows(store, paths: Optional[Dict[str, Path]] = None) -> List[Dict]:
    """:func:`file_status` of every results file the build used (or ``paths``), by label."""
    rows = []
    for label, path in sorted((paths if paths is not None else store.used).items()):
        row = file_status(path, store.load(path, use=False))
        row["label"] = label.split("data/results/", 1)[-1]
        rows.append(row)
    return rows


def staleness_markdown(rows: List[Dict]) -> str:
    """Two lists for the paper: files measured before their study's code last changed, and files
    whose verdicts were decided before their rules last changed."""
    if not has_history():
        return "*No git history here: which results are older than their code is not known.*\n"

    def short(c: Optional[str]) -> str:
        return f"`{c[:7]}`" if c else "?"

    measured = [r for r in rows if r["measured_by_older_code"]]
    decided = [r for r in rows if r["decided_by_older_rules"]]
    unknown = [r for r in rows if r["made"] and r["study_changed"] and r["measured_by_older_code"] is None]
    lines = [f"Of the {len(rows)} files, {len(measured)} were measured before their study's code last changed "
             "(each with the commit that measured it, then the study's newest; a re-run measures today's code): "
             + ("; ".join(f"`{r['label']}` {short(r['made'])} < {short(r['study_changed'])}" for r in measured) or "none")
             + "."]
    lines += ["", f"{len(decided)} store verdicts decided before their rules last changed (the tests decide every "
                  "stored verdict again under today's rules and find the same ones; `mlxlab rescore FILE` "
                  "records today's commit): "
                  + (", ".join(f"`{r['label']}`" for r in decided) or "none") + "."]
    if unknown:
        lines += ["", f"{len(unknown)} name a commit this history does not hold: "
                      + ", ".join(f"`{r['label']}`" for r in unknown) + "."]
    return "\n".join(lines) + "\n"
