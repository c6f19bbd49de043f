"""The decode batch's two forms: rows of one length in one plain KVCache (no padding, no mask) and
ragged rows in a left-padded BatchKVCache, with the moves between them, against mlx-lm's
generate_step (near-tie rule of tests/oracle.py) and the bare decode loop."""

import random

import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache
from oracle import assert_matches, prompts_for, reference

from mlxlab import Engine
from mlxlab.engine.prefix_cache import PrefixCache
from mlxlab.studies.engine_bench.decode_limit import bare_decode, decode_limit, host_profile, limit_verdict


def _kinds(eng):
    return {type(c) for c in eng._batch.cache} if eng._batch.cache is not None else set()


def test_rows_of_one_length_decode_in_one_plain_cache_and_equal_generate_step(tiny):
    prompts = prompts_for(random.Random(1), tiny.vocab_size, [40] * 5)
    eng = Engine(tiny, chunk_size=64)
    reqs = [eng.submit(p, 12) for p in prompts]
    while not eng._decoding:
        eng.step()
    assert _kinds(eng) == {KVCache} and eng._batch.even
    assert eng._batch.cache[0].keys.shape[0] == 5  # the rows share one cache, along the batch axis
    eng.run()
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(tiny, p, 12))


def test_a_ragged_join_pads_and_the_rows_go_back_to_one_cache_when_it_leaves(tiny):
    rng = random.Random(2)
    even = prompts_for(rng, tiny.vocab_size, [30, 30])
    odd = prompts_for(rng, tiny.vocab_size, [55])[0]
    eng = Engine(tiny, chunk_size=64)
    a, b = (eng.submit(p, 14) for p in even)
    while not eng._decoding:
        eng.step()
    assert eng._batch.even
    c = eng.submit(odd, 3)  # joins at another length, finishes first
    seen, padded = set(), False
    while eng.has_work:
        eng.step()
        seen.add(eng._batch.even)
        padded |= BatchKVCache in _kinds(eng)
        if c.done and not a.done:
            assert eng._batch.even and _kinds(eng) == {KVCache}  # padding gone with the odd row
    assert False in seen and True in seen
    assert padded and c.done
    for r, p, n in ((a, even[0], 14), (b, even[1], 14), (c, odd, 3)):
        assert_matches(r.output_tokens, reference(tiny, p, n))


def test_rows_of_an_even_batch_go_into_the_prefix_cache_one_by_one(tiny):
    """A finished row of a plain multi-row cache is stored as its own one-row KV: a follow-up
    prompt extending it restores that prefix and still equals generate_step."""
    prompts = prompts_for(random.Random(3), tiny.vocab_size, [24, 24, 24])
    pc = PrefixCache(max_tokens=10_000)
    eng = Engine(tiny, chunk_size=64, prefix_cache=pc)
    reqs = [eng.submit(p, 6 + 2 * i) for i, p in enumerate(prompts)]
    eng.run()
    follow = prompts[1] + reqs[1].output_tokens + [5, 6, 7]
    r = eng.submit(follow, 6)
    eng.run()
    assert r.cached_tokens >= len(prompts[1])
    assert_matches(r.output_tokens, reference(tiny, follow, 6))


def test_the_bare_loop_equals_the_engine_in_float32(tiny):
    prompts = prompts_for(random.Random(4), tiny.vocab_size, [33] * 3)
    bare = bare_decode(tiny, prompts, 10)
    eng = Engine(tiny)
    reqs = [eng.submit(p, 10) for p in prompts]
    eng.run()
    assert bare["tokens"] == [r.output_tokens for r in reqs]
    assert len(bare["times"]) == 10 and bare["times"] == sorted(bare["times"])
    with pytest.raises(ValueError, match="equal length"):
        bare_decode(tiny, [[1, 2, 3], [1, 2]], 4)


def test_decode_limit_reports_each_side_the_ratios_and_a_host_profile(tiny):
    res = decode_limit(tiny, batches=(1, 3), context=24, tokens=6, repeats=2, progress=False)
    for b in ("1", "3"):
        row = res["batches"][b]
        assert set(row["tok_s"]) == {"bare", "engine", "mlx_lm", "compiled"}
        assert row["greedy_tokens_agree"]["compiled_vs_engine"]  # float32: the compiled step's tokens are the engine's
        assert len(row["compiled_over_mlx_lm"]["ratios"]) == 2
        assert all(v["median"] > 0 for v in row["tok_s"].values())
        assert len(row["engine_over_bare"]["ratios"]) == 2 and row["engine_over_bare"]["median"] > 0
        prof = row["host_profile"]
        assert prof["engine"]["steps"] > 0 and prof["bare"]["graph_us"] > 0 and "deliver_us" in prof["engine"]
    assert res["batches"]["1"]["mlx_lm_side"] == "generate_step"
    assert res["batches"]["3"]["mlx_lm_side"] == "BatchGenerator"
    with pytest.raises(ValueError, match="repeats"):
        decode_limit(tiny, repeats=1)


def _limit_row(ratio):
    return {"engine_over_bare": {"median": ratio, "min": ratio - 0.01, "max": ratio + 0.01},
            "engine_over_mlx_lm": {"median": 1.1}}


def test_limit_verdict_takes_the_worst_batch_of_any_preset():
    ok = limit_verdict({"a": {"batches": {"1": _limit_row(0.95), "8": _limit_row(1.02)}}})
    assert ok["verdict"] == "reproduced" and ok["measured"]["batch"] == 1
    bad = limit_verdict({"a": {"batches": {"1": _limit_row(0.95)}}, "b": {"batches": {"8": _limit_row(0.85)}}})
    assert bad["verdict"] == "not reproduced" and bad["measured"]["model"] == "b"
    assert limit_verdict({})["verdict"] == "not measured"


def test_host_profile_parts_add_up_to_the_step(tiny):
    prompts = prompts_for(random.Random(5), tiny.vocab_size, [20, 20])
    prof = host_profile(tiny, prompts, 8)
    for side in ("bare", "engine"):
        p = prof[side]
        parts = sum(v for k, v in p.items() if k.endswith("_us") and k not in ("step_us", "other_us"))
        assert abs(parts + p["other_us"] - p["step_us"]) < 1e-6


def test_packed_steps_on_an_even_batch_equal_generate_step(tiny):
    """stall_free packs a chunk into the decode forward: with the decode rows in one plain cache
    (rows of one length, no mask) the tokens still equal generate_step's."""
    rng = random.Random(6)
    even = prompts_for(rng, tiny.vocab_size, [26, 26, 26])
    long = prompts_for(rng, tiny.vocab_size, [150])[0]
    eng = Engine(tiny, policy="stall_free", token_budget=40, chunk_size=64)
    reqs = [eng.submit(p, 10) for p in even]
    while not eng._decoding:
        eng.step()
    assert eng._batch.even
    late = eng.submit(long, 4)
    eng.run()
    assert any(s.fused for s in eng.steps)
    for r, p, n in [(r, p, 10) for r, p in zip(reqs, even)] + [(late, long, 4)]:
        assert_matches(r.output_tokens, reference(tiny, p, n))


def _b1(engine_x, compiled_x):
    return {"batches": {"1": {"engine_over_mlx_lm": {"median": engine_x[1], "min": engine_x[0], "max": engine_x[2]},
                              "compiled_over_mlx_lm": {"median": compiled_x[1], "min": compiled_x[0],
                                                       "max": compiled_x[2]}}}}


def test_b1_parity_and_compiled_verdicts_hold_every_preset_to_the_target_and_straddling_is_inconclusive():
    from mlxlab.studies.engine_bench.decode_limit import compiled_verdict, parity_verdict

    ok = {"qwen2.5-0.5b": _b1((1.01, 1.05, 1.1), (1.35, 1.4, 1.5)), "llama-3.2-1b": _b1((1.0, 1.02, 1.04), (1.31, 1.4, 1.42))}
    assert parity_verdict(ok)["verdict"] == "reproduced" and compiled_verdict(ok)["verdict"] == "reproduced"
    slow = dict(ok, **{"llama-3.2-1b": _b1((0.8, 0.82, 0.85), (1.1, 1.2, 1.25))})
    assert parity_verdict(slow)["verdict"] == "not reproduced" and compiled_verdict(slow)["verdict"] == "not reproduced"
    noisy = dict(ok, **{"llama-3.2-1b": _b1((0.95, 1.01, 1.06), (1.25, 1.32, 1.36))})
    p, c = parity_verdict(noisy), compiled_verdict(noisy)
    assert p["verdict"] == c["verdict"] == "inconclusive" and p["measured"]["straddling"] == ["llama-3.2-1b"]
    # the compiled claim names the 0.5b and 1b presets: a slower 1.5b does not decide it
    other = dict(ok, **{"qwen2.5-coder-1.5b": _b1((1.0, 1.0, 1.0), (1.0, 1.05, 1.1))})
    assert compiled_verdict(other)["verdict"] == "reproduced"
    assert parity_verdict({})["verdict"] == "not measured"
