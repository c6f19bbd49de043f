"""The README's generated blocks, made from the results files (``mlxlab paper --readme``).

The README opens with what a newcomer asks first, each answer a block between two markers that
only this module writes (``tests/test_readme.py`` fails when a block differs from what the files
give, so the README cannot quote a number no file holds):

- ``headline``: ``mlxlab serve`` against ``mlx_lm.server`` over HTTP on one model directory
  (``serve_http*.json``, ``mlxlab bench http``), the chat beside a document in one process
  (``contention.json``: mlx-lm's ``BatchGenerator`` against mlxlab's ``slo``, ``mlxlab bench
  contention``) and the tuner (``tune*.json``, ``mlxlab tune``), for every platform with a
  committed file (``data/results/<platform>/``, never a run folder);
- ``first-hour``: the two commands' wall time and disk on a fresh clone
  (``first_hour.json``, ``scripts/first_hour.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List, Optional

from mlxlab.core.paths import ROOT, data_dir
from mlxlab.paper.context import is_history
from mlxlab.paper.format import fmt

BEGIN = "<!-- headline: made by `mlxlab paper --readme` from data/results/; do not edit -->"
END = "<!-- /headline -->"


def markers(name: str):
    """The two markers around block ``name``."""
    if name == "headline":
        return BEGIN, END
    return f"<!-- {name}: made by `mlxlab paper --readme` from data/results/; do not edit -->", f"<!-- /{name} -->"


def _files(results: Path, pattern: str) -> List[Path]:
    out = []
    for plat in sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []:
        out += sorted(f for f in plat.glob(pattern)  # a run cut short, or named history: not the current result
                      if not f.stem.endswith("_partial") and not is_history(f.name))
    return out


def _fig(summary: dict, key: str) -> Optional[float]:
    return (summary.get(key) or {}).get("median")


def _f(v: Optional[float], unit: str = "n", nd: Optional[int] = None) -> str:
    return "n/a" if v is None else fmt(v, unit, nd)


def _verdict(doc: dict, claim: str) -> str:
    return next((v.get("verdict") for v in doc.get("verdicts") or [] if v.get("claim") == claim), "not decided")


def _rel(path: Path, results: Path) -> str:
    base = results.parent.parent
    return f"`{path.relative_to(base) if base in path.parents else path.name}`"


def serve_markdown(results: Path) -> str:
    files = _files(results, "serve_http*.json")
    if not files:
        return "*No `serve_http` results yet: run `mlxlab bench http --save`.*"
    lines = ["| Platform | Model | Server | Documents / min | Chat ITL p99 beside them (solo) | Document TTFT p50 | "
             "Verdicts |", "|---|---|---|---|---|---|---|"]
    for path in files:
        doc = json.loads(path.read_text())
        plat, model = path.parent.name, (doc.get("config") or {}).get("model_dir", "?")
        verdicts = (f"more documents: {_verdict(doc, 'mlx-serve-vs-mlxlm-throughput')}; "
                    f"chat within 2x solo: {_verdict(doc, 'mlx-serve-chat-itl')}")
        for i, (label, s) in enumerate((doc.get("servers") or {}).items()):
            sm = s.get("summary") or {}
            itl, solo = _fig(sm, "chat_itl_p99_ms"), _fig(sm, "solo_itl_p99_ms")
            if sm.get("errors"):  # its figures count only what finished before it broke
                lines.append(f"| {plat if i == 0 else ''} | {model if i == 0 else ''} | {label} | its requests failed: "
                             f"not measured | | | {verdicts if i == 0 else ''} |")
                continue
            lines.append(f"| {plat if i == 0 else ''} | {model if i == 0 else ''} | {label} | "
                         f"{_f(_fig(sm, 'docs_per_min'), 'n', 1)} | {_f(itl)} ms ({_f(solo)} ms) | "
                         f"{_f(_fig(sm, 'doc_ttft_p50_s'), 's')} | {verdicts if i == 0 else ''} |")
    c = json.loads(files[0].read_text()).get("config") or {}
    return (f"**Over HTTP** (`mlxlab bench http`): one model directory, {c.get('workers', '?')} clients posting "
            f"documents back to back beside a streaming chat; medians over the repeats, from "
            f"{', '.join(_rel(p, results) for p in files)}.\n\n" + "\n".join(lines))


def contention_markdown(results: Path) -> str:
    files = [p for p in _files(results, "contention.json")]
    if not files:
        return "*No `contention` results yet: run `mlxlab bench contention --save`.*"
    lines = ["| Platform | Model | mlx-lm `BatchGenerator`: chat ITL p99 (x solo) | mlxlab `slo`: chat ITL p99 (x solo) | "
             "Document TTFT, `slo` over `BatchGenerator` |", "|---|---|---|---|---|"]
    for path in files:
        doc = json.loads(path.read_text())
        for i, (model, p) in enumerate((doc.get("presets") or {}).items()):
            settings = p.get("settings") or {}
            base = next((s for s in settings.values() if s.get("executor") == "mlx_lm"), None)
            slo = settings.get("slo")
            if not base or not slo:
                continue
            ttft = slo["doc_ttft_s"] / base["doc_ttft_s"] if base.get("doc_ttft_s") else None
            lines.append(f"| {path.parent.name if i == 0 else ''} | {model} | {_f(base['chat_itl_p99_ms'])} ms "
                         f"({_f(base['chat_itl_p99_over_solo'], 'x', 1)}) | {_f(slo['chat_itl_p99_ms'])} ms "
                         f"({_f(slo['chat_itl_p99_over_solo'], 'x', 1)}) | {_f(ttft, 'x')} |")
    return ("**In one process** (`mlxlab bench contention`): a chat decoding while a long document prefills, "
            f"on the same model object; medians over the repeats, from {', '.join(_rel(p, results) for p in files)}."
            "\n\n" + "\n".join(lines))


def tune_markdown(results: Path) -> str:
    files = _files(results, "tune*.json")
    if not files:
        return "*No `tune` results yet: run `mlxlab tune --save`.*"
    lines = ["| Platform | Model | Trace (requests) | SLO | Choice | Its objective over `BatchGenerator`'s | Regret "
             "against the exhaustive sweep | Verdict |", "|---|---|---|---|---|---|---|---|"]
    waiting = []  # a sweep not yet whole (continued by --resume): named, not tabled
    for path in files:
        doc = json.loads(path.read_text())
        if _verdict(doc, "mlx-tune-regret") == "not measured":
            waiting.append(_rel(path, results))
            continue
        tr, ch = doc.get("trace") or {}, doc.get("choice") or {}
        reg = next((v.get("measured") or {} for v in doc.get("verdicts") or [] if v.get("claim") == "mlx-tune-regret"), {})
        model = (doc.get("parameters") or {}).get("model", "?")
        more = "".join(f"; {t} asks x{_f(f)}" for t, f in sorted(((doc.get("parameters") or {}).get("output_scale")
                                                               or {}).items()))  # --output-scale
        grid = (doc.get("parameters") or {}).get("grid")
        more += f"; {grid} grid" if grid and grid != "standard" else ""
        more += "; steady" if doc.get("steady") else ""  # every setting scored on warm runs (tune --steady)
        lines.append(f"| {path.parent.name} | {model} | `{tr.get('path', '?')}` ({_f(tr.get('requests'))}{more}) | "
                     f"{', '.join(doc.get('slos') or [])} | {ch.get('label', '?')}"
                     f"{'' if ch.get('meets') else ' (meets no SLO set)'} | "
                     f"{_f((doc.get('vs_mlx_lm') or {}).get('objective_x'), 'x')} ({doc.get('objective', '?')}) | "
                     f"{_f(reg.get('regret'), 'fpct', 1)}"
                     f"{' (the choice missed an SLO in a sweep repeat)' if reg.get('choice_in_pool') is False else ''} | "
                     f"{_verdict(doc, 'mlx-tune-regret')} |")
    return ("**The tuner** (`mlxlab tune`): the setting it chose for a trace, confirmed on the engine beside "
            f"`BatchGenerator`, from {', '.join(_rel(p, results) for p in files if _rel(p, results) not in waiting)}"
            + (f" (sweep not yet whole, so no regret: {', '.join(waiting)})" if waiting else "")
            + ".\n\n" + "\n".join(lines))


def headline_markdown(results: Optional[Path] = None) -> str:
    """The headline block (without the markers): the server, the chat in one process, the tuner."""
    results = Path(results) if results else data_dir() / "results"
    return "\n\n".join([serve_markdown(results), contention_markdown(results), tune_markdown(results)])


def first_hour_markdown(results: Optional[Path] = None) -> str:
    """The two commands' measured cost on a fresh clone (``scripts/first_hour.py``)."""
    results = Path(results) if results else data_dir() / "results"
    files = _files(results, "first_hour.json")
    if not files:
        return "*Not measured yet: `python scripts/first_hour.py --save` times both on a fresh clone.*"
    path = files[0]
    doc = json.loads(path.read_text())
    runs, sizes = doc.get("runs") or {}, doc.get("sizes") or {}
    rep, test = runs.get("reproduce") or {}, runs.get("test") or {}
    counts = test.get("counts") or {}
    when = ((doc.get("environment") or {}).get("written_at") or "")[:10]
    text = (f"Measured on a fresh clone of `{str(doc.get('commit_measured', '?'))[:7]}` on {when}, "
            f"{doc.get('cores', '?')} cores, no GPU ({_rel(path, results)}): `make reproduce` took "
            f"{_f(rep.get('seconds', 0) / 60, 'n', 1)} min including the setup, whose `.venv` is "
            f"{_f(sizes.get('venv_bytes', 0) / 1e9, 'n', 1)} GB")
    if test:
        text += (f"; `make test` took {_f(test.get('seconds', 0) / 60, 'n', 1)} min "
                 f"({_f(counts.get('passed'))} tests passed)")
    loads = [r.get("load_before") for r in runs.values() if r.get("load_before") is not None]
    if loads and max(loads) > (doc.get("cores") or 1):
        text += f" (other work shared the cores: load average up to {_f(max(loads), 'n', 1)})"
    return text + f". The whole clone then takes {_f(sizes.get('clone_bytes', 0) / 1e9, 'n', 1)} GB."


BLOCKS: Dict[str, Callable[[Optional[Path]], str]] = {"headline": headline_markdown, "first-hour": first_hour_markdown}


def update_readme(readme: Optional[Path] = None, results: Optional[Path] = None) -> bool:
    """Replace each generated block the README has with what the results files give (a README
    must hold the headline block; the others where it places them); True when it changed."""
    readme = Path(readme) if readme else ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme} has no headline block: put {BEGIN!r} and {END!r} where the table goes")
    new = text
    for name, make in BLOCKS.items():
        begin, end = markers(name)
        if begin in new and end in new:
            head, rest = new.split(begin, 1)
            _, tail = rest.split(end, 1)
            new = f"{head}{begin}\n{make(results)}\n{end}{tail}"
    if new != text:
        readme.write_text(new)
    return new != text


def readme_block(readme: Optional[Path] = None, name: str = "headline") -> Optional[str]:
    """The block ``name`` the README holds now (without the markers); None where it has none."""
    text = (Path(readme) if readme else ROOT / "README.md").read_text()
    begin, end = markers(name)
    if begin not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
