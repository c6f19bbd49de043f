"""The engine's overlap mode: decode on the main thread, prefill chunks on a worker thread with its
own mlx stream.

Exactness uses the near-tie rule of :mod:`oracle` (tests/oracle.py): greedy tokens must equal
mlx-lm's ``generate_step`` up to the first step where the reference's top-two log-probability gap
is below ``NEAR_TIE``. In overlap mode the interleaving of chunks and decode steps depends on
thread timing, so these runs also check that any schedule the threads produce gives the same
tokens.
"""

import gc
import random
import subprocess
import sys
import threading
import time
import types
import weakref
from pathlib import Path

import pytest
from oracle import (
    MAX_NEAR_TIE_SHARE,
    MAX_TOKENS,
    assert_matches,
    near_tie_share,
    prompts_for,
    reference,
)

from mlxlab import Engine
from mlxlab.policies.base import Interleave

CHUNK_SIZES = [1, 7, 64, 512]
SYNC_CHUNK_SIZES = [16, 256]
SMALL_CHUNK_SIZES = [7, 64, 512]


def chunking_prompts(vocab, chunk_size):
    return prompts_for(random.Random(chunk_size), vocab, [1, 9, 33, 70, 5, 48, 90, 17, 300])


def sync_prompts(vocab, chunk_size):
    return prompts_for(random.Random(50 + chunk_size), vocab, [40, 3, 130, 64, 500])


def small_prompts(vocab, chunk_size):
    return prompts_for(random.Random(7 * chunk_size), vocab, [40, 3, 130, 64])


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
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_overlap_greedy_tokens_equal_generate_step(tiny, policy, chunk_size):
    prompts = chunking_prompts(tiny.vocab_size, chunk_size)
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
@pytest.mark.parametrize("chunk_size", SYNC_CHUNK_SIZES)
def test_overlap_other_syncs_equal_generate_step(tiny, policy, chunk_size, sync):
    prompts = sync_prompts(tiny.vocab_size, chunk_size)
    eng, reqs = staggered_run(tiny, prompts, policy, chunk_size, overlap_sync=sync)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(tiny, p))
    assert_chunks_tile_prompts(eng)


@pytest.mark.parametrize("policy", ["interleave", "prefill_first"])
@pytest.mark.parametrize("chunk_size", SMALL_CHUNK_SIZES)
def test_overlap_small_model_matches_generate_step(small, policy, chunk_size):
    prompts = small_prompts(small.vocab_size, chunk_size)
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


def test_overlap_near_ties_are_rare(tiny, small):
    """The oracle compares tokens only up to a stream's first near-tie: over the reference
    streams of the exactness tests' prompts above (a fixed set, whichever tests ran), near-ties
    are at most 2% of the steps."""
    refs = [reference(tiny, p) for c in CHUNK_SIZES for p in chunking_prompts(tiny.vocab_size, c)]
    refs += [reference(tiny, p) for c in SYNC_CHUNK_SIZES for p in sync_prompts(tiny.vocab_size, c)]
    refs += [reference(small, p) for c in SMALL_CHUNK_SIZES for p in small_prompts(small.vocab_size, c)]
    steps, near_ties = near_tie_share(refs)
    assert steps > 500
    assert near_ties <= MAX_NEAR_TIE_SHARE * steps, (steps, near_ties)


class Recording(Interleave):
    """Interleave that records which thread delivers each observed step."""

    def __init__(self):
        super().__init__()
        self.observed = []

    def observe(self, record):
        self.observed.append((threading.get_ident(), record))


class HoldingChunks:
    """Wraps the module so that, once ``hold`` is set, each prefill chunk waits on the worker until
    the main thread has called four more decode forwards. The second of those decode steps then
    starts after the chunk did and ends (its tokens read, during the third) before the chunk is
    let go: decode provably ran while a chunk was in flight, whatever the threads' speeds."""

    def __init__(self, m):
        self.m, self.args = m, m.args
        self.hold = False
        self.decodes = 0
        self.cv = threading.Condition()

    def __call__(self, x, cache=None):
        if x.shape[1] == 1:  # a decode forward (one token per row), on the main thread
            with self.cv:
                self.decodes += 1
                self.cv.notify_all()
        elif self.hold:  # a prefill chunk, on the worker
            with self.cv:
                target = self.decodes + 4
                # a bound only so that a broken engine fails the test instead of hanging it
                assert self.cv.wait_for(lambda: self.decodes >= target, timeout=120), "decode stalled"
        return self.m(x, cache=cache)

    def __getattr__(self, k):
        return getattr(self.m, k)


def test_decode_runs_while_a_prefill_chunk_is_in_flight(tiny):
    rng = random.Random(11)
    chat_prompt, long_prompt = prompts_for(rng, tiny.vocab_size, [16, 3000])
    policy = Recording()
    model = HoldingChunks(tiny.module)
    eng = Engine(model, policy=policy, chunk_size=256, overlap=True)
    chat = eng.submit(chat_prompt, 400)
    while len(chat.output_tokens) < 4:
        eng.step()
    model.hold = True
    long = eng.submit(long_prompt, 4)
    eng.run()
    assert chat.done and long.done
    prefills = [s for s in eng.steps if s.thread == "prefill" and s.prefill[0][0] == long.id]
    decodes = [s for s in eng.steps if s.thread == "main" and s.phase == "decode"]
    assert len(prefills) == 12 and all(s.end_s > s.start_s for s in prefills)
    for p in prefills:  # every chunk had a decode step run entirely while it was in flight
        assert any(p.start_s < d.start_s and d.end_s < p.end_s for d in decodes), p
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


def test_paced_overlap_greedy_tokens_equal_generate_step(tiny):
    """Pacing only delays decode steps: the tokens are generate_step's."""
    prompts = sync_prompts(tiny.vocab_size, 16)
    eng, reqs = staggered_run(tiny, prompts, "interleave", 16, overlap_pace_x=3.0)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(tiny, p))
    assert_chunks_tile_prompts(eng)


@pytest.mark.parametrize("jobs", [2, 5])
def test_several_chunks_a_hand_over_equal_generate_step(tiny, jobs):
    """A hand-over holding several chunks of one prompt runs them in order: generate_step's tokens,
    the chunks still tiling each prompt, and fewer prefill jobs than chunks."""
    prompts = chunking_prompts(tiny.vocab_size, 16)
    eng, reqs = staggered_run(tiny, prompts, "interleave", 16, overlap_job_chunks=jobs)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(tiny, p))
    assert_chunks_tile_prompts(eng)
    jobs_run = [s for s in eng.steps if s.thread == "prefill"]
    assert max(len(s.prefill) for s in jobs_run) > 1
    assert all(len(s.prefill) <= jobs * len({c[0] for c in s.prefill}) for s in jobs_run)


@pytest.mark.parametrize("n", [0, -2, 1.5, True])
def test_bad_job_chunks_are_refused(tiny, n):
    with pytest.raises(ValueError, match="overlap_job_chunks"):
        Engine(tiny, overlap=True, overlap_job_chunks=n)


def test_pacer_waits_only_while_the_prefill_thread_is_busy():
    from mlxlab.engine.overlap import DecodePacer

    pacer = DecodePacer(2.0)
    assert pacer.delay_s(0.0, busy=True) == 0.0  # nothing measured yet
    for t in (0.0, 0.01, 0.02, 0.03):  # decode-only gaps of 10 ms
        pacer.started(t, busy=False)
    assert pacer.delay_s(0.031, busy=False) == 0.0
    assert pacer.delay_s(0.031, busy=True) == pytest.approx(0.019)  # 0.03 + 2 x 10 ms
    pacer.started(0.05, busy=True)
    pacer.started(0.07, busy=True)  # gaps beside a prefill are not the reference
    assert pacer.delay_s(0.07, busy=True) == pytest.approx(0.02)
    assert DecodePacer(None).delay_s(1.0, busy=True) == 0.0


@pytest.mark.parametrize("x", [0.5, -1, "2", True, float("nan")])
def test_bad_pace_is_refused(tiny, x):
    with pytest.raises(ValueError, match="overlap_pace_x"):
        Engine(tiny, overlap=True, overlap_pace_x=x)


@pytest.mark.parametrize("kw, match", [(dict(overlap="yes"), "overlap"), (dict(overlap=1), "overlap"),
                                       (dict(overlap=True, overlap_sync="layers"), "overlap_sync")])
def test_bad_overlap_options_are_refused(tiny, kw, match):
    with pytest.raises(ValueError, match=match):
        Engine(tiny, **kw)


def _worker_of(eng):
    for _ in range(50):
        if eng._prefill.thread is not None:
            return eng._prefill.thread
        eng.step()
    raise AssertionError("the prefill worker never started")


def test_run_terminates_and_lets_go_of_the_shared_prefill_thread(tiny):
    eng = Engine(tiny, chunk_size=32, overlap=True)
    reqs = [eng.submit(p, 5) for p in prompts_for(random.Random(5), tiny.vocab_size, [100, 7, 60])]
    worker = _worker_of(eng)
    assert worker.is_alive() and worker.daemon
    eng.run()
    assert all(r.done for r in reqs)
    assert eng._prefill.thread is None and not eng._prefill.busy and not eng.has_work
    # the engine stays usable, and a second engine runs on the same thread (one stream per process)
    r = eng.submit(list(range(1, 80)), 3)
    eng.run()
    assert r.done and eng._prefill.thread is None
    other = Engine(tiny, chunk_size=32, overlap=True)
    other.submit(list(range(1, 90)), 3)
    assert _worker_of(other) is worker
    other.run()


def test_close_waits_for_the_engines_chunks_when_stepping_by_hand(tiny):
    with Engine(tiny, chunk_size=16, overlap=True) as eng:
        r = eng.submit(list(range(1, 200)), 3)
        _worker_of(eng)
        eng.step()
    assert eng._prefill.thread is None  # let go by the context manager
    assert not eng._prefill.busy  # the chunks it had in flight were collected
    eng.run()
    assert r.done and r.output_tokens == reference(tiny, list(range(1, 200)), 3)[0]
    eng.close()
    eng.close()  # idempotent


def test_a_dropped_engine_is_freed_though_the_prefill_thread_lives_on(tiny):
    eng = Engine(tiny, chunk_size=16, overlap=True)
    eng.submit(list(range(1, 100)), 3)
    worker = _worker_of(eng)
    ref = weakref.ref(eng)
    del eng
    for _ in range(100):
        gc.collect()
        if ref() is None:
            break
        time.sleep(0.05)  # its job may still be running on the prefill thread
    assert ref() is None and worker.is_alive()


OVERLAP_EXIT_SCRIPT = """
import sys
from mlxlab import load_model, Engine
model = load_model("tiny", dtype="float32")
for i in range(3):
    with Engine(model, chunk_size=16, overlap=True) as eng:
        r = eng.submit(list(range(1, 120)), 4)
        eng.run()
    assert r.done
print("ok")
"""


def test_a_process_that_ran_several_overlap_engines_exits_0(tmp_path):
    """Three overlap engines, one after another, then exit: the process must end with status 0
    (on mlx CUDA a second prefill thread and stream once aborted the process at exit)."""
    script = tmp_path / "overlap_exit.py"
    script.write_text(OVERLAP_EXIT_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


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
    assert eng._prefill.thread is None  # run() let go of it on the way out


def test_wait_for_exit_returns_once_the_os_thread_is_gone():
    """At interpreter exit the prefill thread is joined and then waited for until its OS thread
    has exited (mlx frees a thread's streams then); on Linux /proc/self/task lists live threads."""
    from mlxlab.core.threads import join_fully
    t = threading.Thread(target=lambda: None)
    t.start()
    assert join_fully(t)
    if Path("/proc/self/task").is_dir():
        assert not Path(f"/proc/self/task/{t.native_id}").exists()


def _lazy_rope_llama():
    """A hand-built llama whose llama3 RoPE holds ``_freqs``, an array ``parameters()`` leaves out
    and that stays lazy until first used."""
    import mlx.core as mx
    from mlx_lm.models import llama

    args = llama.ModelArgs.from_dict({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-5,
        "head_dim": 16, "rope_theta": 500000.0, "tie_word_embeddings": True,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}})
    mx.random.seed(3)
    module = llama.Model(args)
    mx.eval(module.parameters())
    return module


def test_overlap_on_a_module_with_lazy_private_arrays_equals_generate_step():
    """An array the model made lazily on the main thread, first evaluated on the prefill thread,
    failed there ("There is no Stream(cpu, 0) in current thread"); the engine evaluates the
    module's arrays first. Also: a raw mlx-lm module (an nn.Module is a dict) is accepted."""
    module = _lazy_rope_llama()
    prompt = list(range(1, 30))
    with Engine(module, chunk_size=8, overlap=True) as eng:
        req = eng.submit(prompt, 6)
        eng.run()
    assert req.done
    # the oracle runs after the engine, so the prefill thread was the first to meet _freqs
    assert_matches(req.output_tokens, reference(types.SimpleNamespace(module=module), prompt, 6))


def test_overlap_first_token_is_sampled_on_its_own_cache_and_a_one_token_request_never_joins(tiny):
    """In overlap mode a finished prefill's first token comes from a forward on its own cache
    (batch 1) as the prefill is collected: a one-token request beside a decoding chat is done without ever joining the
    batch (the chat's rows stay one even cache), and both equal generate_step."""
    chat_prompt, doc_prompt = list(range(3, 40)), list(range(50, 150))
    with Engine(tiny, chunk_size=32, overlap=True) as eng:
        chat = eng.submit(chat_prompt, 24)
        while len(chat.output_tokens) < 4:
            eng.step()
        doc = eng.submit(doc_prompt, 1)
        while not doc.done:
            eng.step()
            assert len(eng._decoding) == 1  # the document never joined the chat's batch
        assert eng._batch.even
        eng.run()
    assert doc.output_tokens == reference(tiny, doc_prompt, 1)[0]
    assert_matches(chat.output_tokens, reference(tiny, chat_prompt, 24))
    assert not any(doc.id in s.decode_seqs for s in eng.steps)  # no batch decode ever ran it


def test_tokens_read_before_the_engine_waits_for_the_prefill_thread_are_handed_out_first(tiny):
    # a chat finishes while a document's prefill is held on the prefill thread: the step that reads
    # the chat's last token then has nothing to run and waits for the prefill. Its hook must run
    # before that wait (a server publishes there), with the chat's last token already read.
    gate = threading.Event()

    class GatedPrefill:
        def __init__(self, m):
            self.m, self.args = m, m.args
            self.armed = False

        def __call__(self, x, cache=None):
            if self.armed and x.shape[1] > 1:
                assert gate.wait(30), "the engine never handed out its tokens before waiting"
            return self.m(x, cache=cache)

        def __getattr__(self, k):
            return getattr(self.m, k)

    rng = random.Random(5)
    chat_prompt, doc_prompt = prompts_for(rng, tiny.vocab_size, [16, 600])
    model = GatedPrefill(tiny.module)
    eng = Engine(model, chunk_size=256, overlap=True)
    seen = []

    def before_wait():
        seen.append((chat.done, len(chat.output_tokens), len(doc.output_tokens)))
        gate.set()

    chat = eng.submit(chat_prompt, 6)
    while len(chat.output_tokens) < 2:
        eng.step()
    model.armed = True
    doc = eng.submit(doc_prompt, 3)
    eng.before_wait = before_wait
    eng.run()
    assert seen and seen[0] == (True, 6, 0)  # the chat's every token read, the document's first not yet
    assert_matches(chat.output_tokens, reference(tiny, chat_prompt, 6))
    assert_matches(doc.output_tokens, reference(tiny, doc_prompt, 3))


@pytest.mark.parametrize("overlap", [True, False])
def test_a_row_far_longer_than_the_batch_decodes_apart_and_both_equal_generate_step(tiny, overlap):
    """With ``decode_apart``, a document whose context is far longer than the decoding chat's does not
    join (and left-pad) the chat's batch: it decodes in its own forward, the chat's rows stay one even
    cache, and both streams equal generate_step; without it the same document joins the batch."""
    chat_prompt, doc_prompt = list(range(3, 40)), list(range(50, 150))
    seen = {}
    for apart in (16, None):
        with Engine(tiny, chunk_size=32, overlap=overlap, decode_apart=apart) as eng:
            chat = eng.submit(chat_prompt, 160)  # long enough to decode while the prefill thread runs
            while len(chat.output_tokens) < 4:
                eng.step()
            doc = eng.submit(doc_prompt, 6)
            joined, alone = False, False
            while not doc.done:
                eng.step()
                joined |= any(s.req is doc for s in eng._decoding)
                alone |= any(s.req is doc for s in eng._solo)
                if apart is not None:
                    assert len(eng._decoding) == 1 and eng._batch.even  # the chat's rows, unpadded
            eng.run()
        seen[apart] = (joined, alone)
        assert_matches(doc.output_tokens, reference(tiny, doc_prompt, 6))
        assert_matches(chat.output_tokens, reference(tiny, chat_prompt, 160))
    assert seen == {16: (False, True), None: (True, False)}


def test_a_short_chat_beside_a_long_batch_decodes_apart_and_near_lengths_still_join(tiny):
    """The rule is the distance to the batch either way: a chat arriving while a long document is
    the batch decodes alone; a second chat of about its length arriving later joins the document's
    batch only if within ``decode_apart`` of it (here it is not, so it decodes alone too), and rows
    ready together start the batch from the shortest."""
    from mlxlab.engine.batch import decodes_apart

    assert decodes_apart([100, 37, 40], None, 16) == [True, False, False]
    assert decodes_apart([100, 37], 110, 16) == [False, True]
    assert decodes_apart([100, 37], 110, None) == [False, False]
    assert decodes_apart([], 110, 0) == []
    doc_prompt, chat_prompt = list(range(50, 150)), list(range(3, 40))
    with Engine(tiny, chunk_size=32, decode_apart=16) as eng:
        doc = eng.submit(doc_prompt, 20)
        while len(doc.output_tokens) < 2:
            eng.step()
        chat = eng.submit(chat_prompt, 8)
        while not chat.done:
            eng.step()
            assert [s.req for s in eng._decoding] == [doc]  # the chat never joined the document's rows
        eng.run()
    assert_matches(doc.output_tokens, reference(tiny, doc_prompt, 20))
    assert_matches(chat.output_tokens, reference(tiny, chat_prompt, 8))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64"])
def test_a_bad_decode_apart_is_refused(tiny, bad):
    with pytest.raises(ValueError, match="decode_apart must be a whole number of positions"):
        Engine(tiny, decode_apart=bad)
