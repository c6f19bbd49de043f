"""``mlxlab bench http`` (mlxlab.studies.serving.against): mlxlab serve against mlx_lm.server over
HTTP on one exported model directory; the verdicts' edges, token gaps as the client saw them, and
one short end-to-end run whose server processes are gone afterwards."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxlab.studies.serving.against import _figures, against_verdicts, token_gaps


def _server(docs, itl_runs, solo=10.0):
    runs = [{"chat_itl_p99_ms": x, "solo_itl_p99_ms": solo} for x in itl_runs]
    return {"runs": runs, "summary": {"docs_per_min": {"median": sorted(docs)[len(docs) // 2], "min": min(docs),
                                                        "max": max(docs)}}}


def _doc(**servers):
    return {"servers": servers, "config": {"model_dir": "m", "workers": 4, "doc_chars": 100, "chat_chars": 10,
                                           "chat_tokens": 5, "repeats": 2, "prefill_step": 64}}


def test_a_chunk_of_several_tokens_splits_its_gap_evenly():
    assert token_gaps({"arrivals": [0.0, 0.1, 0.4], "tokens": [1, 1, 3]}) == pytest.approx([0.1, 0.1, 0.1, 0.1])


def test_documents_are_counted_over_the_whole_window_of_chats_and_gaps_pooled_within_chats():
    solo = {"sent": 0.0, "arrivals": [0.1, 0.2, 0.3], "tokens": [1, 1, 1], "error": None}
    chats = [{"sent": 10.0, "arrivals": [10.5, 10.6, 10.7], "tokens": [1, 1, 1], "error": None},
             {"sent": 11.0, "arrivals": [12.0, 12.1, 12.3, 20.0], "tokens": [1, 1, 2, 1], "error": None}]
    docs = [{"sent": 9.0, "arrivals": [10.2], "tokens": [1], "done": 10.2, "error": None},  # done in the first chat
            {"sent": 9.5, "arrivals": [15.0], "tokens": [1], "done": 15.0, "error": None},  # between chats' tokens
            {"sent": 9.5, "arrivals": [], "tokens": [], "done": 25.0, "error": None},  # after the window
            {"sent": 9.0, "arrivals": [], "tokens": [], "done": 5.0, "error": None}]  # before it
    f = _figures(solo, chats, docs)
    assert f["window_s"] == 10.0 and f["chats"] == 2 and f["docs_finished"] == 2 and f["docs_per_min"] == 12.0
    # the second chat's TTFT (1 s) is no ITL gap; its 2-token chunk splits 0.2 s; its last gap is 7.7 s
    assert f["chat_itl_max_ms"] == pytest.approx(7700.0) and f["chat_ttft_p50_ms"] == pytest.approx(750.0)
    assert f["chat_tok_s_during"] == pytest.approx((2 + 4) / 10.0)  # tokens after each chat's first, over the window
    # the longest gaps say where they fell: the second chat's last (7.7 s), then its first (0.1 s)
    top = f["longest_gaps"]
    assert top[0] == {"chat": 1, "gap": 3, "of": 4, "ms": pytest.approx(7700.0)} and len(top) == 6
    assert [g["ms"] for g in top] == sorted((g["ms"] for g in top), reverse=True)


def test_throughput_needs_the_repeats_apart_and_chat_itl_needs_enough_documents():
    ref = _server([50, 60], [100, 110])
    v = {r["claim"]: r for r in against_verdicts(_doc(**{"mlx_lm.server": ref,
                                                        "mlxlab slo": _server([120, 130], [15, 18])}))}
    assert v["mlx-serve-vs-mlxlm-throughput"]["verdict"] == "reproduced"
    assert v["mlx-serve-chat-itl"]["verdict"] == "reproduced" and v["mlx-serve-chat-itl"]["measured"]["best_policy"] == "mlxlab slo"
    v = {r["claim"]: r for r in against_verdicts(_doc(**{"mlx_lm.server": ref,
                                                        "mlxlab slo": _server([55, 65], [15, 25])}))}
    assert v["mlx-serve-vs-mlxlm-throughput"]["verdict"] == "inconclusive"  # the repeats overlap
    assert v["mlx-serve-chat-itl"]["verdict"] == "inconclusive"  # 1.5x and 2.5x: straddles 2x
    # a calm chat on a policy that starves the documents does not count
    v = {r["claim"]: r for r in against_verdicts(_doc(**{"mlx_lm.server": ref,
                                                        "mlxlab slo": _server([10, 12], [12, 13])}))}
    assert v["mlx-serve-vs-mlxlm-throughput"]["verdict"] == "not reproduced"
    assert v["mlx-serve-chat-itl"]["verdict"] == "not reproduced" and v["mlx-serve-chat-itl"]["measured"]["eligible"] == []



def test_a_server_whose_requests_failed_is_not_a_measurement():
    # mlx_lm.server's generation thread died in the first repeat (seen on an H100 with llama-3.2-1b):
    # the documents that finished before it count fast over a two-second window
    dead = _server([0, 100], [100, 110])
    dead["runs"][0]["errors"] = ["HTTP 404: b'{\"error\": \"generation thread died\"}'"]
    ours = _server([120, 130], [15, 18])
    v = {r["claim"]: r for r in against_verdicts(_doc(**{"mlx_lm.server": dead, "mlxlab slo": ours}))}
    assert v["mlx-serve-vs-mlxlm-throughput"]["verdict"] == "not measured"
    assert "generation thread died" in v["mlx-serve-vs-mlxlm-throughput"]["measured"]["failed"]["mlx_lm.server"][0]
    # the chat's claim is mlxlab's own: decided among the servers that did not fail
    assert v["mlx-serve-chat-itl"]["verdict"] == "reproduced"
    assert "mlx_lm.server" in v["mlx-serve-chat-itl"]["measured"]["failed"]
    # a failed mlxlab policy is not the best one, even with the most documents
    broken = _server([300, 310], [11, 12])
    broken["runs"][1]["errors"] = ["RemoteProtocolError: peer closed connection"]
    v = {r["claim"]: r for r in against_verdicts(_doc(**{"mlx_lm.server": _server([50, 60], [100, 110]),
                                                        "mlxlab interleave": broken, "mlxlab slo": ours}))}
    assert v["mlx-serve-vs-mlxlm-throughput"]["measured"]["best_policy"] == "mlxlab slo"
    assert v["mlx-serve-chat-itl"]["measured"]["eligible"] == ["mlxlab slo"]

def _fake_run(monkeypatch):
    """``against_mlx_lm`` with no process and no HTTP: servers, streams and scenes are logged in
    the list returned (("server", module), ("stream", prompt chars, tokens), ("scene", seed))."""
    from mlxlab.studies.serving import against

    calls = []

    class FakeServer:
        def __init__(self, cmd, port, log_path):
            calls.append(("server", cmd[2]))

        def __enter__(self):
            return "http://fake"

        def __exit__(self, *exc):
            return None

    figs = {"solo_itl_p99_ms": 5.0, "chat_itl_p99_ms": 7.0, "docs_per_min": 10.0, "window_s": 1.0, "chats": 1,
            "errors": []}
    monkeypatch.setattr(against, "Server", FakeServer)
    monkeypatch.setattr(against, "stream", lambda client, url, model, prompt, n, user=None: calls.append(
        ("stream", len(prompt), n)) or {})
    monkeypatch.setattr(against, "scene", lambda *a, **k: calls.append(("scene", k["seed"])) or dict(figs))
    return calls


def test_each_finished_server_is_handed_on_before_the_next_starts(monkeypatch, tmp_path):
    """A run cut short by a time limit keeps what finished: ``on_server`` sees the servers so far,
    mlx_lm.server alone first, and is called before the next server is started."""
    from mlxlab.studies.serving import against

    calls, seen = _fake_run(monkeypatch), []

    def started():
        return sum(c[0] == "server" for c in calls)

    res = against.against_mlx_lm(str(tmp_path / "m"), policies=["slo", "interleave"], repeats=1, progress=False,
                                 on_server=lambda r: seen.append((started(), sorted(r["servers"]))))
    assert seen == [(1, ["mlx_lm.server"]), (2, ["mlx_lm.server", "mlxlab slo"]),
                    (3, ["mlx_lm.server", "mlxlab interleave", "mlxlab slo"])]
    assert set(res["servers"]) == {"mlx_lm.server", "mlxlab slo", "mlxlab interleave"}


def test_every_server_first_streams_a_chat_of_the_timed_shape(monkeypatch, tmp_path):
    """The warm-up starts with the timed chat alone (its prompt length and tokens), before any
    timed scene: after a warm-up of short prompts only, the first repeat's solo chat was 1.05-2.2x
    slower than the second's on an H100."""
    from mlxlab.studies.serving import against

    calls = _fake_run(monkeypatch)
    res = against.against_mlx_lm(str(tmp_path / "m"), policies=["slo"], repeats=2, chat_chars=1500, chat_tokens=100,
                                 progress=False)
    per_server = [("stream", 1500, 100), ("scene", -1), ("scene", 0), ("scene", 1)]
    assert calls == [("server", "mlx_lm.server")] + per_server + [("server", "mlxlab.cli")] + per_server
    assert res["config"]["warm_up"] == against.WARM_UP


def test_a_policy_variant_sets_mlxlab_serves_chunk_size_and_options_and_leaves_mlx_lm_server_alone(monkeypatch, tmp_path):
    """``--policies slo slo:chunk_size=1024:itl_target_x=1.5`` runs the plain policy and the variant
    side by side, each labelled as given; mlx_lm.server keeps the shared prefill step."""
    from mlxlab.studies.serving import against

    cmds = []
    _fake_run(monkeypatch)
    real = against.server_command
    monkeypatch.setattr(against, "server_command", lambda *a, **k: cmds.append(real(*a, **k)) or cmds[-1])
    res = against.against_mlx_lm(str(tmp_path / "m"), policies=["slo", "slo:chunk_size=1024:itl_target_x=1.5"],
                                 repeats=1, prefill_step=2048, progress=False)
    assert set(res["servers"]) == {"mlx_lm.server", "mlxlab slo", "mlxlab slo:chunk_size=1024:itl_target_x=1.5"}
    base, plain, variant = cmds
    assert base[base.index("--prefill-step-size") + 1] == "2048"
    assert plain[plain.index("--chunk-size") + 1] == "2048" and "--policy-option" not in plain
    assert variant[variant.index("--policy") + 1] == "slo" and variant[variant.index("--chunk-size") + 1] == "1024"
    assert variant[variant.index("--policy-option") + 1] == "itl_target_x=1.5"


@pytest.mark.parametrize("spec", ["slo:chunk_size", "slo:chunk_size=0", "slo:chunk_size=big", ":chunk_size=8",
                                  "slo:=3"])
def test_a_malformed_policy_variant_is_refused_before_any_server_starts(monkeypatch, tmp_path, spec):
    from mlxlab.studies.serving import against

    calls = _fake_run(monkeypatch)
    with pytest.raises(ValueError, match="slo|policy name"):
        against.against_mlx_lm(str(tmp_path / "m"), policies=["slo", spec], repeats=1, progress=False)
    assert calls == []


@pytest.mark.parametrize("spec, says", [("nope", "unknown policy 'nope'"), ("slo:no_such=1", "no_such"),
                                        ("slo:chunk_size=-4", "positive integer")])
def test_bench_http_names_a_bad_policy_variant_and_starts_nothing(monkeypatch, tmp_path, capsys, spec, says):
    from mlxlab.cli import main

    calls = _fake_run(monkeypatch)
    (tmp_path / "m").mkdir()
    assert main(["bench", "http", "--model-dir", str(tmp_path / "m"), "--policies", "slo", spec]) == 2
    assert says in capsys.readouterr().err and calls == []


def test_bench_http_runs_both_servers_and_leaves_no_process_behind(tmp_path):
    data = Path(__file__).resolve().parent.parent / "data"
    shutil.copytree(data / "models", tmp_path / "data" / "models")
    shutil.copytree(data / "claims", tmp_path / "data" / "claims")
    env = {**os.environ, "MLXLAB_DATA": str(tmp_path / "data")}  # results land in tmp_path, not the checkout
    model = tmp_path / "tiny"
    run = [sys.executable, "-m", "mlxlab.cli"]
    assert subprocess.run(run + ["export-model", "tiny", "--dtype", "float32", "--out", str(model)],
                          capture_output=True, timeout=300, env=env).returncode == 0
    out = subprocess.run(run + ["bench", "http", "--model-dir", str(model), "--policies", "interleave", "--workers", "1",
                                "--chat-chars", "64", "--chat-tokens", "24", "--doc-chars", "256", "--doc-tokens", "2",
                                "--repeats", "1", "--prefill-step", "64", "--window-s", "2", "--record", "--platform", "scratch"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    path = out.stdout.strip().splitlines()[-1].removeprefix("wrote ")
    assert str(tmp_path) in path
    doc = json.loads(open(path).read())
    assert set(doc["servers"]) == {"mlx_lm.server", "mlxlab interleave"}
    for s in doc["servers"].values():
        assert s["summary"]["solo_itl_p99_ms"]["median"] > 0 and not s["summary"]["errors"]
        assert s["runs"][0]["window_s"] >= 2.0  # chats one after another until the window is over
    assert {v["claim"] for v in doc["verdicts"]} == {"mlx-serve-vs-mlxlm-throughput", "mlx-serve-chat-itl"}
    assert list(Path(path).parent.glob("*_partial.json")) == []  # the run's partial file is gone once it finished
    again = subprocess.run(run + ["bench", "http", "--rescore", path], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    redone = json.loads(open(path).read())
    assert redone["servers"] == doc["servers"] and "rescored_by" in json.dumps(redone)  # decided again, nothing re-run
    assert "figure " in again.stdout
    bad = subprocess.run(run + ["bench", "http", "--rescore", str(tmp_path / "data" / "claims" / "mlxlab.yaml")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "not a saved bench http results file" in bad.stderr
    trace = Path(path).parent / doc["servers"]["mlxlab interleave"]["trace"]  # the mlxlab server's recorded trace
    from mlxlab.core.traces import read_trace

    assert set(read_trace(trace).tenants()) == {"chat", "batch"}
    left = subprocess.run(["pgrep", "-f", f"--model {model}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""  # every server process was stopped by its id


def _saved(scale=1.0, **env):
    """A copy of a committed H200 bench http file, its figures times ``scale``, its environment
    updated with ``env``."""
    doc = json.loads((Path(__file__).resolve().parent.parent / "data" / "results" / "h200"
                      / "serve_http_qwen2.5-0.5b.json").read_text())
    for s in doc["servers"].values():
        s["runs"] = [{k: v * scale if isinstance(v, float) else v for k, v in r.items()} for r in s["runs"]]
    doc["environment"].update(env)
    return doc


def test_merge_pools_the_repeats_of_separate_calls_and_decides_again():
    """Five repeats of the HTTP scene do not fit one ten-minute GPU call: saved runs of one scene
    are pooled server by server, the summary counts every repeat and the verdicts are decided on
    the pooled runs."""
    from mlxlab.studies.serving.http_merge import merge_http

    a, b = _saved(), _saved(scale=2.0)
    doc = merge_http([{**a, "source": "a.json"}, {**b, "source": "b.json"}])
    assert doc["config"]["repeats"] == 4 and [p["source"] for p in doc["parts"]] == ["a.json", "b.json"]
    slo = doc["servers"]["mlxlab slo"]
    assert [r["part"] for r in slo["runs"]] == [0, 0, 1, 1] and "part" not in slo["summary"]
    dpm = slo["summary"]["docs_per_min"]
    assert dpm["n"] == 4 and dpm["max"] == 2 * max(r["docs_per_min"] for r in a["servers"]["mlxlab slo"]["runs"])
    assert {v["claim"] for v in doc["verdicts"]} == {"mlx-serve-vs-mlxlm-throughput", "mlx-serve-chat-itl"}


@pytest.mark.parametrize("change, says", [
    (lambda d: d["config"].update(doc_chars=8000), "different scene"),
    (lambda d: d["environment"].update(source_commit="0000000"), "different commit"),
    (lambda d: d["environment"].update(device_name="NVIDIA H100"), "device_name"),
    (lambda d: d["servers"].pop("mlxlab slo"), "servers"),
    (lambda d: d.update(partial="cut short"), "cut short"),
])
def test_merge_refuses_runs_that_are_not_repeats_of_one_measurement(change, says):
    from mlxlab.studies.serving.http_merge import merge_http

    b = _saved()
    change(b)
    with pytest.raises(ValueError, match=says):
        merge_http([{**_saved(), "source": "a.json"}, {**b, "source": "b.json"}])
    with pytest.raises(ValueError, match="two or more"):
        merge_http([{**_saved(), "source": "a.json"}])


def test_bench_http_merge_writes_the_pooled_file_with_the_parts_machine(tmp_path, monkeypatch, capsys):
    from mlxlab.cli import main

    data = Path(__file__).resolve().parent.parent / "data"
    shutil.copytree(data / "claims", tmp_path / "data" / "claims")
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path / "data"))  # results land in tmp_path, not the checkout
    for name, scale in (("a", 1.0), ("b", 1.5)):
        (tmp_path / f"{name}.json").write_text(json.dumps(_saved(scale)))
    rc = main(["bench", "http", "--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
               "--name", "serve_http_merged"])  # without --save: a run folder, the figure beside the file
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    path = Path(printed.out.strip().splitlines()[-1].removeprefix("wrote ").split(":")[0])
    assert path.name == "serve_http_merged.json" and str(tmp_path) in str(path)
    out = json.loads(path.read_text())
    assert out["environment"]["device_name"] == "NVIDIA H200" and out["environment"]["merged_from"] == ["a.json", "b.json"]
    assert out["parameters"]["repeats"] == 4 and len(out["verdicts"]) == 2
    (tmp_path / "c.json").write_text("{}")
    assert main(["bench", "http", "--merge", str(tmp_path / "a.json"), str(tmp_path / "c.json")]) == 2
    assert "not a saved bench http results file" in capsys.readouterr().err


def test_an_engine_option_in_a_policy_variant_reaches_mlxlab_serves_engine_and_a_bad_one_is_named(tiny):
    """``slo:decode_apart=4096`` is not a policy option: the variant check lets it through to the
    engine (``mlxlab serve --policy-option decode_apart=4096`` builds ``Engine(decode_apart=4096)``)
    and names a bad value before any server starts."""
    from mlxlab import serve
    from mlxlab.cli.serve import _bad_policy_variant, policy_options

    assert _bad_policy_variant(["slo", "slo:decode_apart=4096"], 2048) is None
    assert "decode_apart must be" in _bad_policy_variant(["slo:decode_apart=-1"], 2048)
    assert "no_such" in _bad_policy_variant(["slo:decode_apart=8:no_such=1"], 2048)
    server = serve.build(tiny, policy="slo", **policy_options(["decode_apart=4096"]))
    assert server.worker.engine.decode_apart == 4096
