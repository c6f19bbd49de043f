"""mlx-lm's BatchGenerator behind the executor interface (mlxlab.engine.baseline.MlxLmExecutor).

Oracle: the engine and BatchGenerator run the same model object and both sample greedily, so for
a fixed seed their tokens agree token for token (the engine's own test checks it against
generate_step with a near-tie rule; these prompts have no near-tie, and the run is deterministic).
"""

import math
import random

import pytest

from mlxlab import Engine
from mlxlab.core.executor import Executor
from mlxlab.core.request import DONE
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload
from mlxlab.engine.baseline import MlxLmExecutor

STEP_KEYS = {"start_s", "end_s", "duration_s", "phase", "decode_batch", "prefill_tokens", "tokens"}


def staggered(ex, prompts, steps_between=3, **submit):
    """Submit the prompts one by one with a few steps between them, then run to the end."""
    reqs = []
    for i, p in enumerate(prompts):
        reqs.append(ex.submit(p, 10 + i, tenant=f"t{i}", **submit))
        for _ in range(steps_between):
            ex.step()
    ex.run()
    ex.flush()
    return reqs


def prompts_for(seed, lengths, vocab=1024):
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("chunk", [128, 2048])
def test_greedy_tokens_equal_engine(tiny, chunk):
    prompts = prompts_for(chunk, (300, 40, 700, 1, 129))
    ours = staggered(Engine(tiny, chunk_size=chunk), prompts)
    ex = MlxLmExecutor(tiny, prefill_step_size=chunk)
    theirs = staggered(ex, prompts)
    assert [r.output_tokens for r in theirs] == [r.output_tokens for r in ours]
    for r in theirs:
        assert r.done and r.state == DONE and r.finish_reason == "length"
        assert len(r.token_times_s) == len(r.output_tokens) == r.max_tokens
        assert r.token_times_s == sorted(r.token_times_s)
        assert r.prefill_start_s is not None and r.arrival_s <= r.prefill_start_s <= r.token_times_s[0]
        assert r.finish_s == r.token_times_s[-1] and r.ttft_s > 0
    assert not ex.has_work and ex.step() is None
    # the step records: every prompt token except the last is prefilled, in chunks <= chunk
    pre = {}
    for s in ex.steps:
        d = s.as_dict()
        assert STEP_KEYS <= set(d) and d["duration_s"] >= 0 and d["phase"] in ("decode", "prefill", "mixed")
        for rid, n, ctx in s.prefill:
            assert 0 < n <= chunk and ctx == pre.get(rid, 0)
            pre[rid] = ctx + n
    assert pre == {r.id: r.prompt_tokens - 1 for r in theirs if r.prompt_tokens > 1}
    # every generated token shows up in exactly one step's decode list
    assert sum(len(s.decode_seqs) for s in ex.steps) == sum(len(r.output_tokens) for r in theirs)


def test_stop_tokens(tiny):
    prompt = prompts_for(1, (50,))[0]
    e = Engine(tiny)
    ref = e.submit(prompt, 12)
    e.run()
    stop = ref.output_tokens[5]
    cut = ref.output_tokens.index(stop) + 1
    ex = MlxLmExecutor(tiny)
    r = ex.submit(prompt, 12, stop_tokens=[stop])
    ex.run()
    assert r.output_tokens == ref.output_tokens[:cut] and r.finish_reason == "stop"
    ex2 = MlxLmExecutor(tiny, stop_tokens=[stop])
    r2 = ex2.submit(prompt, 12)
    ex2.run()
    assert r2.output_tokens == r.output_tokens and r2.finish_reason == "stop"


def test_validation_matches_engine(tiny):
    ex, eng = MlxLmExecutor(tiny), Engine(tiny)
    bad = [([], 4), ([1, 2, 5000], 4), ([-1], 4), ([1, 2], 0), ([1, 2], 2.5), ("abc", 4),
           ([1] * 8000, 500)]
    for prompt, max_tokens in bad:
        with pytest.raises(ValueError) as ours:
            ex.submit(prompt, max_tokens)
        with pytest.raises(ValueError) as theirs:
            eng.submit(prompt, max_tokens)
        assert str(ours.value) == str(theirs.value)
    assert ex.requests == [] and not ex.has_work and ex.steps == []
    for k in ("prefill_step_size", "prefill_batch_size", "completion_batch_size"):
        with pytest.raises(ValueError):
            MlxLmExecutor(tiny, **{k: 0})


def test_run_workload(tiny):
    wl = Workload([ChatTenant(sessions=1, turns=2, first_prompt_tokens=40, turn_tokens=8, output_tokens=12,
                              think_time_s=0.01),
                   BatchTenant(workers=2, requests=3, prompt_tokens=(200, 400), output_tokens=3, start_s=0.01)],
                  vocab_size=tiny.vocab_size, seed=3)
    ex = MlxLmExecutor(tiny, prefill_step_size=128)
    assert isinstance(ex, Executor)
    res = run_workload(ex, wl)
    assert res.complete and len(res.submitted) == 5 and all(r.done for r in res.submitted)
    assert res.config["executor"] == "MlxLmExecutor" and res.config["chunk_size"] == 128
    assert set(res.summary) == {"all", "chat", "batch"}
    assert math.isfinite(res.summary["chat"]["itl_s"]["p99"]) and res.summary["batch"]["ttft_s"]["n"] == 3
    assert STEP_KEYS <= set(res.timeline.columns) and len(res.timeline) == len(ex.steps)
    # the same workload on the engine yields the same tokens (same seed, greedy)
    res2 = run_workload(Engine(tiny, chunk_size=128), wl)
    key = lambda r: (r.tenant, r.prompt_tokens)
    assert sorted((key(r), r.output_tokens) for r in res.submitted) == \
        sorted((key(r), r.output_tokens) for r in res2.submitted)
