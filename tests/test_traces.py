"""Traces (mlxlab.core.traces): the three formats read into one shape, bad traces refused with the
line and what to fix, shared prefixes kept through block hashes into the replayed prompts, and
``mlxlab serve --record`` writing a trace the reader takes back. The sample files are written here,
in each format's documented layout."""

import json

import httpx
import pytest

from mlxlab.core.traces import (MOONCAKE_BLOCK, TraceError, TraceRequest, block_hashes, prepare_trace, read_trace,
                                scale_outputs, scale_trace, to_arrivals, write_trace)
from mlxlab.core.workload import TraceWorkload


def _mooncake(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_lines_keep_their_times_lengths_and_shared_blocks(tmp_path):
    p = _mooncake(tmp_path / "mc.jsonl", [
        {"timestamp": 1000, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1000, "input_length": 600, "output_length": 0, "hash_ids": [0, 2]},
        {"timestamp": 3500, "input_length": 100, "output_length": 3, "hash_ids": [7]}])
    t = read_trace(p)
    assert t.format == "mooncake" and [r.arrival_s for r in t.requests] == [0.0, 0.0, 2.5]
    assert [r.prompt_tokens for r in t.requests] == [700, 600, 100]
    assert [r.max_tokens for r in t.requests] == [5, 1, 3] and "1 request(s) asked for 0 tokens" in t.notes[0]
    a = to_arrivals(t, vocab_size=1000)
    assert [len(x.prompt) for x in a] == [700, 600, 100]
    assert a[0].prompt[:MOONCAKE_BLOCK] == a[1].prompt[:MOONCAKE_BLOCK]  # hash id 0: the same block
    assert a[0].prompt[MOONCAKE_BLOCK:] != a[1].prompt[MOONCAKE_BLOCK:600]  # ids 1 and 2 differ
    assert all(1 <= x < 1000 for r in a for x in r.prompt)
    assert to_arrivals(t, vocab_size=1000)[2].prompt == a[2].prompt  # the same seed, the same tokens
    w = TraceWorkload(a)
    assert w.total_requests == 3 and w.config()["tenants"] == {"trace": 3}


def test_azure_csv_times_with_seven_fractional_digits_and_the_chat_batch_split(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.0805900,4096,20\n"
                 "2023-11-16 18:16:46.6805900,1200,1\n")
    t = read_trace(p, split_tokens=2000)
    assert t.format == "azure"
    assert [round(r.arrival_s, 6) for r in t.requests] == [0.0, 3.4, 60.0]
    assert [r.tenant for r in t.requests] == ["chat", "batch", "chat"]
    assert t.summary()["tenants"] == {"chat": 2, "batch": 1} and t.summary()["requests_with_block_hashes"] == 0
    s = scale_trace(t, time_scale=0.5, length_scale=0.25)
    assert [r.prompt_tokens for r in s.requests] == [94, 1024, 300] and s.requests[2].arrival_s == 30.0


def test_output_scale_gives_one_tenant_more_tokens_and_leaves_the_rest_alone():
    t = read_trace("data/traces/samples/seed001_scene_tiny.jsonl")
    s = scale_outputs(t, {"chat": 4})
    for a, b in zip(t.requests, s.requests):
        assert (b.arrival_s, b.prompt_tokens, b.block_hashes) == (a.arrival_s, a.prompt_tokens, a.block_hashes)
        assert b.max_tokens == (a.max_tokens * 4 if a.tenant == "chat" else a.max_tokens)
    assert any(r.tenant == "batch" for r in s.requests) and s.notes[-1] == "outputs scaled: chat x4"
    assert [r.max_tokens for r in scale_outputs(t, {"chat": 0.01}).requests if r.tenant == "chat"][0] == 1
    with pytest.raises(ValueError, match=r"tenant 'chats': the trace's tenants are \['batch', 'chat'\]"):
        scale_outputs(t, {"chats": 2})
    with pytest.raises(ValueError, match="finite number above 0"):
        scale_outputs(t, {"chat": -1})


def test_prepare_trace_scales_lengths_then_outputs_then_cuts_as_tune_replays_it():
    path = "data/traces/samples/seed001_scene_tiny.jsonl"
    t = read_trace(path)
    p = prepare_trace(path, time_scale=2.0, length_scale=0.5, output_scale={"chat": 3}, max_requests=5)
    assert len(p.requests) == 5 and p.notes[-2:] == ["scaled: arrival gaps x2, lengths x0.5", "outputs scaled: chat x3"]
    for a, b in zip(t.requests, p.requests):
        assert b.arrival_s == pytest.approx(a.arrival_s * 2) and b.prompt_tokens == max(1, round(a.prompt_tokens * 0.5))
        half = max(1, round(a.max_tokens * 0.5))  # the length scale first, the chat's factor on what it left
        assert b.max_tokens == (max(1, round(half * 3)) if a.tenant == "chat" else half)
    assert prepare_trace(path).requests == t.requests  # no scale: the trace as read


@pytest.mark.parametrize("body,line,words", [
    ("", None, "empty"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 1}\n{"timestamp": 2, "input_length": 10, '
     '"output_length": 1}\n', 2, "goes backwards"),
    ('{"timestamp": 0, "input_length": -4, "output_length": 1}\n', 1, "at least 1"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1.5}\n', 1, "whole number"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1}\n{not json\n', 2, "not JSON"),
    ('{"timestamp": 0, "input_length": 5000, "output_length": 8}\n', 1, "exceed the model's context of 4096"),
    ('{"timestamp": 0, "output_length": 8}\n', None, "neither an mlxlab record"),
])
def test_a_bad_trace_is_refused_with_its_line_and_what_to_fix(tmp_path, body, line, words):
    p = tmp_path / "bad.jsonl"
    p.write_text(body)
    with pytest.raises(TraceError, match=words) as e:
        read_trace(p, max_context=4096)
    assert e.value.line == line or (line is None and e.value.line in (None, 1))
    if line:
        assert f"line {line}" in str(e.value)


def test_an_azure_csv_with_another_header_or_a_bad_time_is_refused(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(TraceError, match="header has ContextTokens"):
        read_trace(p)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n")
    with pytest.raises(TraceError, match="line 2.*not a date"):
        read_trace(p)


def test_block_hashes_chain_so_equal_hashes_mean_equal_prefixes():
    a = list(range(1, 1001))
    b = a[:512] + [7] * 488
    ha, hb = block_hashes(a, 256), block_hashes(b, 256)
    assert len(ha) == 3 and ha[:2] == hb[:2] and ha[2] != hb[2]
    c = [9] + a[1:]  # a different first block changes every hash after it
    assert all(x != y for x, y in zip(block_hashes(c, 256), ha))
    assert all(0 <= h < 2 ** 63 for h in ha)


def test_a_recorded_trace_replays_what_each_request_produced_with_its_shared_prefix(tmp_path):
    reqs = [TraceRequest(101.5, "batch", 300, 8, (11,), 256, 8),  # finished first: written first
            TraceRequest(100.0, "chat", 600, 64, (11, 12), 256, 20, 0.1, 0.02, 0.05)]
    t = read_trace(write_trace(tmp_path / "rec.jsonl", reqs))
    assert t.format == "mlxlab" and [r.arrival_s for r in t.requests] == [0.0, 1.5]  # sorted by arrival
    assert [r.tenant for r in t.requests] == ["chat", "batch"]
    assert t.requests[0].max_tokens == 20  # the tokens it produced, not the 64 it allowed
    a = to_arrivals(t, vocab_size=50)
    assert a[0].prompt[:256] == a[1].prompt[:256] and a[0].prompt[256:300] != a[1].prompt[256:300]
    assert [r.max_tokens for r in t.requests] == [20, 8]


def test_serve_record_writes_a_line_per_finished_request_that_read_trace_takes(tiny, tmp_path):
    from mlxlab import serve

    path = tmp_path / "rec" / "trace.jsonl"
    srv = serve.build(tiny, model_name="tiny", chunk_size=64, record=str(path))
    url, stop = serve.start_background(srv)
    try:
        prompt = "x" * 600
        for tenant, n in (("chat", 5), ("batch", 3)):
            r = httpx.post(url + "/v1/completions", headers={"X-Tenant": tenant},
                           json={"model": "tiny", "prompt": prompt, "max_tokens": n}, timeout=120)
            assert r.status_code == 200
        assert httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "", "max_tokens": 3}).status_code == 400
    finally:
        stop()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["tenant"] for x in lines] == ["chat", "batch"]  # the refused request left no line
    assert [x["produced_tokens"] for x in lines] == [5, 3] and lines[0]["ttft_s"] > 0
    assert lines[0]["prompt_tokens"] >= 600 and len(lines[0]["block_hashes"]) == lines[0]["prompt_tokens"] // 256
    assert lines[0]["block_hashes"] == lines[1]["block_hashes"]  # the same prompt, the same blocks
    assert "x" * 20 not in path.read_text()  # hashes, never the text
    t = read_trace(path)
    assert t.format == "mlxlab" and t.tenants() == {"chat": 1, "batch": 1} and t.requests[0].arrival_s == 0.0


def test_a_bare_trace_name_reads_the_committed_sample_and_a_missing_one_lists_them(tmp_path, monkeypatch):
    from mlxlab.core.traces import samples_dir

    monkeypatch.chdir(tmp_path)  # the stored command lines name the sample alone; they rerun from any folder
    full = samples_dir() / "seed001_scene_tiny.jsonl"
    assert read_trace("seed001_scene_tiny.jsonl").requests == read_trace(full).requests
    with pytest.raises(TraceError, match="nor a committed sample.*seed001_scene_tiny.jsonl"):
        read_trace("no_such_trace.jsonl")
    with pytest.raises(TraceError, match="no such file$"):  # a path with a folder is never looked up
        read_trace("elsewhere/seed001_scene_tiny.jsonl")
