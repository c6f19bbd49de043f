"""probes/warm_carry_sim.py and the simulator's ``warm`` argument: runs that follow each other in
one process share the shapes they leave warm; the probe simulates a stored sweep so, and its
``fresh`` way is the stored simulation."""

from mlxlab.core.costmodel import FEATURES, StepCostModel
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import TraceWorkload
from mlxlab.sim.simulator import Simulator
from mlxlab.studies.tune.run import simulate_setting
from probes.key_align_sim import load_point
from probes.warm_carry_sim import WAYS, process_runs, score, simulate

COST = {"decode_step": 5e-3, "decode_batch": 3e-4, "prefill_chunks": 10e-3, "prefill_tokens": 15e-6,
        "cold_chunks": 60e-3}


def _doc() -> dict:
    cm = StepCostModel.from_dict({"features": list(FEATURES), "coef": [COST.get(f, 0.0) for f in FEATURES],
                                  "cold_key": "shape", "cold_capacity": 256})
    solo = {"chat": {"all": {"itl_s": {"p50": 0.006, "p90": 0.007, "p99": 0.01, "max": 0.02}},
                     "chat": {"itl_s": {"p50": 0.006, "p90": 0.007, "p99": 0.01, "max": 0.02}}}}
    grid = [{"label": f"interleave-{c}", "policy": "interleave", "chunk_size": c, "options": {}} for c in (256, 1024)]
    grid.append({"label": "stall_free-256", "policy": "stall_free", "chunk_size": 2048, "options": {"token_budget": 256}})
    doc = {"parameters": {"model": "tiny", "trace": "seed001_scene_tiny.jsonl", "length_scale": 4.0, "seed": 0},
           "profile": {"cost_model": cm.as_dict()}, "slos": ["chat.itl_p99<=3x"], "solo": solo,
           "objective": "batch.ttft_p50", "tenants": ["batch", "chat"], "grid": grid, "choice": {"label": "a"}}
    point = load_point(doc, "data/traces/samples")
    for g in grid:
        g.update({k: v for k, v in simulate_setting({**point, "setting": g}).items()
                  if k in ("objective_s", "slo_ratio")})
    return doc


def test_a_run_after_the_same_one_in_one_process_meets_fewer_cold_shapes():
    doc = _doc()
    point = load_point(doc, "data/traces/samples")
    cm = point["cost_model"]

    def ttft(warm):
        sim = Simulator(cm, policy="interleave", chunk_size=256, warm=warm, **point["limits"])
        return run_workload(sim, TraceWorkload(list(point["arrivals"]), name="t")).summary["batch"]["ttft_s"]["p50"]

    shared = cm.warm_shapes()
    first, second = ttft(shared), ttft(shared)
    assert ttft(None) == first and second < first  # fresh equals the default; the second finds its shapes warm


def test_the_probe_scores_each_way_against_the_measured_sweep_and_fresh_is_the_stored_simulation():
    doc = _doc()
    # a measured sweep of two repeats: the stored simulation, then 10% slower
    runs = {}
    for g in doc["grid"]:
        summ = run_workload(Simulator(load_point(doc, "data/traces/samples")["cost_model"], policy=g["policy"],
                                      chunk_size=g["chunk_size"], **g["options"]),
                            TraceWorkload(list(load_point(doc, "data/traces/samples")["arrivals"]), name="t")).summary
        runs[g["label"]] = [summ, summ]
    doc["sweep"] = {"repeats": 2, "order": "shuffle", "runs": runs, "wall_s": 1.0,
                    "rows": [{"label": g["label"], "objective_s": g["objective_s"] * 1.1,
                              "objective_range_s": [g["objective_s"], g["objective_s"] * 1.2],
                              "slo_ratio": g["slo_ratio"] * 1.1, "meets": False} for g in doc["grid"]]}
    ways = simulate(doc, load_point(doc, "data/traces/samples"))
    assert set(ways) == set(WAYS)
    assert [r["objective_s"] for r in ways["fresh"]] == [g["objective_s"] for g in doc["grid"]]
    # carried and steady start later runs warm: never slower than fresh here, faster somewhere
    for way in ("carried", "steady"):
        pairs = list(zip(ways[way], ways["fresh"]))
        assert all(w["objective_s"] <= f["objective_s"] + 1e-12 for w, f in pairs)
        assert any(w["objective_s"] < f["objective_s"] for w, f in pairs)
    s = score(doc, ways["fresh"])
    assert s["tau_objective"] == 1.0 and abs(s["sim_error_objective"] - 0.1 / 1.1) < 1e-9


def test_where_the_sweep_names_each_calls_runs_each_call_is_a_process_warmed_by_what_ran_before_it():
    """A fresh call confirms its candidates and then sweeps in the same process; a resumed call is a new
    process that warms up on one setting: ``processes`` simulates each call so, so a run right after the
    same setting equals ``steady``'s; a file whose calls do not account for every run gets no such way."""
    doc = _doc()
    point = load_point(doc, "data/traces/samples")
    summ = {g["label"]: run_workload(Simulator(point["cost_model"], policy=g["policy"], chunk_size=g["chunk_size"],
                                               **{**point["limits"], **g["options"]}),
                                     TraceWorkload(list(point["arrivals"]), name="t")).summary for g in doc["grid"]}
    doc["confirmed"] = [{"label": "interleave-256"}, {"label": "mlx_lm.BatchGenerator"}]
    doc["sweep"] = {"repeats": 1, "order": "shuffle", "runs": {k: [v] for k, v in summ.items()}, "wall_s": 1.0,
                    "rows": [{"label": g["label"], "objective_s": g["objective_s"], "slo_ratio": g["slo_ratio"],
                              "objective_range_s": [g["objective_s"]] * 2, "meets": False} for g in doc["grid"]],
                    "calls": [{"ran": [[0, "interleave-256"]]},
                              {"warm_up": {"label": "interleave-1024"},
                               "ran": [[0, "interleave-1024"], [0, "stall_free-256"]]}]}
    procs = process_runs(doc)
    assert [p["before"] for p in procs] == [["interleave-256", "mlx_lm.BatchGenerator"], ["interleave-1024"]]
    ways = simulate(doc, point)
    steady = {r["label"]: r for r in ways["steady"]}
    proc = {r["label"]: r for r in ways["processes"]}
    assert proc["interleave-256"] == steady["interleave-256"] and proc["interleave-1024"] == steady["interleave-1024"]
    # stall_free-256 ran after interleave-1024 only: warmer than fresh where they share shapes, never slower
    fresh = {r["label"]: r for r in ways["fresh"]}
    assert proc["stall_free-256"]["objective_s"] <= fresh["stall_free-256"]["objective_s"] + 1e-12
    doc["sweep"]["calls"][1]["ran"] = doc["sweep"]["calls"][1]["ran"][:1]  # a run no call names
    assert process_runs(doc) is None and "processes" not in simulate(doc, point)
