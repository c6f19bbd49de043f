"""The compiled decode step (``Engine(compile_decode=True)``, mlxlab.engine.compiled): greedy
tokens equal to mlx-lm's ``generate_step`` on the same model object (the near-tie oracle of
tests/oracle.py), a lone stream and rows at one length compiled, ragged rows falling back, and the
step traced once per KV buffer size, not once per token."""

import random

import pytest
from oracle import assert_matches, prompts_for, reference

from mlxlab import Engine

TOKENS = 40


def run(model, prompts, **options):
    eng = Engine(model, chunk_size=64, compile_decode=True, **options)
    reqs = [eng.submit(p, TOKENS) for p in prompts]
    eng.run()
    return eng, reqs


@pytest.mark.parametrize("length", [1, 37, 500])  # 500 + 40 outgrows the 512-position buffer it was prefilled in
def test_a_lone_stream_decodes_as_generate_step_and_traces_once_per_buffer(tiny, length, monkeypatch):
    (prompt,) = prompts_for(random.Random(length), tiny.vocab_size, [length])
    eng = Engine(tiny, chunk_size=64, compile_decode=True)
    step, sizes, before = eng._compiled.step, [], eng._compiled.traces  # shared by the model's engines

    def watched(inputs, caches):  # the buffer size each compiled step ran on (after any growth)
        out = step(inputs, caches)
        sizes.append(caches[0].keys.shape[2])
        return out

    monkeypatch.setattr(eng._compiled, "step", watched)  # the shared step, watched for this test only
    req = eng.submit(prompt, TOKENS)
    eng.run()
    assert_matches(req.output_tokens, reference(tiny, prompt, TOKENS))
    assert len(sizes) >= TOKENS - 2  # every step but a one-token prompt's first ran compiled
    # at most once per buffer size (none for a size an earlier engine on this model traced), not per token
    assert 0 <= eng._compiled.traces - before <= len(set(sizes))
    if length == 500:
        assert sorted(set(sizes)) == [512, 768]  # grown once by mlx-lm's step, as KVCache grows


def test_rows_of_one_length_decode_together_compiled(tiny):
    prompts = prompts_for(random.Random(5), tiny.vocab_size, [48, 48, 48])
    eng, reqs = run(tiny, prompts, policy="prefill_first")
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(tiny, p, TOKENS))
    assert eng._compiled.traces >= 1


def test_ragged_rows_fall_back_to_the_uncompiled_step_and_stay_exact(small):
    prompts = prompts_for(random.Random(9), small.vocab_size, [30, 75, 12])
    _, reqs = run(small, prompts)
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(small, p, TOKENS))


def test_engines_on_one_model_share_one_compiled_step(tiny):
    a, b = Engine(tiny, compile_decode=True), Engine(tiny, compile_decode=True)
    assert a._compiled is b._compiled and Engine(tiny)._compiled is None


def test_compile_decode_must_be_a_bool(tiny):
    with pytest.raises(ValueError, match="compile_decode must be True or False"):
        Engine(tiny, compile_decode="yes")
