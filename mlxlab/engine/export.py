"""A model directory any mlx-lm tool loads, offline: a preset's seeded random weights (quantized
if asked) saved with mlx-lm's own writers, and a tokenizer in which each ASCII character is one
token (``mlxlab export-model``).

``mlx_lm.server``, ``mlx_lm.generate`` and ``mlxlab serve`` then load the same weights and the same
tokenizer from one folder, with no download, so a comparison over HTTP runs on identical models;
and a document of N ASCII characters is N tokens on every server, so a workload's prompt lengths
are the same on both sides. Throughput does not depend on the weights' values; the text the
random model writes is noise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

from mlxlab.engine.models import load_model

#: the characters of the tokenizer: ASCII, id = code point (0 stands for anything else)
ASCII = 128


def _bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table (what a ByteLevel tokenizer stores bytes as)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def char_tokenizer_files(out: Path, vocab_size: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for a character tokenizer (Hugging
    Face ``tokenizers``, loaded by ``transformers.AutoTokenizer``, hence by mlx-lm): every ASCII
    character one token, its code point the id, and ``</s>`` (end of sequence) the first id past
    ASCII. It is a byte-level BPE with no merges, declared as a Llama-style fast tokenizer: that
    makes transformers load the file as it is, and a loader that rebuilds the pipeline for the
    config's model type (Qwen2's byte-level split) still gets one token per character."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if vocab_size <= ASCII:
        raise ValueError(f"a character tokenizer needs a vocabulary over {ASCII} ids; this model has {vocab_size}")
    b2u = _bytes_to_unicode()
    vocab = {b2u[i]: i for i in range(ASCII)}
    vocab["</s>"] = ASCII
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["</s>"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizerFast", "eos_token": "</s>", "bos_token": None,
        "add_bos_token": False, "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}, indent=1) + "\n")


def export_model(preset: str, out: Union[str, Path], *, bits: Optional[int] = None, dtype: Optional[str] = None,
                 seed: int = 0, group_size: int = 64, overwrite: bool = False) -> Path:
    """Save ``preset`` (seeded random weights, :func:`mlxlab.engine.models.load_model`) as an mlx-lm
    model directory at ``out``: ``model.safetensors`` and ``config.json`` by mlx-lm's
    ``save_model``/``save_config`` (with its ``quantization`` when ``bits`` is given) and the
    character tokenizer (:func:`char_tokenizer_files`). Refuses a non-empty ``out`` unless
    ``overwrite``. Returns the directory."""
    from mlx_lm.utils import save_config, save_model

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} is not empty: choose a new folder or pass --overwrite")
    if Path(preset).is_dir():
        raise ValueError(f"{preset} is already a model directory: export builds a preset (see available_presets())")
    model = load_model(preset, bits=bits, dtype=dtype, seed=seed, group_size=group_size)
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model.module)
    config = dict(model.config)
    config["mlxlab"] = {"preset": preset, "seed": seed, "weights": "seeded random (mlxlab.engine.models.load_model)",
                        "tokenizer": "one token per ASCII character (mlxlab.engine.export)"}
    save_config(config, out / "config.json")
    vocab = int(config.get("vocab_size") or model.module.args.vocab_size)
    char_tokenizer_files(out, vocab)
    return out
