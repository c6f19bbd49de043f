"""The README's code blocks run as written (a new user copies them first)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_blocks(text: str) -> list:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_python_blocks_are_found():
    assert python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n") == ["a = 1\n"]


def test_readme_python_blocks_run():
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert blocks, "the README has no python block"
    for code in blocks:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"README block failed:\n{code}\n{out.stderr[-3000:]}"
