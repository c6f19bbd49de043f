"""A model directory brings its own tokenizer and chat template to ``mlxlab serve`` (mlx-lm's
``load_tokenizer`` and streaming detokenizer). The directory here is the committed byte-level
model (data/weights/byte-target, vocabulary 256) with a byte-level BPE tokenizer written beside
it, so every id it generates is one the tokenizer can decode, and a multi-byte character split
across tokens must come out whole in the stream."""

import json
import shutil
from pathlib import Path

import pytest

from mlxlab import load_model, serve
from mlxlab.serve.text import HFTokenizer, tokenizer_for

openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")
WEIGHTS = Path(__file__).resolve().parents[1] / "data" / "weights" / "byte-target"
TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "


def _byte_level_bpe(path: Path) -> None:
    """A BPE with no merges over GPT-2's 256 byte symbols: token id = byte value."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "chat_template": TEMPLATE}))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("byte-model")
    for f in WEIGHTS.iterdir():
        shutil.copy(f, d)
    _byte_level_bpe(d)
    return d


def test_a_directory_uses_its_tokenizer_and_chat_template(model_dir):
    tok = tokenizer_for(str(model_dir))
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("héllo") == list("héllo".encode())
    ids = tok.chat_prompt([{"role": "user", "content": "hi"}])
    assert bytes(ids).decode() == "[user] hi\n[assistant] "
    d = tok.detokenizer()
    pieces = [d.add(t) for t in "aé€".encode()]
    assert "".join(pieces) + d.finish() == "aé€" and "\ufffd" not in "".join(pieces)


def test_serving_a_directory_streams_the_tokenizers_text(model_dir):
    model = load_model(str(model_dir), dtype="float32")
    srv = serve.build(model, model_name="byte", tokenizer=tokenizer_for(str(model_dir)), chunk_size=64)
    url, stop = serve.start_background(srv)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        chunks = list(client.chat.completions.create(model="byte", messages=[{"role": "user", "content": "def f"}],
                                                     max_tokens=24, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        ids = [t for c in chunks for t in (c.choices[0].token_ids or [])]
        assert len(ids) == 24 and text == bytes(ids).decode("utf-8", errors="replace")
    finally:
        stop()
