"""``mlxlab reproduce`` and ``mlxlab paper``: the notebooks headless, and the paper built from the results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlxlab.notebook.campaign import __doc__ as campaign_doc
from mlxlab.notebook.reproduce import ReproduceError, parse_params, reproduce

REPRODUCE_HELP = """\
Run the numbered notebooks headless through papermill. Quick mode (--quick) writes to
data/results/PLATFORM/quick/ and build/figures/. A full run writes a new folder
data/results/PLATFORM/runs/TIME/ (results, figures/ and the executed notebooks exported to
notebooks/NAME.html; ignored by git). A full run with --save replaces the committed results:
data/results/PLATFORM/ (and data/results/sim-seed001/) and paper/figures/ (paper/figures/PLATFORM/
for a platform other than cpu), with the notebooks exported to data/results/PLATFORM/notebooks/.

On an NVIDIA GPU (the H200 runs) a notebook run needs, in one Python: mlx's CUDA build and
mlx-lm (pip install -e ".[cuda13,test]", or the bundle scripts/h200.sh unpacks from .mlxcuda/),
and the notebook stack of pyproject.toml: papermill, nbformat, nbconvert, ipykernel with a kernel
named python3 that inherits PYTHONPATH, altair and vl-convert-python (the figures). The bundle
holds mlx and mlx-lm only, and the H200 machine's Python has none of the notebook stack, so its
wheels travel in .whl/ (carried beside .mlxcuda; scripts/h200.sh installs them on arrival). Then,
from the project root on that machine:
  MLX_CUDA_USE_CUDNN_SDPA=0 bash scripts/h200.sh reproduce --platform h200 --save \\
      --param model_name=qwen2.5-coder-1.5b --param bits=4
(scripts/h200.sh sets PYTHONPATH and MLXLAB_PLATFORM=h200 and copies new results to $OUT). The
notebooks' defaults are CPU-sized (the tiny preset), hence the --param (04 takes
--param "models=[qwen2.5-0.5b, llama-3.2-1b, qwen2.5-coder-1.5b]" instead); cuDNN attention off keeps
its per-shape graph builds out of the timings, as in the H200 scheduling and validation runs.
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``reproduce`` and ``paper`` to the ``mlxlab`` command's subcommands."""
    rp = sub.add_parser("reproduce", help="run the notebooks headless through papermill",
                        description=REPRODUCE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("--quick", action="store_true", help="quick mode: small sizes, a minute or two each")
    rp.add_argument("--only", nargs="+", default=None, help="notebook numbers or name parts, e.g. 5 or admission")
    rp.add_argument("--platform", default=None,
                    help="results folder name, passed to every notebook (default: detected, e.g. cpu or h200)")
    rp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                    help="a notebook parameter (value read as YAML: 4, null, [1, 2]); repeatable")
    rp.add_argument("--no-html", action="store_true", help="after a full run, do not export the notebooks to HTML")
    rp.add_argument("--out-dir", type=Path, default=None, help="folder of the executed copies (default: build/notebooks/)")
    rp.add_argument("--out-name", default=None, help="file name of the executed copy (one notebook only)")
    rp.add_argument("--save", action="store_true",
                    help="a full run replaces the committed results and figures (see above); default: a new "
                         "run folder data/results/PLATFORM/runs/TIME/")
    rp.set_defaults(func=cli_reproduce)

    cp = sub.add_parser("campaign", help="a platform's full notebook runs split across device calls (plan, run, collect)",
                        description=campaign_doc,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = cp.add_subparsers(dest="campaign_cmd", required=True)
    c1 = csub.add_parser("plan", help="the entries, what the log says of each, and the pending ones split into calls")
    c2 = csub.add_parser("run", help="on the device: run pending entries while they fit the budget")
    c3 = csub.add_parser("collect", help="here: unpack a call's archive, render its figures, export HTML, merge the log")
    for c in (c1, c2, c3):
        c.add_argument("--platform", default="h200", help="the campaign's platform")
    c1.add_argument("--budget-s", type=float, default=480.0, help="seconds of notebooks per device call")
    c2.add_argument("--budget-s", type=float, required=True, help="stop starting entries past this many seconds")
    c2.add_argument("--call", required=True, help="a label for this device call, recorded with every entry it runs")
    c2.add_argument("--only", nargs="+", default=None, help="entry keys to run, e.g. 01@qwen2.5-0.5b 03@all")
    c2.add_argument("--out", type=Path, default=None, help="folder for the call's archive (default: $OUT if set)")
    c3.add_argument("archive", type=Path, help="the campaign.tar.gz a device call returned")
    for c in (c1, c2, c3):
        c.set_defaults(func=cli_campaign)

    ra = sub.add_parser("rescore", help="decide saved results' verdicts again with this code's rules, in place",
                        description="Decide the verdicts of saved results files again with this version's rules, "
                                    "from their stored measurements: the study is found from each file's name "
                                    "(mlxlab.studies.study_for), nothing is run, no measurement changes, and each "
                                    "file is marked rescored_by this commit. Every study rescores this one way.")
    ra.add_argument("files", nargs="+", type=Path, metavar="JSON")
    ra.add_argument("--figure", action="store_true",
                    help="also draw each file's study figure from it into paper/figures/ as NAME_PLATFORM (.svg, .png): "
                         "for results made where altair is missing, such as a GPU machine's tune files")
    ra.set_defaults(func=cli_rescore)

    rs = sub.add_parser("rescore-warmup", help="decide a saved notebook-04 result's verdicts again, in place",
                        description="Decide the verdicts of saved warmup_memory.json files (notebook 04) again with "
                                    "this version's rules, from their stored events and tables: nothing is run, no "
                                    "measurement changes, and each file is marked rescored_by this commit.")
    rs.add_argument("files", nargs="+", type=Path, metavar="JSON")
    rs.set_defaults(func=cli_rescore_warmup)

    pp = sub.add_parser("paper", help="build the paper (HTML and PDF) from data/results and data/claims",
                        description="Render paper/paper.md.j2 with every number inserted from data/results and "
                                    "data/claims into DIR/index.html (figures embedded) and DIR/paper.pdf (headless "
                                    "Chromium). A missing results file or key fails the build, naming the file and "
                                    "the key path. It reads the committed results only (never a runs/ or quick/ "
                                    "folder) and writes only DIR: no committed file changes.")
    pp.add_argument("--out", type=Path, default=None, help="output folder (default: build/paper/)")
    pp.add_argument("--no-pdf", action="store_true", help="write the HTML only")
    pp.add_argument("--readme", action="store_true",
                    help="instead of the paper: remake README.md's generated blocks (the headline tables: "
                         "serve_http, contention and tune; the first-hour line: first_hour) from the committed "
                         "results (mlxlab.paper.headline); this changes README.md")
    pp.set_defaults(func=cli_paper)


def cli_reproduce(args: argparse.Namespace) -> int:
    failure = None
    try:
        done = reproduce(quick=args.quick, only=args.only, platform=args.platform,
                         parameters=parse_params(args.param), export_html=not args.no_html, save=args.save,
                         out_dir=args.out_dir, out_name=args.out_name)
    except ReproduceError as exc:
        done, failure = exc.done, exc
    print(reproduce_summary(done))
    if failure is not None:
        print(f"mlxlab reproduce: {failure}", file=sys.stderr)
        return 1
    return 0


def reproduce_summary(done) -> str:
    """What a run found, per notebook: its seconds, the verdicts its results store, the executed
    copy to open; then the whole run's tally and where its results and figures went."""
    from collections import Counter

    from mlxlab.core.paths import ROOT
    from mlxlab.notebook.reproduce import tally_text

    def rel(p) -> str:
        p = Path(p)
        return str(p.relative_to(ROOT)) if p.is_absolute() and p.is_relative_to(ROOT) else str(p)

    if not done:
        return "no notebook finished"
    lines, total = [], Counter()
    for d in done:
        total.update(d.get("verdicts") or {})
        lines.append(f"{d['notebook']:34s} {d['seconds']:7.1f} s  {tally_text(d.get('verdicts') or {})}")
        if d.get("skipped_parameters"):
            lines.append(f"{'':34s} (has no parameter {', '.join(d['skipped_parameters'])}: ran on its default)")
    lines.append(f"{'all ' + str(len(done)) + ' notebooks':34s} {sum(d['seconds'] for d in done):7.1f} s  {tally_text(total)}")
    lines.append("Open the executed notebooks (make lab, or any Jupyter) to see each figure and verdict table:")
    lines += [f"  {rel(d['output'])}" + (f"  (HTML: {rel(d['html'])})" if d.get("html") else "") for d in done]
    lines.append(f"results -> {rel(done[0]['results'])}\nfigures -> {rel(done[0]['figures'])}")
    return "\n".join(lines)


def cli_campaign(args: argparse.Namespace) -> int:
    import os

    from mlxlab.notebook import campaign as cg

    try:
        if args.campaign_cmd == "plan":
            runs = cg.read_log(args.platform)
            last = {r["key"]: r for r in runs}
            for e in cg.entries(args.platform):
                r = last.get(e.key)
                seen = f"{r['status']} in {r['seconds']} s ({r['call']}, {str(r['commit'])[:9]})" if r else "never run"
                print(f"{e.key:28s} expects {cg.expected_s(e, runs):6.0f} s   {seen}")
            calls = cg.split_calls(cg.pending(args.platform, runs), runs, args.budget_s)
            for i, call in enumerate(calls, 1):
                print(f"call {i}: {' '.join(e.key for e in call)} "
                      f"({sum(cg.expected_s(e, runs) for e in call):.0f} s)")
            if not calls:
                print("nothing pending")
        elif args.campaign_cmd == "run":
            out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
            done = cg.run(args.platform, args.budget_s, call=args.call, only=args.only, out=out)
            print(f"campaign: {sum(r['status'] == 'ok' for r in done)} of {len(done)} entries ok"
                  + (f"; archive {out / cg.ARCHIVE}" if out and done else ""))
            return 0 if all(r["status"] == "ok" for r in done) else 1
        else:
            got = cg.collect(args.archive, args.platform)
            print(f"collected {len(got['files'])} files, rendered {len(got['figures'])} figures, "
                  f"exported {len(got['html'])} notebooks to HTML")
    except cg.CampaignError as exc:
        print(f"mlxlab campaign: {exc}", file=sys.stderr)
        return 1
    return 0


def rescore_files(files, study=None, what: str = "rescore", figure: bool = False) -> int:
    """Rescore each file in place with its study's rules (``study``: that one for all of them,
    else :func:`mlxlab.studies.study_for` each); one line per file. Exit 2 at the first file that
    is missing, of no study, or not the study's result, which is left as it was. ``figure``: also
    draw the study's figure from each rescored file into the paper's figures as NAME_PLATFORM."""
    from mlxlab.studies import study_for  # no MLX

    for p in files:
        try:
            st = study or study_for(p)
            doc = st.rescore(p)
        except (OSError, ValueError, KeyError) as e:
            print(f"mlxlab {what}: {e}", file=sys.stderr)
            return 2
        print(f"{p}: " + "; ".join(f"{v['claim']} {v['verdict']}" for v in doc["verdicts"]))
        if figure and _draw(st, p, doc) is None:
            print(f"mlxlab {what}: {st.name} draws no figure from a stored file", file=sys.stderr)
            return 2
    return 0


def _draw(study, path, doc):
    """``study``'s figure of ``doc`` written as paper/figures/STEM_PLATFORM.{svg,png}; the paths, or
    None for a study without a chart."""
    from mlxlab.core.results import platform_of
    from mlxlab.notebook.plots import save_figure
    from mlxlab.studies.sim_validation.charts import FIGURES

    plat = platform_of(path)
    chart = study.chart(doc, plat)
    if chart is None:
        return None
    paths = save_figure(chart, f"{Path(path).stem}_{plat}", FIGURES)
    for f in paths:
        print(f"figure {f}")
    return paths


def cli_rescore(args: argparse.Namespace) -> int:
    return rescore_files(args.files, figure=args.figure)


def cli_rescore_warmup(args: argparse.Namespace) -> int:
    from mlxlab.studies.warmup import STUDY

    return rescore_files(args.files, STUDY, "rescore-warmup")


def cli_paper(args: argparse.Namespace) -> int:
    if getattr(args, "readme", False):  # a caller's Namespace may predate the flag
        from mlxlab.paper.headline import update_readme

        print("README.md's generated blocks " + ("remade" if update_readme() else "already match the results"))
        return 0
    from mlxlab.paper.context import PaperDataError
    from mlxlab.paper.render import PaperBuildError, build  # Jinja2 and markdown-it load only here

    try:
        res = build(args.out, pdf=not args.no_pdf)
    except (PaperBuildError, PaperDataError) as exc:
        print(f"mlxlab paper: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {res.html} ({len(res.used)} results files, {len(res.figures)} figures)")
    measured = [r["label"] for r in res.stale if r["measured_by_older_code"]]
    decided = [r["label"] for r in res.stale if r["decided_by_older_rules"]]
    if measured or decided:
        print(f"older than their code (section 16 lists them): {len(measured)} files measured before their study's "
              f"code last changed, {len(decided)} decided before their rules last changed")
        for label in measured:
            print(f"  measured by older code: {label}")
    if res.pdf:
        print(f"wrote {res.pdf}")
    elif not args.no_pdf:  # no Chromium: the HTML stands; Chromium failing is an error
        print(f"mlxlab paper: no PDF: {res.pdf_error}", file=sys.stderr)
        return 0 if res.pdf_error.startswith("no chromium") else 1
    return 0
