"""``mlxlab export-model``: a preset as an mlx-lm model directory any mlx-lm tool loads offline,
with the same weights (greedy tokens equal to the preset's) and a tokenizer in which every ASCII
character is one token."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxlab.cli import main
from mlxlab.engine.export import ASCII, char_tokenizer_files
from mlxlab.engine.models import load_model

TEXT = "Hello,\tworld!\n  two  spaces ~ end"


def test_an_exported_preset_loads_in_mlx_lm_with_its_weights_and_a_character_tokenizer(tmp_path, tiny, capsys):
    from mlx_lm import load

    out = tmp_path / "tiny"
    assert main(["export-model", "tiny", "--dtype", "float32", "--out", str(out)]) == 0
    assert "mlx_lm.server --model" in capsys.readouterr().out
    module, tok = load(str(out))
    ids = tok.encode(TEXT)
    assert ids == [ord(c) for c in TEXT] and tok.decode(ids) == TEXT  # one token per character, both ways
    assert tok.eos_token_id == ASCII
    prompt = mx.array(ids)
    mine = [int(t) for (t, _), _ in zip(generate_step(prompt, tiny.module, max_tokens=10), range(10))]
    theirs = [int(t) for (t, _), _ in zip(generate_step(prompt, module, max_tokens=10), range(10))]
    assert mine == theirs  # the same seeded weights
    assert load_model(str(out)).config["mlxlab"]["preset"] == "tiny"


def test_export_refuses_a_folder_with_files_and_a_model_too_small_for_the_characters(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    assert main(["export-model", "tiny", "--out", str(tmp_path / "x")]) == 2
    assert "is not empty" in capsys.readouterr().err and (tmp_path / "x" / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="vocabulary over 128"):
        char_tokenizer_files(tmp_path, 100)
