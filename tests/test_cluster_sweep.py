"""Sweeps on a Dask cluster (mlxlab.core.cluster, ``--cluster``): a simulator study on a local
cluster of two worker processes gives the in-process results in input order, timed points never
run two at once on one accelerator, a bad address is one clear line, and the contention
benchmark's points join back into the file its verdicts read.

Every cluster here listens on loopback (127.0.0.1) and every wait is bounded (``TIMEOUT_S``)."""

import json
import socket
import time

import pytest

pytest.importorskip("distributed")

from mlxlab.cli import build_parser, main  # noqa: E402
from mlxlab.core.cluster import ACCELERATOR, PointResult, Sweep, describe  # noqa: E402
from mlxlab.core.results import jsonable  # noqa: E402
from mlxlab.studies.contention.sweep import contention_points, merge_points  # noqa: E402
from mlxlab.studies.seed_scale.run import seed_scale_study  # noqa: E402

TIMEOUT_S = 120  # a bound on any one sweep or cluster start, never a measured threshold

#: a small seed-001 study: 8 plane points and 3 crawl cases, a few seconds of simulation
SMALL_STUDY = dict(chunk_sizes=(512, 1024, 2048), stall_free_budgets=(512,), slo_targets_s=(0.5,),
                   long_prompt_tokens=8000, chat_context_tokens=2000, batch_prompt_tokens=(2000, 4000), workers=2)


@pytest.fixture(scope="module")
def sweep():
    """Two worker processes, one thread each; the first holds this machine's one accelerator."""
    with Sweep(n_workers=2, accelerators=1, timeout_s=TIMEOUT_S, progress=False) as s:
        yield s


def _sleep_then_echo(point):
    time.sleep(point["sleep_s"])
    return point["i"]


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _without_wall(res: dict) -> dict:
    return {k: v for k, v in jsonable(res).items() if k not in ("wall_s", "paths")}


# ---------------------------------------------------------------------------------- simulator sweeps
def test_a_simulator_study_on_a_local_cluster_gives_the_in_process_results_in_order(sweep):
    here = seed_scale_study(**SMALL_STUDY)
    before = len(sweep.results)
    there = seed_scale_study(**SMALL_STUDY, mapper=sweep.mapper(timed=False, desc="seed-scale", timeout_s=TIMEOUT_S))
    assert _without_wall(there) == _without_wall(here)
    ran = sweep.results[before:]
    assert len(ran) == 8 + 3  # the plane's points, then the crawl's cases: each ran on the cluster
    assert [r.index for r in ran] == list(range(8)) + list(range(3))
    assert [r.params[2] for r in ran[:8]] == [row["label"] for row in here["plane"]]
    workers = sweep.workers()
    assert {r.worker for r in ran} <= set(workers) and {r.host for r in ran} == {socket.gethostname()}
    assert all(r.environment["git_commit"] == ran[0].environment["git_commit"] for r in ran)
    prov = sweep.provenance()
    assert prov["scheduler"] == "local" and set(prov["environments"]) <= set(workers)
    json.dumps(prov)  # a results file can hold it: the slo point's cost model is stored by its source
    assert len({p["sweep"] for p in prov["points"][before:]}) == 2  # the plane's call, then the crawl's
    slo = [p for p in prov["points"][before:] if str(p["params"][2]).startswith("slo")]
    assert slo and slo[0]["params"][3]["cost_model"] == here["profile"]["source"]


def test_results_come_back_in_input_order_whatever_order_they_finish_in(sweep):
    points = [{"i": i, "sleep_s": s} for i, s in enumerate((0.6, 0.0, 0.3, 0.0))]  # the first finishes late
    out = sweep.run(_sleep_then_echo, points, timed=False, timeout_s=TIMEOUT_S)
    assert [r.value for r in out] == [0, 1, 2, 3] and [r.params for r in out] == points
    assert all(r.ended_at >= r.started_at + p["sleep_s"] for r, p in zip(out, points))


# ---------------------------------------------------------------------------------- timed sweeps
def test_timed_points_never_run_two_at_once_on_one_accelerator(sweep):
    holders = [a for a, w in sweep.workers().items() if w["resources"].get(ACCELERATOR) == 1]
    assert len(holders) == 1 and len(sweep.workers()) == 2  # the other worker could run one at the same time
    points = [{"i": i, "sleep_s": 0.3} for i in range(4)]
    out = sweep.run(_sleep_then_echo, points, timed=True, timeout_s=TIMEOUT_S)
    assert {r.worker for r in out} == set(holders)
    spans = sorted((r.started_at, r.ended_at) for r in out)
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:])), f"timed points overlapped: {spans}"
    assert all("device" in r.environment for r in out)  # a timed point's provenance names its device


def test_a_timed_sweep_without_an_accelerator_worker_fails_at_once():
    with Sweep(n_workers=1, accelerators=0, timeout_s=TIMEOUT_S, progress=False) as s:
        with pytest.raises(ValueError, match="accelerator=1"):
            s.run(_sleep_then_echo, [{"i": 0, "sleep_s": 0.0}], timed=True, timeout_s=TIMEOUT_S)


# ---------------------------------------------------------------------------------- bad addresses
@pytest.mark.parametrize("kind", ["nobody listens", "not an address"])
def test_a_bad_address_is_one_line_naming_it_and_what_to_do(kind):
    address = f"tcp://127.0.0.1:{_free_loopback_port()}" if kind == "nobody listens" else "tcp://127.0.0.1:port"
    with pytest.raises(ValueError) as e:
        Sweep(address, timeout_s=1)
    msg = str(e.value)
    assert "\n" not in msg and address in msg and "local" in msg
    assert ("dask scheduler" in msg) if kind == "nobody listens" else ("tcp://HOST:PORT" in msg)


def test_the_command_reports_a_bad_cluster_in_one_line_and_writes_nothing(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MLXLAB_NO_REEXEC", "1")
    monkeypatch.setattr("mlxlab.core.cluster.CONNECT_TIMEOUT_S", 1.0)  # nobody will answer: do not wait long
    address = f"tcp://127.0.0.1:{_free_loopback_port()}"
    out = tmp_path / "out"
    assert main(["seed-scale", "--cluster", address, "--out", str(out), "--no-figure"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlxlab seed-scale: error: no Dask scheduler answered at " + address) and "\n" not in err
    assert not out.exists()


def test_cluster_option_defaults_to_in_process_and_bare_means_local():
    p = build_parser()
    assert p.parse_args(["seed-scale"]).cluster is None
    assert p.parse_args(["seed-scale", "--cluster"]).cluster == "local"
    assert p.parse_args(["bench", "contention", "--cluster", "tcp://127.0.0.1:8786"]).cluster == "tcp://127.0.0.1:8786"


# ---------------------------------------------------------------------------------- contention points
def _point_result(i, params, *, alone, ttft, first_ttft, solo_p99):
    row = {"label": params["setting"], "executor": "engine", "alone_ttft_s": alone, "doc_ttft_s": ttft,
           "doc_ttft_over_best_alone": ttft / alone, "first_run": {"doc_ttft_s": first_ttft}}
    value = {"solo": {"itl_p99_ms": solo_p99}, "settings": {params["setting"]: row}, "config": {"repeats": 2},
             "model": {"preset": params["model"]}, "wall_s": 1.0}
    return PointResult(i, params, value, "h", f"w{i}", 1, 10.0 * i, 10.0 * i + 5, {})


def test_contention_points_join_back_with_the_best_alone_over_all_and_each_rows_own_solo():
    points = contention_points(["tiny"], ["a", "b"], doc_tokens=256, chat_context=64, repeats=2, warmup="off", seed=0)
    assert [p["setting"] for p in points] == ["a", "b"] and points[0]["doc_tokens"] == 256
    rs = [_point_result(0, points[0], alone=2.0, ttft=3.0, first_ttft=4.0, solo_p99=10.0),
          _point_result(1, points[1], alone=1.0, ttft=1.5, first_ttft=1.0, solo_p99=20.0)]
    merged = merge_points(rs)["tiny"]
    a, b = merged["settings"]["a"], merged["settings"]["b"]
    assert merged["best_alone_setting"] == "b" and merged["best_alone_ttft_s"] == 1.0
    assert a["doc_ttft_over_best_alone"] == 3.0 and a["first_run"]["doc_ttft_over_best_alone"] == 4.0
    assert b["doc_ttft_over_best_alone"] == 1.5
    assert a["solo"]["itl_p99_ms"] == 10.0 and b["solo"]["itl_p99_ms"] == 20.0
    assert a["ran_on"]["worker"] == "w0" and merged["wall_s"] == 15.0 and list(merged["settings"]) == ["a", "b"]
    with pytest.raises(ValueError, match="unknown contention options"):
        contention_points(["tiny"], ["a"], chunk=3)


def test_describe_keeps_data_and_names_objects():
    class CostModel:
        source = "profile.json"

    assert describe({"a": (1, 2.5), "cm": CostModel(), "o": object()}) == \
        {"a": [1, 2.5], "cm": "profile.json", "o": "object"}


def test_tunes_simulated_grid_on_the_cluster_equals_the_grid_run_here(sweep):
    """`mlxlab tune --cluster`: each grid setting is a point of plain data (cost model, limits,
    trace) that a worker simulates to the same row this process gets."""
    from mlxlab.core.traces import Trace, TraceRequest, to_arrivals
    from mlxlab.sim.profiles import load_profile
    from mlxlab.studies.tune.run import default_grid, simulate_setting
    from mlxlab.studies.tune.slo import parse_slo

    trace = Trace([TraceRequest(0.0, "batch", 600, 4), TraceRequest(0.05, "chat", 60, 12),
                   TraceRequest(0.1, "batch", 900, 4), TraceRequest(0.2, "chat", 60, 12)], format="mlxlab")
    arrivals = to_arrivals(trace, 1024, 0)
    base = {"cost_model": load_profile("cpu-small"), "limits": {"vocab_size": 1024, "max_context": 8192},
            "arrivals": arrivals, "slos": [parse_slo("chat.itl_p99<=40ms")], "solos": {},
            "objective": "batch.ttft_p50", "tenants": ["batch", "chat"]}
    points = [{**base, "setting": s} for s in default_grid(True, 900)]
    here = [simulate_setting(p) for p in points]
    there = sweep.mapper(timed=False, desc="tune grid")(simulate_setting, points)
    assert [r["label"] for r in there] == [r["label"] for r in here]
    assert [(r["objective_s"], r["slo_ratio"], r["meets"]) for r in there] == \
        [(r["objective_s"], r["slo_ratio"], r["meets"]) for r in here]
