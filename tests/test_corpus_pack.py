"""The corpus pack (the committed split carried to a machine with another Python) and the
manifest of trained weights that are not committed: round trips and the refusals that keep a
wrong or damaged corpus out of training."""

import hashlib
import json
import tarfile

import pytest

from mlxlab.train.corpus import CorpusMismatch, load_pack, pack_corpus
from mlxlab.train.manifest import weights_manifest


def synthetic_corpus():
    train, held = b"def f(x):\n    return x\n\x00" * 50, b"import os\n\x00" * 20
    meta = {"recipe_version": 1, "python": "CPython 3.11.7", "bytes": {"train": len(train), "heldout": len(held)},
            "sha256": {"train": hashlib.sha256(train).hexdigest(), "heldout": hashlib.sha256(held).hexdigest()}}
    return {"train": train, "heldout": held, "files": {"train": ["a.py"], "heldout": ["b.py"]}, "meta": meta}


def split_of(c, path):
    path.write_text(json.dumps(dict(c["meta"], files=c["files"])))
    return path


def test_a_pack_gives_back_the_corpus_it_was_made_from(tmp_path):
    c = synthetic_corpus()
    pack = pack_corpus(tmp_path / "corpus.tar.xz", corpus=c)
    got = load_pack(pack, split_file=split_of(c, tmp_path / "split.json"))
    assert got["train"] == c["train"] and got["heldout"] == c["heldout"]
    assert got["files"] == c["files"] and got["meta"] == c["meta"]
    with tarfile.open(pack, "r:xz") as tar:
        assert sorted(tar.getnames()) == ["heldout.bin", "meta.json", "train.bin"]


def test_a_pack_of_another_split_is_refused(tmp_path):
    c = synthetic_corpus()
    pack = pack_corpus(tmp_path / "corpus.tar.xz", corpus=c)
    other = dict(c, files={"train": ["a.py", "c.py"], "heldout": ["b.py"]})
    with pytest.raises(CorpusMismatch, match="not the one .* records"):
        load_pack(pack, split_file=split_of(other, tmp_path / "split.json"))
    with pytest.raises(CorpusMismatch, match="not the one"):
        load_pack(pack, split_file=tmp_path / "missing.json")


def test_a_damaged_or_foreign_pack_is_refused(tmp_path):
    c = synthetic_corpus()
    split = split_of(c, tmp_path / "split.json")
    bad = dict(c, train=c["train"][:-1] + b"!")  # bytes that do not match the sha256 the pack records
    with pytest.raises(CorpusMismatch, match="train.bin does not match"):
        load_pack(pack_corpus(tmp_path / "bad.tar.xz", corpus=bad), split_file=split)
    (tmp_path / "junk.tar.xz").write_bytes(b"not a tar")
    with pytest.raises(CorpusMismatch, match="is not a corpus pack"):
        load_pack(tmp_path / "junk.tar.xz", split_file=split)


def test_weights_manifest_identifies_a_model_folder(tmp_path):
    d = tmp_path / "byte-x"
    d.mkdir()
    blob = bytes(range(256)) * 4096
    (d / "model.safetensors").write_bytes(blob)
    (d / "config.json").write_text(json.dumps({"hidden_size": 8, "mlxlab": {"hyper": {"steps": 3}}}))
    m = weights_manifest([d])["byte-x"]
    assert m["sha256"] == hashlib.sha256(blob).hexdigest() and m["bytes"] == len(blob)
    assert m["trained"] == {"hyper": {"steps": 3}} and m["architecture"] == {"hidden_size": 8}
    with pytest.raises(FileNotFoundError, match="holds no model.safetensors"):
        weights_manifest([tmp_path])


def test_the_larger_pair_has_recipes_and_presets():
    from mlxlab.core.presets import preset_config
    from mlxlab.train.tiny import DEFAULT_RECIPES, GPU_RECIPES, TARGET_PRESET, recipe

    for name in GPU_RECIPES:
        cfg = preset_config(name)
        assert cfg["vocab_size"] == 256 and recipe(name) == GPU_RECIPES[name]
    assert preset_config("byte-target-large")["num_hidden_layers"] == 16
    assert recipe("byte-draft") == DEFAULT_RECIPES["byte-draft"] and recipe("other") == DEFAULT_RECIPES[TARGET_PRESET]
