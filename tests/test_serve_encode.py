"""Long prompts tokenized in a worker process (mlxlab.serve.encode) give the ids the server's own
tokenizer gives, a preset's byte tokenizer never starts a process, and bad settings are refused."""

import asyncio

import pytest

from mlxlab.serve.encode import Encoder
from mlxlab.serve.text import ByteTokenizer, tokenizer_for


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from mlxlab.engine.export import export_model

    out = tmp_path_factory.mktemp("m") / "tiny"
    export_model("tiny", out, dtype="float32")
    return out


def test_a_byte_tokenizer_stays_in_process_and_a_negative_count_is_refused():
    enc = Encoder(ByteTokenizer(), processes=2)
    assert enc.processes == 0
    enc.start()
    assert asyncio.run(enc.encode("x" * 5000)) == [120] * 5000
    with pytest.raises(ValueError, match="0 or more"):
        Encoder(ByteTokenizer(), processes=-1)


def test_long_prompts_from_the_worker_process_equal_the_tokenizers_own(model_dir):
    tok = tokenizer_for(str(model_dir))
    enc = Encoder(tok, processes=1, long_chars=100)
    enc.start()
    try:
        text = "the quick brown fox " * 40
        assert asyncio.run(enc.encode(text)) == tok.encode(text)
        assert asyncio.run(enc.encode("short")) == tok.encode("short")  # under long_chars: here
        msgs = [{"role": "user", "content": "hello " * 50}]
        assert asyncio.run(enc.chat_prompt(msgs)) == tok.chat_prompt(msgs)
    finally:
        enc.stop()


def test_the_server_counts_the_same_prompt_tokens_either_way(model_dir):
    import httpx

    from mlxlab import load_model, serve

    model = load_model(str(model_dir))
    counts = []
    for processes in (0, 1):
        server = serve.build(model, model_name="tiny", tokenizer=tokenizer_for(str(model_dir)), chunk_size=256,
                             tokenizer_processes=processes)
        url, stop = serve.start_background(server, timeout_s=120)
        try:
            r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "abc " * 800, "max_tokens": 2,
                                                          "temperature": 0}, timeout=120)
            assert r.status_code == 200, r.text
            counts.append((r.json()["usage"]["prompt_tokens"], r.json()["choices"][0]["token_ids"]))
        finally:
            stop()
    assert counts[0] == counts[1] and counts[0][0] == 3200


def test_mlxlab_serve_starts_a_tokenizer_process_by_default_only_where_cores_are_spare(monkeypatch):
    from mlxlab.serve import encode

    assert [encode.auto_processes(n) for n in (1, 2, 3, 4, 16)] == [0, 0, 0, 1, 1]
    monkeypatch.delattr(encode.os, "sched_getaffinity", raising=False)  # a Mac: the core count
    monkeypatch.setattr(encode.os, "cpu_count", lambda: None)  # unknown: as one core
    assert encode.auto_processes() == 0
    monkeypatch.setattr(encode.os, "cpu_count", lambda: 16)
    assert encode.auto_processes() == 1
    monkeypatch.setattr(encode.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # 2 of 16 allowed
    assert encode.auto_processes() == 0
