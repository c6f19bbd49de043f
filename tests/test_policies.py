"""Policy invariants on synthetic state, without MLX: a tiny fake executor applies each plan
to the queues (prefill chunks advance, finished prompts start decoding, decoders finish after
their tokens) so the invariants are checked over whole runs, not single snapshots."""

import random
import sys

import numpy as np
import pytest

from mlxlab.core.costmodel import StepCostModel
from mlxlab.policies.admission_gate import AdmissionGate
from mlxlab.core.plan import SchedulerState, SeqView, StepPlan, check_plan
from mlxlab.policies.stall_free import StallFree
from mlxlab.policies import make_policy


class FakeQueues:
    """Applies plans to SeqViews; arrivals at given steps."""

    def __init__(self, arrivals, chunk_size):
        self.arrivals = sorted(arrivals, key=lambda a: a[0])  # (step, SeqView)
        self.chunk_size = chunk_size
        self.queue, self.decoding, self.step_no = [], [], 0
        self.waited = {}  # seq_id -> steps since its last decode

    def state(self):
        while self.arrivals and self.arrivals[0][0] <= self.step_no:
            self.queue.append(self.arrivals.pop(0)[1])
        return SchedulerState(self.step_no * 0.01, self.chunk_size, list(self.queue), list(self.decoding))

    def apply(self, plan: StepPlan, state):
        check_plan(plan, state)
        for s in self.decoding:
            self.waited[s.seq_id] = 0 if plan.decode else self.waited.get(s.seq_id, 0) + 1
        if plan.decode:
            for s in self.decoding:
                s.generated += 1
            self.decoding = [s for s in self.decoding if s.generated < s.max_tokens]
        for seq_id, n in plan.prefill:
            s = next(x for x in self.queue if x.seq_id == seq_id)
            s.prefilled_tokens += n
            if s.remaining_prefill == 0:
                self.queue.remove(s)
                self.decoding.append(s)
        self.step_no += 1

    @property
    def busy(self):
        return bool(self.arrivals or self.queue or self.decoding)


def mixed_arrivals(seed, n_big=4, n_chat=6, big=(3000, 9000), chat=(20, 200)):
    rng = random.Random(seed)
    out = []
    for i in range(n_big):
        out.append((rng.randrange(0, 20), SeqView(i, "batch", 0.0, rng.randrange(*big), 0, 0, rng.randrange(1, 8))))
    for j in range(n_chat):
        out.append((rng.randrange(0, 60), SeqView(100 + j, "chat", 0.0, rng.randrange(*chat), 0, 0, rng.randrange(5, 40))))
    return out


def drive(policy, arrivals, chunk_size=512, max_steps=10_000, on_step=None):
    q = FakeQueues(arrivals, chunk_size)
    while q.busy and q.step_no < max_steps:
        st = q.state()
        plan = policy.schedule(st) if (st.prefill_queue or st.decoding) else StepPlan()
        if on_step:
            on_step(st, plan, q)
        q.apply(plan, st)
    assert not q.busy, "policy left work unfinished"
    return q


@pytest.mark.parametrize("seed", range(5))
def test_admission_gate_never_has_two_big_prefills_in_flight(seed):
    gate = AdmissionGate(big_prompt_tokens=2048)

    def check(st, plan, q):
        planned = {i for i, _ in plan.prefill}
        in_flight = {s.seq_id for s in st.prefill_queue if gate.is_big(s) and (s.prefilled_tokens > 0 or s.seq_id in planned)}
        assert len(in_flight) <= 1, in_flight

    drive(gate, mixed_arrivals(seed), on_step=check)


def test_admission_gate_does_not_hold_short_prompts_behind_a_big_one():
    gate = AdmissionGate(big_prompt_tokens=1000)
    big1 = SeqView(1, "batch", 0, 5000, 1024)  # in flight
    big2 = SeqView(2, "batch", 0, 5000, 0)
    chat = SeqView(3, "chat", 0, 50, 0)
    plan = gate.schedule(SchedulerState(0, 512, [big1, big2, chat], []))
    assert [i for i, _ in plan.prefill] == [1, 3]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [64, 256, 512])
def test_stall_free_never_exceeds_its_token_budget(seed, budget):
    pol = StallFree(token_budget=budget)

    def check(st, plan, q):
        decode_tokens = len(st.decoding) if plan.decode else 0
        if len(st.decoding) < budget:
            assert decode_tokens + plan.num_prefill_tokens() <= budget
        else:  # decoding alone fills the budget: no prefill at all
            assert plan.num_prefill_tokens() == 0

    drive(pol, mixed_arrivals(seed), chunk_size=4096, on_step=check)


def test_stall_free_serves_in_flight_prefill_before_new_ones():
    pol = StallFree(token_budget=300, key_align=1)
    new = SeqView(1, "b", 0, 1000, 0)
    started = SeqView(2, "b", 0, 1000, 200)
    plan = pol.schedule(SchedulerState(0, 4096, [new, started], [SeqView(3, "c", 0, 5, 5, 1, 9)]))
    assert plan.decode and plan.prefill == [(2, 299)]


def test_stall_free_ends_chunks_on_aligned_key_lengths():
    """With key_align=8 (the default) a chunk that does not finish its prompt ends at a key
    length that is a multiple of 8: the budget less one decode (299 tokens after 200) becomes
    296, and the 3 tokens left are not spent on an unaligned chunk of the next prompt."""
    pol = StallFree(token_budget=300)
    new = SeqView(1, "b", 0, 1000, 0)
    started = SeqView(2, "b", 0, 1000, 200)
    plan = pol.schedule(SchedulerState(0, 4096, [new, started], [SeqView(3, "c", 0, 5, 5, 1, 9)]))
    assert plan.prefill == [(2, 296)] and (200 + 296) % 8 == 0
    # a prompt's last chunk is left as it is (the engine pads it): 5 of 5 remaining tokens
    last = SeqView(4, "b", 0, 1005, 1000)
    assert pol.schedule(SchedulerState(0, 4096, [last], [])).prefill == [(4, 5)]



def test_an_aligned_cut_is_never_negative_when_the_prompt_is_already_off_the_alignment():
    """``align_chunk`` cuts a chunk back to end on a key length that is a multiple of ``key_align``;
    a prompt already off it (a prefix restored at an odd length) whose chunk is shorter than the
    overshoot has no aligned cut: 0, never a negative size (``slo`` at key_align=256 planned a
    chunk of -32 tokens in a simulated H100 grid before this), and ``slo`` then keeps its chunk."""
    from mlxlab.core.plan import align_chunk

    off = SeqView(1, "b", 0, 4000, 100)  # 100 tokens in: 20 more end at 120, 136 short of 256
    assert align_chunk(20, off, 256) == 0
    assert align_chunk(200, off, 256) == 156 and (100 + 156) % 256 == 0
    pol = make_policy("slo", itl_target_s=0.02, min_chunk=16, max_chunk=32, key_align=256)
    plan = pol.schedule(SchedulerState(0, 4096, [off], []))
    check_plan(plan, SchedulerState(0, 4096, [off], []))
    assert plan.prefill and all(n > 0 for _, n in plan.prefill)

def _fitted_cost_model():
    # synthetic truth: 5 ms per decode step + 20 us per prefill token + 1 ms per chunk
    rng = np.random.default_rng(0)
    recs = []
    for _ in range(200):
        b, n = int(rng.integers(0, 4)), int(rng.integers(0, 2048))
        dur = (0.005 if b else 0) + 0.001 * (n > 0) + 2e-5 * n
        recs.append({"duration_s": dur, "decode_batch": b, "decode_context_tokens": 100 * b,
                     "prefill_tokens": n, "prefill_context_tokens": 0, "prefill_seqs": [1] if n else []})
    return StepCostModel.fit(recs)


@pytest.mark.parametrize("name, options", [
    ("admission_gate", {"big_prompt_tokens": 2048}),
    ("stall_free", {"token_budget": 512}),
    ("slo", {"itl_target_s": 0.02, "min_chunk": 32, "max_chunk": 2048}),
])
@pytest.mark.parametrize("seed", range(3))
def test_no_decoding_sequence_waits_more_than_one_step(name, options, seed):
    pol = make_policy(name, **options)
    q = drive(pol, mixed_arrivals(seed), chunk_size=1024,
              on_step=lambda st, plan, q: None)
    assert max(q.waited.values(), default=0) == 0
    # and each step with decoders decodes them
    def check(st, plan, q):
        if st.decoding:
            assert plan.decode
    drive(make_policy(name, **options), mixed_arrivals(seed + 10), chunk_size=1024, on_step=check)


def test_interleave_and_prefill_first_differ_as_documented():
    dec = [SeqView(9, "c", 0, 5, 5, 1, 50)]
    prompts = [SeqView(i, "b", 0, 4000, 0) for i in range(10)]
    st = SchedulerState(0, 512, prompts, dec)
    inter = make_policy("interleave").schedule(st)
    assert inter.decode and len(inter.prefill) == 8  # mlx-lm's prefill_batch_size
    pf = make_policy("prefill_first").schedule(st)
    assert not pf.decode and pf.prefill == [(0, 512)]


def test_cost_model_recovers_synthetic_coefficients_and_slo_picks_the_largest_fitting_chunk():
    cm = _fitted_cost_model()
    assert cm.predict(1, 100, []) == pytest.approx(0.005, rel=0.05)
    assert cm.predict(0, 0, [(1000, 0)]) == pytest.approx(0.001 + 0.02, rel=0.05)
    pol = make_policy("slo", itl_target_s=0.015, min_chunk=16, max_chunk=4096, cost_model=cm)
    st = SchedulerState(0, 4096, [SeqView(1, "b", 0, 20000, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)])
    (sid, n), = pol.schedule(st).prefill
    # 5 ms decode + 1 ms chunk + 20 us/token <= 15 ms  ->  n <= 450
    assert 430 <= n <= 450
    alone = pol.schedule(SchedulerState(0, 4096, [SeqView(1, "b", 0, 20000, 0)], []))
    assert alone.prefill == [(1, 4096)] and not alone.decode


def test_slo_learns_online_from_observed_steps():
    pol = make_policy("slo", itl_target_s=0.015, min_chunk=16, max_chunk=4096, refit_every=4, min_observations=8)
    st = SchedulerState(0, 4096, [SeqView(1, "b", 0, 20000, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)])
    assert pol.schedule(st).prefill == [(1, 16)]  # unfitted: plays safe
    rng = np.random.default_rng(1)
    for _ in range(16):
        n = int(rng.integers(16, 2048))
        pol.observe({"duration_s": 0.005 + 0.001 + 2e-5 * n, "decode_batch": 1, "decode_context_tokens": 6,
                     "prefill_tokens": n, "prefill_context_tokens": 0, "prefill_seqs": [1]})
        pol.observe({"duration_s": 0.005, "decode_batch": 1, "decode_context_tokens": 6,
                     "prefill_tokens": 0, "prefill_context_tokens": 0, "prefill_seqs": []})
    (_, n), = pol.schedule(st).prefill
    assert 300 <= n <= 460


def test_slo_with_an_unreachable_target_takes_the_knee_of_the_prefill_cost_per_token():
    # 5 ms decode + 1 ms per chunk + 20 us/token: a 3 ms target cannot be met by any chunk
    cm = _fitted_cost_model()
    st = SchedulerState(0, 4096, [SeqView(1, "b", 0, 20000, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)])
    pol = make_policy("slo", itl_target_s=0.003, min_chunk=16, max_chunk=4096, cost_model=cm)
    (_, n), = pol.schedule(st).prefill
    # per token: 1 ms / n + 20 us, cheapest ~20.2 us at 4096; half that throughput at n ~ 49
    assert 48 <= n <= 60 and pol.infeasible_steps == 1
    ctx = st.decoding[0].context_tokens
    base = cm.predict(1, ctx, [])
    per_token = lambda k: (cm.predict(1, ctx, [(k, 0)]) - base) / k  # noqa: E731
    assert per_token(n) <= 2 * per_token(4096) < per_token(40)
    eager = make_policy("slo", itl_target_s=0.003, min_chunk=16, max_chunk=4096, cost_model=cm,
                        infeasible_efficiency=0.9)
    assert eager.schedule(st).prefill[0][1] > 4 * n  # keeping 90% of the throughput needs bigger chunks
    reachable = make_policy("slo", itl_target_s=0.015, min_chunk=16, max_chunk=4096, cost_model=cm)
    reachable.schedule(st)
    assert reachable.infeasible_steps == 0


def test_slo_without_a_fixed_chunk_cost_keeps_min_chunk_when_the_target_is_unreachable():
    # a CPU-like cost: 12 ms decode, 1.5 ms per prefill token, nothing per chunk
    cm = StepCostModel.from_coefficients({"decode_step": 0.012, "prefill_tokens": 0.0015}, n_obs=1)
    st = SchedulerState(0, 2048, [SeqView(1, "b", 0, 2048, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)])
    pol = make_policy("slo", itl_target_s=0.02, min_chunk=32, max_chunk=2048, cost_model=cm)
    assert pol.schedule(st).prefill == [(1, 32)] and pol.infeasible_steps == 1


def test_slo_learning_online_never_jumps_far_past_the_chunks_it_has_seen():
    # every observed chunk carried 16 tokens: the per-token slope is unidentified, so a fit may
    # "predict" that any chunk is as cheap as 16 tokens; the policy must not believe it for 2048
    pol = make_policy("slo", itl_target_s=0.5, min_chunk=16, max_chunk=4096, refit_every=4, min_observations=8)
    st = SchedulerState(0, 4096, [SeqView(1, "b", 0, 20000, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)])
    for _ in range(16):
        pol.observe({"duration_s": 0.02, "decode_batch": 1, "decode_context_tokens": 6,
                     "prefill_tokens": 16, "prefill_context_tokens": 0, "prefill_seqs": [1]})
    (_, n), = pol.schedule(st).prefill
    assert 16 <= n <= 32
    for _ in range(16):  # it has now seen 32-token chunks too: the region doubles
        pol.observe({"duration_s": 0.025, "decode_batch": 1, "decode_context_tokens": 6,
                     "prefill_tokens": 32, "prefill_context_tokens": 0, "prefill_seqs": [1]})
    (_, n), = pol.schedule(st).prefill
    assert 32 < n <= 64


def test_slo_chunk_multiple_rounds_down_to_the_grid_but_not_below_min_chunk():
    cm = _fitted_cost_model()
    st = SchedulerState(0, 4096, [SeqView(1, "b", 0, 20000, 0)], [SeqView(2, "chat", 0, 5, 5, 1, 99)])
    free = make_policy("slo", itl_target_s=0.015, min_chunk=16, max_chunk=4096, cost_model=cm)
    (_, n), = free.schedule(st).prefill
    grid = make_policy("slo", itl_target_s=0.015, min_chunk=16, max_chunk=4096, cost_model=cm, chunk_multiple=128)
    (_, g), = grid.schedule(st).prefill
    assert n % 128 and g == n - n % 128  # ~440 -> 384
    tight = make_policy("slo", itl_target_s=0.0062, min_chunk=16, max_chunk=4096, cost_model=cm,
                        chunk_multiple=128)
    # unreachable: the knee (~49 tokens) rounds down to the grid, and no lower than min_chunk
    assert tight.schedule(st).prefill == [(1, 16)] and tight.infeasible_steps == 1


@pytest.mark.parametrize("bad", [
    ("slo", {"infeasible_efficiency": 0}),
    ("slo", {"infeasible_efficiency": 1.5}),
    ("slo", {"chunk_multiple": 0}),
    ("stall_free", {"token_budget": 0}),
    ("slo", {"itl_target_s": -1}),
    ("slo", {"min_chunk": 0}),
    ("admission_gate", {"big_prompt_tokens": 0}),
    ("nope", {}),
])
def test_bad_policy_options_are_refused(bad):
    with pytest.raises(ValueError):
        make_policy(bad[0], **bad[1])


def test_decode_window_gate_is_registered_by_name_and_checks_its_window():
    from mlxlab.policies import POLICIES
    from mlxlab.policies.decode_window import DecodeWindowGate

    gate = make_policy("admission_gate_window", window_s=0.5, big_prompt_tokens=1000)
    assert POLICIES["admission_gate_window"] is DecodeWindowGate and isinstance(gate, DecodeWindowGate)
    assert isinstance(gate, AdmissionGate) and (gate.window_s, gate.big_prompt_tokens) == (0.5, 1000)
    for bad in ({"window_s": -1}, {"window_s": float("nan")}, {"big_prompt_tokens": 0}):
        with pytest.raises(ValueError):
            make_policy("admission_gate_window", **bad)


def test_decode_window_gate_holds_big_chunks_for_the_window_while_someone_decodes():
    """A step that ran a big prompt's chunk opens a window of ``window_s``: while it is open and a
    sequence decodes, big chunks wait and short prompts still run; after it, or with nobody
    decoding, the big prompt's chunks run."""
    gate = make_policy("admission_gate_window", window_s=0.5, big_prompt_tokens=1000)
    dec = [SeqView(9, "chat", 0, 30, 30, 3, 50)]
    st = SchedulerState(0.0, 512, [SeqView(1, "batch", 0, 4000, 0), SeqView(2, "chat", 0, 50, 0)], dec)
    plan = gate.schedule(st)
    check_plan(plan, st)
    assert plan.decode and plan.prefill == [(1, 512), (2, 50)]
    gate.observe({"prefill_seqs": [1, 2], "end_s": 0.2})  # open until 0.7
    big = SeqView(1, "batch", 0, 4000, 512)
    held = gate.schedule(SchedulerState(0.3, 512, [big, SeqView(3, "chat", 0, 40, 0)], dec))
    assert held.decode and held.prefill == [(3, 40)]
    gate.observe({"prefill_seqs": [3], "end_s": 0.35})  # a short prompt's step opens nothing
    assert gate.schedule(SchedulerState(0.69, 512, [big], dec)).prefill == []
    assert gate.schedule(SchedulerState(0.3, 512, [big], [])).prefill == [(1, 512)]  # nobody decoding
    assert gate.schedule(SchedulerState(0.7, 512, [big], dec)).prefill == [(1, 512)]  # the window closed


@pytest.mark.parametrize("seed", range(3))
def test_decode_window_gate_keeps_the_gate_and_the_window_over_whole_runs(seed):
    gate = make_policy("admission_gate_window", window_s=0.05, big_prompt_tokens=2048)
    last_big, held = [float("-inf")], []

    def check(st, plan, q):
        planned = {i for i, _ in plan.prefill}
        big = {s.seq_id for s in st.prefill_queue if gate.is_big(s)}
        if big and st.decoding and not planned & big:
            held.append(st.now_s)
        in_flight = {s.seq_id for s in st.prefill_queue if s.seq_id in big and (s.prefilled_tokens > 0 or s.seq_id in planned)}
        assert len(in_flight) <= 1, in_flight
        if st.decoding:
            assert plan.decode
            if planned & big:  # a big chunk beside decoders only once the window has closed
                assert st.now_s >= last_big[0] + gate.window_s
        end = st.now_s + 0.01  # the fake clock: each step takes 10 ms
        if planned & big:
            last_big[0] = end
        gate.observe({"prefill_seqs": sorted(planned), "end_s": end})

    drive(gate, mixed_arrivals(seed), on_step=check)
    assert held  # the window did hold a big prompt back while a chat decoded


def test_slo_prefills_the_prompt_with_the_fewest_tokens_left_first_and_equals_in_arrival_order():
    # a chat turn (1,500 tokens) posted behind two documents goes first; then the started document
    cm = _fitted_cost_model()
    docs = [SeqView(1, "batch", 0, 16000, 0), SeqView(2, "batch", 1, 16000, 4000), SeqView(5, "batch", 1, 16000, 0)]
    chat = SeqView(3, "chat", 2, 1500, 0)
    pol = make_policy("slo", min_chunk=16, max_chunk=2048, cost_model=cm)
    assert pol.schedule(SchedulerState(0, 2048, docs + [chat], [])).prefill == [(3, 1500)]
    assert pol.schedule(SchedulerState(0, 2048, docs, [])).prefill == [(2, 2048)]
    assert pol.schedule(SchedulerState(0, 2048, [docs[0], docs[2]], [])).prefill == [(1, 2048)]  # ties: arrival
    fifo = make_policy("slo", min_chunk=16, max_chunk=2048, cost_model=cm, order="arrival")
    assert fifo.schedule(SchedulerState(0, 2048, docs + [chat], [])).prefill == [(1, 2048)]
    # beside a decoding chat the chunk is sized for the chosen prompt (its place in its prompt)
    dec = [SeqView(9, "chat", 0, 5, 5, 1, 99)]
    (sid, n), = pol.schedule(SchedulerState(0, 2048, docs + [chat], dec)).prefill
    assert sid == 3 and 0 < n <= 1500
    with pytest.raises(ValueError, match="order"):
        make_policy("slo", order="lifo")
