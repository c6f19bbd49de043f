"""The byte-level training corpus, built offline from the Python standard library.

Random weights have nothing to lose and accept no drafts, so quality and speculative-decoding
experiments need models that predict something; they are trained (:mod:`mlxlab.train.tiny`) on
this corpus, which needs no download. Recipe (``data/corpus/README.md`` says the same in prose):

* files: every ``*.py`` below ``sysconfig.get_paths()["stdlib"]`` except those inside a
  folder named in :data:`EXCLUDE_DIRS` (tests, site-packages, codec tables, IDLE, ...),
  sorted by relative POSIX path, taken in that order until :data:`MAX_CORPUS_BYTES`;
* split: a file is held out when ``int(sha256(relpath)[:8], 16) % 20 == 0`` (about 5%);
* bytes: each split is the concatenation, in sorted order, of every file's raw bytes followed
  by one ``0x00`` byte (a document separator that never occurs in source text);
* tokens: the byte values themselves (vocabulary 256).

``data/corpus/split.json`` records the Python version, both file lists, byte counts and the
sha256 of both byte strings; :func:`build_corpus` checks them (``verify=True``) and says when
a mismatch comes from a different Python version rather than a changed recipe. Standard library
and numpy only.
"""

from __future__ import annotations

import hashlib
import json
import platform as _platform
import sysconfig
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Union

import numpy as np

from mlxlab.core.paths import data_dir

EXCLUDE_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
    "encodings",    # codec tables: long runs of hex literals, not representative code
    "idlelib",      # the IDLE application
    "pydoc_data",   # one 750 KB file of documentation strings
    "lib2to3",      # grammar tables and fixers, mostly tests
    "distutils",    # deprecated, gone in Python 3.12: keeps the corpus closer across versions
    "turtledemo", "ensurepip",
})
MAX_CORPUS_BYTES = 9_000_000
HELDOUT_MODULUS = 20
SEPARATOR = b"\x00"
VOCAB_SIZE = 256
CORPUS_RECIPE_VERSION = 1


class CorpusMismatch(RuntimeError, ValueError):
    """The corpus rebuilt here (or a pack) differs from the one recorded in ``split.json``; a
    ValueError too, so the command line reports it as a one-line error."""


def split_path() -> Path:
    """The record of the split: ``data/corpus/split.json``."""
    return data_dir() / "corpus" / "split.json"


def stdlib_root() -> Path:
    """The standard-library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def python_version() -> str:
    return f"{_platform.python_implementation()} {_platform.python_version()}"


def is_heldout(relpath: str) -> bool:
    """Deterministic split by file: about 1 in ``HELDOUT_MODULUS`` files is held out."""
    h = int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16)
    return h % HELDOUT_MODULUS == 0


def list_corpus_files(root: Union[None, str, Path] = None,
                      max_bytes: int = MAX_CORPUS_BYTES) -> List[str]:
    """Relative POSIX paths of the corpus files below ``root`` (default: the stdlib), sorted,
    truncated so that their sizes sum to at most ``max_bytes``."""
    root = Path(root) if root is not None else stdlib_root()
    rels = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if any(part in EXCLUDE_DIRS for part in rel.parts[:-1]) or not p.is_file():
            continue
        rels.append(rel.as_posix())
    rels.sort()
    out, total = [], 0
    for r in rels:
        n = (root / r).stat().st_size + len(SEPARATOR)
        if total + n > max_bytes:
            break
        out.append(r)
        total += n
    return out


def _concat(root: Path, rels: Iterable[str]) -> bytes:
    return b"".join((root / r).read_bytes() + SEPARATOR for r in rels)


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def build_corpus(root: Union[None, str, Path] = None, *, verify: bool = True,
                 split_file: Union[None, str, Path] = None) -> dict:
    """Build the corpus: ``{"train": bytes, "heldout": bytes, "files": {...}, "meta": {...}}``.

    With ``verify`` the file lists and sha256 checksums must equal those recorded in
    ``split_file`` (default ``data/corpus/split.json``); otherwise :class:`CorpusMismatch` is
    raised, naming the recorded and the running Python version when they differ (the file set
    is a property of the interpreter's standard library). ``verify=False`` builds whatever the
    running interpreter has.
    """
    root = Path(root) if root is not None else stdlib_root()
    rels = list_corpus_files(root)
    files = {"train": [r for r in rels if not is_heldout(r)],
             "heldout": [r for r in rels if is_heldout(r)]}
    data = {k: _concat(root, v) for k, v in files.items()}
    meta = {
        "recipe_version": CORPUS_RECIPE_VERSION,
        "python": python_version(),
        "source": "sysconfig.get_paths()['stdlib'] of the running interpreter",
        "exclude_dirs": sorted(EXCLUDE_DIRS),
        "max_bytes": MAX_CORPUS_BYTES,
        "heldout_rule": f"int(sha256(relpath)[:8], 16) % {HELDOUT_MODULUS} == 0",
        "separator": "one 0x00 byte after every file",
        "num_files": {k: len(v) for k, v in files.items()},
        "bytes": {k: len(v) for k, v in data.items()},
        "sha256": {k: _sha256(v) for k, v in data.items()},
    }
    if verify:
        _verify(meta, files, Path(split_file) if split_file else split_path())
    return {"train": data["train"], "heldout": data["heldout"], "files": files, "meta": meta}


def _verify(meta: dict, files: dict, path: Path) -> None:
    if not path.is_file():
        raise CorpusMismatch(f"no recorded split at {path}; run write_split() or "
                             f"`mlxlab train-tiny --write-split` first")
    rec = json.loads(path.read_text())
    if rec.get("sha256") == meta["sha256"] and rec.get("files") == files:
        return
    why = []
    if rec.get("python") != meta["python"]:
        why.append(f"the split was recorded with {rec.get('python')} but this is {meta['python']}: "
                   f"the corpus is the interpreter's own standard library, so its files differ "
                   f"between Python versions; rebuild with verify=False (and retrain) or use "
                   f"{rec.get('python')}")
    for k in ("train", "heldout"):
        a, b = set(rec.get("files", {}).get(k, [])), set(files[k])
        if a != b:
            why.append(f"{k}: {len(b - a)} files not in the record (e.g. {sorted(b - a)[:3]}), "
                       f"{len(a - b)} recorded files missing (e.g. {sorted(a - b)[:3]})")
        elif rec.get("sha256", {}).get(k) != meta["sha256"][k]:
            why.append(f"{k}: same files but different bytes (sha256 {meta['sha256'][k][:12]}... "
                       f"vs recorded {rec.get('sha256', {}).get(k, '')[:12]}...): "
                       f"the standard-library sources were modified")
    raise CorpusMismatch("corpus does not match " + str(path) + ": " + "; ".join(why or ["?"]))


def write_split(path: Union[None, str, Path] = None, root: Union[None, str, Path] = None) -> dict:
    """Build the corpus from the running interpreter and record it in ``split.json``."""
    c = build_corpus(root, verify=False)
    rec = dict(c["meta"], files=c["files"])
    path = Path(path) if path else split_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def pack_corpus(path: Union[str, Path], corpus: Optional[dict] = None) -> Path:
    """Write the verified corpus to ``path`` as an xz-compressed tar of ``meta.json`` (the split
    record: versions, file lists, byte counts, sha256), ``train.bin`` and ``heldout.bin``, so a
    machine with another Python (the H200's) trains on the committed split: the corpus is the
    interpreter's own standard library, which differs between versions. Returns ``path``."""
    import io
    import tarfile

    c = corpus if corpus is not None else build_corpus(verify=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = {"meta.json": json.dumps(dict(c["meta"], files=c["files"]), indent=1).encode(),
             "train.bin": c["train"], "heldout.bin": c["heldout"]}
    with tarfile.open(path, "w:xz") as tar:
        for name, blob in parts.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(blob), 0, 0o644
            tar.addfile(info, io.BytesIO(blob))
    return path


def load_pack(path: Union[str, Path], *, split_file: Union[None, str, Path] = None) -> dict:
    """The corpus from a :func:`pack_corpus` file, as :func:`build_corpus` returns it, after
    checking both parts' sha256 against the pack's own record and that record against
    ``split_file`` (default ``data/corpus/split.json``): a pack of another split is refused."""
    import tarfile

    path = Path(path)
    try:
        with tarfile.open(path, "r:xz") as tar:
            blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except (OSError, tarfile.TarError) as e:
        raise CorpusMismatch(f"{path} is not a corpus pack ({e}); write one with `mlxlab train-tiny --pack-corpus`")
    missing = [k for k in ("meta.json", "train.bin", "heldout.bin") if k not in blobs]
    if missing:
        raise CorpusMismatch(f"{path} lacks {', '.join(missing)}: not a corpus pack")
    rec = json.loads(blobs["meta.json"])
    data = {"train": blobs["train.bin"], "heldout": blobs["heldout.bin"]}
    for k, b in data.items():
        if _sha256(b) != rec["sha256"][k]:
            raise CorpusMismatch(f"{path}: {k}.bin does not match the sha256 the pack records (damaged file)")
    split = Path(split_file) if split_file else split_path()
    want = json.loads(split.read_text()) if split.is_file() else None
    if want is None or want.get("sha256") != rec["sha256"] or want.get("files") != rec["files"]:
        raise CorpusMismatch(f"{path} holds the split of {rec.get('python')} (sha256 {rec['sha256']['train'][:12]}...), "
                             f"not the one {split} records: pack the corpus again where that split builds")
    meta = {k: v for k, v in rec.items() if k != "files"}
    return {"train": data["train"], "heldout": data["heldout"], "files": rec["files"], "meta": meta}


_CORPUS_CACHE: Dict[str, dict] = {}


def load_corpus(verify: bool = True) -> dict:
    """:func:`build_corpus` of the default root, cached per process."""
    key = f"verify={verify}"
    if key not in _CORPUS_CACHE:
        _CORPUS_CACHE[key] = build_corpus(verify=verify)
    return _CORPUS_CACHE[key]


def to_tokens(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype=np.uint8).astype(np.int32)


def heldout_prompts(n: int, length: int = 128, seed: int = 0, data: Optional[bytes] = None,
                    midline: bool = False) -> List[List[int]]:
    """``n`` byte-token prompts of ``length`` bytes cut from held-out files, each starting at a
    line start (deterministic for a seed); none spans a file separator. With ``midline`` each
    prompt also ends inside a line, right after a non-whitespace byte, where the source line goes
    on (a cursor in the middle of code, as in code completion)."""
    data = load_corpus()["heldout"] if data is None else data
    rng = np.random.default_rng(seed)
    out: List[List[int]] = []
    tries = 0
    while len(out) < n and tries < 1000 * n:
        tries += 1
        i = int(rng.integers(0, len(data) - length - 1))
        j = data.find(b"\n", i)
        if j < 0 or j + 2 + length > len(data):
            continue
        piece = data[j + 1:j + 1 + length]
        if SEPARATOR in piece or not piece.strip():
            continue
        if midline and (piece[-1:].isspace() or data[j + 1 + length:j + 2 + length] in (b"\n", b"\x00")):
            continue
        out.append(list(piece))
    return out
