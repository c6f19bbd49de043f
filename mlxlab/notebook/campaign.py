"""A platform's full notebook campaign split across device calls: ``mlxlab campaign plan|run|collect``.

The H200 is lent by the call (at most 10 minutes each, 30 a session) and its image has no
package registry, no vl-convert and no nbconvert. So a campaign is a list of **entries** (one
notebook with the parameters of one preset, or of none where the experiment is not per preset),
each run in full mode in its own process under a deadline, and each recorded in the campaign log
``data/results/<platform>/campaign/campaign.json``: which call ran it, at which commit, for how
long, and how it ended. ``run`` takes the pending entries in order while their expected time (the
last measured one, else the plan's estimate) fits the call's budget, and after each entry packs
what it wrote (results, figure specs, the executed notebook, the log) into one archive in
``$OUT`` (a device call returns at most 8 files). ``collect`` unpacks that archive here, renders
the figure specs (:func:`mlxlab.notebook.plots.render_pending`), exports each executed notebook to
HTML without its widget state (the interactive charts need a live kernel; the figures are the
rendered files beside them) and merges the log, so ``plan`` then shows what is left.

Per-preset results go to ``data/results/<platform>/campaign/<preset>/`` and figures to
``paper/figures/<platform>/campaign/<preset>/`` (entries over no preset, or over all of them at
once, one level up): a campaign never overwrites the files of the CLI studies of that platform.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mlxlab.core.paths import ROOT
from mlxlab.core.results import _git_commit  # the commit every results file records
from mlxlab.notebook.reproduce import export_notebook_html

PRESETS = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b")  # the seeds' presets, 4-bit weights
ARCHIVE = "campaign.tar.gz"


class CampaignError(RuntimeError):
    pass


@dataclass(frozen=True)
class Entry:
    notebook: str                  # the two-digit number, e.g. "01"
    preset: Optional[str]          # None: not per preset (its own models, or all presets at once)
    params: Dict = field(default_factory=dict, hash=False, compare=False)
    estimate_s: float = 300.0      # used until a run of this entry has been timed

    @property
    def key(self) -> str:
        return f"{self.notebook}@{self.preset or 'all'}"


def h200_entries() -> List[Entry]:
    """The H200 campaign, in the order the paper reads the notebooks. Per-preset notebooks run
    each preset with 4-bit weights; 03 uses the committed byte-level pair (04 runs one preset per
    entry: its fresh processes make all three too long for one call), 05 the seed-001 model, 07
    the same float32 model on every machine."""
    per_preset = {
        "00": ({}, 70.0),   # estimates: the first H200 calls (00 took 54-66 s warm, 178 s as a machine's first)
        "01": ({"prompt_lengths": [480, 1024, 2048, 4096, 8192, 16384]}, 150.0),  # 138 s on 0.5b
        "02": ({}, 60.0),   # 43 s on 0.5b
        # 04 starts 3 x 3 fresh processes per preset (about 14 s of model build each on the H200) plus
        # the cache-limit settings: all three presets in one entry ran past a 520 s call
        "04": ({}, 330.0),
        "06": ({}, 180.0),
    }
    out = []
    for nb, (extra, est) in per_preset.items():
        for preset in PRESETS:
            model = {"models": [preset]} if nb == "04" else {"model_name": preset}
            out.append(Entry(nb, preset, {**model, "bits": 4, **extra}, est))
    out += [
        Entry("03", None, {}, 130.0),  # 123 s
        Entry("05", None, {"model_name": "qwen2.5-coder-1.5b", "bits": 4}, 360.0),
        Entry("07", None, {}, 150.0),
        Entry("08", None, {}, 200.0),  # two processes (mlx.launch, ring backend on loopback) on one GPU
        # tune on the committed sample trace (not yet run on the H200: an estimate)
        Entry("09", None, {"model_name": "qwen2.5-coder-1.5b", "bits": 4, "dtype": None}, 300.0),
    ]
    order = {"00": 0, "01": 1, "02": 2, "03": 3, "04": 4, "05": 5, "06": 6, "07": 7, "08": 8, "09": 9}
    return sorted(out, key=lambda e: (order[e.notebook], PRESETS.index(e.preset) if e.preset else -1))


ENTRIES = {"h200": h200_entries}


def entries(platform: str) -> List[Entry]:
    if platform not in ENTRIES:
        raise CampaignError(f"no campaign for platform {platform!r}: have {', '.join(ENTRIES)}")
    return ENTRIES[platform]()


def campaign_dir(platform: str) -> Path:
    return ROOT / "data" / "results" / platform / "campaign"


def folders(entry: Entry, platform: str) -> Dict[str, Path]:
    """Where an entry's notebook writes: results, figures and its executed copy."""
    sub = entry.preset or ""
    res = campaign_dir(platform) / sub
    return {"results": res, "figures": ROOT / "paper" / "figures" / platform / "campaign" / sub,
            "executed": campaign_dir(platform) / "executed" / f"{entry.notebook}-{entry.preset or 'all'}.ipynb"}


def read_log(platform: str) -> List[dict]:
    p = campaign_dir(platform) / "campaign.json"
    return json.loads(p.read_text())["runs"] if p.is_file() else []


def write_log(platform: str, runs: Sequence[dict]) -> Path:
    p = campaign_dir(platform) / "campaign.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    runs = sorted(runs, key=lambda r: (r["started"], r["key"]))
    p.write_text(json.dumps({"platform": platform, "runs": runs}, indent=1) + "\n")
    return p


def expected_s(entry: Entry, runs: Sequence[dict]) -> float:
    """The entry's last measured time (a timed-out run counts as at least its deadline), else its estimate."""
    timed = [r for r in runs if r["key"] == entry.key and r["status"] in ("ok", "failed", "timeout")]
    return float(timed[-1]["seconds"]) if timed else entry.estimate_s


def pending(platform: str, runs: Optional[Sequence[dict]] = None) -> List[Entry]:
    """Entries with no successful run in the log."""
    runs = read_log(platform) if runs is None else runs
    done = {r["key"] for r in runs if r["status"] == "ok"}
    return [e for e in entries(platform) if e.key not in done]


def split_calls(todo: Sequence[Entry], runs: Sequence[dict], budget_s: float) -> List[List[Entry]]:
    """The pending entries in order, packed into calls of at most ``budget_s`` expected seconds
    each (an entry expected to take longer than one call gets a call of its own)."""
    calls: List[List[Entry]] = []
    used = 0.0
    for e in todo:
        t = expected_s(e, runs)
        if not calls or used + t > budget_s:
            calls.append([])
            used = 0.0
        calls[-1].append(e)
        used += t
    return calls


def _pack(out: Path, written: Sequence[Path]) -> Path:
    """One archive of everything this call wrote, paths relative to the checkout (rewritten
    atomically after each entry, so a call cut short still returns what finished)."""
    tmp = out / (ARCHIVE + ".part")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(set(written)):
            if p.is_file():
                tar.add(p, arcname=str(p.relative_to(ROOT)))
    os.replace(tmp, out / ARCHIVE)
    return out / ARCHIVE


def _files_newer(folder: Path, since: float) -> List[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.stat().st_mtime >= since] if folder.is_dir() else []


def run(platform: str, budget_s: float, *, call: str, only: Optional[Sequence[str]] = None,
        out: Optional[Path] = None, python: str = sys.executable) -> List[dict]:
    """Run pending entries (or the keys in ``only``, in plan order) whose expected time fits what
    is left of ``budget_s`` (one that does not is skipped and a later, shorter one tried); each
    runs ``mlxlab reproduce`` for its notebook in a child process killed at the budget's end. Returns this call's log records; also merged into the
    campaign log and, with ``out``, packed into ``out/campaign.tar.gz``."""
    runs = read_log(platform)
    todo = [e for e in entries(platform) if e.key in set(only)] if only else pending(platform, runs)
    if only and len(todo) != len(set(only)):
        known = {e.key for e in entries(platform)}
        raise CampaignError(f"unknown campaign entries {sorted(set(only) - known)}; have {sorted(known)}")
    t_end = time.monotonic() + budget_s
    mine, written = [], []
    for e in todo:
        left, want = t_end - time.monotonic(), expected_s(e, runs)
        if want > left:
            print(f"campaign: {e.key} expects {want:.0f} s, {left:.0f} s left: skipped", flush=True)
            continue
        f = folders(e, platform)
        f["executed"].parent.mkdir(parents=True, exist_ok=True)
        params = {**e.params, "results_dir": str(f["results"]), "figures_dir": str(f["figures"])}
        cmd = [python, "-m", "mlxlab.cli", "reproduce", "--only", e.notebook, "--platform", platform, "--no-html",
               "--out-dir", str(f["executed"].parent), "--out-name", f["executed"].name]
        for k, v in params.items():
            cmd += ["--param", f"{k}={json.dumps(v)}"]
        started, t0 = time.time(), time.monotonic()
        print(f"campaign: {e.key} ({left:.0f} s left)", flush=True)
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, left))
            status = "ok" if proc.returncode == 0 else "failed"
            tail = (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired as exc:
            status, tail = "timeout", f"killed at the call's budget ({budget_s:.0f} s)\n" + str(exc.stderr or "")[-1500:]
        rec = {"key": e.key, "notebook": e.notebook, "preset": e.preset, "params": e.params, "call": call,
               "status": status, "seconds": round(time.monotonic() - t0, 1), "started": started,
               "commit": os.environ.get("MLXLAB_SOURCE_COMMIT") or _git_commit(), "tail": tail if status != "ok" else ""}
        print(f"campaign: {e.key} {status} in {rec['seconds']} s" + (f"\n{tail}" if status != "ok" else ""), flush=True)
        mine.append(rec)
        runs.append(rec)
        written += _files_newer(f["results"], started - 1) + _files_newer(f["figures"], started - 1)
        written += [f["executed"]] if f["executed"].is_file() else []
        written.append(write_log(platform, runs))
        if out is not None:
            _pack(Path(out), written)
    return mine


def collect(archive: Path, platform: str) -> Dict[str, List[str]]:
    """Unpack a call's archive into the checkout (paths checked to stay inside it), render the
    figure specs, export each executed notebook to ``campaign/html/`` and merge the call's log
    records into the committed log (the archive's log holds the records the device knew of plus
    its own). Returns the files written, by kind."""
    from mlxlab.notebook.plots import render_pending

    archive = Path(archive)
    if not archive.is_file():
        raise CampaignError(f"no archive at {archive}: pass the {ARCHIVE} a device call returned")
    before = read_log(platform)
    log_rel = str((campaign_dir(platform) / "campaign.json").relative_to(ROOT))
    got: Dict[str, List[str]] = {"files": [], "figures": [], "html": []}
    theirs: List[dict] = []
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            if not m.isfile():
                continue
            dest = (ROOT / m.name).resolve()
            if ROOT.resolve() not in dest.parents:
                raise CampaignError(f"{archive}: member {m.name!r} would land outside the checkout")
            data = tar.extractfile(m).read()
            if m.name == log_rel:
                theirs = json.loads(data)["runs"]
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            got["files"].append(m.name)
    seen = {(r["key"], r["started"]) for r in before}
    write_log(platform, before + [r for r in theirs if (r["key"], r["started"]) not in seen])
    fig_root = ROOT / "paper" / "figures" / platform / "campaign"
    if fig_root.is_dir():
        got["figures"] = [str(p.relative_to(ROOT)) for p in render_pending(fig_root)]
    for name in got["files"]:
        if name.endswith(".ipynb") and "/executed/" in name:
            src = ROOT / name
            html = campaign_dir(platform) / "html" / (src.stem + ".html")
            got["html"].append(str(export_notebook_html(src, html, strip_widgets=True).relative_to(ROOT)))
    return got
