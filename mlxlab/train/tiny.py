"""Train tiny byte-level models on the stdlib corpus (``mlxlab train-tiny``).

Trains the ``byte-target`` and ``byte-draft`` presets (``data/models/byte-*.json``) from scratch
on the corpus of :mod:`mlxlab.train.corpus` with MLX's AdamW, and saves them as mlx-lm model
directories (``config.json`` + ``model.safetensors``; the committed pair is under ``data/weights/``) that
:func:`mlxlab.load_model` loads.
"""

from __future__ import annotations

import json
import math
import time
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

from mlxlab.core.paths import ROOT, data_dir
from mlxlab.core.presets import module_of, preset_config
from mlxlab.engine.models import load_model
from mlxlab.train.corpus import VOCAB_SIZE, load_corpus, python_version, to_tokens

TARGET_PRESET = "byte-target"
DRAFT_PRESET = "byte-draft"

# the committed run: `mlxlab train-tiny` with no model arguments trains both with these
DEFAULT_RECIPES: Dict[str, dict] = {
    TARGET_PRESET: dict(steps=400, seq_len=256, batch=8, lr=1e-3, warmup=40, seed=0),
    DRAFT_PRESET: dict(steps=400, seq_len=256, batch=8, lr=3e-3, warmup=40, seed=0),
}


# issue 20's larger pair, for a GPU (scripts/h200_spec_pair.sh): about 12M training bytes each, 1.4 passes over the
# train split; the drafts' learning rates are higher, as for the small pair
GPU_RECIPES: Dict[str, dict] = {
    "byte-target-large": dict(steps=1500, seq_len=256, batch=32, lr=6e-4, warmup=150, seed=0),
    "byte-draft-third": dict(steps=1500, seq_len=256, batch=32, lr=1.5e-3, warmup=150, seed=0),
    "byte-draft-tenth": dict(steps=1500, seq_len=256, batch=32, lr=3e-3, warmup=150, seed=0),
}


def recipe(name: str) -> dict:
    """The training recipe of preset ``name`` (:data:`DEFAULT_RECIPES`, :data:`GPU_RECIPES`; the
    target's for any other)."""
    return dict({**DEFAULT_RECIPES, **GPU_RECIPES}.get(name, DEFAULT_RECIPES[TARGET_PRESET]))


def weights_dir() -> Path:
    """Where the trained pair lives (``data/weights/<preset>``)."""
    return data_dir() / "weights"


def trained_weights_dir(save: bool = False) -> Path:
    """Where ``mlxlab train-tiny`` writes: with ``save`` the committed pair's folder
    (:func:`weights_dir`, which ``bench speculation`` loads), else ``build/weights/`` (ignored by
    git), so a trial training never replaces the committed weights."""
    return weights_dir() if save else ROOT / "build" / "weights"


def build_model(config: Union[str, dict], seed: int = 0) -> nn.Module:
    """A freshly initialised float32 mlx-lm model (mlx's default init) for a preset or config."""
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


class _TrainLog:
    """The JSONL training log: one record per event, tagged with the run and the model."""

    def __init__(self, path: Union[None, str, Path], name: str):
        self.run_id, self.name, self.f = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}", name, None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.f = open(path, "a")

    def __call__(self, rec: dict) -> None:
        if self.f:
            self.f.write(json.dumps({"run": self.run_id, "model": self.name, **rec}) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f:
            self.f.close()


def _step_function(model: nn.Module, opt, grad_clip: float, compile: bool) -> Callable:
    """One optimizer step on a batch, returning the loss (compiled with the model and optimizer
    state as implicit inputs and outputs when ``compile``)."""
    value_and_grad = nn.value_and_grad(model, loss_fn)

    def step_fn(x, y):
        loss, grads = value_and_grad(model, x, y)
        if grad_clip:
            grads, _ = optim.clip_grad_norm(grads, grad_clip)
        opt.update(model, grads)
        return loss

    if not compile:
        return step_fn
    state = [model.state, opt.state]
    return partial(mx.compile, inputs=state, outputs=state)(step_fn)


def _train_loop(model, opt, step_fn, schedule, train_toks, held, *, steps, seq_len, batch, seed,
                log_every, eval_every, eval_windows, log, say) -> dict:
    """Run ``steps`` optimizer steps on random windows, logging the mean loss every
    ``log_every`` steps and the held-out loss every ``eval_every``. Returns the losses and the
    wall and CPU seconds."""
    batches = _batches(train_toks, seq_len, batch, np.random.default_rng(seed))
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    t_last, tok_last = t0, 0
    losses = []
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
            model.eval()
            e = evaluate(model, held, seq_len=seq_len, max_windows=eval_windows)
            model.train()
            log({"event": "eval", "step": step, "heldout_loss": e["loss_nats"], "heldout_ppl": e["ppl"],
                 "bytes": e["bytes"], "wall_s": time.perf_counter() - t0})
            say(f"  step {step:5d}  held-out loss {e['loss_nats']:.3f} (ppl {e['ppl']:.2f})")
    model.eval()
    return {"losses": losses, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def _save_and_check(model, cfg: dict, out_dir, save_dtype, extra: dict, held, seq_len: int,
                    eval_windows: Optional[int]) -> tuple:
    """Save ``model`` to ``out_dir``, then evaluate the weights exactly as stored (rounded to
    ``save_dtype``, run in float32) and save again with that result in the config. Returns
    ``(out_dir, held-out result of the saved weights)``."""
    out = save_model_dir(model, cfg, out_dir, dtype=save_dtype, extra=extra)
    saved = evaluate(load_model(out, dtype="float32"), held, seq_len=seq_len, max_windows=eval_windows)
    save_model_dir(model, cfg, out_dir, dtype=save_dtype, extra={**extra, "heldout_saved": saved})
    return out, saved


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
    bytes (evenly spaced over the held-out split; None: all of it) is logged, for the float32
    weights and for the weights as saved. If ``out_dir`` is given the model is saved there
    (:func:`save_model_dir`). Returns a summary dict (``model`` holds the trained module).
    """
    cfg = preset_config(config_name) if isinstance(config_name, str) else dict(config_name)
    name = config_name if isinstance(config_name, str) else cfg.get("name", "custom")
    if int(cfg["vocab_size"]) != VOCAB_SIZE:
        raise ValueError(f"byte-level training needs vocab_size {VOCAB_SIZE}, got {cfg['vocab_size']}")
    corpus = corpus if corpus is not None else load_corpus()
    held = corpus["heldout"]
    say = print_fn or (lambda s: None)

    model = build_model(cfg, seed=seed)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    schedule = make_schedule(lr, steps, warmup)
    opt = optim.AdamW(learning_rate=schedule, weight_decay=weight_decay)
    hyper = dict(steps=steps, seq_len=seq_len, batch=batch, lr=lr, warmup=warmup,
                 weight_decay=weight_decay, grad_clip=grad_clip, seed=seed, optimizer="AdamW",
                 schedule="linear warm-up from lr/100, cosine decay to lr/10", compiled=compile)
    log = _TrainLog(log_path, name)
    log({"event": "start", "config": {k: v for k, v in cfg.items() if k != "_source"},
         "num_params": n_params, "hyper": hyper, "corpus": corpus["meta"]["sha256"],
         "python": python_version(), "mlx": mx.__version__})
    say(f"[train-tiny] {name}: {n_params / 1e6:.2f}M params, {steps} steps x {batch} x {seq_len} bytes")

    run = _train_loop(model, opt, _step_function(model, opt, grad_clip, compile), schedule,
                      to_tokens(corpus["train"]), held, steps=steps, seq_len=seq_len, batch=batch, seed=seed,
                      log_every=log_every, eval_every=eval_every, eval_windows=eval_windows, log=log, say=say)
    final = evaluate(model, held, seq_len=seq_len, max_windows=final_eval_windows)
    summary = {"name": name, "num_params": n_params, "train_wall_s": run["wall_s"], "train_cpu_s": run["cpu_s"],
               "tokens_seen": steps * batch * seq_len, "final_train_loss": float(np.mean(run["losses"][-50:])),
               "heldout": final, "hyper": hyper}
    if out_dir is not None:
        extra = {"trained_by": f"{train_tiny.__module__}.{train_tiny.__qualname__}",  # the trainer's dotted name
                 "hyper": hyper, "num_params": n_params,
                 "corpus_sha256": corpus["meta"]["sha256"], "python": python_version(),
                 "corpus_python": corpus["meta"].get("python"),  # the split's, which a pack carries elsewhere
                 "heldout_float32": final, "train_wall_s": round(run["wall_s"], 1)}
        out, summary["heldout_saved"] = _save_and_check(model, cfg, out_dir, save_dtype, extra, held, seq_len,
                                                        final_eval_windows)
        summary["out_dir"] = str(out)
    log({"event": "final", "heldout_loss": final["loss_nats"], "heldout_ppl": final["ppl"],
         "heldout_bits_per_byte": final["bits_per_byte"], "heldout_bytes": final["bytes"],
         "heldout_saved_ppl": summary.get("heldout_saved", {}).get("ppl"),
         "train_wall_s": run["wall_s"], "train_cpu_s": run["cpu_s"], "tokens_seen": summary["tokens_seen"],
         "out_dir": _rel(summary.get("out_dir"))})
    say(f"[train-tiny] {name}: held-out {final['loss_nats']:.3f} nats/byte, ppl {final['ppl']:.2f}, "
        f"{final['bits_per_byte']:.3f} bits/byte ({run['wall_s']:.0f} s training)")
    log.close()
    summary["model"] = model
    return summary


def _rel(path: Optional[str]) -> Optional[str]:
    """``path`` relative to the project root when inside it (logs stay portable)."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return str(path)
