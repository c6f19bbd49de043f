"""Tests for mlxlab.engine.speculative and mlxlab.studies.speculation.run: greedy speculative decoding
is exactly the target's greedy output; the analytic model at known points; the study's bookkeeping."""

import math

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxlab.engine.models import load_model
from mlxlab.engine.speculative import (
    analytic_speedup,
    best_k,
    breakeven_cost_ratio,
    estimate_acceptance,
    expected_tokens_per_pass,
    mlx_lm_speculative,
    speculative_generate,
)
from mlxlab.studies.speculation.run import (
    format_study,
    measure_cost_ratio,
    speculation_study,
    teacher_forced_agreement,
)
from mlxlab.train.corpus import build_corpus, heldout_prompts
from mlxlab.train.tiny import DRAFT_PRESET, TARGET_PRESET, weights_dir


def greedy(model, prompt, n):
    out = []
    for (tok, _), _i in zip(generate_step(mx.array(prompt, mx.uint32), model.module, max_tokens=n), range(n)):
        out.append(int(tok))
    return out


# ----------------------------------------------------------------------------- analytic model


def test_expected_tokens_per_pass_known_points():
    for k in (0, 1, 4, 8):
        assert expected_tokens_per_pass(0.0, k) == 1.0
        assert expected_tokens_per_pass(1.0, k) == k + 1
        assert expected_tokens_per_pass(1 - 1e-12, k) == pytest.approx(k + 1, rel=1e-6)
    assert expected_tokens_per_pass(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    # the sum 1 + a + ... + a^k
    a, k = 0.73, 5
    assert expected_tokens_per_pass(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))
    with pytest.raises(ValueError):
        expected_tokens_per_pass(1.5, 2)


def test_analytic_speedup_formula():
    a, k, c = 0.8, 4, 0.1
    assert analytic_speedup(a, k, c) == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)))
    assert analytic_speedup(0.0, 3, 0.2) == pytest.approx(1 / 1.6)        # nothing accepted: pure loss
    assert analytic_speedup(1.0, 3, 0.0) == pytest.approx(4.0)            # free, perfect draft: k + 1
    assert analytic_speedup(0.9, 4, 0.05, v=2.0) == pytest.approx(expected_tokens_per_pass(0.9, 4) / 2.2)
    # break-even c gives speedup exactly 1
    c0 = breakeven_cost_ratio(0.7, 4)
    assert analytic_speedup(0.7, 4, c0) == pytest.approx(1.0)
    assert breakeven_cost_ratio(0.0, 3) == 0.0
    k_best, s = best_k(0.8, 0.05)
    assert k_best >= 3 and s > 2
    assert best_k(0.1, 0.9) == (0, 1.0)


def test_estimate_acceptance():
    assert estimate_acceptance([(4, 4), (4, 4)]) == 1.0
    assert estimate_acceptance([(4, 0), (4, 0)]) == 0.0
    # 3 accepted then a rejection: 3 successes in 4 trials
    assert estimate_acceptance([(4, 3)]) == pytest.approx(0.75)
    assert math.isnan(estimate_acceptance([(0, 0)]))


# ----------------------------------------------------------------------------- exactness


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


@pytest.fixture(scope="module")
def drafts(tiny):
    return {"same": tiny,                                         # every draft accepted
            "quantized": load_model("tiny", dtype="float32", bits=4),   # partly agrees
            "other": load_model("tiny", dtype="float32", seed=1)}       # almost never agrees


PROMPTS = [[7], [3, 1, 4, 1, 5], list(range(100, 160))]
N = 33


@pytest.fixture(scope="module")
def refs(tiny):
    return [greedy(tiny, p, N) for p in PROMPTS]


@pytest.mark.parametrize("kind", ["same", "quantized", "other"])
@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_random_models_match_target_greedy(tiny, drafts, refs, kind, k):
    n = N
    for p, ref in zip(PROMPTS, refs):
        r = speculative_generate(tiny, drafts[kind], p, n, k)
        assert r["tokens"] == ref
        assert r["target_passes"] == len(r["rounds"])
        assert sum(nn + 1 for _, nn in r["rounds"]) == n
        assert r["accepted"] <= r["proposed"]
        assert all(kk <= k and 0 <= nn <= kk for kk, nn in r["rounds"])
        if k == 0:
            assert r["target_passes"] == n and r["proposed"] == 0
        elif kind == "same":
            assert r["acceptance_rate"] > 0.95
            assert r["tokens_per_pass"] > 0.9 * min(k + 1, n)
        elif kind == "other":
            assert r["acceptance_rate"] < 0.5


def test_mlx_lm_speculative_agrees(tiny, drafts):
    p = PROMPTS[1]
    ref = greedy(tiny, p, 20)
    assert mlx_lm_speculative(tiny, drafts["quantized"], p, 20, 3)["tokens"] == ref


def test_cost_ratio_and_study_smoke(tiny, drafts):
    cost = measure_cost_ratio(tiny, drafts["other"], context=16, steps=4, ks=(2,), repeats=1)
    assert cost["target_step_s"] > 0 and cost["draft_step_s"] > 0
    # c and v are the measured medians' ratios (their size is the machine's business)
    assert cost["c"] == pytest.approx(cost["draft_step_s"] / cost["target_step_s"])
    assert cost["v"][2] == pytest.approx(cost["verify_s"][2] / cost["target_step_s"]) and cost["v"][2] > 0
    st = speculation_study(tiny, drafts["same"], PROMPTS[1:], ks=(1, 2), max_tokens=12, repeats=1, cost=cost)
    assert [r["k"] for r in st["rows"]] == [1, 2]
    for r in st["rows"]:
        assert r["identical"] and r["identical_mlx_lm"]
        assert r["speedup"] > 0 and r["tokens_per_pass"] >= 1
        assert sum(r["accept_hist"]) <= r["target_passes"]
    assert "k" in format_study(st)
    assert st["outputs"] == [greedy(tiny, p, 12) for p in PROMPTS[1:]]
    assert 0 <= st["baseline"]["whitespace_fraction"] <= 1


def test_teacher_forced_agreement(tiny, drafts):
    data = bytes(range(32, 127)) * 20
    same = teacher_forced_agreement(tiny, tiny, data, seq_len=64, max_windows=4)
    assert same["agreement"] == 1.0 and same["positions"] == 4 * 64
    other = teacher_forced_agreement(tiny, drafts["other"], data, seq_len=64, max_windows=4)
    assert other["agreement"] < 0.5


# ----------------------------------------------------------------------------- trained pair


@pytest.fixture(scope="module")
def pair():
    t, d = weights_dir() / TARGET_PRESET, weights_dir() / DRAFT_PRESET
    if not (t / "model.safetensors").is_file() or not (d / "model.safetensors").is_file():
        pytest.skip("trained weights not present")
    return load_model(t, dtype="float32"), load_model(d, dtype="float32")


@pytest.fixture(scope="module")
def code_prompts():
    # held-out files are chosen by path, so this works (approximately) on other Python versions too
    return heldout_prompts(3, length=96, seed=1, data=build_corpus(verify=False)["heldout"])


@pytest.mark.parametrize("k", [2, 4])
def test_trained_pair_matches_target_greedy_and_accepts(pair, code_prompts, k):
    target, draft = pair
    proposed = accepted = 0
    for p in code_prompts:
        ref = greedy(target, p, 64)
        r = speculative_generate(target, draft, p, 64, k)
        assert r["tokens"] == ref
        proposed += r["proposed"]
        accepted += r["accepted"]
    # a trained draft agrees with the trained target far more often than chance (1/256)
    assert accepted / proposed > 0.3


def test_trained_pair_teacher_forced_agreement(pair):
    target, draft = pair
    held = build_corpus(verify=False)["heldout"]
    tf = teacher_forced_agreement(target, draft, held, max_windows=16)
    # measured 0.61 on 128 windows (0.91 where the next byte is whitespace, 0.45 elsewhere)
    assert 0.45 < tf["agreement"] < 0.8
    assert tf["agreement_whitespace"] > tf["agreement_other"]
    assert tf["target_top1"] > tf["draft_top1"]


# ----------------------------------------------------------------------------- in the engine


def _engine_steps_of(eng, req) -> int:
    return sum(req.id in s.decode_seqs for s in eng.steps)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("kind", ["same", "quantized", "other"])
def test_engine_speculative_requests_match_greedy_beside_the_batch(tiny, drafts, kind, overlap):
    """Speculative requests (their own lanes) and plain ones (the batch) decode at the same time;
    each gives mlx-lm's greedy tokens (the oracle's near-tie rule), the speculative ones in fewer
    steps than tokens when the draft agrees, and no KV or lane is left behind."""
    from oracle import assert_matches, reference

    from mlxlab import Engine

    prompts = [list(range(1, 40)), [3, 1, 4, 1, 5], list(range(100, 160)), [9, 8, 7]]
    with Engine(tiny, chunk_size=16, draft_model=drafts[kind], overlap=overlap) as eng:
        plain = eng.submit(prompts[0], 20)
        spec = eng.submit(prompts[1], 20, num_draft_tokens=3)
        while len(plain.output_tokens) < 3:
            eng.step()
        late = [eng.submit(prompts[2], 20, num_draft_tokens=5), eng.submit(prompts[3], 20)]
        eng.run()
    for r, p in zip([plain, spec] + late, prompts):
        assert_matches(r.output_tokens, reference(tiny, p, 20))
    for r in (spec, late[0]):
        assert 0 <= r.draft_accepted <= r.draft_proposed and r.draft_proposed > 0
        if kind == "same":
            assert r.draft_accepted >= 0.9 * r.draft_proposed
            assert _engine_steps_of(eng, r) < len(r.output_tokens) / 2
    assert plain.draft_proposed == late[1].draft_proposed == 0
    assert eng.kv_tokens_in_use() == 0 and not eng._lanes and all(s.cache is None for s in eng._spec)


def test_engine_speculative_refusals(tiny, drafts, pair):
    from mlxlab import Engine

    with pytest.raises(ValueError, match="needs a draft model"):
        Engine(tiny).submit([1, 2, 3], 4, num_draft_tokens=3)
    eng = Engine(tiny, draft_model=drafts["other"])
    for bad in (-1, 33, 2.5, True, "3"):
        with pytest.raises(ValueError, match="num_draft_tokens must be"):
            eng.submit([1, 2, 3], 4, num_draft_tokens=bad)
    with pytest.raises(ValueError, match="kv_bits"):
        eng.submit([1, 2, 3], 4, num_draft_tokens=2, kv_bits=8)
    assert eng.requests == []
    with pytest.raises(ValueError, match="vocabulary"):
        Engine(tiny, draft_model=pair[1])  # 256 byte ids against the preset's 1,024


def test_engine_speculative_cancel_and_prefix_cache(tiny, drafts):
    """A cancelled speculative request frees its KV and lane; a finished one's KV goes into the
    prefix cache and its next turn starts from it, still exact."""
    from oracle import assert_matches, reference

    from mlxlab import Engine
    from mlxlab.engine.prefix_cache import PrefixCache

    eng = Engine(tiny, chunk_size=16, draft_model=drafts["same"], prefix_cache=PrefixCache(max_tokens=4096))
    gone = eng.submit(list(range(50, 90)), 200, num_draft_tokens=4)
    turn1 = eng.submit(list(range(1, 30)), 12, num_draft_tokens=2)
    while len(gone.output_tokens) < 5:
        eng.step()
    assert eng.cancel(gone)
    eng.run()
    assert gone.finish_reason == "cancelled" and len(gone.output_tokens) < 200
    p2 = turn1.prompt + turn1.output_tokens + [5, 6]
    turn2 = eng.submit(p2, 12, num_draft_tokens=2)
    eng.run()
    assert turn2.cached_tokens > len(turn1.prompt)
    assert_matches(turn1.output_tokens, reference(tiny, turn1.prompt, 12))
    assert_matches(turn2.output_tokens, reference(tiny, p2, 12))
    assert eng.kv_tokens_in_use() == 0 and not eng._lanes


def test_engine_trained_pair_speculates_exactly(pair, code_prompts):
    from oracle import assert_matches, reference

    from mlxlab import Engine

    target, draft = pair
    eng = Engine(target, chunk_size=32, draft_model=draft)
    reqs = [eng.submit(p, 48, num_draft_tokens=3) for p in code_prompts] + [eng.submit(code_prompts[0], 48)]
    eng.run()
    for r in reqs:
        assert_matches(r.output_tokens, reference(target, r.prompt, 48))
    assert sum(r.draft_accepted for r in reqs) / sum(r.draft_proposed for r in reqs) > 0.3


def test_greedy_exactness_float32_has_no_flips(pair, code_prompts):
    """In float32 on the CPU the speculative outputs (ours and mlx-lm's) equal the target's own
    greedy output, and a teacher-forced pass picks the same argmax as one-token decoding at
    every position: the baseline the H200's bfloat16 divergence is read against."""
    from mlxlab.studies.speculation.exactness import greedy_exactness

    target, draft = pair
    r = greedy_exactness(target, draft, code_prompts[:2], k=3, max_tokens=24)
    assert r["num_prompts"] == 2 and r["positions"] == 48
    assert r["ours_identical"] == 2 and r["mlx_lm_identical"] == 2
    assert r["flip_positions"] == 0 and r["margins_at_flips"] == []
    assert all(p["ours_first_diff"] is None for p in r["per_prompt"])
    assert 0.0 <= r["max_abs_logit_diff"] < 1e-2


def test_greedy_exactness_reports_the_first_difference():
    """_first_diff names the first index two token lists part at, and a length difference."""
    from mlxlab.studies.speculation.exactness import _first_diff

    assert _first_diff([1, 2, 3], [1, 2, 3]) is None
    assert _first_diff([1, 2, 3], [1, 5, 3]) == 1
    assert _first_diff([1, 2], [1, 2, 3]) == 2


def test_pair_speedups_chart_from_committed_h200_results():
    """The large pair's figure is built from the stored studies: one row per draft and k with the
    median inside the repeats' range, and both analytic curves beside it."""
    import json

    from mlxlab.studies.speculation.charts import pair_rows, pair_speedups_chart
    from mlxlab.core.paths import ROOT

    files = {d: ROOT / "data/results/h200" / f"speculation_large_{d}.json" for d in ("third", "tenth")}
    if not all(f.exists() for f in files.values()):
        pytest.skip("H200 results of the large pair not present")
    studies = {d: json.loads(f.read_text()) for d, f in files.items()}
    df = pair_rows(studies)
    assert len(df) == sum(len(s["rows"]) for s in studies.values())
    assert ((df.lo <= df.measured) & (df.measured <= df.hi)).all()
    spec = pair_speedups_chart(studies, "t").to_dict()
    assert spec["facet"]["field"] == "draft" and len(spec["spec"]["layer"]) == 4
