"""The case studies' published claims as data, and the verdict records that score them.

``data/claims/seed-000.yaml`` and ``seed-001.yaml`` list every claim of the two case studies
(``mlxlab.yaml`` the project's own targets, scored the same way):
an id, the claim in our words, the published figure(s) with their unit, the condition, the
``experiment`` (results file) that tests it, and ``on_a_mac``: what of the CPU and H200 results
should carry over to an Apple-silicon Mac on Metal, what should not, and why (every claim must
say). A study or notebook decides a claim by returning a :func:`verdict` record, which
:func:`mlxlab.core.results.save_results` stores in the results file beside the measurements and
their provenance; the paper reads the verdicts from there.

No MLX here: the paper build and the tests read claims without loading a backend.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional

from mlxlab.core.paths import data_dir

#: the fields every claim of a claims file must have
REQUIRED = ("id", "claim", "published", "condition", "experiment", "on_a_mac")
#: what a claim's ``on_a_mac`` must say, for the error when one lacks it
ON_A_MAC_HINT = ("on_a_mac: a sentence or two on what of the CPU and H200 results should carry over to "
                 "an Apple-silicon Mac running MLX on Metal, what should not, and why")

#: What a measurement can say about a claim. "artifact": the published effect is real in the data
#: but comes from the protocol (a cold first request, noise at N=3), not from the setting.
#: "inconclusive": the run's noise band is wider than the effect the claim is about (or than the
#: claim's own threshold), so it could not see either way; the record says how many repeats would.
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "artifact", "not measurable on this backend",
            "not measured")
#: where a verdict's figures come from: a run on the machine, or the simulator (which never counts
#: as a measured reproduction: the scorecard puts it in the simulator's column)
SOURCES = ("measurement", "simulation")


@dataclass(frozen=True)
class Claim:
    id: str
    study: str
    claim: str
    published: Mapping[str, Any]
    condition: Mapping[str, Any]
    experiment: Any  # a results-file name, or a list of them when several experiments decide it
    on_a_mac: str  # what of the CPU and H200 results carries over to an Apple-silicon Mac, and why
    notebook: Optional[str] = None
    testable: bool = True
    why_not: Optional[str] = None

    @property
    def experiments(self) -> tuple:
        return tuple(self.experiment) if isinstance(self.experiment, (list, tuple)) else (self.experiment,)

    def published_text(self) -> str:
        """The published figure in a few words ("33 to 71 % prefill tok/s")."""
        p = dict(self.published)
        if "text" in p:  # the claims file's own wording where the figure is not one number
            return str(p["text"])
        unit = p.pop("unit", "")
        if "low" in p and "high" in p:
            s = f"{_num(p['low'])} to {_num(p['high'])}"
        elif "value" in p:
            s = _num(p["value"])
        elif "high" in p:
            s = f"under {_num(p['high'])}"
        else:
            s = "; ".join(f"{k.replace('_', ' ')} {_range(v)}" for k, v in p.items() if k not in ("inputs", "table"))
            return s
        return f"{s} {unit}".strip()


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _range(v) -> str:
    if isinstance(v, dict):
        if "low" in v and "high" in v:
            return f"{_num(v['low'])} to {_num(v['high'])}"
        return ", ".join(f"{k} {_num(x)}" for k, x in v.items())
    return _num(v)


def claims_dir() -> Path:
    return data_dir() / "claims"


@functools.lru_cache(maxsize=4)
def _load(folder: str) -> Dict[str, Claim]:
    import yaml  # a dependency of mlx-lm

    out: Dict[str, Claim] = {}
    files = sorted(Path(folder).glob("*.yaml"))
    if not files:
        raise FileNotFoundError(f"no claims files (*.yaml) in {folder}")
    for f in files:
        doc = yaml.safe_load(f.read_text())
        for c in doc["claims"]:
            missing = [k for k in REQUIRED if k not in c]
            if missing:
                raise ValueError(f"{f.name}: claim {c.get('id', '?')} lacks {missing}"
                                 + (f" ({ON_A_MAC_HINT})" if "on_a_mac" in missing else ""))
            if c["id"] in out:
                raise ValueError(f"{f.name}: claim id {c['id']} appears twice")
            if c.get("testable", True) is False and not c.get("why_not"):
                raise ValueError(f"{f.name}: claim {c['id']} is marked untestable without a why_not")
            if not isinstance(c["on_a_mac"], str) or not c["on_a_mac"].strip():
                raise ValueError(f"{f.name}: claim {c['id']} has an empty on_a_mac ({ON_A_MAC_HINT})")
            out[c["id"]] = Claim(study=doc["study"], **c)
    return out


def load_claims(folder: Optional[Path] = None) -> Dict[str, Claim]:
    """Every claim of both case studies, by id, in file order."""
    return _load(str(folder or claims_dir()))


def claim(claim_id: str) -> Claim:
    """One claim; an unknown id raises KeyError naming the closest ids."""
    claims = load_claims()
    if claim_id not in claims:
        near = difflib.get_close_matches(claim_id, claims, n=3)
        raise KeyError(f"no claim {claim_id!r} in {claims_dir()}" + (f"; did you mean {', '.join(near)}?" if near else ""))
    return claims[claim_id]


def decider_commit() -> Optional[str]:
    """The commit of the code deciding verdicts now (the declared source commit on a copy of the
    tree whose .git lags, as on the lent GPU machine), with ``-dirty`` when tracked code differs."""
    import os
    import time

    from mlxlab.core.git import _git_commit, _git_dirty

    now = time.monotonic()
    if _DECIDER[0] is None or now - _DECIDER[0] > 30:  # git once per half minute, not once per verdict
        commit = os.environ.get("MLXLAB_SOURCE_COMMIT") or _git_commit()
        dirty = "MLXLAB_SOURCE_COMMIT" not in os.environ and bool(_git_dirty())
        _DECIDER[:] = [now, None if commit is None else commit + ("-dirty" if dirty else "")]
    return _DECIDER[1]


_DECIDER: list = [None, None]  # [when read, commit]


def verdict(claim_id: str, verdict: str, *, measured: Any, rule: str, fairness: str,
            evidence: Optional[str] = None, source: str = "measurement") -> Dict[str, Any]:
    """The record that decides one claim, as stored in a results file's ``verdicts`` list.

    ``measured``: the figure(s) this run measured (a number, a range, or a small dict of them);
    ``rule``: how the verdict follows from ``measured`` (in words, with its thresholds);
    ``fairness``: what makes the comparison fair or what limits it (conditions that differ from
    the published one, repeats, noise); ``source``: "simulation" when the figures come from the
    simulator, not a run (the record says so, and the scorecard keeps it out of the measured
    columns). The record also names the commit of the code that decided it (``decided_by``), so a
    verdict decided by older rules can be told apart. Raises ValueError on a verdict outside
    :data:`VERDICTS` or a source outside :data:`SOURCES` and KeyError on a claim id that is in no
    claims file."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    if source not in SOURCES:
        raise ValueError(f"verdict for {claim_id}: source {source!r} is not one of {SOURCES}")
    c = claim(claim_id)
    for name, text in (("rule", rule), ("fairness", fairness)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"verdict for {claim_id}: {name} must say something (got {text!r})")
    return {"claim": claim_id, "study": c.study, "text": c.claim, "published": c.published_text(),
            "measured": measured, "rule": rule, "verdict": verdict, "fairness": fairness,
            **({"evidence": evidence} if evidence else {}), **({"source": source} if source != "measurement" else {}),
            "decided_by": decider_commit()}


def not_testable(claim_id: str) -> Dict[str, Any]:
    """The verdict of a claim its claims file marks ``testable: false``: "not measured", with
    the file's reason as the rule."""
    c = claim(claim_id)
    if c.testable:
        raise ValueError(f"claim {claim_id} is testable: measure it")
    return verdict(claim_id, "not measured", measured=None, rule=c.why_not, fairness="nothing was measured")


def check_verdicts(records: Iterable[Mapping[str, Any]], experiment: Optional[str] = None) -> List[Dict[str, Any]]:
    """Validate stored verdict records (known claim, known verdict, a rule and a fairness note);
    with ``experiment`` (a results-file name such as ``scheduling`` or ``scheduling_slo``), also
    that each claim is one that experiment is named to test in the claims files. Returns
    them as a list; raises ValueError on the first bad one."""
    out = []
    for r in records:
        for key in ("claim", "verdict", "rule", "fairness"):
            if key not in r:
                raise ValueError(f"verdict record {dict(r)} lacks {key!r}")
        c = claim(r["claim"])
        if r["verdict"] not in VERDICTS:
            raise ValueError(f"{r['claim']}: verdict {r['verdict']!r} is not one of {VERDICTS}")
        if experiment is not None and not any(experiment == e or experiment.startswith(e + "_") for e in c.experiments):
            raise ValueError(f"{r['claim']} is tested by {list(c.experiments)} (data/claims), not by {experiment!r}")
        out.append(dict(r))
    ids = [r["claim"] for r in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"claims decided twice in one results file: {dup}")
    return out


def measured_text(measured: Any, limit: int = 4) -> str:
    """A verdict's ``measured`` in a few words: ``gain_pct 2.1; ratio_x 1.08`` (numbers to three
    significant digits, the first ``limit`` keys, ``null`` as n/a)."""
    def one(v) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e3 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(one(x) for x in v[:4]) + (", ..." if len(v) > 4 else "") + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} {one(x)}" for k, x in list(v.items())[:3]) + "}"
        return str(v) if str(v) else "none"

    if isinstance(measured, dict):
        items: List[str] = [f"{k} {one(v)}" for k, v in list(measured.items())[:limit]]
        if len(measured) > limit:
            items.append(f"+{len(measured) - limit} more")
        return "; ".join(items) if items else "n/a"
    return one(measured)
