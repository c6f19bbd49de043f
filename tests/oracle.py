"""The exactness oracle of the engine suites: greedy tokens against mlx-lm's ``generate_step`` on the
same model object.

Rule. The engine decodes in a batch (left-padded ``BatchKVCache``, a mask array, packed matmuls)
where ``generate_step`` decodes one sequence alone, so float32 rounding can differ in the last
bits. That can only change a greedy token where the reference's two best logits are nearly tied.
So: the engine's tokens must equal the reference's at every step up to the first step where the
reference's top-two log-probability gap is below ``NEAR_TIE`` (1e-4, about 100x the float32
rounding seen in these logits); after a near-tie the streams may legitimately part. The rule is
only strong if near-ties are rare: :func:`near_tie_share` counts them over a fixed set of
reference streams, and each suite requires at most ``MAX_NEAR_TIE_SHARE`` (2%) of the steps.
"""

import mlx.core as mx
from mlx_lm.generate import generate_step

NEAR_TIE = 1e-4
MAX_NEAR_TIE_SHARE = 0.02
MAX_TOKENS = 16

_refs = {}


def reference(model, prompt, max_tokens=MAX_TOKENS):
    """mlx-lm's greedy tokens and, per step, the gap between the two best log-probabilities
    (cached per model, prompt and length)."""
    key = (id(model), tuple(prompt), max_tokens)
    if key not in _refs:
        tokens, gaps = [], []
        for tok, logprobs in generate_step(mx.array(prompt), model.module, max_tokens=max_tokens,
                                           prefill_step_size=2048):
            top2 = mx.topk(logprobs, 2)
            tokens.append(int(tok))
            gaps.append(float(mx.abs(top2[0] - top2[1]).item()))
        _refs[key] = (tokens, gaps)
    return _refs[key]


def first_near_tie(gaps) -> int:
    """Index of the first near-tied step (the tokens before it must match), or the length."""
    return next((i for i, g in enumerate(gaps) if g < NEAR_TIE), len(gaps))


def assert_matches(out, ref):
    tokens, gaps = ref
    n = first_near_tie(gaps)
    assert out[:n] == tokens[:n], f"diverged before any near-tie: {out} vs {tokens}"
    assert len(out) == len(tokens)


def near_tie_share(refs) -> tuple:
    """(reference steps, streams with a near-tie) over ``refs``: a stream counts once, at its
    first near-tie, where the oracle stops comparing it."""
    steps = sum(len(tokens) for tokens, _ in refs)
    return steps, sum(first_near_tie(gaps) < len(gaps) for _, gaps in refs)


def prompts_for(rng, vocab, lengths):
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
