"""Engine(history_limit=N): a long-running engine keeps only the newest N step records and
finished requests, and decodes exactly as one that keeps everything."""

import pytest
from oracle import assert_matches, reference

from mlxlab import Engine


def test_a_bounded_history_drops_old_books_and_decodes_the_same(tiny):
    prompts = [list(range(1 + i, 20 + 3 * i)) for i in range(8)]
    eng = Engine(tiny, chunk_size=16, history_limit=3)
    reqs = [eng.submit(p, 6) for p in prompts[:4]]
    while len(reqs[0].output_tokens) < 2:
        eng.step()
    reqs += [eng.submit(p, 6) for p in prompts[4:]]  # arrive while the first ones decode
    eng.run()
    for r, p in zip(reqs, prompts):
        assert_matches(r.output_tokens, reference(tiny, p, 6))
    assert [r.id for r in reqs] == list(range(8))  # ids go on counting
    assert [r.id for r in eng.requests] == [5, 6, 7]  # the newest finished ones
    assert len(eng.steps) == 3 and [s.index for s in eng.steps] == sorted({s.index for s in eng.steps})
    assert eng.steps[-1].index > 3 and len(eng._seqs) == 3
    assert eng.kv_tokens_in_use() == 0


def test_unfinished_requests_are_kept_whatever_the_limit(tiny):
    eng = Engine(tiny, chunk_size=16, history_limit=1)
    long = eng.submit(list(range(1, 30)), 40)
    short = [eng.submit([5 + i, 6, 7], 2) for i in range(3)]
    while not all(r.done for r in short):
        eng.step()
    assert long in eng.requests and not long.done
    assert sum(r.done for r in eng.requests) <= 1
    eng.run()
    assert_matches(long.output_tokens, reference(tiny, list(range(1, 30)), 40))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
def test_a_bad_history_limit_is_refused(tiny, bad):
    with pytest.raises(ValueError, match="history_limit"):
        Engine(tiny, history_limit=bad)
