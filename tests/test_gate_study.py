"""The admission-gate experiment (mlxlab.studies.admission_gate.run, gate_verdict): its plan, one run's numbers on
a hand-made timeline, a whole study on the simulator, and every branch of every verdict on
synthetic tables."""

from types import SimpleNamespace

import pandas as pd
import pytest

from mlxlab.core.claims import check_verdicts
from mlxlab.core.costmodel import StepCostModel
from mlxlab.core.presets import preset_config
from mlxlab.core.request import Request
from mlxlab.studies.admission_gate import verdict as gv
from mlxlab.studies.admission_gate.run import Calibration, Cell, executor_factory, gate_run_metrics, gate_study, plan_gate

TINY = preset_config("tiny")


# ---------------------------------------------------------------------------------- the plan
def test_plan_sweeps_equal_chunks_for_every_policy_and_worker_count():
    p = plan_gate(TINY, ref_chunk=512)
    assert p.chunks == (64, 128, 256, 512) and p.prompt_tokens == 1024 and p.repeats == 5
    keys = {c.key for c in p.cells}
    for c in p.chunks:  # one worker: every policy at every chunk
        assert {f"interleave/c{c}/w1", f"admission_gate/c{c}/w1", f"stall_free/c{c}/w1"} <= keys
    for w in (2, 4):  # more workers: the gate and interleave at the same chunks
        for c in (128, 256, 512):
            assert {f"interleave/c{c}/w{w}", f"admission_gate/c{c}/w{w}"} <= keys
    assert "stall_free/c128/w4" in keys and "stall_free/c512/w4" not in keys
    assert {"admission_gate_window/c256/w1", "admission_gate_window/c256/w2"} <= keys
    assert p.stall_cell == Cell("interleave", 512, 1, 3072) and p.sweet_chunks == (128, 256)
    assert p.prompt_tokens_per_repeat() == 1024 * (4 + sum(c.workers for c in p.cells if not c.prompt_tokens)) + 3072


def test_quick_plan_is_smaller_and_bad_options_are_refused():
    q = plan_gate(TINY, quick=True, ref_chunk=512)
    assert q.workers == (1, 2) and q.repeats == 1 and len(q.cells) < len(plan_gate(TINY, ref_chunk=512).cells)
    with pytest.raises(ValueError, match="multiple of 8"):
        plan_gate(TINY, ref_chunk=100)
    with pytest.raises(ValueError, match="context"):
        plan_gate(TINY, ref_chunk=4096)
    with pytest.raises(ValueError, match="kind"):
        executor_factory(TINY, "gpu")


def test_chat_outlasts_the_prefill_of_every_policy():
    p = plan_gate(TINY, ref_chunk=64)
    cal = Calibration(solo_itl_s=0.01, solo_ttft_s=0.02)
    n = {c.key: cal.chat_tokens(p, c) for c in p.cells}
    per = p.prompt_tokens // 16
    assert n["interleave/c16/w4"] >= per and n["admission_gate/c16/w4"] >= 4 * per  # the gate takes one at a time
    assert n["admission_gate_window/c32/w2"] > n["admission_gate/c32/w1"]  # and the window adds decode steps


# ---------------------------------------------------------------------------------- one run
def _req(i, tenant, arrival, times):
    r = Request(i, [1] * 4, len(times), tenant=tenant, arrival_s=arrival)
    r.token_times_s, r.output_tokens = list(times), [1] * len(times)
    return r


def test_run_metrics_on_a_hand_made_timeline():
    # the chat decodes every 0.1 s; a long prompt (id 1) arrives at 1.0 and runs two chunk steps of
    # 1 s (1.0-2.0 and 2.5-3.5) with a decode window between them; its first token comes at 3.6
    chat = _req(0, "chat", 0.0, [0.1 * k for k in range(1, 11)] + [2.0, 2.1, 2.2, 2.3, 2.4, 3.5, 3.6, 3.7])
    long = _req(1, "batch", 1.0, [3.6, 3.7])
    tl = pd.DataFrame([
        dict(start_s=1.0, end_s=2.0, duration_s=1.0, phase="mixed", prefill_seqs=[1], prefill_tokens=64),
        *[dict(start_s=2.0 + 0.1 * k, end_s=2.1 + 0.1 * k, duration_s=0.1, phase="decode", prefill_seqs=[],
               prefill_tokens=0) for k in range(5)],
        dict(start_s=2.5, end_s=3.5, duration_s=1.0, phase="mixed", prefill_seqs=[1], prefill_tokens=64)])
    res = SimpleNamespace(submitted=[chat, long], timeline=tl, executor=None, wall_s=4.0, complete=True)
    m = gate_run_metrics(res, 64)
    assert m["prefill_window_s"] == pytest.approx(2.6)
    # tokens strictly inside (1.0, 3.6): 2.0-2.4 and 3.5
    assert m["chat_tokens_in_window"] == 6 and m["chat_prefill_tok_s"] == pytest.approx(6 / 2.6)
    # the gaps 2.0-2.1 ... 2.3-2.4 touch no chunk step (2.4-3.5 holds the second chunk)
    assert m["window_gaps"] == 4 and m["chat_window_tok_s"] == pytest.approx(10.0)
    assert m["chat_chunk_gap_p50_s"] == pytest.approx(1.05)  # 1.0-2.0 and 2.4-3.5
    assert m["longest_step_s"] == pytest.approx(1.0) and m["long_ttft_s"] == pytest.approx(2.6)
    assert m["chat_worst_gap_s"] == pytest.approx(1.1) and m["chat_covered"] is True


# ---------------------------------------------------------------------------------- a whole study
def test_a_study_on_the_simulator_gives_every_table_row_and_verdict():
    cm = StepCostModel.from_coefficients({"decode_step": 0.002, "prefill_tokens": 2e-4, "prefill_chunks": 0.001})
    plan = plan_gate(TINY, quick=True, ref_chunk=64, repeats=2)
    res = gate_study(TINY, plan, make_executor=executor_factory(TINY, "sim", cm), warmup=False)
    table = {r["config"]: r for r in res["table"]}
    assert set(table) == {c.key for c in plan.cells}
    assert all(r["repeats"] == 2 and r["covered_fraction"] == 1.0 for r in table.values())
    refs = res["references"]
    assert refs["solo_tok_s"] == pytest.approx(500, rel=0.05) and refs["floor_s"] > 0
    # interleave with two prompts runs both chunks in one step: the chat's gap doubles, the gate's does not
    assert table["interleave/c64/w2"]["chat_worst_gap_s"] > 1.5 * table["admission_gate/c64/w2"]["chat_worst_gap_s"]
    assert table["admission_gate_window/c32/w1"]["window_gaps"] > 0
    assert table["admission_gate/c32/w1"]["window_gaps"] == 0  # one decode per chunk: no window
    assert len(res["runs"]) == 2 * (1 + len(plan.chunks) + len(plan.cells)) and "timelines" in res
    vs = check_verdicts(gv.verdicts(res), experiment="admission_gate")
    assert [v["claim"] for v in vs] == list(gv.CLAIM_IDS)
    assert {v["verdict"] for v in vs} <= {"reproduced", "not reproduced"}  # everything it needs ran


# ---------------------------------------------------------------------------------- the verdicts
def _row(policy, chunk, workers, prompt=1024, repeats=5, spread=0.0, **values):
    base = dict(chat_prefill_tok_s=1.0, chat_window_tok_s=float("nan"), window_gaps=0, window_over_solo_x=float("nan"),
                chat_chunk_gap_p50_s=chunk / 512, chat_itl_p99_pooled_s=chunk / 512, chat_itl_p99_s=chunk / 512,
                chat_worst_gap_s=chunk / 512, chunk_time_s=chunk / 512, chunk_time_max_s=chunk / 512,
                gap_over_step_x=1.05, long_ttft_s=2.0 * workers, long_ttft_mean_s=1.5 * workers,
                ttft_over_floor_pct=20.0, ttft_premium_pct=5.0, window_time_fraction=0.0)
    base.update(values)
    base.setdefault("prefill_over_solo_x", base["chat_prefill_tok_s"] / 80.0)  # _result's solo rate
    row = {"config": f"{policy}/c{chunk}/w{workers}", "kind": "cell", "policy": policy, "chunk_size": chunk,
           "workers": workers, "prompt_tokens": prompt, "repeats": repeats}
    for k, v in base.items():
        row[k], row[f"{k}_lo"], row[f"{k}_hi"] = v, v * (1 - spread / 2), v * (1 + spread / 2)
        # the repeats evenly from lo to hi, in repeat order
        row[f"{k}_runs"] = [v * (1 + spread * (i / (repeats - 1) - 0.5)) for i in range(repeats)]
    return row


def _result(rows, solo=80.0):
    return {"config": {"ref_chunk": 512, "prompt_tokens": 1024, "sweet_chunks": [128, 256], "repeats": 5,
                       "model_name": "tiny", "chat_prompt_tokens": 32},
            "references": {"solo_tok_s": solo, "solo_tok_s_runs": [solo] * 5, "solo_itl_s": 1 / solo, "floor_s": 2.0, "floor_chunk": 256,
                           "alone_chunk_time_s": {"128": 0.25, "512": 1.0}, "ref_step_over_solo_itl_x": 80.0},
            "calibration": {"window_s": 0.1}, "table": rows}


def _good():
    rows = [_row("interleave", 512, 1, prompt=3072, chat_prefill_tok_s=1.0, chunk_time_s=1.0)]
    for w in (1, 2, 4):
        for c in (128, 512):
            rows += [_row("interleave", c, w, chat_worst_gap_s=w * c / 512),
                     _row("admission_gate", c, w, **({"chat_itl_p99_pooled_s": 0.02} if c == 128 else {}))]
    rows += [_row("admission_gate", 256, 1, chat_chunk_gap_p50_s=0.5, ttft_over_floor_pct=16.0),
             _row("admission_gate", 128, 1, chat_chunk_gap_p50_s=0.27, ttft_over_floor_pct=28.0, chat_itl_p99_pooled_s=0.02),
             # stall_free meets its own bound (2x the solo ITL of 12.5 ms), as a baseline must
             _row("stall_free", 128, 1, chat_itl_p99_pooled_s=0.02), _row("stall_free", 128, 4, chat_itl_p99_pooled_s=0.02),
             _row("admission_gate_window", 256, 1, window_over_solo_x=0.95, chat_window_tok_s=76.0, window_gaps=30)]
    return rows


def _by_claim(rows, **kw):
    return {v["claim"]: v for v in gv.verdicts(_result(rows, **kw))}


def _replace(rows, key, **values):
    return [_row(r["policy"], r["chunk_size"], r["workers"], r["prompt_tokens"],
                 **{**{k: r[k] for k in r if k + "_lo" in r and k != "prefill_over_solo_x"}, **values})
            if r["config"] == key else r for r in rows]


def test_every_claim_is_reproduced_on_a_table_that_shows_it():
    out = _by_claim(_good())
    assert {c: v["verdict"] for c, v in out.items()} == {c: "reproduced" for c in gv.CLAIM_IDS}
    m = out["s001-stall-crawl"]["measured"]
    assert m["collapse_x"] == pytest.approx(80) and m["seed_equivalent_tok_s"] == pytest.approx(65 / 80)
    assert out["s001-gate-worst-gap"]["measured"]["interleave_growth_x"] == pytest.approx(4.0)
    assert out["s001-sweet-spot"]["measured"]["gap_lo_over_ref_x"] == pytest.approx(0.27)
    assert out["s001-gate-vs-stall-free"]["measured"]["cells_compared"] == 2
    check_verdicts(out.values(), experiment="admission_gate")


@pytest.mark.parametrize("claim_id, key, values", [
    ("s001-stall-crawl", "interleave/c512/w1", dict(chat_prefill_tok_s=40.0)),  # no crawl: 2x
    ("s001-stall-crawl", "interleave/c512/w1", dict(chat_prefill_tok_s=0.02)),  # slower than one token per chunk
    ("s001-gate-worst-gap", "admission_gate/c128/w2", dict(gap_over_step_x=2.0)),  # two steps in a gap
    ("s001-gate-worst-gap", "admission_gate/c512/w4", dict(chat_worst_gap_s=4.0)),  # grows with the queue
    ("s001-gate-window-rate", "admission_gate_window/c256/w1", dict(window_over_solo_x=0.5)),
    ("s001-sweet-spot", "admission_gate/c128/w1", dict(ttft_over_floor_pct=2.0)),  # a premium too small
    ("s001-sweet-spot", "admission_gate/c256/w1", dict(chat_chunk_gap_p50_s=0.95)),  # the gap hardly shrinks
    ("s001-gate-vs-stall-free", "stall_free/c128/w4", dict(chat_itl_p99_pooled_s=0.004)),  # the gate 5x worse
    # the gate matches a stall_free that is 4x its solo ITL: a failing baseline fails the comparison
    ("s001-gate-vs-stall-free", "stall_free/c128/w1", dict(chat_itl_p99_pooled_s=0.05)),
    ("s001-gate-vs-stall-free", "stall_free/c128/w1", dict(long_ttft_s=1.0)),  # the gate's TTFT 2x
])
def test_a_table_against_a_claim_does_not_reproduce_it(claim_id, key, values):
    rows = _good()
    if claim_id == "s001-stall-crawl":
        rows[0] = _row("interleave", 512, 1, prompt=3072, chunk_time_s=1.0, **values)
    else:
        rows = _replace(rows, key, **values)
    assert _by_claim(rows)[claim_id]["verdict"] == "not reproduced"


def test_a_claim_whose_configurations_did_not_run_is_not_measured():
    rows = [r for r in _good() if r["policy"] not in ("admission_gate_window", "stall_free")]
    out = _by_claim(rows)
    assert out["s001-gate-window-rate"]["verdict"] == "not measured"
    assert out["s001-gate-vs-stall-free"]["verdict"] == "not measured"
    empty = _by_claim([])
    assert {v["verdict"] for v in empty.values()} == {"not measured"}


def test_a_figure_nearer_its_bound_than_its_noise_band_is_inconclusive():
    # collapse 80 / 7 = 11.4 against the crawl's 10x, the repeats 40% apart: band 3 x MAD / sqrt(5) = 1.7
    rows = [_row("interleave", 512, 1, prompt=3072, chunk_time_s=1 / 7, chat_prefill_tok_s=7.0, spread=0.4)] + _good()[1:]
    v = _by_claim(rows)["s001-stall-crawl"]
    m = v["measured"]
    assert v["verdict"] == "inconclusive" and m["within_noise"] is True and m["repeats_to_resolve"] > 5
    assert m["noise_band_x"]["collapse"] > m["collapse_x"] - 10 and m["spread_pct"] == pytest.approx(40)
    good = _by_claim(_good())["s001-stall-crawl"]
    assert good["verdict"] == "reproduced" and good["measured"]["within_noise"] is False  # identical repeats


def test_a_clear_failure_outweighs_an_inconclusive_cell():
    # one gate cell two steps long with tight repeats, another on the bound inside a wide band
    rows = _replace(_good(), "admission_gate/c128/w2", gap_over_step_x=2.0)
    rows = [_row("admission_gate", 512, 2, gap_over_step_x=1.25, spread=0.5) if r["config"] == "admission_gate/c512/w2"
            else r for r in rows]
    assert _by_claim(rows)["s001-gate-worst-gap"]["verdict"] == "not reproduced"
    rows = [_row("admission_gate", 512, 2, gap_over_step_x=1.25, spread=0.5) if r["config"] == "admission_gate/c512/w2"
            else r for r in _good()]
    assert _by_claim(rows)["s001-gate-worst-gap"]["verdict"] == "inconclusive"


def test_a_file_without_per_repeat_values_is_decided_on_its_figures():
    rows = [{k: v for k, v in r.items() if not k.endswith("_runs")} for r in _good()]
    out = _by_claim(rows)
    assert {v["verdict"] for v in out.values()} == {"reproduced"}
    assert {v["measured"]["within_noise"] for v in out.values()} == {None}
