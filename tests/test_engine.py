"""The engine's greedy tokens against mlx-lm's ``generate_step`` on the same model object, under
the near-tie rule of :mod:`oracle` (tests/oracle.py)."""

import random

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from oracle import (
    MAX_NEAR_TIE_SHARE,
    MAX_TOKENS,
    assert_matches,
    near_tie_share,
    prompts_for,
    reference,
)

from mlxlab import Engine

CHUNK_SIZES = [1, 7, 64, 512, 4096]
CONCURRENCY = [1, 2, 3, 5, 8]
SMALL_CHUNK_SIZES = [7, 64, 512]


def chunking_prompts(vocab, chunk_size):
    return prompts_for(random.Random(chunk_size), vocab, [1, 9, 33, 70, 5, 48, 90, 17])  # 8 requests, ragged


def concurrency_prompts(vocab, concurrency):
    rng = random.Random(100 + concurrency)
    return prompts_for(rng, vocab, [rng.randrange(2, 120) for _ in range(concurrency)])


def small_prompts(vocab, chunk_size):
    return prompts_for(random.Random(7 * chunk_size), vocab, [40, 3, 130, 64])


def cached_reference(model, prompt):
    return reference(model, prompt, MAX_TOKENS)


def staggered_run(model, prompts, policy, chunk_size, gap_steps=2):
    """Submit the prompts one at a time with ``gap_steps`` engine steps between arrivals,
    so requests join while others prefill and decode."""
    eng = Engine(model, policy=policy, chunk_size=chunk_size)
    reqs = []
    for p in prompts:
        reqs.append(eng.submit(p, MAX_TOKENS))
        for _ in range(gap_steps):
            eng.step()
    eng.run()
    return reqs


@pytest.mark.parametrize("policy", ["interleave", "prefill_first"])
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_greedy_tokens_equal_generate_step_under_chunking_and_concurrency(tiny, policy, chunk_size):
    prompts = chunking_prompts(tiny.vocab_size, chunk_size)
    reqs = staggered_run(tiny, prompts, policy, chunk_size, gap_steps=1 + chunk_size % 3)
    for r, p in zip(reqs, prompts):
        assert r.done and r.finish_reason == "length"
        assert_matches(r.output_tokens, cached_reference(tiny, p))


@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_greedy_tokens_equal_generate_step_for_1_to_8_concurrent_requests(tiny, concurrency):
    prompts = concurrency_prompts(tiny.vocab_size, concurrency)
    reqs = staggered_run(tiny, prompts, "interleave", 32, gap_steps=3)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, cached_reference(tiny, p))


@pytest.mark.parametrize("policy", ["interleave", "prefill_first"])
@pytest.mark.parametrize("chunk_size", SMALL_CHUNK_SIZES)
def test_small_model_matches_generate_step(small, policy, chunk_size):
    prompts = small_prompts(small.vocab_size, chunk_size)
    reqs = staggered_run(small, prompts, policy, chunk_size, gap_steps=2)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, cached_reference(small, p))


@pytest.mark.parametrize("policy, options", [("interleave", {}), ("stall_free", {"token_budget": 40})])
def test_padded_final_chunks_leave_outputs_and_caches_as_without(tiny, policy, options):
    """key_align=8 (the default) runs each prompt's last chunk padded to a key length that is a
    multiple of 8 and trims the pad back off: the records say so, the greedy tokens equal mlx-lm's
    and an unpadded engine's, and each cache holds exactly prompt + generated tokens."""
    rng = random.Random(11)
    prompts = prompts_for(rng, tiny.vocab_size, [38, 9, 70, 64, 100])  # 64: already aligned (63 prefilled)
    runs = {}
    for align in (8, 1):
        eng = Engine(tiny, policy=policy, chunk_size=32, key_align=align, **options)
        reqs = [eng.submit(p, MAX_TOKENS) for p in prompts]
        eng.run()
        runs[align] = (eng, reqs)
    eng, reqs = runs[8]
    pads = {rid: pad for s in eng.steps for rid, pad in s.padding.items()}
    assert pads == {r.id: -(len(p) - 1) % 8 for r, p in zip(reqs, prompts) if (len(p) - 1) % 8}
    assert not any(s.padding for s in runs[1][0].steps)
    for r, r1, p in zip(reqs, runs[1][1], prompts):
        assert r.output_tokens == r1.output_tokens
        assert_matches(r.output_tokens, cached_reference(tiny, p))
    # the cache a prefill leaves behind holds the prompt less its last token, never the pad
    eng = Engine(tiny, policy=policy, chunk_size=32, **options)
    r = eng.submit(prompts[0], 2)
    while not eng._ready:
        eng.step()
    assert eng._ready[0].cache[0].offset == len(prompts[0]) - 1


def test_stall_free_aligned_to_half_its_budget_as_tune_runs_it_on_a_shape_keyed_device_stays_exact(tiny):
    """Tune's grid on a device that prepares attention per shape runs ``stall_free`` with
    ``key_align`` half its budget (``default_grid(shape_keyed=True)``): chunks cut to end on multiples
    of it, final chunks padded up to one (up to ``key_align - 1`` pad tokens, trimmed off). The
    greedy tokens still equal mlx-lm's, every non-final chunk ends aligned, and each pad is the
    distance to the next multiple."""
    from mlxlab.studies.tune.run import default_grid

    quick = next(g["options"] for g in default_grid(True, shape_keyed=True) if g["policy"] == "stall_free")
    assert quick["key_align"] == quick["token_budget"] // 2
    opts = {"token_budget": 48, "key_align": 24}  # the same rule at the tiny model's sizes
    rng = random.Random(13)
    prompts = prompts_for(rng, tiny.vocab_size, [38, 9, 70, 100, 121])
    eng = Engine(tiny, policy="stall_free", chunk_size=2048, **opts)
    reqs = [eng.submit(p, MAX_TOKENS) for p in prompts]
    eng.run()
    pads = {rid: pad for s in eng.steps for rid, pad in s.padding.items()}
    assert pads == {r.id: -(len(p) - 1) % 24 for r, p in zip(reqs, prompts) if (len(p) - 1) % 24}
    lengths = {r.id: len(p) - 1 for r, p in zip(reqs, prompts)}  # the tokens each prefill runs
    chunks = [(rid, n, ctx) for s in eng.steps for rid, n, ctx in s.prefill]
    assert chunks and all((ctx + n) % 24 == 0 for rid, n, ctx in chunks if ctx + n < lengths[rid])
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, cached_reference(tiny, p))
    # slo, aligned coarsely too on such a device (its chunk chosen anew each step): still exact
    eng = Engine(tiny, policy="slo", chunk_size=64, key_align=32)
    reqs = [eng.submit(p, MAX_TOKENS) for p in prompts]
    eng.run()
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, cached_reference(tiny, p))

def test_a_prompt_cache_is_sized_for_the_whole_prompt_at_its_first_chunk(tiny):
    """The first chunk of a 300-token prompt allocates room for all of it (mlx-lm's cache would
    grow 256 tokens at a time, reallocating and copying at every overflow); once the prefill is
    done the cache grows by mlx-lm's own step again, and the tokens equal mlx-lm's."""
    from mlx_lm.models.cache import KVCache

    rng = random.Random(5)
    prompt = prompts_for(rng, tiny.vocab_size, [300])[0]
    eng = Engine(tiny, chunk_size=64)
    r = eng.submit(prompt, MAX_TOKENS)
    eng.step()
    seq = eng._seqs[r.id]
    assert seq.prefilled == 64 and seq.cache[0].keys.shape[2] >= 299
    while not eng._ready:
        eng.step()
    assert seq.cache[0].keys.shape[2] == seq.cache[0].keys.shape[2] // KVCache.step * KVCache.step
    assert all("step" not in c.__dict__ for c in seq.cache)
    eng.run()
    assert_matches(r.output_tokens, cached_reference(tiny, prompt))


def test_bad_key_align_is_refused(tiny):
    with pytest.raises(ValueError, match="key_align"):
        Engine(tiny, key_align=0)


def test_near_ties_are_rare(tiny, small):
    """The oracle above compares tokens only up to a stream's first near-tie: over the reference
    streams of the exactness tests' prompts (a fixed set, whichever tests ran), near-ties are at
    most 2% of the steps."""
    refs = [cached_reference(tiny, p) for c in CHUNK_SIZES for p in chunking_prompts(tiny.vocab_size, c)]
    refs += [cached_reference(tiny, p) for n in CONCURRENCY for p in concurrency_prompts(tiny.vocab_size, n)]
    refs += [cached_reference(small, p) for c in SMALL_CHUNK_SIZES for p in small_prompts(small.vocab_size, c)]
    steps, near_ties = near_tie_share(refs)
    assert steps > 500
    assert near_ties <= MAX_NEAR_TIE_SHARE * steps, (steps, near_ties)


def test_random_model_is_not_degenerate(tiny):
    # a model that repeats one token would make the oracle above vacuous
    rng = random.Random(1)
    outs = [cached_reference(tiny, p)[0] for p in prompts_for(rng, tiny.vocab_size, [20, 21, 22])]
    assert len({t for o in outs for t in o}) > 5


def test_all_decoding_sequences_advance_in_one_forward_pass(tiny):
    calls = []
    module = tiny.module

    class Counting:
        """Wraps the module to count forward calls and their batch sizes."""

        def __init__(self, m):
            self.m, self.args = m, m.args

        def __call__(self, x, cache=None):
            calls.append(x.shape)
            return self.m(x, cache=cache)

        def __getattr__(self, k):
            return getattr(self.m, k)

    eng = Engine(Counting(module), policy="interleave", chunk_size=64)
    rng = random.Random(3)
    reqs = [eng.submit(p, 8) for p in prompts_for(rng, tiny.vocab_size, [10, 20, 30, 40])]
    while any(not r.done for r in reqs):
        before = len(calls)
        rec = eng.step()
        if rec is None:
            break
        if rec.phase == "decode":
            assert len(calls) - before == 1
            assert calls[-1][0] == len(rec.decode_seqs)
    eng.run()
    assert max(len(s.decode_seqs) for s in eng.steps) == 4


def test_chunks_are_scheduling_points_with_step_records(tiny):
    eng = Engine(tiny, policy="interleave", chunk_size=16)
    long = eng.submit(list(range(1, 101)), 4)  # 99 prefill tokens -> 7 chunks
    eng.run()
    chunks = [p[1] for s in eng.steps for p in s.prefill]
    assert chunks == [16] * 6 + [3]
    assert all(s.end_s >= s.start_s for s in eng.steps)
    assert long.ttft_s > 0 and len(long.itl_s) == 3


@pytest.mark.parametrize("bad, match", [
    (dict(prompt_tokens=[]), "empty prompt"),
    (dict(prompt_tokens=[1, 2, 10**6]), "outside the vocabulary"),
    (dict(prompt_tokens=[1, -1]), "outside the vocabulary"),
    (dict(prompt_tokens=[1, 2], max_tokens=0), "max_tokens"),
    (dict(prompt_tokens=[1, 2], max_tokens=-3), "max_tokens"),
    (dict(prompt_tokens=[1] * 8000, max_tokens=500), "context"),
])
def test_bad_input_is_refused_at_submit_and_others_keep_running(tiny, bad, match):
    eng = Engine(tiny, chunk_size=8)
    good = eng.submit([5, 6, 7, 8, 9], 6)
    eng.step()
    with pytest.raises(ValueError, match=match):
        eng.submit(**{"max_tokens": 4, **bad})
    assert len(eng.requests) == 1
    eng.run()
    assert good.done and len(good.output_tokens) == 6
    assert good.output_tokens == cached_reference(tiny, [5, 6, 7, 8, 9])[0][:6]


@pytest.mark.parametrize("chunk_size", [0, -5, 2.5])
def test_bad_chunk_size_is_refused(tiny, chunk_size):
    with pytest.raises(ValueError, match="chunk_size"):
        Engine(tiny, chunk_size=chunk_size)


def test_stop_token_ends_a_request_early(tiny):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = cached_reference(tiny, prompt)[0]
    stop = ref[3]
    eng = Engine(tiny, chunk_size=4, stop_tokens=[stop])
    r = eng.submit(prompt, MAX_TOKENS)
    eng.run()
    assert r.finish_reason == "stop"
    assert r.output_tokens == ref[: ref.index(stop) + 1]


def test_a_chat_turn_restores_its_prefix_and_outputs_stay_identical(tiny, tmp_path):
    from mlxlab.engine.prefix_cache import PrefixCache

    rng = random.Random(11)
    turn1 = [rng.randrange(1, tiny.vocab_size) for _ in range(60)]
    pc = PrefixCache(max_tokens=10_000)
    eng = Engine(tiny, chunk_size=16, prefix_cache=pc)
    r1 = eng.submit(turn1, 10)
    eng.run()
    turn2 = turn1 + r1.output_tokens + [rng.randrange(1, tiny.vocab_size) for _ in range(12)]
    r2 = eng.submit(turn2, 10)
    assert r2.cached_tokens == len(turn1) + len(r1.output_tokens) - 1  # the last output token was never fed
    eng.run()
    prefill = sum(p[1] for s in eng.steps for p in s.prefill if p[0] == r2.id)
    assert prefill == len(turn2) - 1 - r2.cached_tokens
    assert pc.stats.hits == 1
    cold = Engine(tiny, chunk_size=16)
    r2_cold = cold.submit(turn2, 10)
    cold.run()
    assert r2.output_tokens == r2_cold.output_tokens
    assert_matches(r2.output_tokens, reference(tiny, turn2, 10))


def test_prefix_cache_entries_from_a_batch_row_are_exact(tiny):
    from mlxlab.engine.prefix_cache import PrefixCache

    rng = random.Random(12)
    prompts = [[rng.randrange(1, tiny.vocab_size) for _ in range(n)] for n in (30, 45, 12)]
    pc = PrefixCache()
    eng = Engine(tiny, chunk_size=32, prefix_cache=pc)
    reqs = [eng.submit(p, 6) for p in prompts]  # decode together: entries come from BatchKVCache rows
    eng.run()
    follow = prompts[1] + reqs[1].output_tokens + [7, 8, 9]
    hit = eng.submit(follow, 6)
    eng.run()
    assert hit.cached_tokens > len(prompts[1])
    cold = Engine(tiny, chunk_size=32)
    ref = cold.submit(follow, 6)
    cold.run()
    assert hit.output_tokens == ref.output_tokens


def test_kv_budget_refuses_what_can_never_fit_and_queues_what_cannot_fit_yet(tiny):
    per_token = tiny.kv_bytes_per_token()
    eng = Engine(tiny, chunk_size=32, kv_budget_bytes=120 * per_token)
    with pytest.raises(ValueError, match="could never run"):
        eng.submit(list(range(1, 101)), 40)  # 140 tokens of KV > 120
    a = eng.submit(list(range(1, 61)), 20)  # 80 tokens: fits
    b = eng.submit(list(range(2, 62)), 20)  # fits alone, not beside a
    assert [v.seq_id for v in eng.state().prefill_queue] == [a.id]
    eng.run()
    assert a.done and b.done
    assert b.prefill_start_s >= a.finish_s  # b waited until a's KV was released
    ref = Engine(tiny, chunk_size=32)
    rb = ref.submit(list(range(2, 62)), 20)
    ref.run()
    assert b.output_tokens == rb.output_tokens
    assert eng.memory()["peak_bytes"] > 0


def test_warmup_runs_before_the_clock_starts(tiny):
    """The engine's clock starts after its warm-up: on a clock that the warm-up moves on by 100 s,
    the engine reads 0 once it is built."""
    from unittest import mock

    from mlxlab.engine import loop

    t = [0.0]
    real = loop.run_warmup

    def warmup_taking_100_s(*args, **kwargs):
        t[0] += 100.0
        return real(*args, **kwargs)

    with mock.patch.object(loop, "run_warmup", warmup_taking_100_s):
        eng = Engine(tiny, warmup="shapes", chunk_size=64, clock=lambda: t[0])
    assert set(eng.warmup_s) >= {"token", "chunk_64", "batch_8"}
    assert eng.now() == 0.0 and not eng.requests and not eng.steps
    with pytest.raises(ValueError, match="warm-up mode"):
        Engine(tiny, warmup="always")


@pytest.mark.parametrize("name", ["kv_budget_bytes", "cache_limit_bytes", "memory_limit_bytes"])
def test_memory_settings_must_be_byte_counts(tiny, name):
    with pytest.raises(ValueError, match=name):
        Engine(tiny, **{name: -1})


# ---------------------------------------------------------------- per-request KV quantization
def kv_reference(model, prompt, max_tokens, bits, start, step):
    return [int(t) for t, _ in generate_step(mx.array(prompt), model.module, max_tokens=max_tokens, kv_bits=bits,
                                            kv_group_size=64, quantized_kv_start=start, prefill_step_size=step)]


@pytest.mark.parametrize("chunk_size", [7, 64, 4096])
def test_quantized_kv_requests_equal_generate_step_with_kv_bits_beside_plain_ones(tiny, chunk_size):
    """A quantized-KV request decodes in its own forward exactly as generate_step(kv_bits=...)
    does (same conversion points, same kernels: exact equality, no near-tie rule needed); the
    plain requests batched beside it still match their own plain reference."""
    rng = random.Random(7)
    p4, plain, p8, plain2 = prompts_for(rng, tiny.vocab_size, (40, 77, 130, 25))
    eng = Engine(tiny, chunk_size=chunk_size)
    r4 = eng.submit(p4, MAX_TOKENS, kv_bits=4)
    rp = eng.submit(plain, MAX_TOKENS)
    eng.step()
    r8 = eng.submit(p8, MAX_TOKENS, kv_bits=8, quantized_kv_start=100)
    rp2 = eng.submit(plain2, MAX_TOKENS)
    eng.run()
    assert r4.output_tokens == kv_reference(tiny, p4, MAX_TOKENS, 4, 0, chunk_size)
    assert r8.output_tokens == kv_reference(tiny, p8, MAX_TOKENS, 8, 100, chunk_size)
    assert_matches(rp.output_tokens, cached_reference(tiny, plain))
    assert_matches(rp2.output_tokens, cached_reference(tiny, plain2))
    # and quantizing really changed something: 4-bit KV on a random model moves greedy tokens
    assert r4.output_tokens != cached_reference(tiny, p4)[0]


def test_a_quantized_request_really_holds_a_quantized_cache_while_decoding(tiny):
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    eng = Engine(tiny, chunk_size=16)
    q = eng.submit(list(range(1, 50)), 8, kv_bits=4, quantized_kv_start=30)
    p = eng.submit(list(range(2, 51)), 8)
    types = set()
    while eng.has_work:
        eng.step()
        for s in eng._solo:
            types.add(type(s.cache[0]))
    eng.flush()
    assert q.done and p.done
    assert QuantizedKVCache in types and KVCache not in types  # 48 prefilled tokens > start 30
    assert p.id not in {s.req.id for s in eng._solo}


@pytest.mark.parametrize("opts, match", [({"kv_bits": 3}, "kv_bits must be one of"),
                                         ({"kv_bits": 4, "kv_group_size": 48}, "does not divide"),
                                         ({"kv_bits": 4, "quantized_kv_start": -1}, "quantized_kv_start")])
def test_bad_kv_settings_are_refused_at_submit(tiny, opts, match):
    eng = Engine(tiny)
    with pytest.raises(ValueError, match=match):
        eng.submit([1, 2, 3], 4, **opts)
    assert eng.requests == [] and not eng.has_work


def test_a_backend_without_quantized_attention_refuses_kv_bits_up_front(tiny):
    """The probe (not a crash mid-batch) decides; a refused request leaves the others running."""
    from unittest import mock

    from mlxlab.engine import kvquant as K

    eng = Engine(tiny, chunk_size=16)
    ok = eng.submit(list(range(1, 30)), 6)
    eng.step()
    K._probe.cache_clear()
    try:
        with mock.patch.object(K, "quantized_scaled_dot_product_attention",
                               side_effect=RuntimeError("[quantized_matmul] No implementation for problem shape")):
            with pytest.raises(ValueError, match="Use kv_bits=None"):
                eng.submit(list(range(1, 30)), 6, kv_bits=8)
    finally:
        K._probe.cache_clear()
    eng.run()
    assert len(eng.requests) == 1 and ok.done and len(ok.output_tokens) == 6


def test_kv_budget_counts_a_quantized_request_at_its_quantized_size(tiny):
    full, four = tiny.kv_bytes_per_token(), tiny.kv_bytes_per_token(4, 64)
    assert four < full / 3
    eng = Engine(tiny, chunk_size=32, kv_budget_bytes=100 * full)
    with pytest.raises(ValueError, match="could never run"):
        eng.submit(list(range(1, 201)), 40)  # 240 tokens at full precision > 100
    r = eng.submit(list(range(1, 201)), 40, kv_bits=4)  # 240 tokens at 4 bits fit
    eng.run()
    assert r.done


# ---------------------------------------------------------------- packed (fused) stall-free steps
@pytest.mark.parametrize("budget", [8, 40])
def test_fused_stall_free_steps_match_generate_step(tiny, budget):
    """stall_free packs a step's decodes and chunks into one forward (mlxlab.engine.fused); the rows of
    a packed matmul may round differently, so the near-tie rule applies as for batching."""
    rng = random.Random(11)
    prompts = prompts_for(rng, tiny.vocab_size, (30, 70, 45, 90))
    eng = Engine(tiny, policy="stall_free", token_budget=budget, chunk_size=64)
    assert eng.fuse
    reqs = []
    for p in prompts:
        reqs.append(eng.submit(p, MAX_TOKENS))
        for _ in range(3):
            eng.step()
    eng.run()
    mixed = [r for r in eng.steps if r.decode_seqs and r.prefill]
    assert mixed, "the workload should have produced packed steps"
    assert all(r.tokens <= max(budget, len(r.decode_seqs)) for r in eng.steps)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, cached_reference(tiny, p))


def test_a_fused_step_is_one_forward_and_unfused_is_two(tiny):
    """Count the model's own __call__: a packed step bypasses it entirely (one packed pass),
    an unfused mixed step calls it twice (decode, then the chunk)."""
    def count(fuse):
        calls = {"n": 0}
        module = tiny.module
        cls = type(module)
        orig = cls.__call__

        def counting(self, *a, **k):
            calls["n"] += 1
            return orig(self, *a, **k)

        eng = Engine(tiny, policy="stall_free", token_budget=24, chunk_size=64, fuse=fuse)
        a = eng.submit(list(range(1, 20)), 12)
        eng.step(); eng.step()  # a is decoding
        b = eng.submit(list(range(3, 80)), 4)
        cls.__call__ = counting
        try:
            rec = eng.step()
        finally:
            cls.__call__ = orig
        eng.run()
        assert rec.decode_seqs == [a.id] and rec.prefill and rec.prefill[0][0] == b.id
        return calls["n"], a.output_tokens, b.output_tokens

    fused_calls, fa, fb = count(True)
    plain_calls, pa, pb = count(False)
    assert (fused_calls, plain_calls) == (0, 2)
    assert fa == pa and fb == pb


def test_fuse_true_on_a_model_that_cannot_is_refused(tiny):
    from unittest import mock

    with mock.patch("mlxlab.engine.loop.can_fuse", return_value=(False, "model_type 'x' is not one of")):
        with pytest.raises(ValueError, match="use fuse=False"):
            Engine(tiny, policy="stall_free", fuse=True)
    with pytest.raises(ValueError, match="fuse must be"):
        Engine(tiny, fuse="yes")


def test_engines_on_one_thread_share_a_stream_and_other_threads_get_their_own():
    """As every generate_step call shares mlx-lm's generation stream (a fresh stream per engine
    made single-request prefill slower)."""
    import threading

    from mlxlab.engine.loop import thread_stream

    here = thread_stream()
    assert thread_stream() is here
    other = []
    t = threading.Thread(target=lambda: other.append(thread_stream()))
    t.start()
    t.join()
    assert other[0] is not here
