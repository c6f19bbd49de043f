"""A real-browser test: JupyterLab serves the admission-gate notebook, headless Chromium opens it,
runs all cells from the Run menu, moves the explorer's chunk slider with the keyboard and
checks that the chat timeline under it was drawn again with different content.

Needs Debian's ``chromium`` (at /usr/bin/chromium) and the ``playwright`` Python package (its
driver only: no browser is downloaded); skipped when either is missing. CI installs both.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from mlxlab.core.environment import fast_blas_env
from mlxlab.notebook.reproduce import NOTEBOOKS

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTEBOOK = NOTEBOOKS / "05_admission_gate.ipynb"
TOKEN = "mlxlab-browser-test"
BUDGET_S = 360          # the whole test, JupyterLab start to last assertion
RUN_ALL_S = 240         # quick mode takes ~20-40 s here; a slow CI machine gets room


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook_copy(tmp: Path) -> Path:
    """The notebook with its parameters cell sending results and figures into ``tmp`` (quick
    mode, the default, is kept)."""
    book = nbformat.read(str(NOTEBOOK), as_version=4)
    params = next(c for c in book.cells if "parameters" in c.metadata.get("tags", []))
    assert "quick = True" in params.source
    params.source += (f"\nresults_dir = {str(tmp / 'results')!r}"
                      f"\nfigures_dir = {str(tmp / 'figures')!r}\n")
    path = tmp / "work" / NOTEBOOK.name
    path.parent.mkdir(parents=True)
    nbformat.write(book, str(path))
    return path


def _lab_settings(tmp: Path) -> Path:
    """User settings for a predictable page: every cell stays in the DOM (no windowing), and no
    news or update prompts."""
    d = tmp / "lab-settings"
    (d / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (d / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))
    (d / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (d / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return d


def _die_with_parent() -> None:
    """In the JupyterLab child (Linux): get SIGTERM if the test process dies without reaching its
    ``finally`` (pytest killed by a CI timeout), so no server outlives the run."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 15)   # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):
        pass


def _wait_for_server(proc: subprocess.Popen, url: str, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}; log: {log}\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer at {url}; log: {log}\n{log.read_text()[-3000:]}")


# JS run in the page: what each chart under the explorer currently shows (the SVG markup with
# the svg renderer, the pixels of the canvas with the default canvas renderer).
CHART_STATE = """els => els.map(el => {
    const svg = el.querySelector('svg.marks');
    if (svg) return svg.outerHTML;
    const c = el.querySelector('canvas');
    return c ? c.toDataURL() : '';
})"""


def test_chunk_slider_redraws_the_chart_in_jupyterlab(tmp_path, monkeypatch):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                                   "(pip install playwright; its browser download is not needed)")
    start = time.monotonic()
    deadline = start + BUDGET_S

    def ms(cap_s: float) -> float:
        """A Playwright timeout: ``cap_s`` seconds, or what is left of the test's budget."""
        return max(1.0, min(cap_s, deadline - time.monotonic())) * 1000
    nb_path = _notebook_copy(tmp_path)
    port = _free_port()
    env = fast_blas_env()   # the kernel runs the notebook with OpenBLAS, as `make test` does
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for var, sub in (("JUPYTER_CONFIG_DIR", "jupyter-config"), ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
                     ("JUPYTER_DATA_DIR", "jupyter-data"),
                     ("IPYTHONDIR", "ipython")):
        env[var] = str(tmp_path / sub)
    log = tmp_path / "jupyterlab.log"
    shot = tmp_path / "failure.png"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
           f"--ServerApp.root_dir={nb_path.parent}", f"--LabApp.user_settings_dir={_lab_settings(tmp_path)}",
           f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")   # CI containers run as root
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    # ...but Chromium (and Playwright's node driver) must not inherit a preloaded OpenBLAS: with
    # it the zygote never answers and the browser exits ("GPU process isn't usable")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    page = None
    try:
        _wait_for_server(proc, f"http://127.0.0.1:{port}/api/status?token={TOKEN}", log, start + 90)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(ms(60))
                page.goto(f"http://127.0.0.1:{port}/lab/tree/{nb_path.name}?token={TOKEN}", timeout=ms(60))

                # the notebook is open and its kernel is up
                page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=ms(120))
                page.locator("#jp-main-statusbar", has_text=re.compile(r"\| Idle")).wait_for(timeout=ms(120))
                prompts = page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt")

                # Run > Run All Cells; a click while the kernel is still connecting is dropped
                # (the status bar can say Idle a moment early), so click again until cells queue
                for _ in range(4):
                    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(timeout=ms(30))
                    page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel",
                                 has_text=re.compile(r"^Run All Cells$")).click(timeout=ms(30))
                    try:
                        page.wait_for_function(
                            "() => [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')]"
                            ".some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))", timeout=ms(10))
                        break
                    except sync_api.TimeoutError:
                        page.keyboard.press("Escape")
                else:
                    raise AssertionError(f"Run All Cells did not start the cells: {prompts.all_inner_texts()}")

                # every code cell ran (a number in its prompt) and nothing still runs
                page.wait_for_function(
                    """() => {
                        const ps = [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')];
                        return ps.length > 0 && ps.every(p => /\\[\\d+\\]/.test(p.textContent));
                    }""", timeout=ms(RUN_ALL_S), polling=1000)
                errors = page.locator(".jp-OutputArea-output", has_text="Traceback (most recent call last)")
                assert errors.count() == 0, f"a cell failed: {errors.first.inner_text()[:2000]}"

                # the explorer: the "chunk" slider (beside policy and workers) and the chat timeline
                slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text=re.compile(r"^chunk$")))
                slider.wait_for(state="visible", timeout=ms(60))
                box = slider.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
                charts = box.locator(".vega-embed")
                charts.first.locator("svg.marks, canvas").first.wait_for(state="attached", timeout=ms(60))
                assert charts.count() == 1, "the explorer shows the chat timeline of the chosen run"
                readout = slider.locator(".widget-readout")
                before_value = readout.inner_text().strip()
                before = charts.evaluate_all(CHART_STATE)
                assert all(before), "the chart drew something"
                box.scroll_into_view_if_needed()
                page.screenshot(path=str(tmp_path / "before.png"), full_page=False)

                # move the slider one step with the keyboard (left if it already sits at the right end)
                handle = slider.locator(".noUi-handle").first
                handle.focus(timeout=ms(30))
                for key in ("ArrowRight", "ArrowLeft"):
                    page.keyboard.press(key)
                    try:
                        page.wait_for_function("([el, v]) => el.textContent.trim() !== v",
                                               arg=[readout.element_handle(), before_value], timeout=ms(5))
                        break
                    except Exception:  # noqa: BLE001 - at the end of its range: try the other way
                        continue
                after_value = readout.inner_text().strip()
                # the kernel rebuilds the chart; wait until it redrew with something new
                page.wait_for_function(
                    f"""([els, before]) => {{
                        const now = ({CHART_STATE})(els);
                        return now.every((s, i) => s && s !== before[i]);
                    }}""", arg=[charts.element_handles(), before], timeout=ms(60), polling=500)
                page.wait_for_timeout(500)  # let the redraw settle before the picture
                after = charts.evaluate_all(CHART_STATE)
                box.scroll_into_view_if_needed()
                page.screenshot(path=str(tmp_path / "after.png"), full_page=False)

                assert after_value != before_value
                assert after[0] != before[0], "the chart was redrawn differently"
                if after[0].startswith("<svg"):   # svg renderer (what renders here): the title names the run
                    assert f"/c{before_value}/" in before[0]
                    assert f"/c{after_value}/" in after[0]
            except Exception as e:
                if page is not None:
                    try:
                        page.screenshot(path=str(shot), full_page=True)
                    except Exception:  # noqa: BLE001 - the original failure matters more
                        pass
                raise AssertionError(f"{type(e).__name__}: {e}\nscreenshot: {shot}\njupyter log: {log}") from e
            finally:
                browser.close()
    finally:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def test_the_tune_explorer_slider_moves_the_choice_in_static_html(tmp_path, monkeypatch):
    """The tune explorer saved as one HTML file (no kernel, no network): moving its slider in
    headless Chromium moves the ringed choice to another setting of the precomputed grid."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    from mlxlab.notebook.plots import save_explorer
    from mlxlab.studies.tune.charts import explorer_chart

    grid = [{"label": f"interleave-{c}", "policy": "interleave", "objective_s": 50.0 / c, "slo_ratio": c / 512,
             "checks": [{"slo": "chat.itl_p99<=8x", "figure_s": c / 1000, "bound_s": 0.3, "ratio": c / 300}]}
            for c in (64, 128, 256, 512, 1024)]
    page_path = save_explorer(explorer_chart({"grid": grid, "objective": "batch.ttft_p50"}), tmp_path / "x.html")
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # as above: Chromium must not inherit OpenBLAS

    def chosen(page) -> str:  # the label beside the ring: the one text naming a setting
        return page.evaluate("""() => [...document.querySelectorAll('svg text')].map(t => t.textContent)
            .filter(t => t.startsWith('interleave-')).join('|')""")

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(page_path.as_uri())
            page.locator("svg text").first.wait_for(timeout=30_000)
            assert chosen(page) == "interleave-256"  # the bound starts at the SLO's 300 ms
            slider = page.locator("input[type=range]")
            slider.evaluate("(el) => { el.value = el.max; el.dispatchEvent(new Event('input', {bubbles: true})); }")
            page.wait_for_function("() => [...document.querySelectorAll('svg text')].some(t => "
                                   "t.textContent === 'interleave-1024')", timeout=10_000)
            assert chosen(page) == "interleave-1024"  # every setting under the bound: the fastest objective
        finally:
            browser.close()


def test_the_papers_chunk_explorer_moves_in_its_static_html(tmp_path, monkeypatch):
    """The paper's HTML embeds the seed-001 chunk-size explorer drawn from the committed results
    (explorers/chunk_explorer.html, no kernel, no network): choosing another chunk size in its menu
    in headless Chromium changes the figures listed for it, to that size's measured ones."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    from mlxlab.paper.render import build

    res = build(tmp_path / "paper", pdf=False)
    assert 'src="explorers/chunk_explorer.html"' in res.html.read_text()
    page_path = tmp_path / "paper" / "explorers" / "chunk_explorer.html"
    doc = json.loads((Path(__file__).resolve().parent.parent / "data/results/cpu/admission_gate.json").read_text())
    cells = [r for r in doc["table"] if r.get("kind") == "cell" and r["policy"] == "interleave" and r["workers"] == 1
             and r.get("ttft_over_floor_pct") is not None and r.get("chat_itl_p99_pooled_s") is not None]
    target = max(cells, key=lambda r: r["chunk_size"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # Chromium must not inherit OpenBLAS

    def listed(page) -> list:
        return page.evaluate("""() => [...document.querySelectorAll('svg text')].map(t => t.textContent)
            .filter(t => t.startsWith('interleave: '))""")

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(page_path.as_uri())
            page.locator("svg text").first.wait_for(timeout=30_000)
            before = listed(page)
            page.locator("select").select_option(str(target["chunk_size"]))
            want = f"interleave: {target['ttft_over_floor_pct']:.0f}"
            page.wait_for_function(f"() => [...document.querySelectorAll('svg text')].some(t => "
                                   f"t.textContent === {json.dumps(want)})", timeout=10_000)
            assert listed(page) != before and want in listed(page)
        finally:
            browser.close()
