"""Engine.cancel: a client that goes away ends its request and frees its KV; the others go on
exactly as they would have."""

import pytest
from oracle import assert_matches, reference

from mlxlab import Engine


@pytest.mark.parametrize("overlap", [False, True])
def test_cancelling_a_decoding_and_a_waiting_request_leaves_the_others_exact(tiny, overlap):
    keep_p, gone_p, wait_p = list(range(1, 40)), list(range(40, 90)), list(range(90, 300))
    with Engine(tiny, chunk_size=16, overlap=overlap) as eng:
        keep = eng.submit(keep_p, 12)
        gone = eng.submit(gone_p, 12)
        while len(gone.output_tokens) < 3:
            eng.step()
        waiting = eng.submit(wait_p, 12)
        at_cancel = len(eng.steps)  # steps recorded so far; the one in flight may still carry gone
        assert eng.cancel(gone) and eng.cancel(waiting)
        assert not eng.cancel(gone)  # already finished
        before = len(gone.output_tokens)
        eng.run()
    assert gone.finish_reason == waiting.finish_reason == "cancelled"
    assert len(gone.output_tokens) <= before + 1  # at most the token already in flight
    assert waiting.output_tokens == []
    assert_matches(keep.output_tokens, reference(tiny, keep_p, 12))
    assert eng.kv_tokens_in_use() == 0
    # no step after the one in flight at the cancel decodes it (under load keep may have finished
    # before the cancel, so "the last decode step" can be that in-flight one: count from the cancel)
    assert [s.index for s in eng.steps[at_cancel + 1:] if gone.id in s.decode_seqs] == []


def test_cancel_while_the_prefill_thread_holds_the_request(tiny):
    with Engine(tiny, chunk_size=8, overlap=True) as eng:
        req = eng.submit(list(range(1, 200)), 8)
        eng.step()  # handed to the prefill thread
        assert eng._prefill.busy and req.id in eng._prefill.held
        assert eng.cancel(req)
        eng.run()
    assert req.finish_reason == "cancelled" and req.output_tokens == []
    assert eng.kv_tokens_in_use() == 0 and not eng.has_work
