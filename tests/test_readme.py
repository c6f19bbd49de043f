"""The README's and docs/' code blocks run as written (a new user copies them first) and print
tables whole, the README stays short, and its generated blocks are what the results files give."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def python_blocks(text: str) -> list:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_python_blocks_are_found():
    assert python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n") == ["a = 1\n"]


DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_python_blocks_run_and_print_whole_tables(page):
    blocks = python_blocks(page.read_text())
    for code in blocks:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{page.name} block failed:\n{code}\n{out.stderr[-3000:]}"
        assert not re.search(r"\[\d+ rows x \d+ columns\]|\s\.\.\.\s", out.stdout), \
            f"{page.name} prints a truncated table:\n{out.stdout[-2000:]}"


def test_the_readme_has_a_python_block():
    assert python_blocks(README.read_text())


def test_the_readme_reads_in_five_minutes_and_links_each_docs_page_once():
    text = README.read_text()
    assert len(text.splitlines()) <= 160
    for page in (ROOT / "docs").glob("*.md"):
        assert text.count(f"](docs/{page.name})") == 1, page.name
    for word in ("Prefill", "TTFT", "ITL", "seed 000", "seed 001", "make reproduce", "make test"):
        assert word in text, word


@pytest.mark.parametrize("name", ["headline", "first-hour"])
def test_each_generated_block_is_what_the_results_files_give(name):
    """README.md's generated blocks equal what mlxlab.paper.headline makes from the committed
    results: a re-run without `mlxlab paper --readme`, or a hand edit, fails here."""
    from mlxlab.paper.headline import BLOCKS, readme_block

    assert readme_block(README, name) == BLOCKS[name](ROOT / "data" / "results")


def test_update_readme_replaces_only_the_block_and_refuses_a_readme_without_markers(tmp_path):
    import json

    from mlxlab.paper.headline import BEGIN, END, update_readme

    res = tmp_path / "data" / "results" / "cpu"
    res.mkdir(parents=True)
    doc = {"config": {"model_dir": "m", "workers": 4},
           "servers": {"mlx_lm.server": {"summary": {"docs_per_min": {"median": 5.0}, "chat_itl_p99_ms": {"median": 800.0},
                                                      "solo_itl_p99_ms": {"median": 20.0}}},
                       "mlxlab slo": {"summary": {"docs_per_min": {"median": 12.5}, "chat_itl_p99_ms": {"median": 35.0},
                                                   "solo_itl_p99_ms": {"median": 18.0},
                                                   "doc_ttft_p50_s": {"median": 1.5}}}},
           "verdicts": [{"claim": "mlx-serve-vs-mlxlm-throughput", "verdict": "reproduced"}]}
    (res / "serve_http.json").write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nabove\n{BEGIN}\nold\n{END}\nbelow\n")
    assert update_readme(readme, tmp_path / "data" / "results") is True
    text = readme.read_text()
    assert text.startswith("# x\n\nabove\n") and text.endswith(f"{END}\nbelow\n") and "old" not in text
    assert "| mlxlab slo | 12.5 | 35 ms (18 ms) | 1.5 s |" in text and "more documents: reproduced" in text
    assert update_readme(readme, tmp_path / "data" / "results") is False  # already current
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="no headline block"):
        update_readme(readme, tmp_path / "data" / "results")
