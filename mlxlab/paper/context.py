"""What the paper's template reads: results files and claims, behind lookups that fail loudly.

:class:`ResultsStore` opens ``data/results/<platform>/<name>.json`` and ``data/claims/*.yaml``
and remembers every results file the build used (the reproducibility section lists them). Its
values come wrapped in :class:`Node`, a read-only view over the JSON that knows where it is: a
missing file, key or list item, or a record that :meth:`Node.one` cannot single out, raises
:class:`PaperDataError` naming the file and the key path (``data/results/cpu/roofline.json:
no key 'gb_s' at bandwidth``). A JSON ``null`` reads as :class:`Null`, which is false in an
``{% if %}`` and refuses to be formatted as a number, again naming its path.

No MLX here: the paper builds on any machine that has the results.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from mlxlab.core.paths import ROOT, data_dir

#: folders under a platform's results folder that hold no results of the paper
SKIP_DIRS = ("quick", "notebooks")


def is_history(name: str) -> bool:
    """Whether a results file (its name or path) is named history: ``*_before_*``, a run kept to
    show what a later change moved, not the current evidence."""
    base = Path(name).name  # not .stem: "h100/serve_http_qwen2.5-0.5b_before_fix" has no suffix to drop
    return "_before_" in (base[:-5] if base.endswith(".json") else base)


class PaperDataError(Exception):
    """A number the paper needs is not in the data: the message names the file and key path."""


def _step(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


class Null:
    """A JSON ``null`` at a known place: false, prints as ``null``, and :meth:`fail` says where."""

    __slots__ = ("src", "path")

    def __init__(self, src: str, path: str):
        self.src, self.path = src, path

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return "null"

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        return other is None or isinstance(other, Null)

    def __hash__(self) -> int:
        return hash(None)

    def fail(self, what: str = "a number") -> PaperDataError:
        return PaperDataError(f"{self.src}: {self.path or '(top)'} is null, not {what}")


def wrap(value: Any, src: str, path: str = "", log: Optional[Dict[str, set]] = None):
    """A dict or list as a :class:`Node`, ``None`` as :class:`Null`, other scalars as they are;
    a scalar read is noted in ``log`` (file -> key paths), which lists the paper's inserts."""
    if isinstance(value, (dict, list)):
        return Node(value, src, path, log)
    if log is not None:
        log.setdefault(src, set()).add(path)
    if value is None:
        return Null(src, path)
    return value


def unwrap(value: Any) -> Any:
    if isinstance(value, Node):
        return value.raw
    if isinstance(value, Null):
        return None
    return value


_OPS = {"ge": lambda a, b: a is not None and a >= b, "gt": lambda a, b: a is not None and a > b,
        "le": lambda a, b: a is not None and a <= b, "lt": lambda a, b: a is not None and a < b,
        "ne": lambda a, b: a != b, "in": lambda a, b: a in b, "eq": lambda a, b: a == b}


class Node:
    """A strict, read-only view of one JSON value (a dict or a list) from file ``src`` at ``path``.

    ``node.key`` and ``node["key"]`` read a dict key (an int finds its string key too, so
    ``alone_ttft_s[2048]`` reads ``"2048"``); ``node[3]`` a list item. On a list of records,
    :meth:`where` filters (``where(side="mlx-lm", prompt_tokens__ge=1024)``), :meth:`one` picks
    exactly one, :meth:`col` takes one key of every record. A key named like a method is still
    reachable as ``node["items"]``."""

    __slots__ = ("_v", "_src", "_path", "_log")

    def __init__(self, value, src: str, path: str = "", log: Optional[Dict[str, set]] = None):
        self._v, self._src, self._path, self._log = value, src, path, log

    # -- reading -----------------------------------------------------------------------------
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, key):
        v = self._v
        if isinstance(v, dict):
            k = key if key in v else str(key) if str(key) in v else None
            if k is None:
                have = ", ".join(list(map(str, v))[:20]) + (", ..." if len(v) > 20 else "")
                raise PaperDataError(f"{self._src}: no key {key!r} at {self._path or '(top)'} (has: {have})")
            return wrap(v[k], self._src, _step(self._path, k), self._log)
        if isinstance(key, int) and -len(v) <= key < len(v):
            return wrap(v[key], self._src, _step(self._path, key), self._log)
        raise PaperDataError(f"{self._src}: no item {key!r} in {self._path or '(top)'}, a list of {len(v)}")

    def get(self, key, default=None):
        """``node[key]`` or ``default`` where the key is absent (for optional fields only)."""
        try:
            return self[key]
        except PaperDataError:
            return default

    def __contains__(self, key) -> bool:
        return (key in self._v or str(key) in self._v) if isinstance(self._v, dict) else unwrap(key) in self._v

    def __iter__(self) -> Iterator:
        if isinstance(self._v, dict):
            return iter(self._v)
        return (wrap(x, self._src, _step(self._path, i), self._log) for i, x in enumerate(self._v))

    def __len__(self) -> int:
        return len(self._v)

    def __bool__(self) -> bool:
        return bool(self._v)

    def keys(self) -> List[str]:
        return list(self._dict("keys()"))

    def items(self) -> List[Tuple[str, Any]]:
        return [(k, self[k]) for k in self._dict("items()")]

    def values(self) -> List[Any]:
        return [self[k] for k in self._dict("values()")]

    @property
    def raw(self):
        return self._v

    @property
    def where_from(self) -> str:
        return f"{self._src}: {self._path or '(top)'}"

    def _dict(self, what: str) -> dict:
        if not isinstance(self._v, dict):
            raise PaperDataError(f"{self._src}: {self._path or '(top)'} is a list, not a dict ({what})")
        return self._v

    def _records(self, what: str) -> list:
        if not isinstance(self._v, list):
            raise PaperDataError(f"{self._src}: {self._path or '(top)'} is a dict, not a list of records ({what})")
        return self._v

    # -- lists of records ---------------------------------------------------------------------
    def where(self, _conds: Optional[dict] = None, **conds) -> "Node":
        """The records whose keys match: ``key=value`` or ``key__op=value`` with op one of
        ge, gt, le, lt, ne, in (a dict argument takes keys that are not Python names, such as
        ``"ttft_s@512"``). A key a record lacks is an error; no match is an empty list."""
        tests = []
        for k, want in {**(_conds or {}), **conds}.items():
            name, _, op = k.partition("__") if "__" in k else (k, "", "eq")
            if op not in _OPS:
                raise PaperDataError(f"where(): unknown operator {op!r} in {k!r}")
            tests.append((name, _OPS[op], unwrap(want)))
        out, idx = [], []
        for i, rec in enumerate(self._records("where()")):
            if not isinstance(rec, dict):
                raise PaperDataError(f"{self._src}: {_step(self._path, i)} is not a record")
            ok = True
            for name, fn, want in tests:
                if name not in rec:
                    raise PaperDataError(f"{self._src}: no key {name!r} at {_step(self._path, i)} (has: {', '.join(rec)})")
                if not fn(rec[name], want):
                    ok = False
                    break
            if ok:
                out.append(rec)
                idx.append(i)
        label = ",".join(f"{k}={unwrap(v)!r}" for k, v in {**(_conds or {}), **conds}.items())
        return Node(out, self._src, f"{self._path}[?{label}]", self._log)

    def one(self, _conds: Optional[dict] = None, **conds):
        """The single record :meth:`where` finds; none or several is an error."""
        sel = self.where(_conds, **conds)
        if len(sel) != 1:
            raise PaperDataError(f"{self._src}: {len(sel)} records match at {sel._path}, expected exactly one")
        return sel[0]

    def col(self, key: str, skip_null: bool = False) -> "Node":
        """``key`` of every record, as a list (``null`` kept unless ``skip_null``)."""
        out = []
        for i, rec in enumerate(self._records("col()")):
            if not isinstance(rec, dict) or key not in rec:
                raise PaperDataError(f"{self._src}: no key {key!r} at {_step(self._path, i)}")
            if rec[key] is not None or not skip_null:
                out.append(rec[key])
        return Node(out, self._src, f"{self._path}[*].{key}", self._log)

    def flatten(self, key: str) -> "Node":
        """On a list of records that each hold a list of records under ``key``: those inner
        records, each with its parent's scalar fields added (``runs.flatten("events")`` gives
        every event with its run's ``model`` and ``warmup``)."""
        out = []
        for i, rec in enumerate(self._records("flatten()")):
            if not isinstance(rec, dict) or not isinstance(rec.get(key), list):
                raise PaperDataError(f"{self._src}: no list {key!r} at {_step(self._path, i)}")
            parent = {k: v for k, v in rec.items() if k != key and not isinstance(v, (dict, list))}
            out += [{**parent, **inner} if isinstance(inner, dict) else inner for inner in rec[key]]
        return Node(out, self._src, f"{self._path}[*].{key}[*]", self._log)

    def __repr__(self) -> str:
        text = json.dumps(self._v, default=str)
        return text if len(text) < 200 else text[:197] + "..."

    __str__ = __repr__


class ResultsStore:
    """The results, claims and figures one build reads; ``used`` lists the results files read,
    in the order first read."""

    def __init__(self, data: Optional[Path] = None, figures: Optional[Path] = None):
        self.data = Path(data) if data else data_dir()
        self.results = self.data / "results"
        self.figures = Path(figures) if figures else ROOT / "paper" / "figures"
        self.used: Dict[str, Path] = {}
        self.keys: Dict[str, set] = {}  # file -> the key paths of the scalars the build read
        self._docs: Dict[Path, dict] = {}
        self._claims = None

    # -- files --------------------------------------------------------------------------------
    def label(self, path: Path) -> str:
        """A path as the paper prints it: relative to the project (``data/results/cpu/x.json``)."""
        path = Path(path).resolve()
        for base in (self.data.resolve().parent, ROOT):
            try:
                return str(path.relative_to(base))
            except ValueError:
                continue
        return str(path)

    def platforms(self) -> List[str]:
        if not self.results.is_dir():
            return []
        return sorted(p.name for p in self.results.iterdir() if p.is_dir())

    def files(self, platform: str) -> List[Path]:
        """The results files of one platform (not its quick runs, run folders or exported
        notebooks): its own files, then those of its notebook campaign (``campaign/``, one folder
        per preset; :mod:`mlxlab.notebook.campaign`), without the campaign's log."""
        folder = self.results / platform
        if not folder.is_dir():
            return []
        camp = folder / "campaign"
        extra = sorted(p for p in camp.rglob("*.json") if p.name != "campaign.json" and "executed" not in p.parts
                       ) if camp.is_dir() else []
        return sorted(folder.glob("*.json")) + extra

    def like(self, platform: str, pattern: str) -> List[str]:
        """``platform/name`` of each results file of ``platform`` whose name matches the glob
        ``pattern`` (``serve_http_*``), sorted; a run cut short (``*_partial``) is not one."""
        import fnmatch

        return [f"{platform}/{p.stem}" for p in self.files(platform)
                if fnmatch.fnmatch(p.stem, pattern) and not p.stem.endswith("_partial")]

    def load(self, path: Path, use: bool = True) -> dict:
        path = Path(path)
        if path not in self._docs:
            try:
                self._docs[path] = json.loads(path.read_text())
            except FileNotFoundError:
                raise PaperDataError(f"{self.label(path)}: no such results file") from None
            except json.JSONDecodeError as exc:
                raise PaperDataError(f"{self.label(path)}: not valid JSON ({exc})") from None
        if use:
            self.used.setdefault(self.label(path), path)
        return self._docs[path]

    def path(self, spec: str) -> Path:
        """``"cpu/prefill_step_size"`` -> ``data/results/cpu/prefill_step_size.json``."""
        if "/" not in spec:
            raise PaperDataError(f"r({spec!r}): give platform/name, e.g. 'cpu/{spec}'")
        p = self.results / (spec if spec.endswith(".json") else spec + ".json")
        if not p.exists():
            plat = spec.split("/")[0]
            have = ", ".join(f.stem for f in self.files(plat)) or "nothing"
            raise PaperDataError(f"{self.label(p)}: no such results file (data/results/{plat}/ has: {have})")
        return p

    def r(self, spec: str) -> Node:
        """The whole results file ``platform/name`` as a :class:`Node`."""
        p = self.path(spec)
        return Node(self.load(p), self.label(p), "", self.keys)

    # -- claims and verdicts -----------------------------------------------------------------
    def claims(self):
        if self._claims is None:
            from mlxlab.core.claims import load_claims

            self._claims = load_claims(self.data / "claims")
        return self._claims

    def claim(self, claim_id: str) -> Node:
        claims = self.claims()
        if claim_id not in claims:
            import difflib

            near = difflib.get_close_matches(claim_id, claims, n=3)
            raise PaperDataError(f"{self.label(self.data / 'claims')}: no claim {claim_id!r}"
                                 + (f"; did you mean {', '.join(near)}?" if near else ""))
        c = claims[claim_id]
        doc = {"id": c.id, "study": c.study, "claim": c.claim, "published": dict(c.published),
               "published_text": c.published_text(), "condition": dict(c.condition),
               "experiments": list(c.experiments), "notebook": c.notebook, "testable": c.testable,
               "why_not": c.why_not, "on_a_mac": c.on_a_mac}
        return Node(doc, f"{self.label(self.data / 'claims')} ({c.study}.yaml)", claim_id)

    def stored_verdicts(self, platform: str) -> Dict[str, List[Tuple[Path, dict]]]:
        """claim id -> [(results file, verdict record)] over a platform's files; a file without
        a ``verdicts`` list decides nothing."""
        out: Dict[str, List[Tuple[Path, dict]]] = {}
        for p in self.files(platform):
            for rec in self.load(p, use=False).get("verdicts") or []:
                if isinstance(rec, dict) and "claim" in rec:
                    out.setdefault(rec["claim"], []).append((p, rec))
        return out

    def deciding(self, platform: str, claim_id: str) -> List[Tuple[Path, dict]]:
        """The files of ``platform`` that decide ``claim_id``, the claim's own experiment files
        first (in the order the claims file names them), then variants (``scheduling_slo``); among
        them, current files before named history (``*_before_*``) and a decided verdict before a
        "not measured" one (a run not yet whole), so a scorecard cell leads with current evidence."""
        found = self.stored_verdicts(platform).get(claim_id, [])
        exps = list(self.claims()[claim_id].experiments) if claim_id in self.claims() else []

        def rank(item):  # a platform's own files before its notebook campaign's
            stem, camp = item[0].stem, "campaign" in item[0].parent.parts
            late = (is_history(stem), item[1].get("verdict") == "not measured")
            exact = [i for i, e in enumerate(exps) if stem == e]
            return (camp, *late, 0, exact[0], str(item[0])) if exact else (camp, *late, 1, len(exps), str(item[0]))

        return sorted(found, key=rank)

    def verdict(self, platform: str, claim_id: str, file: Optional[str] = None) -> Node:
        """The verdict record a results file of ``platform`` stores for ``claim_id`` (the claim's
        own experiment file first; ``file`` picks one by name)."""
        self.claim(claim_id)
        found = self.deciding(platform, claim_id)
        if file is not None:
            found = [f for f in found if f[0].stem == file.removesuffix(".json")]
        if not found:
            exps = ", ".join(f"{e}.json" for e in self.claims()[claim_id].experiments)
            raise PaperDataError(f"no results file in data/results/{platform}/ holds a verdict for {claim_id}"
                                 + (f" in {file}" if file else "") + f" (the claims name {exps})")
        path, rec = found[0]
        self.load(path)  # now used
        i = next(i for i, v in enumerate(self.load(path)["verdicts"]) if v is rec)
        return Node(rec, self.label(path), f"verdicts[{i}]", self.keys)

    def verdicts_by_file(self, platform: str, claim_id: str) -> List[Tuple[str, Node]]:
        """``(file name, verdict)`` for each results file of ``platform`` that decides ``claim_id``,
        in :meth:`deciding` order, one per file name (a campaign copy of the same name is not
        repeated), leaving out named history (``*_before_*``)."""
        names = list(dict.fromkeys(p.stem for p, _ in self.deciding(platform, claim_id) if not is_history(p.stem)))
        return [(n, self.verdict(platform, claim_id, file=n)) for n in names]

    def has_verdict(self, platform: str, claim_id: str) -> bool:
        return bool(self.deciding(platform, claim_id))

    # -- figures ------------------------------------------------------------------------------
    def figure_path(self, name: str, platform: Optional[str] = None) -> Path:
        p = self.figures / (platform or "") / f"{name}.png"
        if not p.exists():
            raise PaperDataError(f"{self.label(p)}: no such figure (the notebooks and probes write "
                                 f"paper/figures/; a full run makes it)")
        return p


def experiment_claims(store: ResultsStore, experiments: Sequence[str]) -> List[str]:
    """Ids of the claims that any of ``experiments`` decides (by the claims files), in file order."""
    want = set(experiments)
    return [cid for cid, c in store.claims().items() if want & set(c.experiments)]
