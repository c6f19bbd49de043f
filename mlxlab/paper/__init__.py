"""The paper, built from the data: ``mlxlab paper`` renders ``paper/paper.md.j2`` into
``build/paper/index.html`` and ``paper.pdf``.

- :mod:`mlxlab.paper.context`: results files and claims behind strict lookups (a missing file or
  key names the file and the key path);
- :mod:`mlxlab.paper.format`: the number filters (fixed decimals, one unit each);
- :mod:`mlxlab.paper.scorecard`: every claim against the verdicts stored per platform;
- :mod:`mlxlab.paper.provenance`: where each results file used came from, and how to re-make it;
- :mod:`mlxlab.paper.tables`: the appendix, one table per results file;
- :mod:`mlxlab.paper.render`: Jinja2 -> Markdown -> HTML -> PDF (the module says why this chain).

No MLX anywhere here.
"""

from __future__ import annotations


def build(*args, **kwargs):
    """:func:`mlxlab.paper.render.build` (imported on first use: Jinja2 and markdown-it load then)."""
    from mlxlab.paper.render import build as _build

    return _build(*args, **kwargs)
