"""The simulator: exact times on a hand-made cost model, the engine's decisions step for step.
Profiles and fitting: tests/test_profiles.py, tests/test_fit.py; validation against the engine
and the seed-001 study: tests/test_sim_validation.py."""

import random

import pytest

from mlxlab import Engine
from mlxlab.core.costmodel import FEATURES, StepCostModel, WarmShapes, features
from mlxlab.sim.fit import fit_cost_model
from mlxlab.sim import Simulator, simulate
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload

HAND = StepCostModel.from_coefficients({"decode_step": 0.010, "decode_batch": 0.001, "prefill_chunks": 0.100,
                                        "prefill_tokens": 0.001}, n_obs=1, source="hand")


def test_hand_computed_packed_steps_under_stall_free():
    """stall_free packs a step's decode and chunk into one forward (as the engine does): the step
    costs the whole packed prediction, its chunk starts with it and its token comes at its end.
    A (11 tokens: 10 prefilled), budget 21. step 0 prefill: A 10 (0.1 + 0.010) -> 0.110.
    B (61 tokens: 60 prefilled) arrives. step 1 packed: decode A + B 20 -> 0.001 + 0.1 + 0.020
    = 0.121 (the decode's fixed 0.010 rides on the chunk's forward) -> A's first token at 0.231
    (back to back it would come at 0.121)."""
    sim = Simulator(HAND, policy="stall_free", token_budget=21, chunk_size=64, key_align=1)
    assert sim.fuse
    a = sim.submit(list(range(1, 12)), 4, tenant="chat")
    sim.step()
    b = sim.submit(list(range(1, 62)), 1, tenant="batch", arrival_s=sim.now())
    rec = sim.step()
    assert rec.phase == "mixed" and rec.prefill == [(b.id, 20, 0)]
    assert b.prefill_start_s == pytest.approx(0.110)
    assert a.token_times_s == [pytest.approx(0.231)] and rec.end_s == pytest.approx(0.231)
    sim.run()
    unfused = Simulator(HAND, policy="stall_free", token_budget=21, chunk_size=64, fuse=False, key_align=1)
    ua = unfused.submit(list(range(1, 12)), 4, tenant="chat")
    unfused.step()
    unfused.submit(list(range(1, 62)), 1, tenant="batch", arrival_s=unfused.now())
    unfused.step()
    assert ua.token_times_s == [pytest.approx(0.121)]
    f = features(1, 11, [(20, 0)], packed=True)
    assert f[FEATURES.index("decode_step")] == 0 and f[FEATURES.index("decode_batch")] == 1
    assert features(1, 11, [], packed=True)[FEATURES.index("decode_step")] == 1  # no chunk: a decode of its own


def test_a_packed_step_that_changes_the_decode_rows_pays_packed_changes():
    """As above with packed_changes = 0.05: A's first decode rides on B's first chunk, so that
    packed step (0.001 + 0.1 + 0.020, the decode's fixed cost riding on the chunk's forward) also
    pays 0.05: A's first token at 0.110 + 0.171 = 0.281. The next packed step changes nothing:
    A's second token 0.121 later. The fit prices the
    term from packed ``start``/``join_chunk`` records, relative to the whole step."""
    cm = StepCostModel.from_coefficients({**HAND.coefficients(), "packed_changes": 0.05}, n_obs=1)
    sim = Simulator(cm, policy="stall_free", token_budget=21, chunk_size=64, key_align=1)
    a = sim.submit(list(range(1, 12)), 4, tenant="chat")
    sim.step()
    sim.submit(list(range(1, 62)), 1, tenant="batch", arrival_s=sim.now())
    first = sim.step()
    second = sim.step()
    assert (first.joined, first.fused, second.joined, second.fused) == (1, True, 0, True)
    assert a.token_times_s == [pytest.approx(0.281), pytest.approx(0.402)]
    # a decode-only start pays nothing of it
    assert features(1, 11, [], joined=1)[FEATURES.index("packed_changes")] == 0
    assert features(1, 11, [(20, 0)], joined=1, packed=True)[FEATURES.index("packed_changes")] == 1
    base = [{"kind": "decode", "decode_batch": b, "decode_context_tokens": c * b, "prefill_tokens": 0,
             "duration_s": cm.predict(b, c * b)} for b in (1, 2, 4) for c in (100, 1000)]
    base += [{"kind": "prefill", "decode_batch": 0, "prefill_tokens": n, "prefill_context_tokens": c,
              "prefill_seqs": [1], "duration_s": cm.predict(0, 0, [(n, c)])} for n in (16, 32, 64) for c in (0, 64)]
    changes = [{"kind": "start", "fused": True, "joined": 1, "decode_batch": 1, "decode_context_tokens": 10,
                "prefill_tokens": 20, "prefill_context_tokens": 0, "prefill_seqs": [2],
                "duration_s": cm.predict(1, 10, [(20, 0)], packed=True, joined=1)}]
    got = fit_cost_model(base + changes)
    assert got.coefficients()["packed_changes"] == pytest.approx(0.05, rel=1e-4)


def test_hand_computed_token_times_under_interleave():
    """Prompt A (11 tokens: 10 prefilled), prompt B (101 tokens: 100 prefilled), chunk 50.
    step 0 prefill: A 10 (0.1 + 0.010), B 50 (0.1 + 0.050)            -> ends 0.260
    step 1 mixed:   decode A (0.010 + 0.001) -> A's token at 0.271; B 50 more (0.150) -> 0.421
    step 2 decode:  A, B (0.010 + 0.002)     -> both tokens at 0.433 (read during step 3)
    step 3 decode:  A, B                     -> both tokens at 0.445; both hit max_tokens."""
    sim = Simulator(HAND, policy="interleave", chunk_size=50, key_align=1)
    a = sim.submit(list(range(1, 12)), 3, tenant="chat")
    b = sim.submit(list(range(1, 102)), 2, tenant="batch")
    sim.run()
    assert a.token_times_s == pytest.approx([0.271, 0.433, 0.445])
    assert b.token_times_s == pytest.approx([0.433, 0.445])
    assert (a.prefill_start_s, b.prefill_start_s) == pytest.approx((0.0, 0.110))
    assert a.ttft_s == pytest.approx(0.271) and b.ttft_s == pytest.approx(0.433)
    assert a.finish_reason == b.finish_reason == "length" and a.done and b.done
    assert a.output_tokens == [0, 0, 0]
    steps = [(s.phase, s.decode_seqs, s.prefill, s.decode_context_tokens) for s in sim.steps]
    assert steps == [("prefill", [], [(0, 10, 0), (1, 50, 0)], 0),
                     ("mixed", [0], [(1, 50, 50)], 11),
                     ("decode", [0, 1], [], 113),
                     ("decode", [0, 1], [], 115)]
    assert [t for s in sim.steps for t in (s.start_s, s.end_s)] == pytest.approx(
        [0.0, 0.26, 0.26, 0.421, 0.421, 0.433, 0.433, 0.445])
    assert sim.now() == pytest.approx(0.445) and not sim.has_work


def test_a_padded_final_chunk_is_charged_its_pad():
    """With key_align=8 (the engine's default) a prompt's last chunk runs padded to a key length
    that is a multiple of 8: A (11 tokens: 10 prefilled) is charged 16 tokens (0.1 + 0.016), and
    the record says so; 64 tokens (63 prefilled) in chunks of 32: the first chunk ends aligned,
    the last (31 after 32) is padded by 1."""
    sim = Simulator(HAND, policy="interleave", chunk_size=32)
    a = sim.submit(list(range(1, 12)), 1)
    rec = sim.step()
    assert rec.prefill == [(a.id, 10, 0)] and rec.padding == {a.id: 6}
    assert rec.end_s == pytest.approx(0.116)
    assert rec.as_dict()["prefill_chunks"] == [[10, 0, 6]]
    b = sim.submit(list(range(1, 65)), 1)
    sim.run()
    pads = [s.padding for s in sim.steps if b.id in {p[0] for p in s.prefill}]
    assert pads == [{}, {b.id: 1}]
    with pytest.raises(ValueError, match="key_align"):
        Simulator(HAND, key_align=0)


def test_deferred_reads_lag_like_the_engine():
    """A decode-only step's tokens are appended (and a request marked done) at the next step, with
    the time of the step that produced them."""
    sim = Simulator(HAND, chunk_size=64)
    r = sim.submit([5], 2)  # one token: nothing to prefill, decodes at once
    sim.step()
    assert r.output_tokens == [] and sim.has_work
    sim.step()
    assert r.token_times_s == pytest.approx([0.011]) and not r.done
    assert sim.step() is None  # nothing left to plan: reads the last token
    assert r.token_times_s == pytest.approx([0.011, 0.022]) and r.done and r.finish_s == pytest.approx(0.022)


def test_pipelined_token_times_with_tail_and_overhead():
    """With a measured tail (4 ms) and host overhead (1 ms), hand-computed as the engine behaves:
    decode forwards (11 ms) run back to back, Python returns 4 ms before each ends, and a
    decode-only step's tokens are read after the next step queued its forward. A's tokens:
    step 1 starts 0.001, forward ends 0.012, returns 0.008; step 2 starts 0.009, forward ends
    0.023, returns 0.019 and reads step 1's token (0.019); step 3 reads step 2's (0.030);
    B arrives; step 4 is mixed: its forward ends 0.045 (after step 3's at 0.034), it reads step
    3's token at 0.041 and its own at 0.045 (one tail later), then B's first chunk (0.150 s);
    step 5 (mixed) starts 0.196 with nothing in flight: its forward ends 0.207, then B's last
    chunk to 0.357; step 6 decodes A and B (12 ms, returns 0.366), step 7 B alone reads them
    (0.377), and the run's final flush waits for step 7's forward (0.381)."""
    cm = StepCostModel.from_coefficients(HAND.coefficients(), n_obs=1, tail_s=0.004, overhead_s=0.001)
    sim = Simulator(cm, policy="interleave", chunk_size=50, key_align=1)
    a = sim.submit([5], 6, tenant="chat")
    for _ in range(3):
        sim.step()
    assert a.token_times_s == pytest.approx([0.019, 0.030]) and sim.now() == pytest.approx(0.030)
    assert [(s.start_s, s.end_s) for s in sim.steps[:2]] == [pytest.approx((0.001, 0.019)), pytest.approx((0.009, 0.030))]
    b = sim.submit(list(range(1, 102)), 2, tenant="batch")
    sim.run()
    assert a.token_times_s == pytest.approx([0.019, 0.030, 0.041, 0.045, 0.207, 0.377])
    assert b.token_times_s == pytest.approx([0.377, 0.381]) and sim.now() == pytest.approx(0.381)
    assert [s.phase for s in sim.steps] == ["decode"] * 3 + ["mixed"] * 2 + ["decode"] * 2
    assert [s.start_s for s in sim.steps[3:]] == pytest.approx([0.031, 0.196, 0.358, 0.367])


def test_batch_changes_are_charged():
    """A (10 prefilled) and B (20) join at once: the merge copies 2 rows x 20 KV positions; B
    finishes and A is extracted back to a plain cache: 11 positions (10 + its first input)."""
    cm = StepCostModel.from_coefficients({"decode_step": 0.01, "join_tokens": 1e-5, "drop_tokens": 1e-4,
                                          "prefill_tokens": 1e-3}, n_obs=1)
    sim = Simulator(cm, policy="interleave", chunk_size=64)
    sim.submit([1] * 11, 3)
    sim.submit([1] * 21, 1)
    sim.run()
    assert [s.phase for s in sim.steps] == ["prefill", "decode", "decode", "decode"]
    assert [s.duration_s for s in sim.steps[1:]] == pytest.approx([0.0104, 0.0111, 0.01])


def test_submit_validation_matches_the_engine(tiny):
    eng = Engine(tiny)
    sim = Simulator.for_model(tiny, HAND)
    assert (sim.vocab_size, sim.max_context) == (eng.vocab_size, eng.max_context)
    cases = [([], 4), ([1, 2, tiny.vocab_size], 4), ([-1], 4), ([1, 2], 0), ([1, 2], -3), ([1, 2], 2.5),
             ([1] * (tiny.max_context - 3), 4), ("ab", 3)]
    for prompt, max_tokens in cases:
        with pytest.raises(ValueError) as e_eng:
            eng.submit(prompt, max_tokens)
        with pytest.raises(ValueError) as e_sim:
            sim.submit(prompt, max_tokens)
        assert str(e_sim.value) == str(e_eng.value)
    assert not sim.requests and not eng.requests
    with pytest.raises(ValueError, match="chunk_size"):
        Simulator(HAND, chunk_size=0)
    with pytest.raises(ValueError, match="noise"):
        Simulator(HAND, noise=-1)
    with pytest.raises(ValueError, match="unknown policy"):
        Simulator(HAND, policy="nope")


@pytest.mark.parametrize("policy,options", [
    ("interleave", {}),
    ("interleave", {"prefill_batch_size": 1}),
    ("prefill_first", {}),
    ("admission_gate", {"big_prompt_tokens": 200}),
    ("stall_free", {"token_budget": 100}),
])
def test_same_decisions_as_the_engine(tiny, policy, options):
    """Everything submitted at t=0: policies are deterministic given the queues, so the engine and
    the simulator must make the same plan at every step."""
    rng = random.Random(1)
    specs = [(40, 6), (1, 3), (300, 4), (250, 2), (90, 5)]
    prompts = [[rng.randrange(1, tiny.vocab_size) for _ in range(n)] for n, _ in specs]
    eng = Engine(tiny, policy=policy, chunk_size=64, **options)
    sim = Simulator.for_model(tiny, HAND, policy=policy, chunk_size=64, **options)
    for ex in (eng, sim):
        for p, (_, m) in zip(prompts, specs):
            ex.submit(p, m, arrival_s=0.0)
        ex.run()

    def trace(ex):
        return [(s.phase, s.decode_seqs, s.prefill, s.decode_context_tokens, s.joined, s.dropped, s.fused,
                 s.padding) for s in ex.steps]

    assert trace(sim) == trace(eng)
    assert any(s.padding for s in eng.steps)  # final chunks ran padded (key_align=8), in both
    # the batch changes and packed steps the records name really happen in this trace
    assert sum(s.joined for s in eng.steps) == len(specs)  # every request joins the decode rows once
    assert sum(s.dropped for s in eng.steps) >= 1
    assert any(s.fused for s in eng.steps) == (policy == "stall_free")
    assert [len(r.output_tokens) for r in sim.requests] == [len(r.output_tokens) for r in eng.requests]
    assert [r.finish_reason for r in sim.requests] == [r.finish_reason for r in eng.requests]


def test_runner_drives_the_simulator_with_arrivals_and_advance_to():
    wl = Workload([ChatTenant(sessions=2, turns=3, first_prompt_tokens=100, turn_tokens=20, output_tokens=8,
                              think_time_s=0.5, stagger_s=0.3),
                   BatchTenant(workers=1, requests=2, prompt_tokens=400, output_tokens=4, start_s=2.0)],
                  vocab_size=500, seed=3)
    res = simulate(HAND, wl, policy="interleave", chunk_size=128)
    assert res.complete and len(res.requests) == 8 and res.config["executor"] == "Simulator"
    assert set(res.timeline.columns) >= {"step", "start_s", "end_s", "phase", "decode_batch", "prefill_tokens"}
    # an idle gap is jumped, not stepped through: the batch arrives at 2.0 s on the virtual clock
    batch = res.requests[res.requests.tenant == "batch"]
    assert batch.scheduled_s.min() == pytest.approx(2.0)
    assert (res.requests.ttft_s > 0).all()
    again = simulate(HAND, wl, policy="interleave", chunk_size=128)
    assert again.requests.ttft_s.tolist() == res.requests.ttft_s.tolist()  # deterministic


def test_noise_is_seeded_and_mean_preserving():
    def run(noise, seed):
        sim = Simulator(HAND, chunk_size=32, noise=noise, seed=seed)
        r = sim.submit(list(range(1, 500)), 200)
        sim.run()
        return r.token_times_s

    assert run(0.2, 7) == run(0.2, 7)
    assert run(0.2, 7) != run(0.2, 8)
    plain, noisy = run(0.0, 0), run(0.2, 7)
    assert noisy[-1] == pytest.approx(plain[-1], rel=0.1)  # ~200 steps: the mean factor is ~1


def test_a_batch_decode_reads_the_padded_kv():
    """Two rows at contexts 2 and 5 read 2 x 5 KV positions (the engine's left-padded
    BatchKVCache): 7 of context and 3 of padding, each at its own price; a cost model without the
    padding term (duck-typed) is charged the padding as context. The record keeps the engine's sum."""
    class KvOnly:  # predict(batch, kv, chunks, batch-change terms): no padding term
        def predict(self, decode_batch=0, decode_context_tokens=0, chunks=(), **change):
            return 1e-3 * decode_context_tokens

    priced = StepCostModel.from_coefficients({"decode_context_tokens": 1e-3, "decode_padding_tokens": 1e-3}, n_obs=1)
    free_pad = StepCostModel.from_coefficients({"decode_context_tokens": 1e-3}, n_obs=1)
    cheap_pad = StepCostModel.from_coefficients({"decode_context_tokens": 1e-3, "decode_padding_tokens": 1e-4}, n_obs=1)
    for cm, second in ((priced, 0.011), (KvOnly(), 0.011), (free_pad, 0.008), (cheap_pad, 0.0083)):
        sim = Simulator(cm, chunk_size=64)
        a = sim.submit([1], 2)
        b = sim.submit([1, 2, 3, 4, 5], 1)
        sim.run()
        assert a.token_times_s == pytest.approx([0.001, second]) and b.token_times_s == pytest.approx([second])
        assert [s.decode_context_tokens for s in sim.steps] == [1, 7]


def test_unaligned_attention_and_batch_change_features():
    """A chunk's attention pairs count as unaligned when context + tokens is off the 8-token
    alignment; a record's listed chunks are counted one by one; a lone stream starting is no batch
    change, rows merged into a batch and rows dropped are."""
    from mlxlab.core.costmodel import FEATURES, features, rebatch_counts, record_features
    from mlxlab.core.plan import KEY_ALIGN

    un = FEATURES.index("prefill_attention_unaligned")
    pairs = FEATURES.index("prefill_attention")
    assert KEY_ALIGN == 8
    assert features(chunks=[(512, 8192)])[un] == 0 and features(chunks=[(504, 8192)])[un] == 0
    assert features(chunks=[(511, 8192)])[un] == features(chunks=[(511, 8192)])[pairs] > 0
    # a key length that is a multiple of 2 or 4 pays a half or a quarter (the H200 probe: 0.40, 0.24)
    assert features(chunks=[(510, 8192)])[un] == pytest.approx(features(chunks=[(510, 8192)])[pairs] / 2)
    assert features(chunks=[(508, 8192)])[un] == pytest.approx(features(chunks=[(508, 8192)])[pairs] / 4)
    # a chunk run padded by one token is aligned, and its pad goes through the model
    padded = features(chunks=[(511, 8192, 1)])
    assert padded[un] == 0 and padded[FEATURES.index("prefill_tokens")] == 512
    assert padded[pairs] == features(chunks=[(512, 8192)])[pairs]
    assert record_features({"prefill_tokens": 511, "prefill_context_tokens": 8192, "prefill_seqs": [1],
                            "prefill_chunks": [[511, 8192, 1]]})[un] == 0
    listed = record_features({"prefill_tokens": 130, "prefill_context_tokens": 50, "prefill_seqs": [1, 2],
                              "prefill_chunks": [[80, 0], [50, 50]]})
    assert listed[pairs] == pytest.approx(80 * 80 / 2 + 50 * 50 + 50 * 50 / 2)
    # 80 is aligned; 100 is a multiple of 4, not 8: a quarter
    assert listed[un] == pytest.approx((50 * 50 + 50 * 50 / 2) / 4)
    assert listed[FEATURES.index("prefill_chunks")] == 2
    assert rebatch_counts({"decode_batch": 1, "joined": 1}) == (0, False)
    assert rebatch_counts({"decode_batch": 3, "joined": 2}) == (2, True)
    assert rebatch_counts({"decode_batch": 1, "dropped": 1}) == (0, True)


def test_the_simulator_charges_a_batch_change_and_merged_rows():
    """A prefilled (lone start: nothing merged), then B joins it (two rows merged into a batch:
    one change, two rows), B finishes and leaves (one change)."""
    cm = StepCostModel.from_coefficients({"decode_step": 0.01, "join_rows": 0.002, "batch_changes": 0.005,
                                          "prefill_tokens": 1e-3}, n_obs=1)
    sim = Simulator(cm, policy="interleave", chunk_size=64)
    sim.submit([1] * 11, 4)
    sim.run()  # A alone: no change charged
    assert [s.duration_s for s in sim.steps if s.phase == "decode"] == pytest.approx([0.01] * 4)
    sim = Simulator(cm, policy="interleave", chunk_size=64)
    sim.submit([1] * 11, 4)
    sim.submit([1] * 11, 2)
    sim.run()
    dec = [s for s in sim.steps if s.phase == "decode"]
    assert [(s.joined, s.dropped) for s in dec][:3] == [(2, 0), (0, 0), (0, 1)]
    assert dec[0].duration_s == pytest.approx(0.01 + 2 * 0.002 + 0.005)
    assert dec[2].duration_s == pytest.approx(0.01 + 0.005)


def test_a_ragged_batch_change_pays_per_row_and_an_even_one_does_not():
    """Rows of one length join as one plain cache (no padding): no ragged cost. A 10-token and a
    20-token prompt make a left-padded batch: its join pays ragged_change_rows per row, and the
    drop back to one row (even again) does not."""
    cm = StepCostModel.from_coefficients({"decode_step": 0.01, "ragged_change_rows": 0.1, "prefill_tokens": 1e-4},
                                         n_obs=1)
    even = Simulator(cm, policy="interleave", chunk_size=64)
    even.submit([1] * 11, 3), even.submit([1] * 11, 2)
    even.run()
    assert [s.duration_s for s in even.steps if s.phase == "decode"] == pytest.approx([0.01] * 3)
    ragged = Simulator(cm, policy="interleave", chunk_size=64)
    ragged.submit([1] * 11, 3), ragged.submit([1] * 21, 2)
    ragged.run()
    dec = [s for s in ragged.steps if s.phase == "decode"]
    assert [(s.joined, s.dropped) for s in dec] == [(2, 0), (0, 0), (0, 1)]
    assert [s.duration_s for s in dec] == pytest.approx([0.01 + 2 * 0.1, 0.01, 0.01])


def test_the_first_chunk_of_each_token_count_in_a_run_is_cold():
    """cold_chunks: each token count (pad included) pays once per run, at its first chunk: 32, 32,
    then the 7 left padded to 8 (a new count); a second prompt of the same shape pays nothing, and
    a new simulator (a new run) pays again."""
    cm = StepCostModel.from_coefficients({"prefill_chunks": 0.01, "cold_chunks": 0.5}, n_obs=1)
    sim = Simulator(cm, policy="interleave", chunk_size=32)
    sim.submit([1] * 72, 1)
    sim.run()
    assert [s.duration_s for s in sim.steps if s.prefill] == pytest.approx([0.51, 0.01, 0.51])
    sim.submit([1] * 72, 1)
    sim.run()
    assert [s.duration_s for s in sim.steps if s.prefill][3:] == pytest.approx([0.01] * 3)
    again = Simulator(cm, policy="interleave", chunk_size=32)
    again.submit([1] * 72, 1)
    again.run()
    assert [s.duration_s for s in again.steps if s.prefill] == pytest.approx([0.51, 0.01, 0.51])
    assert features(0, 0, [(32, 0), (8, 32)], cold_chunks=5)[FEATURES.index("cold_chunks")] == 2  # at most one a chunk


def test_warm_shapes_by_size_or_by_attention_shape_with_an_lru():
    """WarmShapes: keyed by size a chunk is warm once its token count ran (any context); keyed by
    shape (mlx CUDA with cuDNN attention: one graph per query and key shape) the same size at a new
    key length is cold, and a shape pushed out of the LRU is cold again."""
    size = WarmShapes("size")
    assert size.cold([(32, 0), (32, 32), (7, 64, 1)]) == [1, 0, 1]
    assert size.cold([(8, 0)]) == [0]  # 7 + 1 pad ran as 8 tokens
    shape = WarmShapes("shape", capacity=2)
    assert shape.cold([(32, 0), (32, 32), (32, 0)]) == [1, 1, 0]
    assert shape.cold([(16, 0)]) == [1]  # three shapes met: (32, key 64), the oldest left, is cold again
    assert shape.cold([(32, 32), (16, 0)]) == [1, 0]
    for bad in (dict(key="rows"), dict(key="shape", capacity=0), dict(key="shape", capacity=2.5)):
        with pytest.raises(ValueError):
            WarmShapes(**bad)


def test_a_shape_keyed_profile_charges_stall_free_chunks_that_follow_the_decode_batch():
    """With a profile that counted cold chunks by attention shape, a chunk size fixed by the policy
    pays the first use once per (size, key length) and a second prompt of the same length runs
    warm; the same cost model keyed by size charges only each size's first chunk. The key and
    capacity survive the profile's dict."""
    coef = {"prefill_chunks": 0.01, "cold_chunks": 0.5, "decode_step": 0.001}
    by_size = StepCostModel.from_coefficients(coef, n_obs=1)
    by_shape = StepCostModel.from_coefficients(coef, n_obs=1, cold_key="shape", cold_capacity=256)
    back = StepCostModel.from_dict(by_shape.as_dict())
    assert (back.cold_key, back.cold_capacity) == ("shape", 256)
    assert StepCostModel.from_dict({k: v for k, v in by_size.as_dict().items() if not k.startswith("cold_")}
                                   ).cold_key == "size"  # a profile saved before the key

    def chunk_costs(cm):
        sim = Simulator(cm, policy="interleave", chunk_size=32)
        sim.submit([1] * 96, 1)
        sim.run()
        sim.submit([2] * 96, 1)
        sim.run()
        return [round(s.duration_s, 3) for s in sim.steps if s.prefill]

    assert chunk_costs(by_size) == [0.51, 0.01, 0.01, 0.01, 0.01, 0.01]
    assert chunk_costs(by_shape) == [0.51, 0.51, 0.51, 0.01, 0.01, 0.01]
    with pytest.raises(ValueError, match="cold key"):
        StepCostModel(cold_key="rows")
