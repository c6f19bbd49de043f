"""Run the numbered notebooks headless through papermill: ``mlxlab reproduce [--quick] [--only N]``.

Executed copies go to ``build/notebooks/`` (git-ignored). A failure names the notebook and the
cell (papermill's own error carries the cell index) and stops the run. After a full run each
executed notebook is also exported to HTML (nbconvert) beside the results it wrote,
``<results>/notebooks/<name>.html``, so a reader can see the run that made them.

Where the notebooks write (:func:`notebook_folders`): a quick run, ``data/results/<platform>/quick/``
and ``build/figures/``; a full run, one new folder ``data/results/<platform>/runs/<time>/`` for
every notebook (figures in its ``figures/``; :func:`mlxlab.core.results.run_folder`), all ignored
by git; only a full run with ``save`` replaces the committed ``data/results/<platform>/`` and
``paper/figures/``. ``platform`` is passed to every notebook (``nb.setup`` names the results
folder after it); a saved run for a platform other than ``cpu`` writes its figures to
``paper/figures/<platform>/`` so it does not overwrite the CPU figures the paper embeds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mlxlab.core.environment import platform_name
from mlxlab.core.paths import ROOT
from mlxlab.core.results import results_dir as committed_results, run_folder

NOTEBOOKS = ROOT / "notebooks"
BUILD = ROOT / "build" / "notebooks"


class ReproduceError(RuntimeError):
    """A run that cannot go on; ``done`` holds the entries of the notebooks that finished before."""

    def __init__(self, message: str, done: Optional[List[Dict]] = None):
        super().__init__(message)
        self.done = list(done or [])


#: the parameters ``reproduce`` itself passes to every notebook (``nb.setup``'s arguments)
OWN_PARAMETERS = ("quick", "platform", "results_dir", "figures_dir")


def notebook_parameters(nb: Path) -> List[str]:
    """The names in a notebook's ``parameters`` cell (papermill's own reading of it)."""
    from papermill.inspection import _infer_parameters
    from papermill.iorw import load_notebook_node

    book = load_notebook_node(str(nb))
    # a notebook that names no kernel is still a Python one here (papermill would ask for a name)
    return [p.name for p in _infer_parameters(book, name="python3", language="python")]


def split_parameters(nbs: Sequence[Path], given: Dict) -> Dict[Path, Dict]:
    """Each notebook's share of the user's ``--param`` values: the names its parameters cell has.
    A name that no notebook of the run has is refused with each notebook's parameters (papermill
    would only warn, run the notebook on its defaults and overwrite the last results); a name some
    notebooks lack goes to the others only (``04``'s ``models`` in place of ``model_name``)."""
    user = {k: v for k, v in given.items() if k not in OWN_PARAMETERS}
    names = {nb: notebook_parameters(nb) for nb in nbs}
    unknown = [k for k in user if not any(k in have for have in names.values())]
    if unknown:
        listing = "; ".join(f"{nb.name}: {', '.join(n for n in have if n not in OWN_PARAMETERS) or '(none)'}"
                            for nb, have in names.items())
        raise ReproduceError(f"--param {', '.join(unknown)}: no notebook of this run has such a parameter. "
                             f"Their parameters: {listing}")
    return {nb: {k: v for k, v in user.items() if k in names[nb]} for nb in nbs}


class _Rollback:
    """The files at the top of a notebook's output folders before it runs, copied aside, so a run
    that fails leaves them as they were (its new files removed, changed ones put back), and a run
    that succeeds says which files it wrote."""

    def __init__(self, folders: Sequence[Path]):
        import tempfile

        self.folders = [Path(f) for f in dict.fromkeys(folders)]
        self.keep = Path(tempfile.mkdtemp(prefix="mlxlab-reproduce-"))
        self.before: Dict[Path, Tuple[int, int]] = {}
        for i, folder in enumerate(self.folders):
            for f in self._files(folder):
                st = f.stat()
                self.before[f] = (st.st_mtime_ns, st.st_size)
                _copy(f, self.keep / str(i) / f.name)

    @staticmethod
    def _files(folder: Path) -> List[Path]:
        return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []

    def written(self) -> List[Path]:
        """Files new or changed since the snapshot."""
        out = []
        for folder in self.folders:
            for f in self._files(folder):
                st = f.stat()
                if self.before.get(f) != (st.st_mtime_ns, st.st_size):
                    out.append(f)
        return out

    def restore(self) -> None:
        for f in self.written():
            if f in self.before:
                _copy(self.keep / str(self.folders.index(f.parent)) / f.name, f)
            else:
                f.unlink()
        self.discard()

    def discard(self) -> None:
        import shutil

        shutil.rmtree(self.keep, ignore_errors=True)


def _copy(src: Path, dst: Path) -> None:
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def verdict_tally(files: Sequence[Path]) -> Dict[str, int]:
    """How many verdicts of each kind the results files (JSON) store."""
    import json
    from collections import Counter

    counts: Counter = Counter()
    for f in files:
        if f.suffix == ".json":
            try:
                counts.update(v.get("verdict", "?") for v in json.loads(f.read_text()).get("verdicts") or [])
            except (ValueError, AttributeError):
                continue
    return dict(counts)


def tally_text(counts: Dict[str, int]) -> str:
    """``{'reproduced': 2, 'not reproduced': 1}`` -> ``'2 reproduced, 1 not reproduced'``."""
    order = ("reproduced", "not reproduced", "inconclusive", "artifact", "not measurable on this backend", "not measured")
    keys = [k for k in order if k in counts] + sorted(k for k in counts if k not in order)
    return ", ".join(f"{counts[k]} {k}" for k in keys) or "no verdicts"


def notebook_folders(quick: bool, platform: Optional[str] = None, results_dir: Optional[str] = None,
                     figures_dir: Optional[str] = None) -> Tuple[Path, Path]:
    """A notebook's results and figures folders, as ``nb.setup`` resolves them: the given ones,
    else for a quick run ``data/results/<platform>/quick/`` and ``build/figures/``, for a full run
    a new run folder ``data/results/<platform>/runs/<time>/`` with its figures in ``figures/``
    (all ignored by git: a notebook run by hand in JupyterLab never replaces committed results).
    Only :func:`reproduce` with ``save`` passes the committed ``data/results/<platform>/`` and
    ``paper/figures/``."""
    plat = platform or platform_name()
    if not quick and not results_dir:
        res = run_folder(plat)
        return res, Path(figures_dir) if figures_dir else res / "figures"
    res = Path(results_dir) if results_dir else committed_results(plat) / "quick"
    fig = Path(figures_dir) if figures_dir else ROOT / "build/figures"
    return res, fig


def list_notebooks(only: Optional[Sequence[str]] = None, notebooks_dir: Optional[Path] = None) -> List[Path]:
    """The numbered notebooks in reading order; ``only`` keeps those whose number or name
    matches (``"5"``, ``"05"`` or ``"admission"``)."""
    nbs = sorted(p for p in Path(notebooks_dir or NOTEBOOKS).glob("[0-9][0-9]_*.ipynb"))
    if only:
        keep = []
        for p in nbs:
            num = p.name[:2]
            if any((o.isdigit() and int(o) == int(num)) or (not o.isdigit() and o in p.name) for o in only):
                keep.append(p)
        if not keep:
            raise ReproduceError(f"no notebook matches {list(only)}; have {[p.name for p in nbs]}")
        nbs = keep
    return nbs


def parse_params(items: Sequence[str]) -> Dict:
    """``["bits=4", "model_name=qwen2.5-coder-1.5b"]`` -> ``{"bits": 4, "model_name": "..."}``
    (each value read as YAML, as papermill's ``-y`` does)."""
    import yaml

    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ReproduceError(f"--param {item!r}: give KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def export_notebook_html(executed: Path, dest: Path, strip_widgets: bool = False) -> Path:
    """An executed notebook as one standalone HTML page (nbconvert's ``HTMLExporter``), with the
    checkout's own path written relative (a committed page names no machine's folders).
    ``strip_widgets`` drops the widget state and views (a device campaign's pages: the charts'
    widgets carry every chart's data and need a live kernel; its figures are rendered files);
    text, tables and verdicts stay."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    if strip_widgets:
        nb.metadata.pop("widgets", None)
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                o.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
    body, _ = HTMLExporter().from_notebook_node(nb)
    body = body.replace(str(ROOT) + "/", "").replace(str(ROOT), ".")  # paths of this checkout, relative
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(body, encoding="utf-8")
    return dest


def _failed_cell(exc) -> str:
    idx = getattr(exc, "cell_index", None)
    ename, evalue = getattr(exc, "ename", type(exc).__name__), getattr(exc, "evalue", str(exc))
    return f"cell {idx}" if idx is not None else "a cell", f"{ename}: {str(evalue)[:500]}"


def reproduce(*, quick: bool = True, only: Optional[Sequence[str]] = None, platform: Optional[str] = None,
              parameters: Optional[Dict] = None, out_dir: Optional[Path] = None, kernel_name: Optional[str] = None,
              progress: bool = True, notebooks_dir: Optional[Path] = None, export_html: bool = True,
              html_dir: Optional[Path] = None, save: bool = False, out_name: Optional[str] = None) -> List[Dict]:
    """Execute the notebooks; returns one dict per notebook (name, seconds, output path, the
    ``results`` and ``figures`` folders it wrote, and after a full run with ``export_html`` the
    HTML export, default folder ``<results>/notebooks/``). A full run writes one new run folder
    unless ``save`` (then the committed results and figures); ``save`` with ``quick`` is refused.
    ``parameters`` (notebook parameters) override the folders. ``out_name`` names the executed
    copy of a single notebook (a campaign runs one notebook per preset into one folder). Raises :class:`ReproduceError`
    naming the notebook and cell on the first failure."""
    import papermill as pm  # heavy (nbclient, jupyter): only a run needs it, not `mlxlab --help`

    from mlxlab.notebook.kernel import ensure_kernel

    if quick and save:
        raise ReproduceError("--save replaces the committed results, which a quick run must not: drop --quick or --save")
    kernel_name = kernel_name or ensure_kernel()  # the notebooks' kernel: fast BLAS preloaded

    out_dir = Path(out_dir) if out_dir else BUILD
    out_dir.mkdir(parents=True, exist_ok=True)
    nbs = list_notebooks(only, notebooks_dir)
    if out_name and len(nbs) != 1:
        raise ReproduceError(f"--out-name names one executed notebook, but {len(nbs)} match: narrow --only")
    params = {"quick": quick, **({"platform": platform} if platform else {})}
    plat = platform or platform_name()
    given = parameters or {}
    if not quick and save:  # the committed results; a platform other than cpu keeps the CPU figures the paper embeds
        params.update(results_dir=str(committed_results(plat)),
                      figures_dir=str(ROOT / "paper" / "figures" / ("" if plat == "cpu" else plat)))
    elif not quick and not save:  # one run folder for every notebook: nothing committed changes
        run = Path(given["results_dir"]) if given.get("results_dir") else run_folder(plat)
        params.update(results_dir=str(run), figures_dir=str(run / "figures"))
    per_notebook = split_parameters(nbs, given)
    params.update({k: v for k, v in given.items() if k in OWN_PARAMETERS})
    results, figures = notebook_folders(quick, plat, params.get("results_dir"), params.get("figures_dir"))
    if not quick and export_html and html_dir is None:  # beside the results the run writes
        html_dir = results / "notebooks"
    bar = None
    if progress:
        # optional plumbing: only a run with a progress bar needs it
        from tqdm.auto import tqdm

        bar = tqdm(nbs, desc="notebooks", unit="nb")
    done = []
    for nb in nbs:
        if bar is not None:
            bar.set_postfix_str(nb.name)
        out = out_dir / (out_name or nb.name)
        running = out.with_name(out.stem + ".running.ipynb")  # the last good copy stays until this one succeeds
        rollback = _Rollback([results, figures])
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(str(nb), str(running), parameters={**params, **per_notebook[nb]}, cwd=str(nb.parent),
                                kernel_name=kernel_name, progress_bar=False, log_output=False)
        except BaseException as exc:  # papermill raises PapermillExecutionError with the cell index
            rollback.restore()
            failed = out.with_name(out.stem + ".failed.ipynb")
            if running.exists():
                running.replace(failed)
            if not isinstance(exc, Exception):
                raise
            where, what = _failed_cell(exc)
            raise ReproduceError(f"{nb.name} failed in {where}: {what}\n(executed copy: {failed}; the last good "
                                 f"copy and results are kept)", done) from exc
        finally:
            if bar is not None:
                bar.update(1)
        running.replace(out)
        written = rollback.written()
        rollback.discard()
        entry = {"notebook": nb.name, "seconds": round(time.perf_counter() - t0, 1), "output": str(out),
                 "results": str(results), "figures": str(figures), "written": [str(p) for p in written],
                 "verdicts": verdict_tally(written),
                 "skipped_parameters": sorted(set(given) - set(OWN_PARAMETERS) - set(per_notebook[nb]))}
        if not quick and export_html:
            entry["html"] = str(export_notebook_html(out, Path(html_dir) / f"{nb.stem}.html"))
        done.append(entry)
    if bar is not None:
        bar.close()
    return done
