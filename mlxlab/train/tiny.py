"""Train tiny byte-level models on a corpus built offline (``mlxlab train-tiny``).

Random weights have nothing to lose and accept no drafts, so quality and speculative-decoding
experiments need models that actually predict something. This module builds a byte-level
corpus from the Python standard library of the running interpreter (no download), splits it
by file into train / held-out, trains the ``byte-target`` and ``byte-draft`` presets
(``data/models/byte-*.json``) with MLX's AdamW, and saves them as mlx-lm model directories
(``config.json`` + ``model.safetensors``) that :func:`mlxlab.load_model` loads.

Corpus recipe (``data/corpus/README.md`` says the same in prose):

* files: every ``*.py`` below ``sysconfig.get_paths()["stdlib"]`` except those inside a
  folder named in :data:`EXCLUDE_DIRS` (tests, site-packages, codec tables, IDLE, ...),
  sorted by relative POSIX path, taken in that order until :data:`MAX_CORPUS_BYTES`;
* split: a file is held out when ``int(sha256(relpath)[:8], 16) % 20 == 0`` (about 5%);
* bytes: each split is the concatenation, in sorted order, of every file's raw bytes followed
  by one ``0x00`` byte (a document separator that never occurs in source text);
* tokens: the byte values themselves (vocabulary 256).

``data/corpus/split.json`` records the Python version, both file lists, byte counts and the
sha256 of both byte strings; :func:`build_corpus` checks them (``verify=True``) and says when
a mismatch comes from a different Python version rather than a changed recipe.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform as _platform
import sysconfig
import time
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Union

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from mlxlab.core.paths import data_dir
from mlxlab.core.presets import module_of, preset_config

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

TARGET_PRESET = "byte-target"
DRAFT_PRESET = "byte-draft"

# the committed run: `mlxlab train-tiny` with no model arguments trains both with these
DEFAULT_RECIPES: Dict[str, dict] = {
    TARGET_PRESET: dict(steps=400, seq_len=256, batch=8, lr=1e-3, warmup=40, seed=0),
    DRAFT_PRESET: dict(steps=400, seq_len=256, batch=8, lr=3e-3, warmup=40, seed=0),
}


class CorpusMismatch(RuntimeError):
    """The corpus rebuilt here differs from the one recorded in ``split.json``."""


# --------------------------------------------------------------------------- corpus


def corpus_dir() -> Path:
    return data_dir() / "corpus"


def weights_dir() -> Path:
    return data_dir() / "weights"


def split_path() -> Path:
    return corpus_dir() / "split.json"


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


# --------------------------------------------------------------------------- models


def build_model(config: Union[str, dict], seed: int = 0) -> nn.Module:
    """A freshly initialised float32 mlx-lm model (mlx's default init) for a preset or config."""
    from mlx_lm.utils import _get_classes

    cfg = preset_config(config) if isinstance(config, str) else dict(config)
    model_cls, args_cls = _get_classes(cfg)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(cfg))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def loss_fn(model: nn.Module, x: mx.array, y: mx.array) -> mx.array:
    """Mean next-byte cross entropy in nats."""
    logits = model(x)
    return nn.losses.cross_entropy(logits.astype(mx.float32), y, reduction="mean")


def evaluate(model, data: Union[bytes, np.ndarray], seq_len: int = 256, batch: int = 16,
             max_windows: Optional[int] = None) -> dict:
    """Per-byte cross entropy (nats), bits per byte and perplexity of ``model`` on ``data``.

    ``data`` is cut into non-overlapping windows of ``seq_len + 1`` bytes (the first byte of each
    window is context only), so every predicted byte sees between 1 and ``seq_len`` bytes of
    context; with ``max_windows`` only that many windows, evenly spaced over ``data``, are
    scored (deterministic).
    """
    model = module_of(model)
    toks = to_tokens(data) if isinstance(data, (bytes, bytearray)) else np.asarray(data, np.int32)
    n_win = (len(toks) - 1) // seq_len
    if n_win < 1:
        raise ValueError(f"need more than {seq_len} bytes to evaluate, got {len(toks)}")
    idx = np.arange(n_win)
    if max_windows is not None and max_windows < n_win:
        idx = np.unique(np.linspace(0, n_win - 1, max_windows).round().astype(int))
    wins = np.stack([toks[i * seq_len:(i + 1) * seq_len + 1] for i in idx])
    total, count = 0.0, 0
    for s in range(0, len(wins), batch):
        w = mx.array(wins[s:s + batch])
        logits = model(w[:, :-1]).astype(mx.float32)
        ce = nn.losses.cross_entropy(logits, w[:, 1:], reduction="sum")
        total += ce.item()
        count += w.shape[0] * seq_len
    nats = total / count
    return {"loss_nats": nats, "bits_per_byte": nats / math.log(2), "ppl": math.exp(nats),
            "bytes": count, "seq_len": seq_len, "windows": int(len(wins))}


def _batches(toks: np.ndarray, seq_len: int, batch: int, rng: np.random.Generator):
    hi = len(toks) - seq_len - 1
    while True:
        idx = rng.integers(0, hi, size=batch)
        w = np.stack([toks[i:i + seq_len + 1] for i in idx])
        yield mx.array(w[:, :-1]), mx.array(w[:, 1:])


def make_schedule(lr: float, steps: int, warmup: int):
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``lr / 10``."""
    warmup = max(0, min(warmup, steps - 1))
    decay = optim.cosine_decay(lr, max(1, steps - warmup), end=lr / 10)
    if warmup == 0:
        return decay
    return optim.join_schedules([optim.linear_schedule(lr / 100, lr, warmup), decay], [warmup])


def save_model_dir(model: nn.Module, config: dict, out_dir: Union[str, Path],
                   dtype: mx.Dtype = mx.float16, extra: Optional[dict] = None) -> Path:
    """Save ``model`` as an mlx-lm model directory: ``config.json`` + ``model.safetensors``
    (parameters stored in ``dtype``; :func:`mlxlab.load_model` casts them back on load)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(dtype) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    cfg = {k: v for k, v in config.items() if k != "_source"}
    cfg["torch_dtype"] = {mx.float16: "float16", mx.bfloat16: "bfloat16"}.get(dtype, "float32")
    if extra:
        cfg["mlxlab"] = extra
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out


def train_tiny(config_name: Union[str, dict] = TARGET_PRESET, steps: int = 1500, seq_len: int = 256,
               batch: int = 16, lr: float = 3e-3, seed: int = 0, out_dir: Union[None, str, Path] = None,
               *, warmup: int = 100, weight_decay: float = 0.1, grad_clip: float = 1.0,
               log_path: Union[None, str, Path] = None, log_every: int = 25,
               eval_every: Optional[int] = None, eval_windows: int = 32,
               final_eval_windows: Optional[int] = 256, corpus: Optional[dict] = None,
               compile: bool = True, save_dtype: mx.Dtype = mx.float16,
               print_fn: Optional[Callable[[str], None]] = None) -> dict:
    """Train a byte-level model from scratch on the train split and evaluate it on held-out.

    ``config_name`` is a preset (``byte-target``, ``byte-draft``) or a config dict with
    ``vocab_size`` 256. AdamW (``weight_decay``), warm-up then cosine decay (:func:`make_schedule`),
    gradient clipping to ``grad_clip``; batches are ``batch`` random windows of ``seq_len`` bytes
    drawn with ``seed``. Every ``log_every`` steps a JSON line (step, loss, lr, tokens/s, wall)
    goes to ``log_path``; every ``eval_every`` steps the held-out loss on ``eval_windows``
    windows; at the end the held-out perplexity on ``final_eval_windows`` windows of ``seq_len``
    bytes (evenly spaced over the held-out split; None: all of it) is logged, for the float32 weights and for the weights as saved. If
    ``out_dir`` is given the model is saved there (:func:`save_model_dir`). Returns a summary
    dict (``model`` holds the trained module).
    """
    cfg = preset_config(config_name) if isinstance(config_name, str) else dict(config_name)
    name = config_name if isinstance(config_name, str) else cfg.get("name", "custom")
    if int(cfg["vocab_size"]) != VOCAB_SIZE:
        raise ValueError(f"byte-level training needs vocab_size {VOCAB_SIZE}, got {cfg['vocab_size']}")
    corpus = corpus if corpus is not None else load_corpus()
    train_toks, held = to_tokens(corpus["train"]), corpus["heldout"]
    say = print_fn or (lambda s: None)

    model = build_model(cfg, seed=seed)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    schedule = make_schedule(lr, steps, warmup)
    opt = optim.AdamW(learning_rate=schedule, weight_decay=weight_decay)
    value_and_grad = nn.value_and_grad(model, loss_fn)

    def step_fn(x, y):
        loss, grads = value_and_grad(model, x, y)
        if grad_clip:
            grads, _ = optim.clip_grad_norm(grads, grad_clip)
        opt.update(model, grads)
        return loss

    if compile:
        state = [model.state, opt.state]
        step_fn = partial(mx.compile, inputs=state, outputs=state)(step_fn)

    run_id = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    log_f = None
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log_f = open(log_path, "a")

    def log(rec):
        rec = {"run": run_id, "model": name, **rec}
        if log_f:
            log_f.write(json.dumps(rec) + "\n")
            log_f.flush()

    hyper = dict(steps=steps, seq_len=seq_len, batch=batch, lr=lr, warmup=warmup,
                 weight_decay=weight_decay, grad_clip=grad_clip, seed=seed, optimizer="AdamW",
                 schedule="linear warm-up from lr/100, cosine decay to lr/10", compiled=compile)
    log({"event": "start", "config": {k: v for k, v in cfg.items() if k != "_source"},
         "num_params": n_params, "hyper": hyper, "corpus": corpus["meta"]["sha256"],
         "python": python_version(), "mlx": mx.__version__})
    say(f"[train-tiny] {name}: {n_params / 1e6:.2f}M params, {steps} steps x {batch} x {seq_len} bytes")

    batches = _batches(train_toks, seq_len, batch, np.random.default_rng(seed))
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    t_last, tok_last = t0, 0
    losses = []
    evals = []

    def do_eval(step):
        model.eval()
        e = evaluate(model, held, seq_len=seq_len, max_windows=eval_windows)
        model.train()
        rec = {"event": "eval", "step": step, "heldout_loss": e["loss_nats"], "heldout_ppl": e["ppl"],
               "bytes": e["bytes"], "wall_s": time.perf_counter() - t0}
        log(rec)
        evals.append(rec)
        say(f"  step {step:5d}  held-out loss {e['loss_nats']:.3f} (ppl {e['ppl']:.2f})")

    for step in range(1, steps + 1):
        x, y = next(batches)
        loss = step_fn(x, y)
        mx.eval(loss, model.state, opt.state)
        losses.append(loss.item())
        if step % log_every == 0 or step == steps:
            now = time.perf_counter()
            toks = step * batch * seq_len
            rec = {"event": "train", "step": step, "loss": float(np.mean(losses[-log_every:])),
                   "lr": float(schedule(mx.array(step - 1))),
                   "tokens_per_s": (toks - tok_last) / (now - t_last), "wall_s": now - t0,
                   "cpu_s": time.process_time() - c0}
            t_last, tok_last = now, toks
            log(rec)
            say(f"  step {step:5d}  loss {rec['loss']:.3f}  lr {rec['lr']:.2e}  "
                f"{rec['tokens_per_s']:.0f} tok/s  {rec['wall_s']:.0f} s")
        if eval_every and step % eval_every == 0 and step != steps:
            do_eval(step)
    train_wall = time.perf_counter() - t0
    train_cpu = time.process_time() - c0
    model.eval()
    final = evaluate(model, held, seq_len=seq_len, max_windows=final_eval_windows)
    summary = {"name": name, "num_params": n_params, "train_wall_s": train_wall, "train_cpu_s": train_cpu,
               "tokens_seen": steps * batch * seq_len, "final_train_loss": float(np.mean(losses[-50:])),
               "heldout": final, "hyper": hyper}
    if out_dir is not None:
        extra = {"trained_by": "mlxlab.train.tiny.train_tiny", "hyper": hyper, "num_params": n_params,
                 "corpus_sha256": corpus["meta"]["sha256"], "python": python_version(),
                 "heldout_float32": final, "train_wall_s": round(train_wall, 1)}
        out = save_model_dir(model, cfg, out_dir, dtype=save_dtype, extra=extra)
        # evaluate the weights exactly as stored (rounded to save_dtype, run in float32)
        from mlxlab.engine.models import load_model
        saved = evaluate(load_model(out, dtype="float32"), held, seq_len=seq_len,
                         max_windows=final_eval_windows)
        extra["heldout_saved"] = saved
        save_model_dir(model, cfg, out_dir, dtype=save_dtype, extra=extra)
        summary["heldout_saved"] = saved
        summary["out_dir"] = str(out)
    log({"event": "final", "heldout_loss": final["loss_nats"], "heldout_ppl": final["ppl"],
         "heldout_bits_per_byte": final["bits_per_byte"], "heldout_bytes": final["bytes"],
         "heldout_saved_ppl": summary.get("heldout_saved", {}).get("ppl"),
         "train_wall_s": train_wall, "train_cpu_s": train_cpu, "tokens_seen": summary["tokens_seen"],
         "out_dir": _rel(summary.get("out_dir"))})
    say(f"[train-tiny] {name}: held-out {final['loss_nats']:.3f} nats/byte, ppl {final['ppl']:.2f}, "
        f"{final['bits_per_byte']:.3f} bits/byte ({train_wall:.0f} s training)")
    if log_f:
        log_f.close()
    summary["model"] = model
    return summary


def _rel(path: Optional[str]) -> Optional[str]:
    """``path`` relative to the project root when inside it (logs stay portable)."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(data_dir().resolve().parent))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- CLI


def add_train_arguments(parser) -> None:
    """Arguments of ``mlxlab train-tiny`` (the lead wires this into cli.py)."""
    parser.add_argument("--models", nargs="+", default=[TARGET_PRESET, DRAFT_PRESET],
                        help="presets to train (default: byte-target byte-draft)")
    parser.add_argument("--steps", type=int, default=None, help="default: per-model recipe")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=None,
                        help="weights folder (default: data/weights); each model goes to OUT/<preset>")
    parser.add_argument("--log", default=None, help="JSONL log (default: OUT/train_log.jsonl, appended)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-windows", type=int, default=256,
                        help="held-out windows of seq-len bytes scored at the end (0: all)")
    parser.add_argument("--no-verify", action="store_true",
                        help="train on this interpreter's stdlib even if it differs from data/corpus/split.json")
    parser.add_argument("--write-split", action="store_true",
                        help="(re)record data/corpus/split.json from this interpreter, then train")


def cli_train(args) -> int:
    if args.write_split:
        rec = write_split()
        print(f"[train-tiny] wrote {split_path()}: {rec['num_files']} files, {rec['bytes']} bytes")
    corpus = build_corpus(verify=not args.no_verify)
    print(f"[train-tiny] corpus ({corpus['meta']['python']}): train {len(corpus['train'])} bytes, "
          f"held-out {len(corpus['heldout'])} bytes", flush=True)
    out_root = Path(args.out) if args.out else weights_dir()
    log_path = Path(args.log) if args.log else out_root / "train_log.jsonl"
    for name in args.models:
        r = dict(DEFAULT_RECIPES.get(name, DEFAULT_RECIPES[TARGET_PRESET]))
        for k in ("steps", "seq_len", "batch", "lr", "warmup", "seed"):
            if getattr(args, k, None) is not None:
                r[k] = getattr(args, k)
        train_tiny(name, out_dir=out_root / name, log_path=log_path, corpus=corpus,
                   eval_every=args.eval_every, final_eval_windows=args.eval_windows or None, print_fn=lambda s: print(s, flush=True), **r)
    return 0
