"""Write a notebook from a list of cells (used to author notebooks/ from plain Python).

Usage: ``python scripts/nbtools.py notebooks/src/05_x.py`` turns a ``# %%``-delimited script
into ``notebooks/05_x.ipynb`` without outputs. A cell starting with ``# %% parameters`` is
tagged ``parameters`` for papermill; ``# %% [markdown]`` cells become markdown.
"""
import sys
from pathlib import Path

import nbformat


def convert(src: Path, dst: Path) -> None:
    text = src.read_text()
    cells = []
    for block in text.split("# %%")[1:]:
        head, _, body = block.partition("\n")
        head = head.strip()
        body = body.strip("\n")
        if head.startswith("[markdown]"):
            lines = [l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.splitlines()]
            cells.append(nbformat.v4.new_markdown_cell("\n".join(lines)))
        else:
            c = nbformat.v4.new_code_cell(body)
            if head == "parameters":
                c.metadata["tags"] = ["parameters"]
            cells.append(c)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, str(dst))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        src = Path(arg)
        convert(src, Path("notebooks") / (src.stem + ".ipynb"))
        print("wrote", Path("notebooks") / (src.stem + ".ipynb"))
