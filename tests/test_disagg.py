"""Disaggregated serving (mlxlab.engine.disagg): greedy tokens of a prefill worker and a decode
worker equal one engine's and mlx-lm's ``generate_step``'s (tests/oracle.py), in process (the wire
format packed and unpacked, no network) and as two processes under ``mlx.launch`` on loopback
(the ring backend; bounded by a subprocess timeout)."""

import random
import sys

import pytest

from mlxlab.engine import disagg
from mlxlab.engine.loop import Engine
from tests.oracle import assert_matches, first_near_tie, reference

CHUNK = 32  # several chunks per prompt below, with a padded final chunk


def workload(vocab):
    rng = random.Random(21)

    def p(n):
        return [rng.randrange(1, vocab) for _ in range(n)]

    return [
        {"prompt": p(5), "max_tokens": 12},
        {"prompt": p(37), "max_tokens": 12, "tenant": "b"},
        {"prompt": p(70), "max_tokens": 10},
        {"prompt": p(1), "max_tokens": 3, "after": [0, 4]},  # nothing to prefill; joins a running batch
        {"prompt": p(90), "max_tokens": 1, "after": [1, 2]},  # done at its first token: no KV travels
        {"prompt": p(45), "max_tokens": 500, "until": [4, 2]},  # cancelled once request 4 is done
    ]


def in_process(model, work):
    """Prefill engine -> pack -> unpack -> decode engine, one process (the ranks' drivers without the network)."""
    dec = Engine.__new__(disagg.DecodeEngine)
    disagg.DecodeEngine.__init__(dec, model)
    msgs = []

    def hand_off(seq, token, t, caches):
        arrays = disagg.pack_prompt(index_of[seq.req.id], seq.req, token, caches, pre._t0,
                                    {"arrival": seq.req.arrival_s, "prefill_start": seq.req.prefill_start_s, "first": t})
        head, text = arrays[0].tolist(), arrays[1].tolist()
        msgs.append(disagg.unpack_prompt(head, text, *(arrays[2:] or [None, None])))

    pre = disagg.PrefillEngine(model, hand_off, chunk_size=CHUNK)
    dec.align_clock(pre._t0)
    index_of, reqs = {}, {}
    for i, r in enumerate(work):
        if r.get("after") is None:
            index_of[pre._next_request] = i
            pre.submit(r["prompt"], r["max_tokens"], tenant=r.get("tenant", "default"))
    pre.run()
    for m in msgs:
        reqs[m["index"]] = dec.adopt(m, dec.now())
    dec.run()
    return msgs, reqs


def test_wire_round_trip_keeps_metadata_and_tokens(tiny):
    work = workload(tiny.vocab_size)[:3]
    msgs, reqs = in_process(tiny, work)
    assert sorted(m["index"] for m in msgs) == [0, 1, 2]
    for m in msgs:
        r = work[m["index"]]
        assert m["prompt"] == r["prompt"] and m["max_tokens"] == r["max_tokens"]
        assert m["tenant"] == r.get("tenant", "default")
        assert m["positions"] == len(r["prompt"])  # trimmed to the prompt: no padding, no presized room
        assert m["keys"].shape == (4, 1, 2, len(r["prompt"]), 64) and m["keys"].dtype == tiny.dtype
    local = disagg.run_local(Engine(tiny, chunk_size=CHUNK), work)
    for i, r in enumerate(work):
        assert reqs[i].output_tokens == local[i].output_tokens
        assert_matches(reqs[i].output_tokens, reference(tiny, r["prompt"], r["max_tokens"]))


def test_workload_errors_name_the_request():
    with pytest.raises(ValueError, match="request 1: after names request 1"):
        disagg.check_workload([{"prompt": [1], "max_tokens": 2}, {"prompt": [2], "max_tokens": 2, "after": [1, 1]}])
    with pytest.raises(ValueError, match="request 0 has no prompt"):
        disagg.check_workload([{"prompt": [], "max_tokens": 2}])
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        disagg.check_workload([{"prompt": [3], "max_tokens": 0}])


def test_engines_refuse_what_cannot_travel(tiny):
    with pytest.raises(ValueError, match="does not take overlap"):
        disagg.DecodeEngine(tiny, overlap=True)
    pre = disagg.PrefillEngine(tiny, lambda *a: None)
    with pytest.raises(ValueError, match="does not take kv_bits"):
        pre.submit([1, 2, 3], 4, kv_bits=8)


def test_two_processes_on_loopback_match_one_engine(tiny, tmp_path):
    from mlxlab.studies.disagg.run import launch

    work = workload(tiny.vocab_size)
    files = launch(work, tmp_path, model="tiny", dtype="float32", chunk_size=CHUNK, rounds=1, timeout_s=180)
    local = disagg.run_local(Engine(tiny, chunk_size=CHUNK), work)
    got = files["rank1"]["rounds"][0]["requests"]
    sent = files["rank0"]["rounds"][0]["sent"]
    assert sorted(map(int, got)) == list(range(len(work)))
    for i, r in enumerate(work):
        out = got[str(i)]["output_tokens"]
        if r.get("until") is None:
            assert out == local[i].output_tokens, f"request {i}"
            assert_matches(out, reference(tiny, r["prompt"], r["max_tokens"]))
        else:  # cancelled on a clock: as far as both got, the same tokens
            n = min(len(out), len(local[i].output_tokens))
            ref = reference(tiny, r["prompt"], n)
            n = min(n, first_near_tie(ref[1]))
            assert n >= 1 and out[:n] == local[i].output_tokens[:n] == ref[0][:n], f"request {i}"
    assert got["5"]["finish_reason"] == "cancelled" and local[5].finish_reason == "cancelled"
    # KV of every prompt position travels, 4 layers x 2 heads x 64 dims x (keys, values) x float32; none for a
    # request its first token ended
    for i, r in enumerate(work):
        want = 0 if r["max_tokens"] == 1 else len(r["prompt"]) * 4 * 2 * 64 * 2 * 4
        assert sent[str(i)]["kv_bytes"] == want, f"request {i}"
    assert files["rank0"]["env"]["OPENBLAS_NUM_THREADS"] == "1" and files["rank1"]["blas"] == files["rank0"]["blas"]


def test_two_independent_engines_split_by_tenant_match_one_engine(tiny, tmp_path):
    """The split setting (the no-disaggregation baseline with two devices): the chat on one
    engine, the document on another, each in its own process; the document arrives once the chat
    has its warm tokens and the chat stops after the document, through signal files. Greedy tokens
    equal one engine's, and the merged file is on one clock."""
    from mlxlab.studies.disagg.run import contention_workload, launch, run_figures

    work = contention_workload(tiny.vocab_size, chat_context=64, doc_tokens=300, doc_max_tokens=4,
                               chat_max_tokens=400, seed=3)
    files = launch(work, tmp_path, model="tiny", dtype="float32", chunk_size=CHUNK, rounds=1, split=True,
                   timeout_s=180)
    local = disagg.run_local(Engine(tiny, chunk_size=CHUNK), work)
    got = files["split"]["rounds"][0]["requests"]
    assert sorted(got) == ["0", "1"]
    doc, chat = got["1"], got["0"]
    assert doc["output_tokens"] == local[1].output_tokens
    n = min(len(chat["output_tokens"]), len(local[0].output_tokens))
    assert n > 8 and chat["output_tokens"][:n] == local[0].output_tokens[:n]
    # the document came after the chat's warm tokens, on the merged clock, and the chat outlived it
    assert doc["arrival_s"] >= chat["token_times_s"][7] and chat["token_times_s"][-1] > doc["token_times_s"][0]
    assert chat["finish_reason"] == "cancelled"
    fig = run_figures(files)
    assert fig["devices"] == 2 and "transfers" not in fig and fig["doc_ttft_s"] > 0


def test_launcher_without_its_script_runs_mlx_launch_through_python(tiny, tmp_path, monkeypatch):
    # the H200's carried mlx bundle has mlx._distributed_utils but no mlx.launch script beside python
    from mlxlab.studies.disagg import run as D

    monkeypatch.setattr(D.sys, "executable", str(tmp_path / "bin" / "python3"))  # no mlx.launch there
    cmd = D.launcher_command()
    assert cmd[0] == str(tmp_path / "bin" / "python3") and "mlx._distributed_utils.launch" in cmd[-1]
    monkeypatch.undo()
    monkeypatch.setattr(D, "launcher_command", lambda: [sys.executable, "-c", cmd[-1]])
    work = [{"prompt": [5, 6, 7, 8], "max_tokens": 3}]
    files = D.launch(work, tmp_path / "run", model="tiny", dtype="float32", chunk_size=CHUNK, rounds=1, timeout_s=180)
    local = disagg.run_local(Engine(tiny, chunk_size=CHUNK), work)
    assert files["rank1"]["rounds"][0]["requests"]["0"]["output_tokens"] == local[0].output_tokens


def test_busy_share_counts_overlapping_steps_once():
    from mlxlab.studies.disagg.run import _busy

    steps = [{"start_s": 0.0, "end_s": 2.0}, {"start_s": 1.0, "end_s": 3.0}, {"start_s": 5.0, "end_s": 6.0}]
    assert _busy(steps, 0.0, 10.0) == 4.0  # [0, 3] and [5, 6]
    assert _busy(steps, 2.5, 5.5) == 1.0  # [2.5, 3] and [5, 5.5]


def test_contention_workload_is_valid_and_chat_first():
    from mlxlab.studies.disagg.run import contention_workload

    w = disagg.check_workload(contention_workload(1024, 20, 50))
    assert [r["tenant"] for r in w] == ["chat", "doc"] and w[1]["after"] == [0, 8] and w[0]["until"][0] == 1
    assert len(w[0]["prompt"]) == 20 and len(w[1]["prompt"]) == 50 and w[1]["max_tokens"] > 1


def test_simulated_disaggregation_moves_every_prompt_and_keeps_the_chat_off_the_document():
    from mlxlab.studies.disagg.run import contention_workload
    from mlxlab.studies.disagg.sim import figures, kv_bytes_per_token, simulate_disagg, simulate_single

    work = contention_workload(1024, 64, 600)
    line = {"latency_s": 0.001, "s_per_byte": 1e-9}
    single = figures(simulate_single("cpu-small", work, model="tiny", chunk_size=128))
    reqs, moves = simulate_disagg("cpu-small", work, model="tiny", transfer=line, chunk_size=128)
    split = figures(reqs)
    assert moves[1]["bytes"] == 600 * kv_bytes_per_token("tiny") == 600 * 4 * 2 * 64 * 2 * 4
    assert moves[1]["transfer_s"] == pytest.approx(0.001 + moves[1]["bytes"] * 1e-9)
    # read between the decode worker's steps: at its arrival or within the step it came in
    assert moves[1]["arrives_s"] <= reqs[1].token_times_s[0] <= moves[1]["arrives_s"] + max(reqs[0].itl_s)
    assert reqs[0].finish_reason == "cancelled" and len(reqs[1].output_tokens) == work[1]["max_tokens"]
    # the chat decodes on its own worker: no gap of the window holds a prefill chunk
    assert split["chat_itl_p99_ms"] < single["chat_itl_p99_ms"]
