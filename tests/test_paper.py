"""The paper is built, not typed: it renders from data/results and data/claims (CI builds it),
every insert resolves or the build names the missing file and key path, every figure exists,
the scorecard shows the verdicts the results files store, and the template holds no typed
measured figure. `mlxlab reproduce` passes the platform on and exports full runs to HTML."""

import argparse
import html
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from mlxlab.core.claims import load_claims, verdict
from mlxlab.core.paths import ROOT
from mlxlab.paper.context import PaperDataError, ResultsStore, is_history
from mlxlab.paper.format import fmt, measured_text, span
from mlxlab.paper.provenance import provenance_rows, rerun_command
from mlxlab.paper.render import (TEMPLATE, PaperBuildError, build, figure_names, find_chromium, markdown_to_html,
                                 render_markdown, typed_figures, write_pdf)
from mlxlab.paper.scorecard import MAC_TITLE, NOT_RUN, scorecard_rows


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    return build(tmp_path_factory.mktemp("paper"), pdf=False)


# -- the real paper -------------------------------------------------------------------------

def test_the_paper_builds_to_one_standalone_html_page(paper):
    page = paper.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<h1>" in page and "<table>" in page
    assert 'src="figures/' not in page, "every figure is embedded as a data URI"
    assert page.count('src="data:image/png;base64,') == len(paper.figures) > 0
    assert (paper.html.parent / "paper.md").read_text() == paper.markdown
    assert json.loads((paper.html.parent / "inserts.json").read_text()) == paper.keys
    assert set(paper.keys) <= set(paper.used), "every file an insert reads is in the reproducibility section"


def test_every_figure_the_paper_references_exists(paper):
    names = figure_names(TEMPLATE.read_text())
    assert names, "the paper shows figures"
    missing = [n for n in names if not (ROOT / "paper" / "figures" / f"{n}.png").exists()]
    assert missing == []
    # plus one figure per GPU bench http file, named from the file in a loop (like(platform, glob)); named
    # history (serve_http_*_before_*) is counted in the text, not drawn
    gpu = [f for plat in ("h200", "h100") for f in (ROOT / "data" / "results" / plat).glob("serve_http_*.json")
           if not f.stem.endswith("_partial") and not is_history(f.name)]
    assert all((ROOT / "paper" / "figures" / f.parent.name / f"{f.stem}.png").exists() for f in gpu)
    # and one per GPU tune file (tune_MODEL_h200, tune_MODEL_h100: `mlxlab rescore --figure` draws them)
    tunes = [f for plat in ("h200", "h100") for f in (ROOT / "data" / "results" / plat).glob("tune_*.json")
             if not is_history(f.name)]
    assert all((ROOT / "paper" / "figures" / f"{f.stem}_{f.parent.name}.png").exists() for f in tunes)
    # and one per CPU tune with the chat asking more tokens (tune_chat_x8_cpu), the wide grid (tune_wide_cpu) or the
    # full one (tune_full_cpu), drawn in its paragraph's loop
    more = [f for pat in ("tune_*chat_x*.json", "tune*_wide.json", "tune*_full.json")
            for f in (ROOT / "data" / "results" / "cpu").glob(pat)
            if not is_history(f.name)]
    assert all((ROOT / "paper" / "figures" / f"{f.stem}_cpu.png").exists() for f in more)
    assert len(paper.figures) == len(set(names)) + len(gpu) + len(tunes) + len(more)


def test_the_paper_source_holds_no_typed_measured_figure():
    found = typed_figures(TEMPLATE.read_text())
    assert found == [], "typed figures in paper/paper.md.j2 (insert them from data/results):\n" + "\n".join(found)
    assert not (ROOT / "paper" / "paper.md").exists(), "the typed source is gone: the paper is built"


def test_the_typed_figure_check_finds_figures_outside_inserts():
    text = "a gain of 12% at 2,048 tokens, 1.08x faster, 49 ms\n{{ x | pct }} `3 ms` {# 5 s #}\n" \
           "{{ figure('f', 'took 3 s') }} Qwen2.5-0.5B in 4-bit, 3 steps"
    assert [f.split(": ")[1] for f in typed_figures(text)] == ["12%", "2,048 tokens", "1.08x", "49 ms", "3 s"]


def test_each_scorecard_verdict_is_the_one_its_results_file_stores(paper):
    rows = [r for r in paper.scorecard]
    assert {r["claim"] for r in rows} == set(load_claims()), "the full scorecard lists every claim"
    for row in rows:
        for plat, entries in row["cells"].items():
            for e in entries:
                doc = json.loads((ROOT / e["file"]).read_text())
                stored = [v for v in doc["verdicts"] if v["claim"] == row["claim"]]
                assert [v["verdict"] for v in stored] == [e["verdict"]], (row["claim"], e["file"])
                if e["source"] == "simulation":  # a simulated verdict shows in the simulated column only
                    assert plat.startswith("sim-"), (row["claim"], e["file"], plat)
                else:
                    assert e["file"].startswith(f"data/results/{plat}/")


def test_the_tally_counts_no_simulated_verdict_as_measured(paper):
    from mlxlab.paper.scorecard import PLATFORMS

    measured = [e for r in paper.scorecard for p in PLATFORMS for e in r["cells"][p]]
    assert measured and not [e for e in measured if e["source"] == "simulation"]
    moved = [r["claim"] for r in paper.scorecard if any(e["source"] == "simulation" and not e["file"].startswith(
        "data/results/sim-") for p, es in r["cells"].items() for e in es)]
    assert "s001-own-compute" in moved  # the disaggregation study's simulated scene, stored with a CPU run


def test_the_full_scorecard_shows_each_claims_mac_line(paper):
    section = next(x for x in paper.markdown.split("\n## ") if re.match(r"\d+\. Scorecard", x))  # whatever its number
    assert MAC_TITLE in section and "`on_a_mac`" in section, "the scorecard section names the column"
    page = paper.html.read_text()
    body = page[re.search(r'<h2 id="\d+-scorecard', page).start():]
    body = body[:body.index("<h2", 1)]
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())
    for cid, c in load_claims().items():
        row = next(x for x in section.splitlines() if x.startswith(f"| <code>{cid}</code>"))
        assert row.rstrip(" |").endswith(f"<small>{html.escape(c.on_a_mac).replace('|', '&#124;')}</small>"), cid
        assert " ".join(c.on_a_mac.split()) in text, f"{cid}: its on_a_mac line is not in the HTML scorecard"


def test_the_reproducibility_section_lists_every_file_used(paper):
    start = re.search(r"^## \d+\. Reproducibility$", paper.markdown, re.M).start()  # whatever its number
    section = paper.markdown[start:paper.markdown.index("## Appendix")]
    assert paper.used
    for label in paper.used:
        assert f"`{label.split('data/results/', 1)[1]}`" in section, label


# -- strict lookups, on a tiny template -----------------------------------------------------

def _store(tmp_path, files=None, figures=None) -> ResultsStore:
    """A data folder with the real claims and the given results files ({"cpu/x": doc})."""
    data = tmp_path / "data"
    shutil.copytree(ROOT / "data" / "claims", data / "claims")
    for spec, doc in (files or {}).items():
        p = data / "results" / f"{spec}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc))
    fig = tmp_path / "figures"
    fig.mkdir()
    for name in figures or ():
        (fig / f"{name}.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return ResultsStore(data, fig)


DOC = {"environment": {"platform": "cpu", "device": "cpu", "device_name": "test", "git_commit": "abc1234",
                       "git_dirty": False, "mlx": "0.32.4", "mlx_lm": "0.32.2", "blas": "openblas",
                       "mlx_env": {}, "argv": ["/x/bin/mlxlab", "bench", "engine"], "written_at": "2026-01-01"},
       "a": {"b": [{"side": "mlx-lm", "n": 480, "gain_pct": 1.97}, {"side": "mlxlab", "n": 480, "gain_pct": -2.0}]},
       "none_here": None}


def test_inserts_resolve_through_keys_records_and_filters(tmp_path):
    s = _store(tmp_path, {"cpu/x": DOC})
    md, _ = render_markdown(s, source='{{ r("cpu/x").a.b.one(side="mlx-lm").gain_pct | pct(1, sign=True) }} '
                                       '{{ r("cpu/x").a.b.col("gain_pct") | span("pct", 1) }} '
                                       '{{ r("cpu/x").a.b.where(n__ge=400) | length }}')
    assert md == "+2.0% -2.0 to 2.0% 2"
    assert list(s.used) == ["data/results/cpu/x.json"]
    assert s.keys == {"data/results/cpu/x.json": {"a.b[?side='mlx-lm'][0].gain_pct", "a.b[*].gain_pct[0]",
                                                  "a.b[*].gain_pct[1]"}}


def test_like_lists_a_platforms_matching_files_but_not_a_run_cut_short(tmp_path):
    s = _store(tmp_path, {"h200/serve_http_b": DOC, "h200/serve_http_a": DOC, "h200/serve_http_c_partial": DOC,
                          "h200/serve_overhead": DOC, "cpu/serve_http_d": DOC})
    assert s.like("h200", "serve_http_*") == ["h200/serve_http_a", "h200/serve_http_b"]
    assert s.like("h100", "serve_http_*") == []  # no such platform folder: nothing, not an error
    md, _ = render_markdown(s, source='{% for f in like("h200", "serve_http_*") %}{{ f }};{% endfor %}')
    assert md == "h200/serve_http_a;h200/serve_http_b;"


@pytest.mark.parametrize("source, message", [
    ('{{ r("cpu/x").a.nope }}', r"data/results/cpu/x.json: no key 'nope' at a \(has: b\)"),
    ('{{ r("cpu/x").a.b[0].gain }}', r"data/results/cpu/x.json: no key 'gain' at a.b\[0\]"),
    ('{{ r("cpu/x").a.b[5] }}', r"no item 5 in a.b, a list of 2"),
    ('{{ r("cpu/x").a.b.one(n=480) }}', r"2 records match at a.b\[\?n=480\], expected exactly one"),
    ('{{ r("cpu/x").none_here | ms }}', r"data/results/cpu/x.json: none_here is null"),
    ('{{ r("cpu/missing").a }}', r"data/results/cpu/missing.json: no such results file"),
    ('\n\n{{ no_such_name }}', r"line 3: UndefinedError: 'no_such_name' is undefined"),
    ('{{ verdict("cpu", "s000-step-prefill-480") }}', r"no results file in data/results/cpu/ holds a verdict for "
                                                      r"s000-step-prefill-480 \(the claims name prefill_step_size.json\)"),
    ('{{ claim("s000-step-prefil-480") }}', r"no claim 's000-step-prefil-480'.*did you mean s000-step-prefill-480"),
    ('{{ figure("nope", "a caption", source="cpu/x") }}', r"figures/nope.png: no such figure"),
    ('{{ figure("nope", "a caption") }}', r"figure\('nope'\): give source=, the results file"),
    ('{{ explorer("nope", "a caption", source="cpu/x") }}', r"explorer\('nope'\): no such explorer"),
])
def test_a_missing_file_key_or_figure_fails_the_build_naming_it(tmp_path, source, message):
    with pytest.raises(PaperBuildError, match=message):
        render_markdown(_store(tmp_path, {"cpu/x": DOC}), source=source)


def test_number_filters_use_fixed_decimals_and_one_unit():
    assert fmt(1.0807, "x") == "1.08x" and fmt(0.0429, "fpct", 1) == "4.3%" and fmt(-0.01, "pct") == "0%"
    assert fmt(0.04869, "ms") == "49 ms" and fmt(0.7123, "s", 2) == "0.71 s" and fmt(1086.1, "tok_s") == "1,086 tok/s"
    assert fmt(2048, "n") == "2,048" and fmt(659456000, "mib") == "629 MiB"
    assert span([17.1, 40.3, 30], "pct") == "17-40%" and span([-22, -7], "pct") == "-22 to -7%"
    assert span([1.001, 1.004], "x") == "1.00x"
    for bad in (None, "3", True, [1]):
        with pytest.raises(PaperDataError):
            fmt(bad, "x")
    assert measured_text({"gain_pct": 1.9691, "n": 3, "ok": True, "a": None, "b": 2}) == \
        "gain_pct 1.97; n 3; ok yes; a n/a; +1 more"


# -- the scorecard, against files that store verdicts -----------------------------------------

def _verdicts_doc(*records, experiment_doc=DOC):
    return {**experiment_doc, "verdicts": list(records)}


def test_the_scorecard_shows_stored_verdicts_and_not_run_elsewhere(tmp_path):
    v_cpu = verdict("s000-step-prefill-480", "artifact", measured={"gain_pct": 1.97}, rule="r", fairness="f")
    v_h200 = verdict("s000-step-prefill-480", "not reproduced", measured={"gain_pct": -3.5}, rule="r", fairness="f")
    v_var = verdict("mlx-slo-chat-itl", "not reproduced", measured={"itl_p99_x": 10.3}, rule="r", fairness="f")
    s = _store(tmp_path, {"cpu/prefill_step_size": _verdicts_doc(v_cpu),
                          "h200/prefill_step_size": _verdicts_doc(v_h200),
                          "cpu/scheduling_slo": _verdicts_doc(v_var),
                          "cpu/roofline": DOC})  # no verdicts: decides nothing
    rows = {r["claim"]: r for r in scorecard_rows(s)}
    assert len(rows) == len(load_claims())
    assert [e["verdict"] for e in rows["s000-step-prefill-480"]["cells"]["cpu"]] == ["artifact"]
    assert [e["verdict"] for e in rows["s000-step-prefill-480"]["cells"]["h200"]] == ["not reproduced"]
    assert rows["mlx-slo-chat-itl"]["cells"]["cpu"][0]["file"] == "data/results/cpu/scheduling_slo.json"
    assert rows["s001-decode-ceiling"]["cells"] == {"cpu": [], "h200": []}
    md, helpers = render_markdown(s, source='{{ scorecard("prefill_step_size") }}\n{{ tally() }}\n'
                                            '{{ verdict("cpu", "s000-step-prefill-480").measured.gain_pct | pct(1) }}')
    table = md.split("\n")
    line = next(x for x in table if "s000-step-prefill-480" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1].startswith("**artifact**<br>gain_pct 1.97") and cells[2].startswith("**not reproduced**")
    assert f"*{NOT_RUN}*" in next(x for x in table if "s000-step-decode" in x)
    assert "| artifact | 1 | 0 |" in md and md.rstrip().endswith("2.0%")
    assert [r["claim"] for r in helpers.scorecards] == [c for c, x in load_claims().items()
                                                         if "prefill_step_size" in x.experiments]


def test_a_verdict_its_repeats_could_flip_is_marked_in_the_scorecard(tmp_path):
    from mlxlab.paper.scorecard import FRAGILE
    v_cpu = verdict("s000-step-prefill-480", "not reproduced", measured={"gain_pct": 1.0, "within_noise": True},
                    rule="r", fairness="f")
    v_h200 = verdict("s000-step-prefill-480", "artifact", measured={"gain_pct": 1.0, "within_noise": False},
                     rule="r", fairness="f")
    s = _store(tmp_path, {"cpu/prefill_step_size": _verdicts_doc(v_cpu), "h200/prefill_step_size": _verdicts_doc(v_h200)})
    md, _ = render_markdown(s, source='{{ scorecard("prefill_step_size") }}')
    line = next(x for x in md.split("\n") if "s000-step-prefill-480" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert FRAGILE in cells[1] and FRAGILE not in cells[2]


def test_a_verdict_of_another_platform_or_claim_does_not_count(tmp_path):
    v = verdict("s000-step-decode", "reproduced", measured={"change_pct": 0.4}, rule="r", fairness="f")
    s = _store(tmp_path, {"h200/prefill_step_size": _verdicts_doc(v)})
    assert s.has_verdict("h200", "s000-step-decode") and not s.has_verdict("cpu", "s000-step-decode")
    with pytest.raises(PaperDataError, match="data/results/cpu/ holds a verdict for s000-step-decode"):
        s.verdict("cpu", "s000-step-decode")
    assert s.verdict("h200", "s000-step-decode").verdict == "reproduced"


def test_a_verdict_line_names_another_platform_only_where_it_decides_the_claim(tmp_path):
    """CPU and H200 are always named (*not run* where they decide nothing); an H100 folder only in
    the lines of the claims its files decide."""
    v = verdict("s000-step-decode", "reproduced", measured={"change_pct": 0.4}, rule="r", fairness="f")
    s = _store(tmp_path, {"h100/prefill_step_size": _verdicts_doc(v), "cpu/roofline": DOC})
    md, _ = render_markdown(s, source='{{ platforms_for("s000-step-decode") | join(",") }};'
                                       '{{ platforms_for("s000-step-prefill-480") | join(",") }};'
                                       '{{ platforms() | join(",") }}')
    assert md == "cpu,h200,h100;cpu,h200;cpu,h200,h100"


# -- provenance ------------------------------------------------------------------------------

def test_provenance_names_the_machine_commit_and_command(tmp_path):
    # an old file: no stored command line at all (the key is missing), so the command is inferred
    old_env = {k: v for k, v in DOC["environment"].items() if k != "argv"}
    gpu = {**DOC, "environment": {**old_env, "device": "gpu", "git_commit": None}}
    s = _store(tmp_path, {"cpu/bench_engine": DOC, "cpu/prefill_step_size": DOC, "h200/scheduling_slo": gpu,
                          "h200/chunk_probe": gpu})
    for spec in ("cpu/bench_engine", "cpu/prefill_step_size", "h200/scheduling_slo", "h200/chunk_probe"):
        s.r(spec)
    rows = {r["file"].split("results/")[1]: r for r in provenance_rows(s)}
    assert rows["cpu/bench_engine.json"]["command"] == "mlxlab bench engine"
    assert rows["cpu/bench_engine.json"]["commit"] == "abc1234" and rows["cpu/bench_engine.json"]["dirty"] == "no"
    assert rows["cpu/prefill_step_size.json"]["command"] == "mlxlab bench engine"  # the stored argv wins
    assert rows["h200/scheduling_slo.json"]["command"].startswith(
        "bash scripts/h200.sh bench scheduling --name scheduling_slo (inferred")
    assert rows["h200/scheduling_slo.json"]["commit"] == "not recorded"
    assert "python3 -m probes.chunk_probe" in rows["h200/chunk_probe.json"]["command"]
    nb_doc = {**DOC, "environment": {**DOC["environment"], "argv": None}}  # a notebook kernel stores none
    assert rerun_command(s, Path("data/results/cpu/prefill_step_size.json"), nb_doc) == "mlxlab reproduce --only 01"


def test_provenance_gives_each_files_repeats_and_lists_those_under_five(tmp_path):
    from mlxlab.paper.provenance import provenance_markdown, repeats_of
    five = {**DOC, "parameters": {"repeats": 5, "ttft_repeats": 7}}
    three = {**DOC, "config": {"repeats": 3}}
    cli = {**DOC, "environment": {**DOC["environment"], "argv": ["mlxlab", "bench", "x", "--repeats", "2"]}}
    assert repeats_of(five) == {"repeats": 5, "ttft_repeats": 7} and repeats_of(cli) == {"repeats": 2}
    s = _store(tmp_path, {"cpu/a": five, "cpu/b": three, "cpu/c": DOC})
    for spec in ("cpu/a", "cpu/b", "cpu/c"):
        s.r(spec)
    rows = {r["file"].split("results/")[1]: r for r in provenance_rows(s)}
    assert rows["cpu/a.json"]["repeats"] == "5; ttft 7"
    assert rows["cpu/b.json"]["repeats"] == "3 (under 5)" and rows["cpu/c.json"]["repeats"] == "not stored"
    md = provenance_markdown(list(rows.values()))
    assert "1 of these 3 files ran some setting fewer than 5 times" in md and "`cpu/b.json`." in md


def test_provenance_lists_named_history_under_five_apart_from_the_current_files(tmp_path):
    from mlxlab.paper.provenance import provenance_markdown
    three = {**DOC, "config": {"repeats": 3}}
    s = _store(tmp_path, {"cpu/b": three, "cpu/b_before_fix": three})
    for spec in ("cpu/b", "cpu/b_before_fix"):
        s.r(spec)
    md = provenance_markdown(provenance_rows(s))
    few = next(line for line in md.splitlines() if "fewer than 5 times" in line)
    history = next(line for line in md.splitlines() if line.startswith("Named history"))
    assert few.startswith("1 of these 2 files") and few.endswith("`cpu/b.json`.") and "b_before_fix" not in few
    assert history.endswith("`cpu/b_before_fix.json`.")


# -- HTML and PDF ----------------------------------------------------------------------------

def test_markdown_becomes_html_with_tables_and_embedded_figures(tmp_path):
    png = tmp_path / "f.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    page = markdown_to_html('# T\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<figure><img src="figures/f.png"></figure>\n',
                            {"figures/f.png": png})
    assert "<table>" in page and "<td>1</td>" in page and "data:image/png;base64," in page and "<title>T</title>" in page


@pytest.mark.skipif(find_chromium() is None, reason="no chromium on PATH")
def test_the_paper_opens_with_its_findings_from_the_scorecard(paper):
    """The first section after the title is the findings: counts per platform and the claims that
    held on both measured platforms or on neither, each as the scorecard has it."""
    headings = re.findall(r"^## (.+)$", paper.markdown, re.M)
    assert headings[0] == "Findings" and headings[1].startswith("1. ")
    first = paper.markdown.split("## 1. ")[0]
    rows = {r["claim"]: r for r in paper.scorecard}
    held = re.findall(r"\(`(s00[01]-[a-z0-9-]+)`\)", first.split("**What held on neither.**")[0])
    assert held, "the findings name what held"
    for cid in held:
        assert {rows[cid]["cells"][p][0]["verdict"] for p in ("cpu", "h200")} == {"reproduced"}, cid


def test_each_figure_names_the_results_file_and_the_command_that_drew_it(paper):
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", paper.markdown, re.S)
    assert len(captions) >= len(paper.figures) > 0
    for c in captions:
        assert "Drawn from" in c and "data/results/" in c and ("mlxlab " in c or "python" in c or "h200.sh" in c), c


def test_the_html_embeds_each_explorer_as_a_self_contained_page(paper):
    from mlxlab.paper.render import EXPLORERS

    page = paper.html.read_text()
    for name in EXPLORERS:
        assert f'src="explorers/{name}.html"' in page
        explorer = (paper.html.parent / "explorers" / f"{name}.html").read_text()
        assert "vegaEmbed" in explorer and "cdn.jsdelivr" not in explorer, "inlined: it opens offline"


def test_the_build_lists_results_older_than_their_code(paper):
    section = paper.markdown.split("**Results older than their code.**")[1]
    measured = [r["label"] for r in paper.stale if r["measured_by_older_code"]]
    assert f"{len(measured)} were measured before their study's code last changed" in section
    assert all(f"`{label}`" in section for label in measured)


def test_the_paper_prints_to_pdf(paper):
    pdf = paper.html.parent / "paper.pdf"
    assert write_pdf(paper.html, pdf) is None
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 100_000


def test_mlxlab_paper_writes_the_html_and_says_why_there_is_no_pdf(tmp_path, monkeypatch, capsys):
    from mlxlab.cli.tools import cli_paper
    from mlxlab.paper import render

    assert cli_paper(argparse.Namespace(out=tmp_path / "a", no_pdf=True)) == 0
    assert (tmp_path / "a" / "index.html").exists() and "wrote" in capsys.readouterr().out
    monkeypatch.setattr(render, "find_chromium", lambda: None)
    assert cli_paper(argparse.Namespace(out=tmp_path / "b", no_pdf=False)) == 0
    assert (tmp_path / "b" / "index.html").exists() and not (tmp_path / "b" / "paper.pdf").exists()
    assert "no PDF: no chromium on PATH" in capsys.readouterr().err


# -- mlxlab reproduce -------------------------------------------------------------------------

def test_reproduce_passes_the_platform_and_exports_a_full_run_to_html(tmp_path, monkeypatch):
    import papermill

    from mlxlab.notebook import reproduce as R

    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("quick = True\nbits = 16",
                                                                     metadata={"tags": ["parameters"]}),
                                           nbformat.v4.new_markdown_cell(f"results in {ROOT}/data/results")])
    nbformat.write(book, str(tmp_path / "01_x.ipynb"))
    seen = {}

    def fake_execute(src, out, parameters=None, **kw):
        seen.update(parameters)
        shutil.copy(src, out)

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    done = R.reproduce(quick=False, platform="h200", notebooks_dir=tmp_path, out_dir=tmp_path / "out",
                       progress=False, parameters={"bits": 4, "results_dir": str(tmp_path / "res")}, save=True)
    assert seen["platform"] == "h200" and seen["quick"] is False and seen["bits"] == 4
    assert seen["figures_dir"] == str(ROOT / "paper" / "figures" / "h200")
    page = Path(done[0]["html"])
    assert page == tmp_path / "res" / "notebooks" / "01_x.html"
    assert "results in data/results" in page.read_text() and str(ROOT) not in page.read_text()
    seen.clear()
    done = R.reproduce(quick=True, platform="h200", notebooks_dir=tmp_path, out_dir=tmp_path / "out", progress=False)
    assert "figures_dir" not in seen and "html" not in done[0]


def test_reproduce_params_are_read_as_yaml():
    from mlxlab.notebook.reproduce import ReproduceError, parse_params

    assert parse_params(["bits=4", "model_name=qwen2.5-coder-1.5b", "models=[a, b]", "x=null"]) == \
        {"bits": 4, "model_name": "qwen2.5-coder-1.5b", "models": ["a", "b"], "x": None}
    with pytest.raises(ReproduceError, match="KEY=VALUE"):
        parse_params(["bits"])


def test_verdicts_by_file_lists_each_deciding_file_but_not_named_history(tmp_path):
    # the paper's stored() shows each file's verdict where the files disagree; a *_before_* file is history
    claim = "mlx-serve-vs-mlxlm-throughput"
    mk = lambda v: _verdicts_doc(verdict(claim, v, measured={}, rule="r", fairness="f"))  # noqa: E731
    s = _store(tmp_path, {"h100/serve_http_a": mk("not measured"), "h100/serve_http_b": mk("reproduced"),
                          "h100/serve_http_b_before_fix": mk("not reproduced")})
    got = [(name, v.verdict) for name, v in s.verdicts_by_file("h100", claim)]
    assert sorted(got) == [("serve_http_a", "not measured"), ("serve_http_b", "reproduced")]
    assert "data/results/h100/serve_http_b.json" in s.used
    assert s.verdicts_by_file("h200", claim) == []


def test_named_history_is_told_apart_by_name_also_when_a_model_name_has_a_dot(tmp_path):
    """``*_before_*`` files are history (kept to show what a change moved): the GPU http table and the
    README headline leave them out, while a model name's dot (qwen2.5) is no file suffix."""
    assert is_history("h100/serve_http_qwen2.5-0.5b_before_handout_fix")
    assert is_history("serve_http_qwen2.5-0.5b_before_handout_fix.json")
    assert not is_history("h100/serve_http_qwen2.5-0.5b") and not is_history("contention.json")
    s = _store(tmp_path, {"h100/serve_http_qwen2.5-0.5b": DOC, "h100/serve_http_qwen2.5-0.5b_before_fix": DOC})
    md, _ = render_markdown(s, source='{% for f in like("h100", "serve_http_*") | reject("history") %}{{ f }};{% endfor %}')
    assert md == "h100/serve_http_qwen2.5-0.5b;"


def test_a_named_history_file_deciding_a_claim_too_is_marked_as_history_in_its_cell():
    """The scorecard's "also" line names the other files that decide a claim; one kept as named
    history (``*_before_*``) says so, so a reader does not take it for current evidence."""
    from mlxlab.paper.scorecard import _cell

    entries = [{"file": f"data/results/h100/{n}.json", "verdict": v, "measured": {"tau": 0.6}}
               for n, v in (("tune_llama-3.2-1b", "not reproduced"), ("tune_qwen2.5-coder-1.5b", "not reproduced"),
                            ("tune_llama-3.2-1b_before_unpacked", "reproduced"))]
    also = _cell(entries).split("also: ")[1]
    assert "tune_llama-3.2-1b_before_unpacked.json reproduced (named history)" in also
    assert "tune_qwen2.5-coder-1.5b.json not reproduced;" in also and also.count("named history") == 1


def test_a_scorecard_cell_leads_with_a_current_decided_verdict_not_history_or_a_run_not_yet_whole(tmp_path):
    """Among a platform's files deciding one claim, ``deciding`` (and so a scorecard cell's first
    entry and ``stored()``) puts a decided verdict of a current file first, then a "not measured" one
    (a sweep not yet whole), then named history, whatever their names' order."""
    claim = "mlx-serve-vs-mlxlm-throughput"
    mk = lambda v: _verdicts_doc(verdict(claim, v, measured={}, rule="r", fairness="f"))  # noqa: E731
    s = _store(tmp_path, {"h100/serve_http_a": mk("not measured"), "h100/serve_http_a_before_fix": mk("reproduced"),
                          "h100/serve_http_b": mk("not reproduced")})
    order = [p.stem for p, _ in s.deciding("h100", claim)]
    assert order == ["serve_http_b", "serve_http_a", "serve_http_a_before_fix"]
    assert s.verdict("h100", claim).verdict == "not reproduced"


def test_the_readme_tuner_table_marks_a_trace_whose_tenant_asks_more_tokens(tmp_path):
    """A tune run with ``--output-scale`` replays the same trace file with a tenant asking more
    tokens: its headline row says so, or it reads as a second run of the plain trace."""
    from mlxlab.paper.headline import tune_markdown

    doc = {"trace": {"path": "t.jsonl", "requests": 31}, "slos": ["chat.itl_p99<=3x"], "choice": {"label": "slo-512",
           "meets": True}, "objective": "batch.ttft_p50", "parameters": {"model": "small"}}
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "tune.json").write_text(json.dumps(doc))
    (tmp_path / "cpu" / "tune_chat_x8.json").write_text(json.dumps(
        {**doc, "parameters": {"model": "small", "output_scale": {"chat": 8.0}}}))
    rows = [r for r in tune_markdown(tmp_path).splitlines() if r.startswith("| cpu")]
    assert [r.split(" | ")[2] for r in rows] == ["`t.jsonl` (31)", "`t.jsonl` (31; chat asks x8)"]


def test_the_readme_tuner_table_names_a_tune_whose_sweep_is_not_whole_without_a_row(tmp_path):
    """A GPU tune's sweep runs over several calls: until it is whole its regret is not measured, and the
    headline names the file instead of tabling a row with no regret."""
    from mlxlab.paper.headline import tune_markdown

    doc = {"trace": {"path": "t.jsonl", "requests": 31}, "slos": ["chat.itl_p99<=3x"], "choice": {"label": "slo-512",
           "meets": True}, "objective": "batch.ttft_p50", "parameters": {"model": "small"},
           "verdicts": [{"claim": "mlx-tune-regret", "verdict": "reproduced", "measured": {"regret": 0.01}}]}
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "tune.json").write_text(json.dumps(doc))
    (tmp_path / "cpu" / "tune_steady.json").write_text(json.dumps(
        {**doc, "verdicts": [{"claim": "mlx-tune-regret", "verdict": "not measured", "measured": {}}]}))
    md = tune_markdown(tmp_path)
    rows = [r for r in md.splitlines() if r.startswith("| cpu")]
    assert len(rows) == 1 and rows[0].endswith("| reproduced |")
    assert "(sweep not yet whole, so no regret: `" in md and md.splitlines()[0].endswith("cpu/tune_steady.json`).")
