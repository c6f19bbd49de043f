"""Tests for mlxlab.train: the offline corpus and its split (corpus), training and saving (tiny),
the train-tiny command's arguments, the committed weights and their held-out perplexity."""

import argparse
import hashlib
import json

import mlx.core as mx
import numpy as np
import pytest

from mlxlab.core.presets import available_presets, preset_config
from mlxlab.engine.models import load_model
from mlxlab.cli.studies import add_train_arguments, cli_train
from mlxlab.train.corpus import (
    SEPARATOR, CorpusMismatch, build_corpus, heldout_prompts, is_heldout, list_corpus_files,
    python_version, split_path, write_split,
)
from mlxlab.train.tiny import DRAFT_PRESET, TARGET_PRESET, evaluate, train_tiny, weights_dir

# stated bounds on held-out perplexity per byte of the committed weights (measured values are
# in data/weights/*/config.json and the training log; these leave room for other Python versions)
# (CPython 3.11.7, all 1,662 held-out windows of 256 bytes: target 6.53, draft 8.54; on the 48
# windows tested here: 6.32 and 8.32)
PPL_BOUND = {TARGET_PRESET: 7.4, DRAFT_PRESET: 9.5}


def _fake_stdlib(root):
    files = {
        "a.py": b"import os\nprint(os.sep)\n",
        "pkg/__init__.py": b"",
        "pkg/mod.py": b"def f(x):\n    return x + 1\n" * 20,
        "pkg/test/test_mod.py": b"assert True\n",        # excluded folder
        "site-packages/x.py": b"x = 1\n",                # excluded folder
        "zz.py": b"class Z:\n    pass\n" * 50,
        "notes.txt": b"not python\n",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    # enough files that both splits are non-empty
    for i in range(60):
        (root / "many").mkdir(exist_ok=True)
        (root / "many" / f"m{i:02d}.py").write_bytes(f"VALUE_{i} = {i}\n".encode() * 10)
    return root


def test_corpus_listing_split_deterministic_and_disjoint(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    files = list_corpus_files(root)
    assert files == sorted(files) == list_corpus_files(root)
    assert "pkg/mod.py" in files and "a.py" in files
    assert not any("test/" in f or "site-packages" in f or not f.endswith(".py") for f in files)
    c = build_corpus(root, verify=False)
    tr, he = c["files"]["train"], c["files"]["heldout"]
    assert tr and he and not set(tr) & set(he) and sorted(tr + he) == files
    assert all(is_heldout(f) for f in he) and not any(is_heldout(f) for f in tr)
    assert c["train"].count(SEPARATOR) == len(tr) and c["heldout"].count(SEPARATOR) == len(he)
    assert c["meta"]["sha256"]["train"] == hashlib.sha256(c["train"]).hexdigest()
    assert build_corpus(root, verify=False)["meta"] == c["meta"]
    # the split rule depends only on the path
    h = int(hashlib.sha256(b"pkg/mod.py").hexdigest()[:8], 16)
    assert is_heldout("pkg/mod.py") == (h % 20 == 0)
    # the byte cap keeps a sorted prefix
    capped = list_corpus_files(root, max_bytes=200)
    assert capped == files[:len(capped)] and len(capped) < len(files)


def test_corpus_verification(tmp_path):
    root = _fake_stdlib(tmp_path / "lib")
    split = tmp_path / "split.json"
    rec = write_split(split, root=root)
    assert rec["python"] == python_version() and set(rec["files"]) == {"train", "heldout"}
    build_corpus(root, verify=True, split_file=split)            # passes
    # a modified file: same file list, different bytes
    (root / "zz.py").write_bytes(b"class Z:\n    pass\n" * 51)
    with pytest.raises(CorpusMismatch, match="different bytes"):
        build_corpus(root, verify=True, split_file=split)
    # a record made on another Python: the message says so
    rec["python"] = "CPython 2.7.18"
    split.write_text(json.dumps(rec))
    with pytest.raises(CorpusMismatch, match="CPython 2.7.18"):
        build_corpus(root, verify=True, split_file=split)
    with pytest.raises(CorpusMismatch, match="no recorded split"):
        build_corpus(root, verify=True, split_file=tmp_path / "missing.json")


def test_recorded_split_matches_this_interpreter():
    rec = json.loads(split_path().read_text())
    assert rec["num_files"]["heldout"] == len(rec["files"]["heldout"]) > 0
    assert not set(rec["files"]["train"]) & set(rec["files"]["heldout"])
    assert all(is_heldout(f) for f in rec["files"]["heldout"])
    if rec["python"] != python_version():
        with pytest.raises(CorpusMismatch, match=rec["python"]):
            build_corpus(verify=True)
        pytest.skip(f"split recorded on {rec['python']}, running {python_version()}")
    c = build_corpus(verify=True)
    assert len(c["train"]) == rec["bytes"]["train"] and len(c["heldout"]) == rec["bytes"]["heldout"]


def test_presets_are_byte_level():
    assert {TARGET_PRESET, DRAFT_PRESET} <= set(available_presets())
    for name in (TARGET_PRESET, DRAFT_PRESET):
        cfg = preset_config(name)
        assert cfg["vocab_size"] == 256
        assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64   # KV quantization group 64
    assert preset_config(DRAFT_PRESET)["num_hidden_layers"] < preset_config(TARGET_PRESET)["num_hidden_layers"]


def _small_corpus():
    text = b"".join(b"def f%d(x):\n    return x * %d\n\n" % (i, i % 7) for i in range(400))
    return {"train": text, "heldout": text[:4000],
            "meta": {"sha256": {"train": "t", "heldout": "h"}}}


def test_short_training_reduces_loss_and_saves(tmp_path):
    cfg = dict(preset_config(DRAFT_PRESET), hidden_size=64, num_attention_heads=1,
               num_key_value_heads=1, num_hidden_layers=1, intermediate_size=128)
    log = tmp_path / "log.jsonl"
    r = train_tiny(cfg, steps=30, seq_len=64, batch=8, lr=1e-2, warmup=3, seed=0,
                   out_dir=tmp_path / "m", log_path=log, log_every=5, corpus=_small_corpus(),
                   final_eval_windows=16)
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    losses = [x["loss"] for x in recs if x["event"] == "train"]
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 1.0 and losses[0] > 4.0
    assert recs[0]["event"] == "start" and recs[-1]["event"] == "final"
    assert r["heldout"]["loss_nats"] < 4.0
    # the saved directory loads through mlxlab.load_model with the same predictions
    m = load_model(tmp_path / "m", dtype="float32")
    x = mx.array([list(b"def f1(x):\n    ret")])
    a, b = m.module(x), r["model"](x)
    assert mx.allclose(a, b, atol=0.05).item()
    assert abs(r["heldout_saved"]["loss_nats"] - r["heldout"]["loss_nats"]) < 0.02
    # the saved config names the trainer by its real dotted name
    assert m.config["mlxlab"]["trained_by"] == f"{train_tiny.__module__}.{train_tiny.__qualname__}" \
        == "mlxlab.train.tiny.train_tiny"


def test_cli_arguments(tmp_path):
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    a = p.parse_args([])
    assert a.models == [TARGET_PRESET, DRAFT_PRESET] and a.steps is None
    a = p.parse_args(["--models", DRAFT_PRESET, "--steps", "7", "--out", str(tmp_path)])
    assert a.models == [DRAFT_PRESET] and a.steps == 7 and a.out == str(tmp_path)


# ----------------------------------------------------------------------------- committed weights


@pytest.fixture(scope="module")
def heldout():
    try:
        return build_corpus(verify=True)["heldout"]
    except CorpusMismatch:
        # held-out files are chosen by path: the same files of this interpreter's version
        return build_corpus(verify=False)["heldout"]


@pytest.mark.parametrize("name", [TARGET_PRESET, DRAFT_PRESET])
def test_committed_weights_load_and_predict(name, heldout):
    d = weights_dir() / name
    if not (d / "model.safetensors").is_file():
        pytest.skip("trained weights not present")
    assert (d / "model.safetensors").stat().st_size < 6 * 2 ** 20
    m = load_model(d)
    assert m.vocab_size == 256 and m.dtype == mx.float32
    trained_by = m.config["mlxlab"]["trained_by"]  # the trainer's dotted name when the weights were made
    assert trained_by.startswith("mlxlab.train") and trained_by.endswith(".train_tiny")
    e = evaluate(m, heldout, seq_len=256, max_windows=48)
    assert e["ppl"] < PPL_BOUND[name], e


def test_committed_target_beats_draft(heldout):
    t, d = weights_dir() / TARGET_PRESET, weights_dir() / DRAFT_PRESET
    if not (t / "model.safetensors").is_file():
        pytest.skip("trained weights not present")
    et = evaluate(load_model(t), heldout, max_windows=48)
    ed = evaluate(load_model(d), heldout, max_windows=48)
    assert et["loss_nats"] < ed["loss_nats"]


def test_training_log_committed():
    path = weights_dir() / "train_log.jsonl"
    if not path.is_file():
        pytest.skip("no training log")
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    finals = {r["model"]: r for r in recs if r["event"] == "final"}
    assert {TARGET_PRESET, DRAFT_PRESET} <= set(finals)
    for r in finals.values():
        assert r["heldout_loss"] < np.log(256)
    assert any(r["event"] == "train" and "tokens_per_s" in r for r in recs)


def test_heldout_prompts(heldout):
    ps = heldout_prompts(4, length=50, seed=3, data=heldout)
    assert len(ps) == 4 and all(len(p) == 50 and 0 not in p for p in ps)
    assert ps == heldout_prompts(4, length=50, seed=3, data=heldout)
