"""``mlxlab serve`` driven by real clients on a loopback port: the openai package (chat and
completions, streaming and not), 32 concurrent streams, a disconnect mid-stream, every bad input,
and a clean exit on SIGTERM. Token ids come back in each choice (mlxlab's ``token_ids``) and
must equal mlx-lm's greedy tokens for the same prompt."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from oracle import assert_matches, reference

from mlxlab import serve
from mlxlab.serve.text import ByteTokenizer

openai = pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tiny):
    srv = serve.build(tiny, model_name="tiny", chunk_size=64)
    url, stop = serve.start_background(srv)
    yield srv, url
    stop()
    assert not srv.worker.alive  # the lifespan stopped the engine thread


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="none", max_retries=0)


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_completion_equals_greedy_generate_step(client, tiny):
    r = client.completions.create(model="tiny", prompt="hello world", max_tokens=8)
    ids = ByteTokenizer().encode("hello world")
    assert_matches(r.choices[0].token_ids, reference(tiny, ids, 8))
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"


def test_chat_stream_equals_greedy_generate_step(client, tiny):
    messages = [{"role": "user", "content": "héllo ünïcode"}]
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, stream=True))
    ids = [t for c in chunks for t in (c.choices[0].token_ids or [])]
    assert_matches(ids, reference(tiny, ByteTokenizer().chat_prompt(messages), 10))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 10


def test_a_stop_string_ends_the_text_before_it(client):
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=40, stop="<|")
    assert "<|" not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 40  # the tiny model's ids above 255 print as <|id|>


def test_32_concurrent_streams_each_get_their_tokens_in_order(server, tiny):
    url = server[1]
    prompts = [[(7 * i + j) % 250 + 1 for j in range(5 + i)] for i in range(32)]

    async def one(c, p):
        out = []
        stream = await c.completions.create(model="tiny", prompt=p, max_tokens=12, stream=True)
        async for chunk in stream:
            out.extend(chunk.choices[0].token_ids or [])
        return out

    async def all_of():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, p) for p in prompts)), 120)

    outs = asyncio.run(all_of())
    for p, out in zip(prompts, outs):
        assert_matches(out, reference(tiny, p, 12))


def test_a_disconnect_mid_stream_cancels_the_request_and_frees_its_kv(server):
    srv, url = server
    base = _metric(url, "mlxlab:kv_cache_usage_bytes")
    body = {"model": "tiny", "prompt": list(range(1, 300)), "max_tokens": 4000, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data:") for line in got)
    deadline = time.monotonic() + 20
    while _metric(url, "mlxlab:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    req = srv.worker.engine.requests[-1]
    assert req.finish_reason == "cancelled" and len(req.output_tokens) < 4000
    assert _metric(url, "mlxlab:kv_cache_usage_bytes") == base == 0


BAD = [
    (b"{not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_json", None),
    ({"prompt": "x"}, 400, "missing_field", "model"),
    ({"model": "gpt-9", "prompt": "x"}, 404, "model_not_found", "model"),
    ({"model": "tiny"}, 400, "missing_field", "prompt"),
    ({"model": "tiny", "prompt": "x", "max_tokens": "5"}, 400, "invalid_type", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": -1}, 400, "invalid_value", "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 10 ** 9}, 400, "context_length_exceeded", "max_tokens"),
    ({"model": "tiny", "prompt": ""}, 400, "invalid_request", "prompt"),
    ({"model": "tiny", "prompt": [1, 2, 99999]}, 400, "invalid_request", "prompt"),
    ({"model": "tiny", "prompt": [1, 2.5]}, 400, "invalid_request", "prompt"),
    ({"model": "tiny", "prompt": list(range(1, 200)) * 60}, 400, "context_length_exceeded", "prompt"),
    ({"model": "tiny", "prompt": "x", "kv_bits": 3}, 400, "invalid_request", "kv_bits"),
    ({"model": "tiny", "prompt": "x", "num_draft_tokens": 3}, 400, "no_draft_model", "num_draft_tokens"),
    ({"model": "tiny", "prompt": "x", "temperature": -2}, 400, "invalid_request", "temperature"),
    ({"model": "tiny", "prompt": "x", "stop": 5}, 400, "invalid_type", "stop"),
    ({"model": "tiny", "prompt": "x", "stream": "yes"}, 400, "invalid_type", "stream"),
]


@pytest.mark.parametrize("body, status, code, param", BAD)
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(server, client, body, status, code, param):
    url = server[1]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + "/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param and err["message"] and err["type"]
    assert client.completions.create(model="tiny", prompt="ok", max_tokens=2).usage.completion_tokens == 2


def test_chat_bad_messages_and_an_oversized_body_are_refused(server):
    url = server[1]
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0]"
    big = b'{"model": "tiny", "prompt": "' + b"a" * (server[0].max_body_bytes + 10) + b'"}'
    r = httpx.post(url + "/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_models_health_and_metrics(server, client):
    url = server[1]
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    client.completions.create(model="tiny", prompt="m", max_tokens=3, user="agent")
    text = httpx.get(url + "/metrics").text
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "num_requests_running", "num_requests_waiting", "kv_cache_usage_bytes"):
        assert f"mlxlab:{name}" in text
    assert 'mlxlab:time_to_first_token_seconds_count{tenant="agent"} 1.0' in text


def test_a_seeded_request_repeats_its_tokens(client):
    kw = dict(model="tiny", prompt="seeded", max_tokens=8, temperature=0.8, top_p=0.9, seed=11)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].token_ids == b.choices[0].token_ids


def test_sigterm_cancels_in_flight_requests_and_exits_0(tmp_path):
    port = serve.free_port()
    env = {**os.environ, "MLXLAB_NO_REEXEC": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "mlxlab.cli", "serve", "--model", "tiny", "--dtype", "float32",
                             "--warmup", "off", "--port", str(port), "--log-level", "warning"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
            time.sleep(0.1)
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": "x", "max_tokens": 5000, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
            proc.send_signal(signal.SIGTERM)
            rest = list(lines)  # the stream ends (its request cancelled) instead of running to 5,000 tokens
        assert proc.wait(30) == 0, proc.stdout.read().decode()[-2000:]
        events = [json.loads(x[5:]) for x in rest if x.startswith("data:") and x.strip() != "data: [DONE]"]
        assert sum(len(e["choices"][0]["token_ids"]) for e in events) < 5000
        assert events[-1]["choices"][0]["finish_reason"] == "stop" and rest[-1] in ("", "data: [DONE]")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_workload_over_http_gives_the_in_process_tokens_and_tables(server, tiny):
    """The HTTP executor drives the seed-001 workload (a chat session beside batch workers)
    against the server; every request's output equals the in-process run's (greedy), and the
    summary table has the same rows and columns."""
    from mlxlab import run_workload
    from mlxlab.core.workload import workload_preset
    from mlxlab.serve.client import HttpExecutor

    wl = workload_preset("chat+batch", vocab_size=tiny.vocab_size, scale=1 / 256, max_context=2048)
    http = run_workload(HttpExecutor(server[1], "tiny"), wl, max_wall_s=120)
    local = run_workload(tiny, wl, chunk_size=64, max_wall_s=120)
    assert http.complete and local.complete
    by_prompt = lambda res: sorted((r.tenant, tuple(r.prompt), tuple(r.output_tokens)) for r in res.submitted)  # noqa: E731
    assert by_prompt(http) == by_prompt(local)
    assert list(http.summary_table().tenant) == list(local.summary_table().tenant)
    assert list(http.summary_table().columns) == list(local.summary_table().columns)


def test_a_request_over_the_kv_budget_is_refused_with_the_reason_and_others_wait(tiny):
    """With a KV budget, a request that could never fit gets a 400 saying so; two that fit only
    one at a time both finish (the second waits for the first's KV)."""
    per_token = serve.build(tiny, model_name="tiny").worker.engine.kv_bytes_per_token
    srv = serve.build(tiny, model_name="tiny", chunk_size=64, kv_budget_bytes=300 * per_token)
    url, stop = serve.start_background(srv)
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": list(range(1, 250)), "max_tokens": 100})
        assert r.status_code == 400 and "KV budget" in r.json()["error"]["message"]

        async def two():
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
                return await asyncio.gather(*(c.completions.create(model="tiny", prompt=list(range(1 + i, 150 + i)),
                                                                    max_tokens=20) for i in range(2)))
        outs = asyncio.run(two())
        assert [o.usage.completion_tokens for o in outs] == [20, 20]
        reqs = srv.worker.engine.requests
        assert reqs[-1].token_times_s[0] >= reqs[-2].finish_s or reqs[-2].token_times_s[0] >= reqs[-1].finish_s
    finally:
        stop()


def test_stop_returns_only_once_the_engine_os_thread_has_exited(tiny):
    """mlx frees a thread's streams when its OS thread exits; a process that exits before then
    aborts ("terminate called without an active exception", seen in CI after the README's server
    block). So stop() waits for the engine's OS thread, not only for Python's join."""
    srv = serve.build(tiny, model_name="tiny", chunk_size=64)
    url, stop = serve.start_background(srv)
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 4})
    assert r.status_code == 200
    tid = srv.worker.thread.native_id
    stop()
    assert not srv.worker.alive
    if Path("/proc/self/task").is_dir():
        assert not Path(f"/proc/self/task/{tid}").exists()


def test_a_request_counts_as_ended_before_its_stream_hears_done(tiny, monkeypatch):
    """A client that sends its next request the moment one ends must find the slot free under
    --max-in-flight: the worker drops the request from its counts before it tells the stream (CI once
    read outstanding 1 after every answer had arrived)."""
    from mlxlab.serve.worker import Stream

    seen, put = [], Stream.put
    srv = serve.build(tiny, model_name="tiny", chunk_size=64, max_in_flight=1)

    def spy(self, *event):
        if event and event[0] in ("done", "error"):
            seen.append((event[0], srv.worker.outstanding, srv.worker.in_flight))
        put(self, *event)

    monkeypatch.setattr(Stream, "put", spy)
    url, stop = serve.start_background(srv)
    try:
        for i in range(2):  # one after the other under a limit of one: both admitted
            r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": f"x{i}", "max_tokens": 4})
            assert r.status_code == 200
    finally:
        stop()
    assert seen[:2] == [("done", 0, 0), ("done", 0, 0)]


def test_a_burst_cannot_pass_max_in_flight(tiny):
    """Six requests at once under --max-in-flight 2: the limit counts a request from its submit on
    the event loop, not from when the engine thread takes it, so exactly two are admitted (the
    soak saw 19 in flight under a limit of 8 when the engine thread's count decided)."""
    srv = serve.build(tiny, model_name="tiny", chunk_size=64, max_in_flight=2)
    url, stop = serve.start_background(srv)

    async def burst():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*[client.post(url + "/v1/completions", json={
                "model": "tiny", "prompt": f"burst {i}", "max_tokens": 600}) for i in range(6)])

    try:
        codes = sorted(r.status_code for r in asyncio.run(burst()))
        assert codes == [200, 200, 429, 429, 429, 429]
        assert srv.worker.outstanding == 0 and srv.worker.in_flight == 0
    finally:
        stop()


def test_a_burst_of_errors_starts_no_threads(tiny):
    """Errors are answered on the event loop: a plain-function exception handler ran in anyio's
    thread pool, which grew by a thread per error answered at once and kept them (a 45 s soak saw
    the server's threads rise by 8 in bursts of 429s and called it a leak)."""
    srv = serve.build(tiny, model_name="tiny", chunk_size=64)
    url, stop = serve.start_background(srv)

    def workers():
        return sum(t.name.startswith("AnyIO worker") for t in threading.enumerate())

    async def burst():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*[client.post(url + "/v1/completions", json={
                "model": "tiny", "prompt": "", "max_tokens": 2}) for _ in range(24)])

    try:
        before = workers()
        codes = {r.status_code for r in asyncio.run(burst())}
        assert codes == {400}
        assert workers() == before
    finally:
        stop()


def test_over_max_in_flight_a_request_gets_429_with_retry_after(tiny):
    srv = serve.build(tiny, model_name="tiny", chunk_size=64, max_in_flight=1)
    url, stop = serve.start_background(srv)
    try:
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": "x", "max_tokens": 3000, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)  # the first request is in the engine
            busy = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "y", "max_tokens": 2})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["type"] == "rate_limit_error"
        deadline = time.monotonic() + 20
        while srv.worker.in_flight and time.monotonic() < deadline:  # the disconnect cancelled the first
            time.sleep(0.02)
        ok = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "y", "max_tokens": 2})
        assert ok.status_code == 200
    finally:
        stop()


def test_the_serve_overhead_study_runs_both_paths_on_the_same_tokens(tiny):
    from mlxlab.studies.serving.run import format_table, serve_overhead

    res = serve_overhead(tiny, model_name="tiny", streams=(1, 3), prompt_tokens=24, max_tokens=4, repeats=1,
                         progress=False, chunk_size=64)
    for n in ("1", "3"):
        r = res["streams"][n]
        assert r["same_tokens"] and r["http"]["n_ttft"] == r["in_process"]["n_ttft"] == int(n)
        assert r["http"]["ttft_p50_ms"] > 0 and set(r["ratios"]) == {"ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                                                                       "itl_p99_ms"}
    assert "http / in" in format_table("tiny", res)


def test_a_long_running_server_keeps_a_bounded_history(tiny):
    """After more requests than its history limit, the server's engine holds at most that many
    finished requests and step records, every client got all its tokens, and no KV is held."""
    srv = serve.build(tiny, model_name="tiny", chunk_size=32, history_limit=5)
    assert serve.build(tiny, model_name="tiny").worker.engine.history_limit == serve.HISTORY_LIMIT
    url, stop = serve.start_background(srv)
    prompts = [[(3 * i + j) % 250 + 1 for j in range(4 + i)] for i in range(16)]
    try:
        async def all_of():
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
                return await asyncio.gather(*(c.completions.create(model="tiny", prompt=p, max_tokens=6)
                                              for p in prompts))
        outs = asyncio.run(all_of())
        for p, o in zip(prompts, outs):
            assert_matches(o.choices[0].token_ids, reference(tiny, p, 6))
        eng = srv.worker.engine
        assert srv.worker.in_flight == 0 and len(eng.requests) <= 5 and len(eng.steps) <= 5
        assert len(eng._seqs) <= 5 and eng.kv_tokens_in_use() == 0
        assert _metric(url, "mlxlab:kv_cache_usage_bytes") == 0
        assert _metric(url, 'mlxlab:request_success_total{finished_reason="length",tenant="default"}') == 16
    finally:
        stop()


@pytest.fixture(scope="module")
def draft_server(tiny):
    """A server whose draft model is a 4-bit copy of the target (it agrees often, not always)."""
    from mlxlab import load_model

    srv = serve.build(tiny, model_name="tiny", chunk_size=32, draft_model=load_model("tiny", dtype="float32", bits=4))
    url, stop = serve.start_background(srv)
    yield srv, url
    stop()


def test_speculative_requests_over_http_equal_greedy_beside_plain_ones(draft_server, tiny):
    """``num_draft_tokens`` through the openai client (extra_body), completions and chat,
    streaming and not, at the same time as plain requests decoding in the batch: every stream's
    tokens are mlx-lm's greedy ones, and usage counts the accepted drafts."""
    url = draft_server[1]
    prompts = [[(5 * i + j) % 250 + 1 for j in range(6 + 3 * i)] for i in range(6)]
    messages = [{"role": "user", "content": "speculate"}]

    async def completion(c, p, extra, stream):
        if not stream:
            r = await c.completions.create(model="tiny", prompt=p, max_tokens=14, extra_body=extra)
            return r.choices[0].token_ids, r.usage
        ids, usage = [], None
        async for chunk in await c.completions.create(model="tiny", prompt=p, max_tokens=14, stream=True,
                                                      extra_body=extra):
            ids.extend(chunk.choices[0].token_ids or [])
            usage = chunk.usage or usage
        return ids, usage

    async def chat(c, stream):
        extra = {"num_draft_tokens": 3}
        if not stream:
            r = await c.chat.completions.create(model="tiny", messages=messages, max_tokens=14, extra_body=extra)
            return r.choices[0].token_ids, r.usage
        ids = []
        async for chunk in await c.chat.completions.create(model="tiny", messages=messages, max_tokens=14,
                                                           stream=True, extra_body=extra):
            ids.extend(chunk.choices[0].token_ids or [])
        return ids, None

    async def all_of():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
            jobs = [completion(c, p, {"num_draft_tokens": 3} if i % 2 == 0 else {}, i % 3 == 0)
                    for i, p in enumerate(prompts)]
            return await asyncio.wait_for(asyncio.gather(*jobs, chat(c, False), chat(c, True)), 120)

    outs = asyncio.run(all_of())
    for i, (p, (ids, usage)) in enumerate(zip(prompts, outs)):
        assert_matches(ids, reference(tiny, p, 14))
        details = getattr(usage, "completion_tokens_details", None)
        if i % 2 == 0:
            assert details is not None and 0 <= details.accepted_prediction_tokens
            assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
        else:
            assert details is None
    chat_ref = reference(tiny, ByteTokenizer().chat_prompt(messages), 14)
    for ids, _ in outs[-2:]:
        assert_matches(ids, chat_ref)
    eng = draft_server[0].worker.engine
    assert sum(r.draft_accepted for r in eng.requests) > 0  # the drafts were used, and some accepted
    assert eng.kv_tokens_in_use() == 0 and not eng._lanes


@pytest.mark.parametrize("extra, code", [({"num_draft_tokens": "3"}, "invalid_type"),
                                         ({"num_draft_tokens": -1}, "invalid_value"),
                                         ({"num_draft_tokens": 1000}, "invalid_value"),
                                         ({"num_draft_tokens": 2.5}, "invalid_type"),
                                         ({"num_draft_tokens": 2, "kv_bits": 8}, "invalid_request")])
def test_bad_num_draft_tokens_gets_an_openai_error(draft_server, extra, code):
    url = draft_server[1]
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == "num_draft_tokens" and err["message"]
    ok = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3,
                                                   "num_draft_tokens": 0})
    assert ok.status_code == 200 and "completion_tokens_details" not in ok.json()["usage"]


def test_a_draft_of_another_vocabulary_is_a_startup_error():
    env = {**os.environ, "MLXLAB_NO_REEXEC": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "mlxlab.cli", "serve", "--model", "tiny", "--dtype", "float32",
                          "--draft-model", str(ROOT / "data/weights/byte-draft"), "--warmup", "off",
                          "--port", str(serve.free_port())], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "vocabulary" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_servers_num_draft_tokens_is_the_default_of_requests_that_name_none(tiny):
    with pytest.raises(ValueError, match="draft model"):
        serve.build(tiny, model_name="tiny", num_draft_tokens=2)
    srv = serve.build(tiny, model_name="tiny", chunk_size=32, draft_model=tiny, num_draft_tokens=2)
    url, stop = serve.start_background(srv)
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [4, 5, 6], "max_tokens": 9}).json()
        assert_matches(r["choices"][0]["token_ids"], reference(tiny, [4, 5, 6], 9))
        d = r["usage"]["completion_tokens_details"]
        assert d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"] > 0
        plain = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [4, 5, 6], "max_tokens": 9,
                                                          "num_draft_tokens": 0}).json()
        assert "completion_tokens_details" not in plain["usage"]
    finally:
        stop()


def test_the_http_executor_is_busy_while_its_streams_run(server):
    """While a request streams, a step of the HTTP executor reports work (a record of the wait,
    not kept): a runner that got None would sleep until its next scheduled arrival, past the
    finishes and follow-ups of the streams in flight."""
    from mlxlab.serve.client import HttpExecutor

    ex = HttpExecutor(server[1], "tiny")
    req = ex.submit(list(range(1, 50)), 64)
    rec = ex.step()
    assert rec is not None and rec.phase == "http" and ex.steps == []
    ex.close()  # waits for the stream
    assert req.done and len(req.output_tokens) == 64 and ex.step() is None


def test_serve_overhead_reports_where_the_two_paths_tokens_first_differ():
    from mlxlab.studies.serving.run import first_differences

    assert first_differences([[1, 2, 3], [4, 5], [7, 8, 9]], [[1, 2, 3], [4, 6], [7, 8]]) == [None, 1, 2]


def test_serve_verdict_decides_on_the_worst_itl_p99_ratio_and_reports_the_added_ttft():
    from mlxlab.core.claims import check_verdicts
    from mlxlab.studies.serving.run import serve_verdicts

    def res(ratio):
        row = {"ratios": {"itl_p99_ms": ratio}, "http": {"ttft_p50_ms": 30.0}, "in_process": {"ttft_p50_ms": 10.0},
               "same_tokens": True}
        return {"streams": {"1": row, "16": {**row, "ratios": {"itl_p99_ms": 1.1}}}}

    (ok,) = check_verdicts(serve_verdicts({"a": res(1.4), "b": res(0.9)}), experiment="serve_overhead")
    assert ok["verdict"] == "reproduced" and ok["measured"]["where"] == "a:1"
    assert ok["measured"]["http_extra_ttft_p50_ms"]["b:16"] == 20.0
    (bad,) = serve_verdicts({"a": res(1.6)})
    assert bad["verdict"] == "not reproduced" and bad["measured"]["worst"] == 1.6
    assert serve_verdicts({})[0]["verdict"] == "not measured"


def test_serve_verdict_calls_a_ratio_inside_its_rounds_noise_band_inconclusive_not_a_pass_or_a_failure():
    from mlxlab.studies.serving.run import serve_verdicts

    def res(pooled, paired):
        return {"streams": {"1": {"ratios": {"itl_p99_ms": pooled}, "http": {"ttft_p50_ms": 11.0},
                                  "in_process": {"ttft_p50_ms": 10.0}, "same_tokens": True,
                                  "paired_ratios": {"itl_p99_ms": paired}}}}

    # 1.45 under the 1.5 bound, but the rounds' ratios spread (MAD 0.2 over 5: band 0.268): it could be either side
    (v,) = serve_verdicts({"a": res(1.45, [1.2, 1.45, 1.65, 1.25, 1.7])})
    assert v["verdict"] == "inconclusive" and v["measured"]["unresolved"] == ["a:1"]
    assert v["measured"]["itl_p99_ratio_band"]["a:1"] == 0.268 and v["measured"]["repeats_to_resolve"] > 5
    # the same figure with tight rounds passes; one over the bound beyond its band fails
    assert serve_verdicts({"a": res(1.45, [1.44, 1.45, 1.46, 1.45, 1.45])})[0]["verdict"] == "reproduced"
    assert serve_verdicts({"a": res(1.9, [1.85, 1.9, 1.95, 1.9, 1.9])})[0]["verdict"] == "not reproduced"
    # a failure anywhere outweighs an inconclusive elsewhere
    both = {"a": res(1.45, [1.2, 1.45, 1.65, 1.25, 1.7]), "b": res(1.9, [1.85, 1.9, 1.95, 1.9, 1.9])}
    assert serve_verdicts(both)[0]["verdict"] == "not reproduced"


def test_bench_serve_rescore_decides_a_saved_file_again_in_place(tmp_path):
    """--rescore adds the verdicts and rescored_by and keeps the measurements as they were."""
    import json

    from mlxlab.cli import main as cli_main

    row = {"ratios": {"itl_p99_ms": 1.7}, "http": {"ttft_p50_ms": 12.0}, "in_process": {"ttft_p50_ms": 10.0},
           "same_tokens": True}
    doc = {"environment": {"commit": "abc"}, "presets": {"tiny": {"streams": {"1": row}}}}
    path = tmp_path / "serve_overhead.json"
    path.write_text(json.dumps(doc))
    assert cli_main(["bench", "serve", "--rescore", str(path)]) == 0
    out = json.loads(path.read_text())
    assert out["verdicts"][0]["verdict"] == "not reproduced" and out["verdicts"][0]["measured"]["worst"] == 1.7
    assert out["presets"] == doc["presets"] and out["environment"] == doc["environment"]
    assert "mlxlab.studies.serving.run" in out["rescored_by"]["what"] and "commit" in out["rescored_by"]


def test_the_engine_worker_publishes_what_an_overlap_engine_read_before_the_engine_waits(tiny):
    # tests/test_overlap.py checks the engine calls before_wait, with the tokens read, before it blocks;
    # the server's worker must be the one listening, or a chat's last token waits for a document's prefill
    from mlxlab import Engine
    from mlxlab.serve.worker import EngineWorker

    eng = Engine(tiny.module, chunk_size=256, overlap=True)
    worker = EngineWorker(eng)
    assert eng.before_wait == worker._publish
    eng.close()
