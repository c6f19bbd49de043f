"""The scorecard: every claim of ``data/claims`` against the verdicts the results files store.

One row per claim; one column per platform (CPU and H200 always, any other results folder that
holds a verdict after them), each cell the stored verdict and what was measured, or *not run*
where no results file of that platform decides the claim; and the published figure, which for
the case studies is the authors' Apple run (for mlxlab's own claims, the target it set); and
the claims file's ``on_a_mac`` line, what of these results should carry over to an Apple-silicon
Mac on Metal and why (a judgement, not a measurement). The rows are built as data
(:func:`scorecard_rows`) and rendered from it (:func:`scorecard_markdown`), so a test can check
each cell against its file.
"""

from __future__ import annotations

import html
from typing import Dict, List, Optional, Sequence

from mlxlab.paper.context import ResultsStore, is_history
from mlxlab.paper.format import measured_text

#: the platforms every scorecard shows, in this order, with their column titles
PLATFORMS = {"cpu": "CPU (measured)", "h200": "H200 (measured)"}
#: results folders of simulations (``sim-seed001``): their columns, and every verdict whose record
#: says ``source: simulation`` wherever it is stored, never count as measured reproductions
SIMULATED = "sim-"
SIM_TITLE = "Simulated (not a measurement)"
NOT_RUN = "not run"
#: the title of the last column: the claims file's on_a_mac line
MAC_TITLE = "On a Mac (expected, from these results)"
STUDY_TITLES = {"seed-000": "Case study seed 000: one request at a time (Apple M4 Pro)",
                "seed-001": "Case study seed 001: multi-tenant serving (Apple M4 Max)",
                "mlxlab": "mlxlab's own targets"}


def columns(store: ResultsStore) -> List[str]:
    """CPU, H200, then every other platform folder whose files hold at least one verdict."""
    extra = [p for p in store.platforms() if p not in PLATFORMS and store.stored_verdicts(p)]
    return list(PLATFORMS) + extra


def platforms_for(store: ResultsStore, claim_id: str) -> List[str]:
    """The platforms a verdict line names for one claim: CPU and H200 always (*not run* where they
    decide nothing), any other only where one of its files decides the claim (an H100 folder
    holding the HTTP runs alone is no news in every other section)."""
    return [p for p in columns(store) if p in PLATFORMS or store.has_verdict(p, claim_id)]


def column_title(platform: str) -> str:
    """The column's heading: the named platforms' own, a simulation's, else the folder's name as a
    measured platform (``h100`` -> ``H100 (measured)``)."""
    if platform.startswith(SIMULATED):
        return f"{SIM_TITLE}: {platform}"
    return PLATFORMS.get(platform) or f"{platform.upper()} (measured)"


def simulated(rec: Dict) -> bool:
    """Whether a verdict record's figures come from the simulator."""
    return rec.get("source") == "simulation"


def scorecard_rows(store: ResultsStore, claim_ids: Optional[Sequence[str]] = None,
                   platforms: Optional[Sequence[str]] = None) -> List[Dict]:
    """One dict per claim: ``claim``, ``study``, ``text``, ``published``, ``on_a_mac``, ``testable``,
    ``experiments`` and ``cells`` (platform -> list of {verdict, measured, rule, file, source},
    empty where not run). A simulated verdict stored in a measured platform's file (a simulation of
    the seed's machine run there) goes to the first simulated column, after that column's own, and
    never into a measured column. Files that supply a cell count as used (the reproducibility
    section lists them)."""
    claims = store.claims()
    ids = list(claims) if claim_ids is None else list(claim_ids)
    plats = list(platforms) if platforms is not None else columns(store)
    sim_col = next((p for p in plats if p.startswith(SIMULATED)), None)
    rows = []
    for cid in ids:
        c = claims[cid]
        cells: Dict[str, List[Dict]] = {p: [] for p in plats}
        moved = []
        for plat in plats:
            for path, rec in store.deciding(plat, cid):
                entry = {"verdict": rec.get("verdict"), "measured": rec.get("measured"), "rule": rec.get("rule"),
                         "file": store.label(path), "source": rec.get("source", "measurement")}
                if plat.startswith(SIMULATED) or not simulated(rec):
                    cells[plat].append(entry)
                    store.load(path)  # used
                elif sim_col is not None:
                    moved.append(entry)
                    store.load(path)
        if sim_col is not None:
            cells[sim_col] += moved
        rows.append({"claim": cid, "study": c.study, "text": c.claim, "published": c.published_text(),
                     "on_a_mac": c.on_a_mac, "testable": c.testable, "experiments": list(c.experiments),
                     "cells": cells})
    return rows


#: a verdict whose measured ``within_noise`` is true: three times its repeats' spread reaches across
#: the claim's threshold (the studies that store the flag say how they compute it)
FRAGILE = "(within noise: the repeats' spread could flip it)"


def _within_noise(entry: Dict) -> bool:
    return isinstance(entry.get("measured"), dict) and entry["measured"].get("within_noise") is True


def _cell(entries: List[Dict]) -> str:
    """The first entry (the claim's own experiment file, else the first variant) in full; other
    files that decide the claim too, one short line each."""
    if not entries:
        return f"*{NOT_RUN}*"
    first, rest = entries[0], entries[1:]
    name = lambda e: html.escape(_short(e["file"]))  # noqa: E731
    fragile = _within_noise(first)
    text = (f"**{html.escape(str(first['verdict']))}**" + (f"<br><small>{FRAGILE}</small>" if fragile else "")
            + f"<br>{_escape(measured_text(first['measured'], limit=3))}"
            f"<br><small>{name(first)}</small>")
    if rest:
        text += "<br><small>also: " + "; ".join(
            f"{name(e)} {html.escape(str(e['verdict']))}" + (" (named history)" if is_history(e["file"]) else "")
            for e in rest) + "</small>"
    return text


def _short(label: str) -> str:
    """A results file as a cell names it: its name, with the campaign folder (and preset) where it
    has one (``campaign/llama-3.2-1b/overview_bench.json``)."""
    parts = label.split("/")
    return "/".join(parts[parts.index("campaign"):]) if "campaign" in parts else parts[-1]


def _escape(text: str) -> str:
    return html.escape(text).replace("|", "&#124;")


def scorecard_markdown(rows: List[Dict], platforms: Sequence[str], by_study: bool = True) -> str:
    """The rows as Markdown tables (one per study with ``by_study``)."""
    head = ["Claim", *[column_title(p) for p in platforms], "Published (seed: the Apple run; mlxlab: target)",
            MAC_TITLE]
    groups: Dict[str, List[Dict]] = {}
    for r in rows:
        groups.setdefault(r["study"] if by_study else "", []).append(r)
    out = []
    for study, rs in groups.items():
        if study:
            out += [f"**{STUDY_TITLES.get(study, study)}**", ""]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rs:
            claim = f"<code>{r['claim']}</code><br>{_escape(r['text'])}"
            if not r["testable"]:
                claim += "<br><small>(marked untestable in the claims file)</small>"
            mac = f"<small>{_escape(r['on_a_mac'])}</small>"
            out.append("| " + " | ".join([claim, *[_cell(r["cells"][p]) for p in platforms],
                                          _escape(r["published"]), mac]) + " |")
        out.append("")
    return "\n".join(out)


def tally(rows: List[Dict], platforms: Sequence[str]) -> Dict[str, Dict[str, int]]:
    """platform -> verdict (or "not run") -> number of claims, from each cell's first entry. The
    measured columns count measured verdicts only (:func:`scorecard_rows` keeps simulated ones out
    of them); a simulated column is counted apart, under its own title."""
    out: Dict[str, Dict[str, int]] = {}
    for p in platforms:
        counts: Dict[str, int] = {}
        for r in rows:
            v = r["cells"][p][0]["verdict"] if r["cells"][p] else NOT_RUN
            counts[v] = counts.get(v, 0) + 1
        out[p] = counts
    return out


def tally_markdown(rows: List[Dict], platforms: Sequence[str]) -> str:
    counts = tally(rows, platforms)
    verdicts = sorted({v for c in counts.values() for v in c}, key=lambda v: (v == NOT_RUN, v))
    head = ["Verdict", *[column_title(p) for p in platforms]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in verdicts:
        lines.append("| " + " | ".join([v, *[str(counts[p].get(v, 0)) for p in platforms]]) + " |")
    fragile = [sum(1 for r in rows if r["cells"][p] and _within_noise(r["cells"][p][0])) for p in platforms]
    lines.append("| " + " | ".join(["of these, within noise (the repeats' spread could flip them)",
                                    *[str(n) for n in fragile]]) + " |")
    lines.append("| " + " | ".join(["all claims", *[str(len(rows)) for _ in platforms]]) + " |")
    return "\n".join(lines) + "\n"


def findings(rows: List[Dict], platforms: Sequence[str] = tuple(PLATFORMS)) -> Dict:
    """What the paper's opening states, from the scorecard rows: per measured platform and per
    side (``cases``: the two case studies' claims; ``mlxlab``: the project's own targets) how many
    claims each verdict got (``counts``), and the claim ids that held on every measured platform
    (``held``), failed on every one (``failed``) and held on some but failed on others (``split``)."""
    out: Dict = {"platforms": list(platforms)}
    for side, keep in (("cases", lambda r: r["study"] != "mlxlab"), ("mlxlab", lambda r: r["study"] == "mlxlab")):
        mine = [r for r in rows if keep(r)]
        first = {r["claim"]: {p: (r["cells"][p][0]["verdict"] if r["cells"][p] else NOT_RUN) for p in platforms}
                 for r in mine}
        vs = lambda cid: set(first[cid].values())  # noqa: E731
        out[side] = {
            "total": len(mine),
            "counts": tally(mine, platforms),
            "held": [c for c in first if vs(c) == {"reproduced"}],
            "failed": [c for c in first if vs(c) == {"not reproduced"}],
            "split": [c for c in first if {"reproduced", "not reproduced"} <= vs(c)],
        }
    return out


def counts_text(counts: Dict[str, int]) -> str:
    """``{'reproduced': 22, 'not reproduced': 21, 'not run': 4}`` -> ``'22 reproduced, 21 not
    reproduced and 4 not run'``, in the verdicts' reading order."""
    order = ("reproduced", "not reproduced", "inconclusive", "artifact", "not measurable on this backend",
             "not measured", NOT_RUN)
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)] + \
            [f"{n} {k}" for k, n in sorted(counts.items()) if k not in order and n]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1] if parts else "none"
