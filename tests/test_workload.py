"""Workloads (tenants, arrivals, presets, traces) and the runner that plays them on an executor."""

import heapq
import math

import pytest

from mlxlab.core.executor import Executor
from mlxlab.core.request import DONE, Request, StepRecord
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import BatchTenant, ChatTenant, TraceWorkload, Workload, load_trace, save_trace, trace_path, workload_preset

VOCAB = 1024


def drive(workload, output_len=None):
    """Play a workload with instant service: every request finishes at its arrival time with
    ``max_tokens`` (or ``output_len``) output tokens derived from its prompt. Returns arrivals."""
    heap, order, out = [], 0, []
    for a in workload.start():
        heapq.heappush(heap, (a.time_s, order, a))
        order += 1
    while heap:
        _, _, a = heapq.heappop(heap)
        out.append(a)
        n = output_len or a.max_tokens
        output = [(a.prompt[-1] + i) % (VOCAB - 1) + 1 for i in range(n)]
        for nxt in workload.on_finish(a, output, a.time_s + 0.5):
            heapq.heappush(heap, (nxt.time_s, order, nxt))
            order += 1
    return out


def small_mix(seed=0, **batch):
    return Workload([ChatTenant(sessions=2, turns=3, first_prompt_tokens=(40, 60), turn_tokens=(5, 15),
                                output_tokens=8, think_time_s=(0.1, 0.3), stagger_s=0.2),
                     BatchTenant(**{"workers": 2, "requests": 5, "prompt_tokens": (100, 200),
                                    "output_tokens": 4, **batch})], vocab_size=VOCAB, seed=seed)


def test_same_seed_gives_identical_arrivals_and_other_seed_differs():
    a = [x.as_dict() for x in drive(small_mix(seed=7))]
    b = [x.as_dict() for x in drive(small_mix(seed=7))]
    c = [x.as_dict() for x in drive(small_mix(seed=8))]
    assert a == b
    assert a != c
    assert all(1 <= t < VOCAB for x in a for t in x["prompt"])


def test_workload_start_resets_state_for_a_second_run():
    w = small_mix()
    assert [x.as_dict() for x in drive(w)] == [x.as_dict() for x in drive(w)]


def test_chat_turn_resends_previous_prompt_and_output_after_think_time():
    w = Workload([ChatTenant(sessions=1, turns=4, first_prompt_tokens=30, turn_tokens=(5, 9),
                             output_tokens=6, think_time_s=0.25)], vocab_size=VOCAB, seed=3)
    (a,) = w.start()
    for turn in range(1, 4):
        output = list(range(100 + turn, 106 + turn))
        (nxt,) = w.on_finish(a, output, finish_s=10.0 * turn)
        assert nxt.index == turn and nxt.key == a.key
        assert nxt.prompt[: len(a.prompt) + len(output)] == a.prompt + output
        assert 5 <= len(nxt.prompt) - len(a.prompt) - len(output) <= 9
        assert nxt.time_s == pytest.approx(10.0 * turn + 0.25)
        a = nxt
    assert w.on_finish(a, [1] * 6, 50.0) == []  # the last turn has no follow-up


def test_closed_batch_workers_share_the_question_pool():
    w = Workload([BatchTenant(workers=3, requests=7, prompt_tokens=(50, 80), output_tokens=2, gap_s=0.1)],
                 vocab_size=VOCAB, seed=1)
    first = w.start()
    assert [a.key for a in first] == [0, 1, 2] and all(a.time_s == 0 for a in first)
    arrivals = drive(w)
    assert sorted(a.index for a in arrivals) == list(range(7))
    # a worker sends its next question gap_s after its previous one finished (0.5 s of service)
    for worker in range(3):
        times = [a.time_s for a in arrivals if a.key == worker]
        assert all(b - a == pytest.approx(0.6) for a, b in zip(times, times[1:]))
    assert len({tuple(a.prompt) for a in arrivals}) == 7  # every question is fresh


def test_poisson_interarrival_mean_is_one_over_rate():
    rate, n = 5.0, 4000
    w = Workload([BatchTenant(workers=4, requests=n, prompt_tokens=1, output_tokens=1, arrival="poisson",
                              rate_per_s=rate, start_s=2.0)], vocab_size=VOCAB, seed=11)
    times = [a.time_s for a in w.start()]
    gaps = [b - a for a, b in zip([2.0] + times, times)]
    assert len(times) == n and all(g > 0 for g in gaps)
    mean = sum(gaps) / n
    # the mean of n exponential gaps has relative standard error 1/sqrt(n) ~ 1.6%: allow ~4 sigma
    assert abs(mean * rate - 1) < 0.065
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / n) / mean
    assert abs(cv - 1) < 0.1  # exponential gaps: standard deviation equals the mean
    assert w.on_finish(w.start()[0], [1], 3.0) == []  # open loop: no follow-ups


def test_trace_round_trip(tmp_path, monkeypatch):
    arrivals = drive(small_mix(seed=2))
    path = save_trace(tmp_path / "mix.jsonl", arrivals)
    back = load_trace(path)
    assert [a.as_dict() for a in back] == [a.as_dict() for a in sorted(arrivals, key=lambda a: a.time_s)]
    assert len(path.read_text().splitlines()) == len(arrivals)
    # a bare name lands in data/traces/ (data/ follows MLXLAB_DATA)
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path / "data"))
    p = save_trace("mix", arrivals)
    assert p == tmp_path / "data" / "traces" / "mix.jsonl" == trace_path("mix")
    replay = TraceWorkload.from_file("mix")
    assert [a.as_dict() for a in replay.start()] == [a.as_dict() for a in back]
    assert replay.on_finish(back[0], [1, 2], 1.0) == []


def test_presets_scale_seed_001_lengths_and_keep_77_to_1_at_seed_scale():
    small = workload_preset("seed-001", vocab_size=VOCAB, scale=1 / 32)
    chat, batch = small.tenants
    assert batch.prompt_tokens == (312, 781) and batch.requests == 150 and batch.workers == 4
    arrivals = drive(small)
    last_chat = max((a for a in arrivals if a.tenant == "chat"), key=lambda a: a.index)
    assert 650 <= last_chat.prompt_tokens <= 850  # ~23k / 32
    # at seed scale the input:output ratio is the case study's 77:1 (fewer questions to stay fast)
    full = drive(workload_preset("seed-001", vocab_size=VOCAB, batch={"requests": 24}))
    for tenant in ("chat", "batch"):
        rs = [a for a in full if a.tenant == tenant]
        ratio = sum(a.prompt_tokens for a in rs) / sum(a.max_tokens for a in rs)
        assert 65 < ratio < 90, (tenant, ratio)
    last = max((a for a in full if a.tenant == "chat"), key=lambda a: a.index)
    assert 21_000 < last.prompt_tokens < 25_000
    assert [t.name for t in workload_preset("chat-solo", vocab_size=VOCAB).tenants] == ["chat"]
    assert [t.name for t in workload_preset("chat+batch", vocab_size=VOCAB).tenants] == ["chat", "batch"]
    with pytest.raises(ValueError):
        workload_preset("chat-solo", vocab_size=VOCAB, batch={"workers": 2})


def test_max_context_ends_a_chat_session_early():
    w = Workload([ChatTenant(turns=10, first_prompt_tokens=100, turn_tokens=50, output_tokens=10)],
                 vocab_size=VOCAB, max_context=300)
    arrivals = drive(w)
    assert len(arrivals) < 10
    assert all(a.prompt_tokens + a.max_tokens <= 300 for a in arrivals)


# ------------------------------------------------------------------------------ the runner
class VirtualExecutor(Executor):
    """A stand-in for the simulator: a virtual clock, each step costs ``step_s``; a prompt is
    prefilled in one step, then every decoding request gets one token per step."""

    def __init__(self, step_s=0.01):
        self.t, self.step_s = 0.0, step_s
        self.requests, self.steps, self.decoding, self.queue = [], [], [], []
        self.advances = []

    def now(self):
        return self.t

    def advance_to(self, t):
        self.advances.append(t)
        self.t = max(self.t, t)

    @property
    def has_work(self):
        return bool(self.queue or self.decoding)

    def submit(self, prompt, max_tokens, *, tenant, arrival_s):
        assert arrival_s <= self.t + 1e-12, "submitted before its arrival time"
        r = Request(id=len(self.requests), prompt=list(prompt), max_tokens=max_tokens, tenant=tenant,
                    arrival_s=arrival_s)
        self.requests.append(r)
        self.queue.append(r)
        return r

    def step(self):
        if not self.has_work:
            return None
        start = self.t
        self.t += self.step_s
        rec = StepRecord(len(self.steps), start, self.t, "", [r.id for r in self.decoding], [])
        for r in self.decoding:
            r.output_tokens.append(r.prompt[-1])
            r.token_times_s.append(self.t)
            if len(r.output_tokens) == r.max_tokens:
                r.state, r.finish_s, r.finish_reason = DONE, self.t, "length"
        self.decoding = [r for r in self.decoding if not r.done]
        if self.queue:
            r = self.queue.pop(0)
            rec.prefill.append((r.id, r.prompt_tokens - 1, 0))
            self.decoding.append(r)
        rec.phase = "mixed" if rec.prefill and rec.decode_seqs else ("prefill" if rec.prefill else "decode")
        self.steps.append(rec)
        return rec


def check_chat_turn_timing(res, think_s):
    chat = res.requests[res.requests.tenant == "chat"].sort_values(["key", "index"])
    for _, session in chat.groupby("key"):
        rows = session.to_dict("records")
        for prev, nxt in zip(rows, rows[1:]):
            assert nxt["arrival_s"] == pytest.approx(prev["finish_s"] + think_s, abs=1e-9)


def test_run_workload_waits_on_a_virtual_clock_and_replays_its_trace():
    w = Workload([ChatTenant(sessions=1, turns=3, first_prompt_tokens=20, turn_tokens=5, output_tokens=4,
                             think_time_s=2.0, start_s=1.0),
                  BatchTenant(workers=1, requests=3, prompt_tokens=50, output_tokens=3, arrival="poisson",
                              rate_per_s=0.5)], vocab_size=VOCAB, seed=5)
    ex = VirtualExecutor()
    res = run_workload(ex, w)
    assert res.complete and len(res.requests) == 6
    assert list(res.requests.output_tokens) == [a.max_tokens for a in res.trace]
    check_chat_turn_timing(res, 2.0)
    assert ex.advances and ex.advances[0] == pytest.approx(1.0)  # idle until the chat's start
    assert res.config["executor"] == "VirtualExecutor"
    # replaying the recorded trace open loop submits the same prompts at the same times
    again = run_workload(VirtualExecutor(), TraceWorkload(res.trace))
    assert [(a.time_s, a.prompt) for a in again.trace] == [(a.time_s, a.prompt) for a in res.trace]
    with pytest.raises(ValueError, match="policy"):
        run_workload(VirtualExecutor(), w, "interleave")


def test_run_workload_stops_at_max_wall_s():
    w = Workload([ChatTenant(turns=3, first_prompt_tokens=10, turn_tokens=5, output_tokens=2,
                             think_time_s=60.0)], vocab_size=VOCAB)
    res = run_workload(VirtualExecutor(), w, max_wall_s=0.0)
    assert not res.complete


def test_run_workload_on_tiny_model_finishes_chat_and_batch():
    from mlxlab import load_model

    model = load_model("tiny", dtype="float32")
    think = 0.05
    w = Workload([ChatTenant(sessions=1, turns=3, first_prompt_tokens=96, turn_tokens=(10, 20),
                             output_tokens=8, think_time_s=think),
                  BatchTenant(workers=2, requests=4, prompt_tokens=(200, 300), output_tokens=4)],
                 vocab_size=model.vocab_size, seed=0)
    res = run_workload(model, w, "interleave", chunk_size=64)
    reqs = res.requests
    assert res.complete and len(reqs) == 7
    assert (reqs.finish_reason == "length").all()
    assert list(reqs.output_tokens) == [a.max_tokens for a in res.trace]
    check_chat_turn_timing(res, think)
    # nothing was submitted (so nothing started) before its arrival time
    assert all(r.prefill_start_s >= r.arrival_s for r in res.submitted)
    # chat turns carry the conversation: each prompt extends the previous prompt + output
    chat = sorted((r for r in res.submitted if r.tenant == "chat"), key=lambda r: r.id)
    for prev, nxt in zip(chat, chat[1:]):
        assert nxt.prompt[: prev.prompt_tokens + 8] == prev.prompt + prev.output_tokens
    for tenant in ("chat", "batch"):
        s = res.summary[tenant]
        for v in (s["ttft_s"]["p50"], s["ttft_s"]["p99"], s["itl_s"]["p50"], s["itl_s"]["p99"], s["itl_max_s"],
                  s["decode_tok_s"], s["prefill_tok_s_run"]):
            assert math.isfinite(v) and v > 0
    assert res.config["policy"] == "interleave" and res.config["chunk_size"] == 64
    assert max(n for step in res.executor.steps for _, n, _ in step.prefill) == 64
    assert set(res.summary_table().tenant) == {"all", "chat", "batch"}
    doc = res.to_json()
    assert doc["summary"]["chat"]["requests"] == 3 and doc["config"]["workload"]["seed"] == 0


def test_a_workload_comes_back_from_its_config():
    """Workload.from_config(w.config()) sends the same arrivals (saved results name their
    workload by its config; rescoring a validation rebuilds it from there)."""
    import json

    w = Workload([ChatTenant(sessions=2, turns=2, first_prompt_tokens=40, turn_tokens=8, output_tokens=5,
                             think_time_s=0.1, stagger_s=0.05),
                  BatchTenant(workers=2, requests=3, prompt_tokens=(30, 90), output_tokens=4)],
                 vocab_size=500, seed=3, max_context=4096, name="mix")
    back = Workload.from_config(json.loads(json.dumps(w.config())))
    assert back.config() == w.config()
    assert [(a.time_s, a.prompt, a.max_tokens, a.tenant) for a in back.start()] == \
        [(a.time_s, a.prompt, a.max_tokens, a.tenant) for a in w.start()]
    with pytest.raises(ValueError, match="not a workload config"):
        Workload.from_config({"kind": "trace"})
