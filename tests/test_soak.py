"""``mlxlab bench soak`` (mlxlab.studies.serving.soak): the seeded fault generator, the verdict's
edges (a 5xx, a lost request, memory that keeps growing), the server's leak metrics, the server
bug the soak found (a non-streaming client that leaves was not cancelled), and a short soak on
``tiny`` end to end asserting the soak's invariants."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mlxlab.studies.serving.soak_faults import FAULTS, FaultGenerator, _post
from mlxlab.studies.serving.soak_verdict import end_checks, per_minute, soak_verdict

MIB = 2 ** 20


# ----------------------------------------------------------------------------- the fault generator
def test_the_fault_generator_is_seeded_and_draws_every_kind_each_round():
    gen_a, gen_b, gen_c = FaultGenerator(3), FaultGenerator(3), FaultGenerator(4)
    a = [gen_a.next() for _ in range(3 * len(FAULTS))]
    assert a == [gen_b.next() for _ in range(3 * len(FAULTS))]  # the same seed, the same faults and parameters
    assert a != [gen_c.next() for _ in range(3 * len(FAULTS))]
    for r in range(3):  # each round holds every kind once, however short the run
        assert sorted(f["kind"] for f in a[r * len(FAULTS):(r + 1) * len(FAULTS)]) == sorted(FAULTS)
    burst = next(f for f in a if f["kind"] == "burst")
    assert burst["streams"] > 8  # past the default --max-in-flight
    assert {f["kv_bits"] for f in a if f["kind"] == "bad_kv_bits"} <= {2, 3, 5, 16}


# ----------------------------------------------------------------------------- the verdict
def _sample(t, rss, active=10 * MIB, kv=0, in_flight=0, admitted=0, finished=0, fds=7, threads=8):
    return {"t": t, "rss_bytes": rss, "active_bytes": active, "kv_bytes": kv, "in_flight": in_flight,
            "admitted": admitted, "finished": finished, "by_reason": {"length": finished}, "fds": fds,
            "threads": threads, "server_cancelled": 0}


def _records(n=20, outcome="finished"):
    return [{"kind": "chat", "sent": float(i), "status": 200, "outcome": outcome, "well_formed": True,
             "arrivals": [i + 0.1, i + 0.2], "tokens": [1, 1], "ids": [1, 2]} for i in range(n)]


def _doc(records, samples, warm, after, **extra):
    from mlxlab.studies.serving.soak_verdict import counts

    end = end_checks(warm, after, samples, 0.0, 20.0, records)
    return {"config": {"model": "tiny"}, "totals": counts(records), "end": end,
            "faults_by_kind": {k: 1 for k in FAULTS}, "sigterm": {"clean": True},
            "outputs": {"equal": True, "compared": 4}, **extra}


def test_a_clean_run_reproduces_and_a_5xx_a_lost_request_or_growing_memory_fails_it():
    warm = _sample(0.0, 200 * MIB)
    flat = [_sample(float(t), 220 * MIB, admitted=20, finished=20) for t in range(0, 21, 2)]
    after = _sample(21.0, 221 * MIB, admitted=20, finished=20)
    good = _doc(_records(), flat, warm, after)
    assert soak_verdict(good)["verdict"] == "reproduced"

    # outputs that part decide in float32 (or where no dtype is stored), not in bfloat16: no exact oracle there
    parted = {"equal": False, "compared": 4, "identical": 1}
    assert soak_verdict({**good, "outputs": parted})["verdict"] == "not reproduced"
    assert soak_verdict({**good, "outputs": {**parted, "dtype": "mlx.core.float32"}})["verdict"] == "not reproduced"
    half = soak_verdict({**good, "outputs": {**parted, "dtype": "mlx.core.bfloat16"}})
    assert half["verdict"] == "reproduced" and half["measured"]["outputs_decide"] is False
    assert soak_verdict({**good, "outputs": {"compared": 0, "dtype": "mlx.core.bfloat16"}})["verdict"] == "not reproduced"

    five = _records()
    five[3] = {**five[3], "status": 500, "outcome": "server_error"}
    assert soak_verdict(_doc(five, flat, warm, after))["verdict"] == "not reproduced"

    # one request admitted and never finished: still in flight, its KV held
    stuck = _sample(21.0, 221 * MIB, admitted=21, finished=20, in_flight=1, kv=64 * 1024)
    v = soak_verdict(_doc(_records(), flat, warm, stuck))
    assert v["verdict"] == "not reproduced" and v["measured"]["lost"] == 1 and v["measured"]["kv_freed"] is False
    # a well-formed stream that ended without its finish counts as lost too
    cut = _records()
    cut[5] = {**cut[5], "outcome": "stream_error"}
    assert soak_verdict(_doc(cut, flat, warm, after))["measured"]["lost"] == 1

    growing = [_sample(float(t), (200 + 10 * t) * MIB, admitted=20, finished=20) for t in range(0, 21, 2)]
    v = soak_verdict(_doc(_records(), growing, warm, _sample(21.0, 420 * MIB, admitted=20, finished=20)))
    assert v["verdict"] == "not reproduced" and v["measured"]["memory_bounded"] is False
    leak = _sample(21.0, 221 * MIB, active=60 * MIB, admitted=20, finished=20)  # MLX arrays never freed
    assert soak_verdict(_doc(_records(), flat, warm, leak))["measured"]["memory_bounded"] is False

    missing = _doc(_records(), flat, warm, after, faults_by_kind={"burst": 3})
    assert soak_verdict(missing)["verdict"] == "not reproduced"
    assert soak_verdict({})["verdict"] == "not measured"


def test_per_minute_counts_requests_by_when_they_were_sent():
    recs = _records(6) + [{"kind": "burst", "sent": 70.0, "status": 429, "error_code": "server_busy",
                           "outcome": "refused"}]
    rows = per_minute(recs, [_sample(30.0, 100 * MIB), _sample(90.0, 120 * MIB)], 0.0, 60.0)
    assert [r["sent"] for r in rows] == [6, 1] and rows[1]["refused_by"] == {"429 server_busy": 1}
    assert rows[0]["rss_bytes"] == 100 * MIB and rows[1]["rss_bytes_max"] == 120 * MIB
    assert rows[0]["itl_p50_ms"] == pytest.approx(100.0) and rows[1]["ttft_p50_ms"] is None


# ----------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def server(tiny):
    from mlxlab import serve

    srv = serve.build(tiny, model_name="tiny", chunk_size=64)
    url, stop = serve.start_background(srv)
    yield srv, url
    stop()


def _metrics(url):
    from mlxlab.studies.serving.soak import probe

    return probe(url, None)


def test_metrics_expose_what_a_soak_watches_for_leaks(server):
    srv, url = server
    before = _metrics(url)
    httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=60)
    m = _metrics(url)
    assert m["admitted"] == before["admitted"] + 1 and m["in_flight"] == 0 and m["kv_bytes"] == 0
    assert m["active_bytes"] > 0 and m["peak_bytes"] >= m["active_bytes"] and m["cache_bytes"] is not None
    assert m["rss_bytes"] > 0 and m["fds"] > 0 and m["threads"] >= 2  # the process collector, /proc/self/task


def test_a_non_streaming_client_that_leaves_cancels_its_request(server):
    """The soak's finding: a client of a non-streaming request that disconnected left its request
    decoding to max_tokens (its KV and an in-flight slot held), as no send told the server."""
    srv, url = server
    before = _metrics(url)["by_reason"].get("cancelled", 0)
    body = json.dumps({"model": "tiny", "prompt": "x" * 500, "max_tokens": 6000}).encode()
    sock = _post(url, "/v1/completions", body)
    while _metrics(url)["in_flight"] == 0:  # admitted
        time.sleep(0.02)
    sock.close()
    while srv.worker.in_flight:
        time.sleep(0.05)
    m = _metrics(url)
    assert m["by_reason"].get("cancelled", 0) == before + 1 and m["kv_bytes"] == 0  # not run out to max_tokens


# ----------------------------------------------------------------------------- a short soak
def test_a_short_soak_on_tiny_loses_nothing_and_frees_everything(tmp_path):
    data = Path(__file__).resolve().parent.parent / "data"
    shutil.copytree(data / "models", tmp_path / "data" / "models")
    shutil.copytree(data / "claims", tmp_path / "data" / "claims")
    env = {**os.environ, "MLXLAB_DATA": str(tmp_path / "data")}  # results land in tmp_path, not the checkout
    out = subprocess.run([sys.executable, "-m", "mlxlab.cli", "bench", "soak", "--model", "tiny", "--dtype", "float32",
                          "--minutes", "0.75", "--fault-gap-s", "0.5", "--chat-chars", "128", "--chat-tokens", "32",
                          "--doc-chars", "512", "--interval-s", "15", "--sample-s", "2", "--sample-outputs", "6",
                          "--seed", "1", "--platform", "scratch"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    path = out.stdout.strip().splitlines()[-1].removeprefix("wrote ")
    assert str(tmp_path) in path
    doc = json.loads(Path(path).read_text())
    end, totals = doc["end"], doc["totals"]
    assert totals["http_5xx"] == 0 and end["http_5xx"] == 0
    assert end["lost"] == 0 and end["kv_freed"] and end["admitted"] == end["finished_or_cancelled"] > 0
    assert totals["by_kind"]["chat"].get("finished") and totals["by_kind"]["document"].get("finished")
    assert set(doc["faults_by_kind"]) == set(FAULTS)
    assert doc["sigterm"]["exit_code"] == 0 and doc["sigterm"]["clean"]
    assert doc["outputs"]["compared"] > 0 and doc["outputs"]["equal"]
    assert end["memory_bounded"], {k: v for k, v in end.items() if k.startswith(("active", "rss", "fds", "threads"))}
    assert [v["verdict"] for v in doc["verdicts"]] == ["reproduced"]
    assert doc["per_minute"] and all(r.get("rss_bytes") for r in doc["per_minute"][:1])
    assert "tiny" in doc["environment"]["argv"] and not any(str(tmp_path) in a for a in doc["environment"]["argv"])
    left = subprocess.run(["pgrep", "-f", "mlxlab.cli serve --model tiny"], capture_output=True, text=True)
    assert left.stdout.strip() == ""  # the server process was stopped
