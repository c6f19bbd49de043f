"""The README's headline table, made from the results files (``mlxlab paper --readme``).

The README opens with what a user choosing a server asks first: ``mlxlab serve`` against
``mlx_lm.server`` over HTTP on the same model directory (``mlxlab bench http``). The rows come from
every committed ``serve_http*.json`` of every platform (``data/results/<platform>/``, not run
folders), one row per server, and the block between :data:`BEGIN` and :data:`END` in README.md is
replaced by it; ``tests/test_readme.py`` fails when the README's block differs from what the files
give, so the README cannot quote a number no file holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

from mlxlab.core.paths import ROOT, data_dir
from mlxlab.paper.format import fmt

BEGIN = "<!-- headline: made by `mlxlab paper --readme` from data/results/*/serve_http*.json; do not edit -->"
END = "<!-- /headline -->"


def _files(results: Path) -> List[Path]:
    out = []
    for plat in sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []:
        out += sorted(plat.glob("serve_http*.json"))
    return out


def _fig(summary: dict, key: str) -> Optional[float]:
    return (summary.get(key) or {}).get("median")


def _f(v: Optional[float], unit: str = "n", nd: Optional[int] = None) -> str:
    return "n/a" if v is None else fmt(v, unit, nd)


def _verdicts(doc: dict) -> str:
    vs = {v.get("claim"): v.get("verdict") for v in doc.get("verdicts") or []}
    return (f"more documents: {vs.get('mlx-serve-vs-mlxlm-throughput', 'not decided')}; "
            f"chat within 2x solo: {vs.get('mlx-serve-chat-itl', 'not decided')}")


def headline_markdown(results: Optional[Path] = None) -> str:
    """The headline block (without the markers): a sentence, the table, the files it came from."""
    results = Path(results) if results else data_dir() / "results"
    files = _files(results)
    if not files:
        return "*No `serve_http` results yet: run `mlxlab bench http --save` (see the command table).*"
    lines = ["| Platform | Model | Server | Documents / min | Chat ITL p99 beside them (solo) | Document TTFT p50 | "
             "Verdicts |", "|---|---|---|---|---|---|---|"]
    for path in files:
        doc = json.loads(path.read_text())
        plat = path.parent.name
        model = (doc.get("config") or {}).get("model_dir", "?")
        for i, (label, s) in enumerate((doc.get("servers") or {}).items()):
            sm = s.get("summary") or {}
            itl, solo = _fig(sm, "chat_itl_p99_ms"), _fig(sm, "solo_itl_p99_ms")
            lines.append(f"| {plat if i == 0 else ''} | {model if i == 0 else ''} | {label} | "
                         f"{_f(_fig(sm, 'docs_per_min'), 'n', 1)} | {_f(itl)} ms ({_f(solo)} ms) | "
                         f"{_f(_fig(sm, 'doc_ttft_p50_s'), 's')} | {_verdicts(doc) if i == 0 else ''} |")
    c = json.loads(files[0].read_text()).get("config") or {}
    names = ", ".join(f"`{p.relative_to(results.parent.parent) if results.parent.parent in p.parents else p.name}`"
                      for p in files)
    return (f"Over HTTP, on one model directory, {c.get('workers', '?')} clients posting documents back to back "
            f"beside a streaming chat (medians over the repeats; from {names}):\n\n" + "\n".join(lines))


def update_readme(readme: Optional[Path] = None, results: Optional[Path] = None) -> bool:
    """Replace the README's headline block with :func:`headline_markdown`; True when it changed.
    A README without both markers is an error naming them."""
    readme = Path(readme) if readme else ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme} has no headline block: put {BEGIN!r} and {END!r} where the table goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{headline_markdown(results)}\n{END}{tail}"
    if new != text:
        readme.write_text(new)
    return new != text


def readme_block(readme: Optional[Path] = None) -> str:
    """The headline block the README holds now (without the markers)."""
    text = (Path(readme) if readme else ROOT / "README.md").read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
