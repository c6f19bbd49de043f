"""Per-request sampling (mlxlab.engine.sampling): a seeded request's tokens do not depend on what
it is batched with, greedy rows beside it stay exact, bad options are refused."""

import pytest
from oracle import assert_matches, reference

from mlxlab import Engine

PROMPT, OTHER = list(range(5, 60)), list(range(100, 140))


def _run(model, with_other: bool, seed: int, overlap: bool = False):
    with Engine(model, chunk_size=16, overlap=overlap) as eng:
        other = eng.submit(OTHER, 12) if with_other else None
        req = eng.submit(PROMPT, 12, temperature=0.9, top_p=0.95, seed=seed)
        eng.run()
    return req.output_tokens, other


@pytest.mark.parametrize("overlap", [False, True])
def test_a_seeded_request_gives_the_same_tokens_alone_and_batched(tiny, overlap):
    alone, _ = _run(tiny, False, 7, overlap)
    batched, other = _run(tiny, True, 7, overlap)
    assert alone == batched and len(alone) == 12
    assert_matches(other.output_tokens, reference(tiny, OTHER, 12))  # the greedy row beside it is exact
    assert _run(tiny, False, 8)[0] != alone  # another seed, other tokens (a temperature near 1 on 1k ids)


@pytest.mark.parametrize("kw, match", [(dict(temperature=-1), "temperature"), (dict(temperature="hot"), "temperature"),
                                       (dict(temperature=1, top_p=0), "top_p"), (dict(temperature=1, top_p=1.5), "top_p"),
                                       (dict(temperature=1, top_k=-3), "top_k"), (dict(temperature=1, seed=1.5), "seed"),
                                       (dict(temperature=float("nan")), "temperature")])
def test_bad_sampling_options_are_refused_and_the_engine_still_serves(tiny, kw, match):
    eng = Engine(tiny, chunk_size=16)
    with pytest.raises(ValueError, match=match):
        eng.submit(PROMPT, 4, **kw)
    good = eng.submit(OTHER, 4)
    eng.run()
    assert good.output_tokens == reference(tiny, OTHER, 4)[0] and len(eng.requests) == 1
