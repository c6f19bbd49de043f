"""The engine's "policy" warm-up: a throwaway engine configured like the real one runs a chat with a
document beside it before the clock starts, so a first run meets shapes it has already seen."""

import random

import pytest
from oracle import assert_matches, prompts_for, reference

from mlxlab import Engine
from mlxlab.policies import SLOChunking


@pytest.mark.parametrize("kw", [dict(policy="stall_free", token_budget=64), dict(policy="interleave", overlap=True)])
def test_policy_warmup_runs_before_the_clock_and_leaves_no_trace(tiny, kw):
    eng = Engine(tiny, chunk_size=32, warmup="policy", warmup_tokens=90, **kw)
    assert set(eng.warmup_s) == {"token", "policy"} and all(v > 0 for v in eng.warmup_s.values())
    assert eng.requests == [] and eng.steps == [] and not eng.has_work
    assert eng.now() < sum(eng.warmup_s.values()) + 1.0  # the clock started after the warm-up
    p = prompts_for(random.Random(9), tiny.vocab_size, [70])[0]
    r = eng.submit(p, 8)
    eng.run()
    assert_matches(r.output_tokens, reference(tiny, p, 8))


def test_policy_warmup_primes_a_learning_policy_with_its_repeated_shapes(tiny):
    """The warm-up runs a copy of the policy (its own choices are not the real one's), and the real
    policy then observes the warm-up's steps, less each shape's first step (first-use costs)."""
    pol = SLOChunking(min_observations=2, refit_every=2)
    eng = Engine(tiny, policy=pol, chunk_size=32, warmup="policy", warmup_tokens=120)
    assert eng.policy is pol and pol.chosen == []
    assert 0 < len(pol._records) < len(eng.steps) + 200 and pol.cost_model.fitted
    shapes = [(r["phase"], r["fused"], r["decode_batch"], tuple(c[0] for c in r["prefill_chunks"]))
              for r in pol._records]
    assert len(pol._records) >= 2
    plain = Engine(tiny, policy="interleave", chunk_size=32, warmup="policy", warmup_tokens=120)
    assert plain.policy.observes is False and shapes  # nothing to prime


def test_unknown_warmup_mode_and_bad_warmup_tokens_are_refused(tiny):
    with pytest.raises(ValueError, match="policy"):
        Engine(tiny, warmup="everything")
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="warmup_tokens"):
            Engine(tiny, warmup="policy", warmup_tokens=bad)


def test_slo_default_target_is_twice_the_models_decode_only_step():
    """With no itl_target_s, slo aims at itl_target_x (2) times the model's decode-only step: here a
    5 ms decode and 1 ms + 20 us/token per chunk, so the largest chunk within 10 ms is ~200."""
    from mlxlab.core.costmodel import StepCostModel
    from mlxlab.core.plan import SchedulerState, SeqView
    cm = StepCostModel.from_coefficients({"decode_step": 0.005, "prefill_chunks": 0.001, "prefill_tokens": 2e-5},
                                         n_obs=1)
    pol = SLOChunking(cost_model=cm, min_chunk=16, max_chunk=4096)
    st = SchedulerState(0, 4096, [SeqView(1, "b", 0, 20000, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)])
    assert pol.target_s(1, 6) == pytest.approx(2 * cm.predict(1, 6, []))
    (_, n), = pol.schedule(st).prefill
    assert 180 <= n <= 200 and pol.infeasible_steps == 0
    assert "2x decode step" in repr(pol)
    with pytest.raises(ValueError, match="itl_target_x"):
        SLOChunking(itl_target_x=1.0)


def test_policy_warmup_keeps_the_chat_decoding_through_the_whole_document(tiny):
    """Every chunk of the warm-up's document runs beside the chat's decode, as in the scene it warms
    for: a packing policy (stall_free) then meets its packed shapes, not the document alone. The
    chat used to stop after 8 tokens, leaving most of the document's chunks to run alone."""
    from mlxlab.engine.warmup import policy_warmup

    eng = Engine(tiny, policy="stall_free", token_budget=24, chunk_size=32)
    policy_warmup(eng, tiny.vocab_size, 200)
    chat, doc = eng.requests
    doc_steps = [r for r in eng.steps if any(c[0] == doc.id for c in r.prefill)]  # the document's chunks
    assert len(doc_steps) >= 200 // 24
    assert all(r.decode_seqs == [chat.id] and r.fused for r in doc_steps)  # each packed with the chat's decode
    assert chat.finish_reason == "cancelled" and doc.done and not eng.has_work
    assert sum(t > doc.token_times_s[0] for t in chat.token_times_s) >= 2


def test_slo_plans_its_largest_chunk_when_prefill_runs_beside_decode():
    """In overlap mode a chunk does not lengthen the decode step it is planned with, so slo has
    nothing to trade and plans max_chunk even while a chat decodes (and counts no choice)."""
    from mlxlab.core.plan import SchedulerState, SeqView
    pol = SLOChunking(min_chunk=16, max_chunk=1024)
    st = SchedulerState(0, 1024, [SeqView(1, "b", 0, 20000, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)],
                        side_prefill=True)
    assert pol.schedule(st).prefill == [(1, 1024)] and pol.chosen == []
    st.side_prefill = False
    assert pol.schedule(st).prefill == [(1, 16)]  # serial, nothing learned yet: its smallest chunk


def test_engine_left_to_choose_runs_slo_beside_decode_on_a_gpu_only(tiny, monkeypatch):
    """overlap=None: slo's side_prefill options (pipelined, the whole prompt per hand-over) on a GPU;
    off on the CPU; an explicit option always wins; greedy output equals mlx-lm's either way."""
    import mlxlab.engine.overlap as ov
    from mlxlab.policies.slo import WHOLE_PROMPT

    cpu = Engine(tiny, policy="slo")
    assert cpu.overlap is False and Engine(tiny, policy="interleave").overlap is False
    monkeypatch.setattr(ov, "side_by_side_device", lambda: True)
    eng = Engine(tiny, policy="slo", chunk_size=32)
    assert (eng.overlap, eng.overlap_sync, eng.overlap_job_chunks) == (True, "pipelined", WHOLE_PROMPT)
    assert Engine(tiny, policy="interleave").overlap is False  # no side_prefill wish
    assert Engine(tiny, policy="slo", overlap=False).overlap is False
    assert Engine(tiny, policy="slo", overlap_sync="layer").overlap_sync == "layer"
    ps = prompts_for(random.Random(4), tiny.vocab_size, [90, 7])
    rs = [eng.submit(p, 6) for p in ps]
    eng.run()
    for r, p in zip(rs, ps):
        assert_matches(r.output_tokens, reference(tiny, p, 6))
    with pytest.raises(ValueError, match="overlap must be"):
        Engine(tiny, overlap="yes")


def test_slo_stops_observing_steps_once_its_prefill_runs_beside_decode(tiny, monkeypatch):
    """In overlap mode slo's model decides nothing, so the engine stops building step records for
    it (their cost and the refits would fall on the chat's thread); serial slo keeps learning."""
    import mlxlab.engine.overlap as ov

    monkeypatch.setattr(ov, "side_by_side_device", lambda: True)
    eng = Engine(tiny, policy="slo", chunk_size=32)
    ps = prompts_for(random.Random(5), tiny.vocab_size, [9, 120])
    eng.submit(ps[0], 12)
    eng.step()
    eng.submit(ps[1], 4)
    eng.run()
    assert eng.policy.observes is False and eng.policy._records == []
    serial = Engine(tiny, policy="slo", chunk_size=32, overlap=False)
    serial.submit(ps[1], 4)
    serial.run()
    assert serial.policy.observes is True and serial.policy._records
