"""The engine's overlap mode: decode on the main thread, prefill chunks on a worker thread with its
own mlx stream.

Exactness uses the oracle rule of tests/test_engine.py: greedy tokens must equal mlx-lm's
``generate_step`` up to the first step where the reference's top-two log-probability gap is below
``NEAR_TIE``; near-ties must stay under 2% of reference steps. In overlap mode the interleaving
of chunks and decode steps depends on thread timing, so these runs also check that any schedule
the threads produce gives the same tokens.
"""

import gc
import random
import threading

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxlab import Engine
from mlxlab.policies.base import Interleave

NEAR_TIE = 1e-4
MAX_TOKENS = 16
_stats = {"steps": 0, "near_ties": 0}
_refs = {}


def reference(model, prompt, max_tokens=MAX_TOKENS):
    key = (id(model), tuple(prompt), max_tokens)
    if key not in _refs:
        tokens, gaps = [], []
        for tok, logprobs in generate_step(mx.array(prompt), model.module, max_tokens=max_tokens):
            top2 = mx.topk(logprobs, 2)
            tokens.append(int(tok))
            gaps.append(float(mx.abs(top2[0] - top2[1]).item()))
        _refs[key] = (tokens, gaps)
    return _refs[key]


def assert_matches(out, ref):
    tokens, gaps = ref
    n = next((i for i, g in enumerate(gaps) if g < NEAR_TIE), len(tokens))
    _stats["near_ties"] += n < len(tokens)
    _stats["steps"] += len(tokens)
    assert out[:n] == tokens[:n], f"diverged before any near-tie: {out} vs {tokens}"
    assert len(out) == len(tokens)


def prompts_for(rng, vocab, lengths):
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def assert_chunks_tile_prompts(eng):
    """Every prompt was prefilled exactly once, in order: no chunk ran twice or was skipped, so
    no sequence was handed to the worker while it still held it."""
    chunks = {}
    for rec in eng.steps:
        for seq_id, n, start in rec.prefill:
            chunks.setdefault(seq_id, []).append((start, n))
    for req in eng.requests:
        pos = 0
        for start, n in sorted(chunks.get(req.id, [])):
            assert start == pos, f"request {req.id}: chunk at {start}, expected {pos}"
            pos += n
        assert pos == len(req.prompt) - 1


def staggered_run(model, prompts, policy, chunk_size, gap_steps=2, **kw):
    eng = Engine(model, policy=policy, chunk_size=chunk_size, overlap=True, **kw)
    reqs = []
    for p in prompts:
        reqs.append(eng.submit(p, MAX_TOKENS))
        for _ in range(gap_steps):
            eng.step()
    eng.run()
    return eng, reqs


@pytest.mark.parametrize("policy", ["interleave", "prefill_first"])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, 512])
def test_overlap_greedy_tokens_equal_generate_step(tiny, policy, chunk_size):
    rng = random.Random(chunk_size)
    prompts = prompts_for(rng, tiny.vocab_size, [1, 9, 33, 70, 5, 48, 90, 17, 300])
    eng, reqs = staggered_run(tiny, prompts, policy, chunk_size, gap_steps=1 + chunk_size % 3)
    for r, p in zip(reqs, prompts):
        assert r.done and r.finish_reason == "length"
        assert_matches(r.output_tokens, reference(tiny, p))
    assert_chunks_tile_prompts(eng)
    assert {s.thread for s in eng.steps} == {"main", "prefill"}
    assert all(s.phase == "prefill" for s in eng.steps if s.thread == "prefill")
    assert all(not s.prefill for s in eng.steps if s.thread == "main")  # main never prefills
    assert [s.index for s in eng.steps] == list(range(len(eng.steps)))


@pytest.mark.parametrize("sync", ["pipelined", "chunk"])
@pytest.mark.parametrize("policy", ["interleave", "prefill_first"])
@pytest.mark.parametrize("chunk_size", [16, 256])
def test_overlap_other_syncs_equal_generate_step(tiny, policy, chunk_size, sync):
    rng = random.Random(50 + chunk_size)
    prompts = prompts_for(rng, tiny.vocab_size, [40, 3, 130, 64, 500])
    eng, reqs = staggered_run(tiny, prompts, policy, chunk_size, overlap_sync=sync)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(tiny, p))
    assert_chunks_tile_prompts(eng)


@pytest.mark.parametrize("policy", ["interleave", "prefill_first"])
@pytest.mark.parametrize("chunk_size", [7, 64, 512])
def test_overlap_small_model_matches_generate_step(small, policy, chunk_size):
    rng = random.Random(7 * chunk_size)
    prompts = prompts_for(rng, small.vocab_size, [40, 3, 130, 64])
    eng, reqs = staggered_run(small, prompts, policy, chunk_size)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(small, p))
    assert_chunks_tile_prompts(eng)


def test_overlap_stop_token_ends_a_request_early(tiny):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 8
    ref = reference(tiny, prompt)[0]
    stop = ref[3]
    with Engine(tiny, chunk_size=8, stop_tokens=[stop], overlap=True) as eng:
        r = eng.submit(prompt, MAX_TOKENS)
        eng.run()
    assert r.finish_reason == "stop"
    assert r.output_tokens == ref[: ref.index(stop) + 1]


def test_overlap_near_ties_are_rare():
    # runs after the exactness tests above (pytest keeps file order)
    assert _stats["steps"] > 500
    assert _stats["near_ties"] <= 0.02 * _stats["steps"], _stats


class Recording(Interleave):
    """Interleave that records which thread delivers each observed step."""

    def __init__(self):
        super().__init__()
        self.observed = []

    def observe(self, record):
        self.observed.append((threading.get_ident(), record))


def test_decode_runs_while_a_prefill_chunk_is_in_flight(tiny):
    rng = random.Random(11)
    chat_prompt, long_prompt = prompts_for(rng, tiny.vocab_size, [16, 3000])
    policy = Recording()
    eng = Engine(tiny, policy=policy, chunk_size=256, overlap=True)
    chat = eng.submit(chat_prompt, 400)
    while len(chat.output_tokens) < 4:
        eng.step()
    long = eng.submit(long_prompt, 4)
    eng.run()
    assert chat.done and long.done
    prefills = [s for s in eng.steps if s.thread == "prefill" and s.prefill[0][0] == long.id]
    decodes = [s for s in eng.steps if s.thread == "main" and s.phase == "decode"]
    assert len(prefills) == 12 and all(s.end_s > s.start_s for s in prefills)
    inside = [(d, p) for d in decodes for p in prefills if p.start_s < d.start_s and d.end_s < p.end_s]
    assert inside, "no decode step ran while a prefill chunk was in flight"
    # the chat produced tokens while the long prompt was prefilling
    t0, t1 = prefills[0].start_s, prefills[-1].end_s
    assert sum(t0 < t < t1 for t in chat.token_times_s) >= len(prefills)
    # records of both threads reach the policy, on the main thread only, once each
    assert {tid for tid, _ in policy.observed} == {threading.get_ident()}
    assert sorted(r["step"] for _, r in policy.observed) == [s.index for s in eng.steps]
    assert {r["thread"] for _, r in policy.observed} == {"main", "prefill"}
    assert_matches(chat.output_tokens[:MAX_TOKENS], reference(tiny, chat_prompt))
    assert_matches(long.output_tokens, reference(tiny, long_prompt, 4))


@pytest.mark.parametrize("bad, match", [
    (dict(prompt_tokens=[]), "empty prompt"),
    (dict(prompt_tokens=[1, 2, 10**6]), "outside the vocabulary"),
    (dict(prompt_tokens=[1, -1]), "outside the vocabulary"),
    (dict(prompt_tokens=[1, 2], max_tokens=0), "max_tokens"),
    (dict(prompt_tokens=[1] * 8000, max_tokens=500), "context"),
])
def test_overlap_bad_input_is_refused_at_submit_while_the_worker_runs(tiny, bad, match):
    eng = Engine(tiny, chunk_size=64, overlap=True)
    good = eng.submit([5, 6, 7, 8, 9], 6)
    long = eng.submit(list(range(1, 600)), 2)
    eng.step()
    eng.step()
    with pytest.raises(ValueError, match=match):
        eng.submit(**{"max_tokens": 4, **bad})
    assert len(eng.requests) == 2
    eng.run()
    assert good.done and good.output_tokens == reference(tiny, [5, 6, 7, 8, 9], 6)[0]
    assert long.done and len(long.output_tokens) == 2


@pytest.mark.parametrize("kw, match", [(dict(overlap="yes"), "overlap"), (dict(overlap=1), "overlap"),
                                       (dict(overlap=True, overlap_sync="layers"), "overlap_sync")])
def test_bad_overlap_options_are_refused(tiny, kw, match):
    with pytest.raises(ValueError, match=match):
        Engine(tiny, **kw)


def _worker_of(eng):
    for _ in range(50):
        if eng._worker is not None:
            return eng._worker
        eng.step()
    raise AssertionError("the prefill worker never started")


def test_run_terminates_and_stops_the_worker(tiny):
    eng = Engine(tiny, chunk_size=32, overlap=True)
    reqs = [eng.submit(p, 5) for p in prompts_for(random.Random(5), tiny.vocab_size, [100, 7, 60])]
    worker = _worker_of(eng)
    assert worker.is_alive() and worker.daemon
    eng.run()
    assert all(r.done for r in reqs)
    assert not worker.is_alive() and eng._worker is None and not eng.has_work
    # the engine stays usable: a new worker starts and stops again
    r = eng.submit(list(range(1, 80)), 3)
    eng.run()
    assert r.done and eng._worker is None


def test_close_stops_the_worker_when_stepping_by_hand(tiny):
    with Engine(tiny, chunk_size=16, overlap=True) as eng:
        r = eng.submit(list(range(1, 200)), 3)
        worker = _worker_of(eng)
        eng.step()
    assert not worker.is_alive()  # closed by the context manager
    assert not eng._busy  # the chunks it had in flight were collected
    eng.run()
    assert r.done and r.output_tokens == reference(tiny, list(range(1, 200)), 3)[0]
    eng.close()
    eng.close()  # idempotent


def test_dropped_engine_lets_its_worker_exit(tiny):
    eng = Engine(tiny, chunk_size=16, overlap=True)
    eng.submit(list(range(1, 100)), 3)
    worker = _worker_of(eng)
    del eng
    gc.collect()
    worker.join(timeout=5)
    assert not worker.is_alive()


def test_worker_failure_is_raised_on_the_main_thread(tiny):
    class FailingPrefill:
        def __init__(self, m):
            self.m, self.args = m, m.args

        def __call__(self, x, cache=None):
            if x.shape[1] > 1:
                raise MemoryError("simulated prefill failure")
            return self.m(x, cache=cache)

        def __getattr__(self, k):
            return getattr(self.m, k)

    eng = Engine(FailingPrefill(tiny.module), chunk_size=16, overlap=True)
    eng.submit(list(range(1, 50)), 3)
    with pytest.raises(RuntimeError, match="prefill worker failed") as info:
        eng.run()
    assert isinstance(info.value.__cause__, MemoryError)
    assert eng._worker is None  # run() stopped it on the way out
