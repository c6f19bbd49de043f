"""Build the paper: ``paper/paper.md.j2`` (Jinja2) -> Markdown -> HTML -> PDF.

Why this toolchain: Jinja2 is already installed with mlx-lm (its chat templates), its
``StrictUndefined`` turns a name the template misspells into a failed build, and the source stays
readable Markdown with ``{{ ... }}`` inserts; MyST or Jupyter Book would bring Sphinx and its
configuration for a single page that needs none of it. Markdown becomes HTML through markdown-it-py
(CommonMark with tables), and headless Chromium prints the HTML to PDF.

Every measured or published number in the paper is an insert: ``r("cpu/roofline")`` reads a
results file, ``verdict("cpu", claim_id)`` a stored verdict, ``claim(id)`` a claim of
``data/claims``; a missing file or key stops the build with the file and key path (and the
template line). Figures are embedded as data URIs, so ``index.html`` stands alone.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mlxlab.core.paths import ROOT
from mlxlab.paper.context import Node, PaperDataError, ResultsStore, experiment_claims, is_history
from mlxlab.paper.format import filters
from mlxlab.paper.provenance import provenance_markdown, provenance_rows, rerun_command
from mlxlab.paper.scorecard import (columns, counts_text, findings, platforms_for, scorecard_markdown, scorecard_rows,
                                     tally_markdown)

TEMPLATE = ROOT / "paper" / "paper.md.j2"
DEFAULT_OUT = ROOT / "build" / "paper"
_PROVENANCE = "<!-- provenance of the results files used: filled in after rendering -->"
_STALENESS = "<!-- results older than their code: filled in after rendering -->"
#: the interactive charts the paper's HTML embeds (name -> "module:function" drawing it from a stored
#: results document): Vega-Lite parameters, so they move without a kernel
EXPLORERS = {"chunk_explorer": "mlxlab.studies.admission_gate.charts:chunk_explorer_from_doc",
             "tune_explorer": "mlxlab.studies.tune.charts:explorer_chart"}

CSS = """
body { font-family: Georgia, 'Times New Roman', serif; max-width: 52em; margin: 2em auto; padding: 0 1em;
       line-height: 1.45; color: #222; }
h1, h2, h3, h4 { font-family: Helvetica, Arial, sans-serif; line-height: 1.2; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: .8em; width: 100%; }
th, td { border: 1px solid #bbb; padding: .25em .45em; vertical-align: top; text-align: left; }
th { background: #f0f0f0; }
td code, td small { overflow-wrap: anywhere; }
td { min-width: 4.5em; }
code { font-size: .9em; background: #f6f6f6; padding: 0 .15em; }
figure { margin: 1.5em 0; text-align: center; page-break-inside: avoid; }
figure img { max-width: 100%; max-height: 32em; width: auto; height: auto; }
figcaption { font-size: .9em; color: #444; margin-top: .4em; text-align: left; }
.note { font-size: .9em; color: #555; }
@media print { body { max-width: none; margin: 0; } table { font-size: .7em; } h2 { page-break-after: avoid; }
  figure.explorer { display: none; } }
figure.explorer iframe { width: 100%; height: 470px; border: 0; }
"""


class PaperBuildError(RuntimeError):
    """The paper did not build: the message says which template line and which data."""


@dataclass
class Build:
    """What :func:`build` made: the Markdown, the HTML file, the PDF (or why not), the scorecard
    rows it showed, the results files and figures it used, and the key paths it inserted
    (file -> sorted paths, also written to ``inserts.json``)."""
    markdown: str
    html: Optional[Path]
    pdf: Optional[Path] = None
    pdf_error: Optional[str] = None
    scorecard: List[Dict] = field(default_factory=list)
    used: Dict[str, Path] = field(default_factory=dict)
    figures: List[Path] = field(default_factory=list)
    keys: Dict[str, List[str]] = field(default_factory=dict)
    stale: List[Dict] = field(default_factory=list)


class Helpers:
    """The functions the template calls; they record what the build used."""

    def __init__(self, store: ResultsStore):
        self.store = store
        self.figures: Dict[str, Path] = {}  # src in the Markdown -> PNG
        self.scorecards: List[Dict] = []  # every scorecard row shown, for the tests
        self.stale: List[Dict] = []  # mlxlab.paper.staleness rows, when the template asks for them
        self.explorers: Dict[str, object] = {}  # name -> the Altair chart build() writes to explorers/NAME.html
        self._md = None

    def globals(self) -> Dict:
        s = self.store
        return {"r": s.r, "like": s.like, "verdict": s.verdict, "verdicts_by_file": s.verdicts_by_file, "has_verdict": s.has_verdict, "claim": s.claim,
                "claims_of": lambda *exps: experiment_claims(s, exps), "figure": self.figure,
                "scorecard": self.scorecard, "tally": self.tally, "provenance": lambda: _PROVENANCE,
                "staleness": lambda: _STALENESS, "findings": self.findings, "explorer": self.explorer, "counts_text": counts_text,
                "appendix": self.appendix, "platforms": lambda: columns(s), "claim_ids": lambda: list(s.claims()),
                "platforms_for": lambda cid: platforms_for(s, cid),
                "campaign_pending": self.campaign_pending, "plans": self.plans, "simulated_only": self.simulated_only,
                "measured_before": self.measured_before, "thin_rank": _thin_rank()}

    def measured_before(self, spec: str, commit: str) -> Optional[bool]:
        """Whether the results file ``spec`` was measured at a commit before ``commit`` (its
        ``environment.source_commit``, else ``git_commit``); None where git cannot say (no
        history, or a commit it does not hold)."""
        from mlxlab.paper.staleness import older

        env = self.store.load(self.store.path(spec), use=False).get("environment") or {}
        mine = (env.get("source_commit") or env.get("git_commit") or "").split("-")[0]
        return older(mine, commit) if mine else None

    def simulated_only(self) -> List[Dict]:
        """The claims that only a simulation decides on the measured platforms (CPU, H200): one
        ``{claim, files}`` each, the files holding the simulated verdicts. The scorecard shows
        them in the simulated column; section 15 lists them as not measured."""
        from mlxlab.paper.scorecard import PLATFORMS, simulated

        out = []
        for cid in self.store.claims():
            found = [(p, rec) for plat in PLATFORMS for p, rec in self.store.deciding(plat, cid)]
            if found and all(simulated(rec) for _, rec in found):
                out.append({"claim": cid, "files": sorted({self.store.label(p) for p, _ in found})})
        return out

    def plans(self, spec: str) -> Dict[str, dict]:
        """Where the simulator's plan parts from the engine's in the validation ``platform/name``
        (:func:`mlxlab.studies.sim_validation.divergence.plan_summary`)."""
        from mlxlab.studies.sim_validation.divergence import plan_summary

        return plan_summary(self.store.load(self.store.path(spec)))

    def campaign_pending(self, platform: str) -> List[str]:
        """Keys of the platform's notebook-campaign entries with no successful run in its log
        (``data/results/<platform>/campaign/campaign.json``; every entry when there is none)."""
        from mlxlab.notebook.campaign import pending

        log = self.store.results / platform / "campaign" / "campaign.json"
        return [e.key for e in pending(platform, self.store.load(log)["runs"] if log.is_file() else [])]

    def inline(self, text: str) -> str:
        if self._md is None:
            self._md = _markdown()
        return self._md.renderInline(text)

    def figure(self, name: str, caption: str, source=None, platform: Optional[str] = None) -> str:
        """An embedded figure ``paper/figures/[platform/]name.png`` with a numbered caption that
        ends with where it comes from: ``source``, the results file(s) it is drawn from
        (``"cpu/serve_http"`` or a list), each linked, with the command that writes it again. A
        missing PNG, a missing results file or no ``source`` fails the build."""
        if not source:
            raise PaperDataError(f"figure({name!r}): give source=, the results file(s) the figure is drawn from")
        path = self.store.figure_path(name, platform)
        src = f"figures/{platform + '/' if platform else ''}{name}.png"
        self.figures[src] = path
        n = len(self.figures)
        origins = [self._origin(spec) for spec in ([source] if isinstance(source, str) else list(source))]
        where = f" Drawn from {'; '.join(origins)}."
        return (f'<figure id="fig-{name}"><img src="{src}" alt="{html.escape(name)}">'
                f"<figcaption><b>Figure {n}.</b> {self.inline(caption + where)}</figcaption></figure>\n")

    def _origin(self, spec: str) -> str:
        res = self.store.path(spec)
        rel = self.store.label(res)
        return f"[`{rel}`](../../{rel}) (`{rerun_command(self.store, res, self.store.load(res))}`)"

    def explorer(self, name: str, caption: str, source: str) -> str:
        """An interactive chart (:data:`EXPLORERS`) drawn from the results file ``source`` and
        embedded in the HTML as ``explorers/NAME.html`` (self-contained; its menus and sliders move
        without a kernel); the PDF leaves it out, as the static figure beside it says the same."""
        from mlxlab.studies.base import resolve

        if name not in EXPLORERS:
            raise PaperDataError(f"explorer({name!r}): no such explorer (have: {', '.join(EXPLORERS)})")
        self.explorers[name] = resolve(EXPLORERS[name])(self.store.load(self.store.path(source)))
        text = f"{caption} Drawn from {self._origin(source)}; it works without a kernel (not in the PDF)."
        return (f'<figure class="explorer" id="explorer-{name}"><iframe src="explorers/{name}.html" '
                f'title="{html.escape(name)}" loading="lazy"></iframe>'
                f"<figcaption><b>Explorer.</b> {self.inline(text)}</figcaption></figure>\n")

    def scorecard(self, *experiments: str, claims: Optional[Sequence[str]] = None) -> str:
        """The scorecard rows of the claims ``experiments`` decide (or the ``claims`` listed;
        neither: every claim, one table per study)."""
        ids = list(claims) if claims else experiment_claims(self.store, experiments) if experiments else None
        if ids is not None and not ids:
            raise PaperDataError(f"scorecard(): no claim in data/claims names experiment(s) {list(experiments)}")
        plats = columns(self.store)
        rows = scorecard_rows(self.store, ids, plats)
        self.scorecards.extend(rows)
        return scorecard_markdown(rows, plats, by_study=ids is None)

    def findings(self) -> Dict:
        """:func:`mlxlab.paper.scorecard.findings` over every claim, on the measured platforms."""
        from mlxlab.paper.scorecard import PLATFORMS

        return findings(scorecard_rows(self.store, None, list(PLATFORMS)), list(PLATFORMS))

    def tally(self) -> str:
        plats = columns(self.store)
        return tally_markdown(scorecard_rows(self.store, None, plats), plats)

    def appendix(self) -> str:
        from mlxlab.paper.tables import appendix_markdown

        return appendix_markdown(self.store)


def _thin_rank() -> int:
    from mlxlab.studies.tune.slo import THIN_RANK  # the rank below which tune calls a tail figure thin

    return THIN_RANK


def _markdown():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable("table")


def _template_line(exc: BaseException, name: str) -> Optional[int]:
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(name):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def render_markdown(store: Optional[ResultsStore] = None, template: Optional[Path] = None,
                    source: Optional[str] = None):
    """The paper as Markdown, and the :class:`Helpers` that rendered it (what it used).
    ``source`` renders a template given as text instead of the file (for tests)."""
    import jinja2

    store = store or ResultsStore()
    template = Path(template or TEMPLATE)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template.parent)), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(filters())
    env.tests["history"] = is_history  # like(...) | reject("history"): the current files only
    helpers = Helpers(store)
    env.globals.update(helpers.globals())
    from mlxlab.studies.tune.confirm import SOLO_REPEATS

    env.globals["SOLO_REPEATS"] = SOLO_REPEATS  # tune's rule, not a measurement: the paper cites it as the code has it
    name = "<source>" if source is not None else template.name
    try:
        tpl = env.from_string(source) if source is not None else env.get_template(template.name)
        text = tpl.render()
    except (PaperDataError, jinja2.TemplateError, TypeError, ValueError) as exc:
        line = _template_line(exc, name if source is None else "<template>")
        where = f"{name}, line {line}" if line else name
        raise PaperBuildError(f"{where}: {type(exc).__name__}: {exc}") from exc
    if _PROVENANCE in text:
        text = text.replace(_PROVENANCE, provenance_markdown(provenance_rows(store)))
    if _STALENESS in text:
        from mlxlab.paper.staleness import staleness_markdown, staleness_rows

        helpers.stale = staleness_rows(store)
        text = text.replace(_STALENESS, staleness_markdown(helpers.stale))
    return text, helpers


def markdown_to_html(markdown: str, figures: Dict[str, Path], title: Optional[str] = None) -> str:
    """A standalone HTML page: the Markdown rendered, the CSS above, each figure a data URI."""
    body = _markdown().render(markdown)
    # an id on each section heading, so a section can be linked (index.html#s7-...)
    body = re.sub(r"<h2>([^<]*)</h2>",
                  lambda m: f'<h2 id="{_slug(m.group(1))}">{m.group(1)}</h2>', body)
    for src, path in figures.items():
        uri = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
        body = body.replace(f'src="{src}"', f'src="{uri}"')
    if title is None:
        m = re.search(r"^# (.+)$", markdown, re.M)
        title = m.group(1) if m else "mlxlab paper"
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", html.unescape(text).lower()).strip("-")


def find_chromium() -> Optional[str]:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def write_pdf(html_path: Path, pdf_path: Path, chromium: Optional[str] = None, timeout: float = 180) -> Optional[str]:
    """Print ``html_path`` to ``pdf_path`` with headless Chromium; returns None, or why no PDF."""
    chromium = chromium or find_chromium()
    if not chromium:
        return "no chromium on PATH (apt-get install chromium): wrote the HTML only"
    pdf_path = Path(pdf_path)
    pdf_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
               f"--user-data-dir={profile}", f"--print-to-pdf={pdf_path}", Path(html_path).resolve().as_uri()]
        # not with the CLI's preloaded OpenBLAS: under LD_PRELOAD Chromium's GPU process fails to start
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return f"chromium did not finish printing within {timeout:.0f} s"
    if not pdf_path.exists() or pdf_path.stat().st_size == 0:
        return f"chromium wrote no PDF (exit {out.returncode}): {out.stderr.strip()[-500:]}"
    return None


def build(out: Optional[Path] = None, *, template: Optional[Path] = None, store: Optional[ResultsStore] = None,
          pdf: bool = True) -> Build:
    """Render the paper into ``out`` (default ``build/paper/``): ``paper.md`` (the rendered
    Markdown), ``index.html`` (standalone but for ``explorers/*.html``, the interactive charts it
    embeds, each self-contained), ``inserts.json`` (the key paths inserted, per
    results file) and, with ``pdf`` and Chromium, ``paper.pdf``."""
    out = Path(out or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    store = store or ResultsStore()
    markdown, helpers = render_markdown(store, template)
    (out / "paper.md").write_text(markdown)
    html_path = out / "index.html"
    html_path.write_text(markdown_to_html(markdown, helpers.figures))
    if helpers.explorers:
        from mlxlab.notebook.plots import save_explorer  # altair and vl-convert: only a paper with explorers

        for name, chart in helpers.explorers.items():
            save_explorer(chart, out / "explorers" / f"{name}.html")
    keys = {f: sorted(paths) for f, paths in sorted(store.keys.items())}
    (out / "inserts.json").write_text(json.dumps(keys, indent=1) + "\n")
    result = Build(markdown, html_path, scorecard=helpers.scorecards, used=dict(store.used),
                   figures=list(helpers.figures.values()), keys=keys, stale=helpers.stale)
    if pdf:
        result.pdf_error = write_pdf(html_path, out / "paper.pdf")
        result.pdf = None if result.pdf_error else out / "paper.pdf"
    return result


def figure_names(text: str) -> List[str]:
    """The figures a template source calls ``figure("name", ..., platform="p")`` with, as paths
    under ``paper/figures/`` without the suffix (``name`` or ``p/name``)."""
    out = []
    for m in re.finditer(r"figure\(\s*[\"']([^\"']+)[\"'](.*?)\)\s*\}\}", text, re.S):
        plat = re.search(r"platform\s*=\s*[\"']([^\"']+)[\"']", m.group(2))
        out.append(f"{plat.group(1)}/{m.group(1)}" if plat else m.group(1))
    return out


#: a number followed by a unit, as the project's before-stop hook counts typed figures
TYPED = re.compile(r"(?:^|[^0-9.A-Za-z_])([0-9][0-9,]*(?:\.[0-9]+)? ?(?:x|%|ms|s|tok/s|GB/s|GB|MB|MiB|tokens))(?![A-Za-z0-9])")


def typed_figures(text: str) -> List[str]:
    """Measured-looking figures typed into a template source: numbers followed by a unit in the
    prose, after removing inserts, statements, comments and code spans, and also in the quoted
    strings of ``figure(...)`` inserts (a caption is prose too). Returns ``"line N: figure"`` items."""
    found = []
    for i, line in enumerate(_strip_template(text).splitlines(), 1):
        found += [f"line {i}: {m.group(1)}" for m in TYPED.finditer(line)]
    for m in re.finditer(r"\{\{\s*figure\(.*?\}\}", text, re.S):  # captions; lookup keys may hold numbers
        line = text.count("\n", 0, m.start()) + 1
        for q in re.findall(r"\"([^\"]*)\"|'([^']*)'", m.group(0)):
            found += [f"line {line}: {f.group(1)}" for f in TYPED.finditer(q[0] or q[1])]
    return found


def _strip_template(text: str) -> str:
    keep_lines = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    for pat in (r"\{#.*?#\}", r"\{%.*?%\}", r"\{\{.*?\}\}", r"`[^`\n]*`"):
        text = re.sub(pat, keep_lines, text, flags=re.S)
    return text


__all__ = ["Build", "Helpers", "Node", "PaperBuildError", "build", "render_markdown", "markdown_to_html",
           "write_pdf", "find_chromium", "figure_names", "typed_figures", "TEMPLATE", "DEFAULT_OUT"]
