"""probes/tail_steps.py: a tenant's gaps split by the steps that ended inside them, with the cost
model's time for those steps; on the simulator's own run the prediction is its clock exactly."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlxlab.core.runner import run_workload
from mlxlab.core.workload import TraceWorkload
from mlxlab.sim.simulator import Simulator
from probes import tail_steps
from probes.key_align_sim import load_point
from probes.tail_steps import GAP_FIELDS, decode_steps, gap_summary, predicted_steps, replay, tenant_gaps
from tests.test_warm_carry_sim import _doc


def _rec(start, end, chunks=(), batch=1):
    return {"start_s": start, "end_s": end, "duration_s": end - start, "decode_batch": batch,
            "prefill_chunks": [list(c) for c in chunks], "prefill_tokens": sum(c[0] for c in chunks)}


def test_each_gap_holds_the_steps_that_ended_inside_it_and_their_chunks():
    recs = [_rec(0.0, 0.01), _rec(0.01, 0.05, [(512, 0)]), _rec(0.05, 0.06), _rec(0.06, 0.07, [(64, 512), (32, 0)]),
            _rec(0.07, 0.08)]
    chat = SimpleNamespace(tenant="chat", token_times_s=[0.01, 0.06, 0.08])
    doc = SimpleNamespace(tenant="batch", token_times_s=[0.05, 0.07])
    gaps = tenant_gaps([chat, doc], recs, "chat", predicted=[1.0, 2.0, 3.0, 4.0, 5.0])
    assert [(g["steps"], g["chunk_tokens"], g["largest_chunk"]) for g in gaps] == [(2, 512, 512), (2, 96, 64)]
    assert [g["predicted_s"] for g in gaps] == [5.0, 9.0] and gaps[0]["steps_s"] == pytest.approx(0.05)
    s = gap_summary(gaps, top=1)
    assert s["n"] == 2 and s["chunk"]["n"] == 2 and s["decode"] == {"n": 0}
    assert len(s["top"]) == 1 and len(s["top"][0]) == len(GAP_FIELDS) and s["top"][0][0] == pytest.approx(0.05)
    assert gap_summary([]) == {"n": 0}


def test_decode_only_steps_are_split_by_the_tenant_in_them_and_a_changed_batch():
    clock = [0.0]

    def rec(d, seqs, ctx, joined=0, chunks=()):  # one after another
        clock[0] += d
        return {**_rec(clock[0] - d, clock[0], chunks, batch=len(seqs)), "decode_seqs": list(seqs),
                "decode_context_tokens": ctx, "joined": joined, "dropped": 0}

    recs = [rec(0.01, [1, 2], 100), rec(0.03, [2, 3], 9000), rec(0.05, [2, 3, 4], 12000), rec(0.02, [1], 50, joined=1),
            rec(0.04, [1, 2], 100, chunks=[(512, 0)]), rec(0.01, [], 0)]  # a chunk step and an empty one: not counted
    reqs = [SimpleNamespace(id=1, tenant="chat")] + [SimpleNamespace(id=i, tenant="batch") for i in (2, 3, 4)]
    out = decode_steps(recs, [0.01, 0.01, 0.01, 0.01, 0.01, 0.01], reqs, "chat")
    assert set(out) == {"with chat, same batch", "without chat, same batch", "with chat, batch changed"}
    w = out["without chat, same batch"]
    assert (w["n"], w["rows_p50"], w["context_p50"]) == (2, 2.5, 10500)
    assert w["measured_p50_s"] == pytest.approx(0.04) and w["ratio_p50"] == pytest.approx(4.0)
    assert out["with chat, same batch"]["ratio_p50"] == pytest.approx(1.0)
    assert out["with chat, batch changed"]["n"] == 1


def test_a_steps_own_time_starts_where_the_step_before_it_ended():
    # a pipelined decode-only step ends when the next step reads its tokens: spans overlap
    recs = [_rec(0.0, 0.018), _rec(0.009, 0.027), _rec(0.018, 0.030), _rec(0.031, 0.071, [(512, 0)])]
    assert tail_steps.own_times(recs) == pytest.approx([0.018, 0.009, 0.003, 0.040])
    costs = tail_steps.step_costs(recs, [0.009] * 4)
    dec = costs["chunk none, decode rows"]
    assert dec["measured_p50_s"] == pytest.approx(0.009) and dec["span_p50_s"] == pytest.approx(0.018)
    assert dec["ratio_p50"] == pytest.approx(1.0)


def test_with_a_decode_tail_the_simulators_decode_only_steps_cost_their_prediction_not_their_span():
    doc = _doc()
    doc["profile"]["cost_model"] = {**doc["profile"]["cost_model"], "tail_s": 0.002}  # tokens read one step later
    point = load_point(doc, "data/traces/samples")
    cm = point["cost_model"]
    assert cm.tail_s == 0.002
    sim = Simulator(cm, policy="interleave", chunk_size=1024, **point["limits"])
    res = run_workload(sim, TraceWorkload(list(point["arrivals"]), name="t"))
    recs = [s.as_dict() for s in res.executor.steps]
    costs = tail_steps.step_costs(recs, predicted_steps(recs, cm))["chunk none, decode rows"]
    assert costs["n"] > 100
    assert costs["ratio_p50"] == pytest.approx(1.0, abs=0.02)  # one forward a step, as the cost model prices it
    assert costs["span_p50_s"] > 1.5 * costs["measured_p50_s"]  # start to read covers the next step's forward


@pytest.mark.parametrize("policy,chunk,options", [("interleave", 1024, {}), ("stall_free", 2048, {"token_budget": 256})])
def test_on_the_simulators_own_run_the_prediction_is_its_clock_and_the_gaps_give_its_p99(policy, chunk, options):
    doc = _doc()
    point = load_point(doc, "data/traces/samples")
    cm = point["cost_model"]

    def sim():
        return Simulator(cm, policy=policy, chunk_size=chunk, **{**point["limits"], **options})

    res = run_workload(sim(), TraceWorkload(list(point["arrivals"]), name="t"))
    recs = [s.as_dict() for s in res.executor.steps]
    assert [r["duration_s"] for r in recs] == pytest.approx(predicted_steps(recs, cm), abs=1e-12)
    r = replay(sim(), point["arrivals"], "chat", cm, 5)
    assert r["gaps"]["p99_s"] == r["itl_p99_s"] and r["gaps"]["n"] == 1015  # every gap of the chat, none twice
    assert r["gaps"]["chunk"]["n"] > 0 and r["gaps"]["chunk"]["gap_p50_s"] > r["gaps"]["decode"]["gap_p50_s"]
    # the timeline: every request once, from the first arrival; a chunk step per step that prefilled
    tl = r["timeline"]
    assert len(tl["requests"]) == len(point["arrivals"]) and min(q[1] for q in tl["requests"]) == 0.0
    assert all(q[1] <= q[2] <= q[3] for q in tl["requests"]) and {q[0] for q in tl["requests"]} == {"chat", "batch"}
    assert len(tl["chunk_steps"]) == sum(1 for s in recs if s["prefill_chunks"])
    # every prompt token but the last is prefilled in chunks (the last goes in with the first decode, as mlx-lm's)
    assert sum(c[2] for c in tl["chunk_steps"]) == sum(len(a.prompt) - 1 for a in point["arrivals"])


def test_the_probe_replays_a_tunes_settings_on_the_engine_and_keeps_the_gaps(tmp_path, monkeypatch):
    shutil.copytree(Path("data/models"), tmp_path / "models")  # the presets; results go to tmp_path
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    monkeypatch.setattr("probes.common.reexec_with_fast_blas", lambda: None)
    doc = _doc()
    doc["parameters"].update(length_scale=0.25, dtype="float32")
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(doc))
    assert tail_steps.main([str(path), "--settings", "interleave-256", "--repeats", "1", "--output-scale", "chat=2",
                            "--platform", "scratch", "--label", "t"]) == 0
    out = json.loads((tmp_path / "results" / "scratch" / "tail_steps_tiny_t.json").read_text())
    run = out["settings"]["interleave-256"]
    assert out["output_scale"] == {"chat": 2.0} and len(run["engine"]) == 1
    # the chat asks for twice its tokens: gaps = its requests x (2 x its tokens at length 0.25, less one)
    point = load_point({**doc, "parameters": {**doc["parameters"], "output_scale": {"chat": 2.0}}}, "data/traces/samples")
    want = sum(len(range(a.max_tokens)) - 1 for a in point["arrivals"] if a.tenant == "chat")
    assert run["sim"]["gaps"]["n"] == want and run["engine"][0]["gaps"]["n"] == want
    assert run["engine"][0]["step_costs"] and out["mlx_env"] is not None
    with pytest.raises(SystemExit, match="no grid setting"):
        tail_steps.main([str(path), "--settings", "nope", "--platform", "scratch"])
