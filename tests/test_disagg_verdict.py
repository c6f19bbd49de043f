"""The disaggregation study's verdicts (mlxlab.studies.disagg.verdict), its seed-scale scene
(mlxlab.studies.disagg.seed), its figure (mlxlab.studies.disagg.charts) and `bench disagg`'s
verdicts and --rescore, on saved-file documents built here (no process is launched)."""

import copy
import json
import shutil
from pathlib import Path

import pytest

from mlxlab.core.claims import check_verdicts
from mlxlab.studies.disagg import verdict as DV

DATA = Path(__file__).resolve().parent.parent / "data"


def run(p50, p99, ttft, chat, doc, transfers=None):
    r = {"chat_itl_p50_ms": p50, "chat_itl_p99_ms": p99, "doc_ttft_s": ttft, "chat_itl_before_doc_p50_ms": 10.0,
         "output_tokens": {"chat": list(chat), "doc": list(doc)}}
    if transfers is not None:
        r["transfers"], r["doc_transfer_s"] = transfers, transfers["1"]["transfer_s"]
    return r


def tx(chat_s, doc_s):
    """The KV sends of one run as run_figures keeps them (message bytes: the KV and a header)."""
    return {"0": {"kv_bytes": 64 * 4096, "bytes": 64 * 4096 + 400, "transfer_s": chat_s},
            "1": {"kv_bytes": 600 * 4096, "bytes": 600 * 4096 + 2000, "transfer_s": doc_s}}


def document(single_p99=(400.0, 420.0, 380.0), disagg_p99=(40.0, 44.0, 38.0)):
    """A disagg.json as run_study saves it, for tiny: three repeats a side, tokens and KV sends."""
    chat, doc = list(range(1, 30)), [5, 6, 7, 8]
    runs = {"single": [run(200.0, p, 1.0, chat[:12], doc) for p in single_p99],
            "disagg": [run(9.0, p, 1.2, chat, doc, tx(0.002 + 0.0001 * i, 0.01 + 0.001 * i))
                       for i, p in enumerate(disagg_p99)]}
    summary = {"disagg": {"doc_kv_bytes": {"median": 600 * 4096}}, "single": {}}
    return {"environment": {"platform": "scratch"},
            "config": {"model": "tiny", "chat_context": 64, "doc_tokens": 600, "doc_max_tokens": 4, "seed": 0,
                       "chunk_size": 128, "policy": "interleave", "repeats": 3, "rounds": 2, "cpu_count": 2,
                       "openblas_threads_per_process": 1},
            "load": [{"repeat": 0, "setting": "single", "loadavg": [0.5, 0.5, 0.5]}],
            "runs": runs, "summary": summary}


# ------------------------------------------------------------------------------------------ exactness
def test_exactness_compares_documents_whole_and_chats_over_their_common_length():
    doc = document()
    v = DV.exact_verdict(doc)
    assert v["verdict"] == "reproduced" and v["measured"]["runs_compared"] == 5  # 2 other singles + 3 split
    assert v["measured"]["chat_tokens_compared_min"] == 12
    bad = copy.deepcopy(doc)
    bad["runs"]["disagg"][1]["output_tokens"]["chat"][7] = 999
    v = DV.exact_verdict(bad)
    assert v["verdict"] == "not reproduced" and v["measured"]["first_difference"] == \
        {"run": "disagg:1", "chat_index": 7, "doc_equal": True}
    bad["runs"]["disagg"][2]["output_tokens"]["doc"] = [5, 6, 7, 9]
    assert DV.exact_verdict(bad)["measured"]["runs_equal"] == 3


def test_runs_without_tokens_leave_exactness_not_measured():
    doc = document()
    for rs in doc["runs"].values():
        for r in rs:
            del r["output_tokens"]
    v = DV.exact_verdict(doc)
    assert v["verdict"] == "not measured" and "store no tokens" in v["rule"]


# ------------------------------------------------------------------------------------------ chat ITL
def test_chat_itl_needs_half_and_every_repeat_below_one_engines():
    v = DV.chat_itl_verdict(document())
    assert v["verdict"] == "reproduced" and v["measured"]["separated"] is True
    assert v["measured"]["itl_p99_ratio_x"] == pytest.approx(0.1, abs=0.01)
    assert v["measured"]["disagg_doc_ttft_s"]["median"] == 1.2 and v["measured"]["doc_ttft_ratio_x"] == 1.2
    # a median ratio under 0.5 with one repeat as slow as one engine's is within the noise: not reproduced
    noisy = DV.chat_itl_verdict(document(disagg_p99=(40.0, 390.0, 38.0)))
    assert noisy["verdict"] == "not reproduced" and noisy["measured"]["separated"] is False
    assert noisy["measured"]["itl_p99_ratio_x"] < DV.ITL_GAIN_X
    assert DV.chat_itl_verdict(document(disagg_p99=(300.0, 310.0, 290.0)))["verdict"] == "not reproduced"
    one_sided = document()
    del one_sided["runs"]["disagg"]
    assert DV.chat_itl_verdict(one_sided)["verdict"] == "not measured"


# ------------------------------------------------------------------------------------------ simulator
def simulated(factor):
    """validate()'s shape: every disaggregated figure simulated at ``factor`` x the measured median."""
    med = {"chat_itl_p50_ms": 9.0, "chat_itl_p99_ms": 40.0, "doc_ttft_s": 1.2, "doc_transfer_s": 0.011}
    return {"profile_name": "given", "transfer_fit": {"latency_s": 0.001, "s_per_byte": 1e-9},
            "settings": {"disagg": {**{k: {"simulated": factor * v} for k, v in med.items()},
                                    "doc_kv_bytes": {"simulated": 600 * 4096}},
                         "single": {"chat_itl_p50_ms": {"simulated": 200.0}, "chat_itl_p99_ms": {"simulated": 400.0},
                                    "doc_ttft_s": {"simulated": 2.0}}}}


def test_topology_is_scored_per_metric_with_the_validation_rule():
    v = DV.sim_verdict(document(), simulated=simulated(1.05))
    assert v["verdict"] == "reproduced" and v["measured"]["passed"] == 4 and v["measured"]["kv_bytes_equal"]
    assert v["measured"]["single_errors"]["doc_ttft_s"] == 1.0  # 2.0 s simulated against 1.0 measured
    v = DV.sim_verdict(document(), simulated=simulated(0.5))
    assert v["verdict"] == "not reproduced" and v["measured"]["worst_error"] == pytest.approx(0.5, abs=0.01)
    # the tolerance widens with the repeats' own spread: a noisy metric is not held to 10%
    noisy = DV.sim_verdict(document(disagg_p99=(20.0, 40.0, 60.0)), simulated=simulated(1.3))
    assert noisy["measured"]["disagg"]["chat_itl_p99_ms"]["passed"] is True
    assert noisy["measured"]["disagg"]["chat_itl_p50_ms"]["passed"] is False


def test_topology_without_a_profile_is_not_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    shutil.copytree(DATA / "claims", tmp_path / "claims")
    v = DV.sim_verdict(document())
    assert v["verdict"] == "not measured" and v["measured"] == {"profile": "scratch-tiny"}


# ------------------------------------------------------------------------------------------ seed scale
@pytest.fixture(scope="module")
def seed():
    from mlxlab.studies.disagg.seed import seed_disagg_study

    return seed_disagg_study({"latency_s": 0.02, "s_per_byte": 3e-9})


def test_seed_scene_separates_what_each_fix_buys(seed):
    st, solo = seed["settings"], seed["solo_itl_ms"]
    # no fix: every step prefills a chunk of each waiting prompt, the chat waits seconds between tokens
    assert st["one machine"]["chat_itl_p50_ms"] > 100 * solo
    # the gate: the chat streams between chunks, its worst gap one chunk; a prefix cache fixes only the warm turn
    gate, cached = st["one machine, gate"], st["one machine, gate + prefix cache"]
    assert gate["chat_itl_p50_ms"] < 1.1 * solo < 10 * solo < gate["chat_worst_gap_ms"]
    assert cached["warm_turn_ttft_s"] < gate["warm_turn_ttft_s"] / 10
    # two machines: the chat decodes alone; the warm turn still waits for prefill without the cache,
    # and with it pays one hand-over: its 23k+ positions of 20 KB over the line
    two, two_cached = st["two machines"], st["two machines + prefix cache"]
    assert two["chat_itl_p99_ms"] < 2 * solo and two_cached["chat_itl_p99_ms"] < 2 * solo
    assert two_cached["warm_turn_ttft_s"] < two["warm_turn_ttft_s"] / 5
    assert two_cached["warm_turn_kv_bytes"] == (23_000 + 8 + 64) * seed["kv_bytes_per_token"]
    assert two_cached["warm_turn_transfer_s"] == pytest.approx(0.02 + two_cached["warm_turn_kv_bytes"] * 3e-9)


def test_seed_verdict_reads_the_two_machines_against_the_fixes(seed):
    v = DV.seed_verdict(document(), seed=seed)
    assert v["verdict"] == "reproduced" and set(v["measured"]["warm_turn_ttft_s"]) == set(seed["settings"])
    worse = copy.deepcopy(seed)
    worse["settings"][DV.TWO]["batch_last_first_token_s"] = 1e9  # the batch pays for the chat: not reproduced
    assert DV.seed_verdict(document(), seed=worse)["verdict"] == "not reproduced"
    no_sends = document()
    for r in no_sends["runs"]["disagg"]:
        del r["transfers"]
    assert DV.seed_verdict(no_sends)["verdict"] == "not measured"


def test_prefix_cache_restores_the_longest_cached_prefix_short_of_the_last_token():
    from mlxlab.studies.disagg.seed import CachedSim

    sim = CachedSim("cpu-small", cached_prefixes=[[1, 2, 3], [1, 2, 3, 4, 5, 6]], vocab_size=100)
    assert sim.submit([1, 2, 3, 4, 9], 2).cached_tokens == 4
    assert sim.submit([1, 2, 3, 4, 5, 6], 2).cached_tokens == 5  # the last token is the first decode input
    assert sim.submit([7, 1, 2], 2).cached_tokens == 0


# ------------------------------------------------------------------------------------------ figure and CLI
def test_figure_has_a_measured_row_and_the_seed_row_when_its_verdict_is_stored(seed):
    from mlxlab.studies.disagg import charts as DC

    doc = document()
    assert len(DC.measured_frame(doc)) == 18 and set(DC.transfer_frame(doc).prompt) == {"chat", "document"}
    assert len(DC.disagg_chart(doc).to_dict()["vconcat"]) == 1
    doc["verdicts"] = [DV.seed_verdict(doc, seed=seed)]
    assert len(DC.disagg_chart(doc, "cpu").to_dict()["vconcat"]) == 2
    assert list(DC.seed_frame(doc["verdicts"][0]["measured"]).setting) == list(seed["settings"])


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """data/ in tmp_path (the tiny preset, the claims, the cpu-small profile as scratch-tiny)."""
    from mlxlab.studies.sim_validation import charts as sim_charts

    (tmp_path / "models").mkdir()
    shutil.copy(DATA / "models" / "tiny.json", tmp_path / "models")
    shutil.copytree(DATA / "claims", tmp_path / "claims")
    (tmp_path / "profiles").mkdir()
    shutil.copy(DATA / "profiles" / "cpu-small.json", tmp_path / "profiles" / "scratch-tiny.json")
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    monkeypatch.setattr(sim_charts, "FIGURES", tmp_path / "figures")
    return tmp_path


def test_rescore_decides_a_saved_file_again_in_place(scratch, capsys):
    from mlxlab.cli import main as cli_main

    doc = document()
    path = scratch / "results" / "scratch" / "disagg.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    assert cli_main(["bench", "disagg", "--rescore", str(path)]) == 0
    out = json.loads(path.read_text())
    assert out["runs"] == doc["runs"] and out["environment"] == doc["environment"]
    assert [v["claim"] for v in check_verdicts(out["verdicts"], experiment="disagg")] == \
        ["mlx-disagg-exact", "mlx-disagg-chat-itl", "mlx-disagg-sim", "s001-own-compute"]
    assert out["verdicts"][2]["measured"]["profile"] == "scratch-tiny"  # the platform's profile for the model
    assert "mlxlab.studies.disagg.verdict" in out["rescored_by"]["what"]
    # without --save the figure goes to a new run folder, not paper/figures/
    (run,) = (scratch / "results" / "scratch" / "runs").iterdir()
    assert (run / "disagg.png").stat().st_size > 0 and not (scratch / "figures").exists()
    assert "[reproduced] mlx-disagg-chat-itl" in capsys.readouterr().out


def test_bench_disagg_stores_its_verdicts_with_the_measurement(scratch, monkeypatch):
    from mlxlab.cli import main as cli_main
    from mlxlab.studies.disagg import run as disagg

    doc = document()
    monkeypatch.setattr(disagg, "run_study", lambda **kw: {k: doc[k] for k in ("runs", "config", "summary", "load")})
    monkeypatch.setattr(disagg, "format_table", lambda res: "the table")
    assert cli_main(["bench", "disagg", "--model", "tiny", "--platform", "scratch", "--save"]) == 0
    out = json.loads((scratch / "results" / "scratch" / "disagg.json").read_text())
    assert out["parameters"]["model"] == "tiny" and len(out["verdicts"]) == 4
    assert (scratch / "figures" / "scratch" / "disagg.png").stat().st_size > 0


def test_a_prefill_that_ends_after_the_decode_side_went_idle_is_still_handed_off():
    """The last prompt's prefill ends when the decode simulator has nothing left (the chat that
    triggered it is done): it still travels."""
    from mlxlab.studies.disagg.sim import simulate_disagg

    work = [{"prompt": list(range(1, 6)), "max_tokens": 2},
            {"prompt": list(range(1, 400)), "max_tokens": 3, "after": [0, 1]}]
    reqs, moves = simulate_disagg("cpu-small", work, model="tiny", transfer={"latency_s": 0.001, "s_per_byte": 0.0},
                                  chunk_size=64)
    assert sorted(reqs) == sorted(moves) == [0, 1]
    assert len(reqs[1].output_tokens) == 3 and reqs[1].token_times_s[0] >= moves[1]["arrives_s"]


def test_both_sides_hold_the_same_threads_and_the_note_says_how_many():
    from mlxlab.studies.disagg.run import threads_by_setting

    assert threads_by_setting(1) == {"single": 2, "disagg": 1, "disagg-busywait": 1, "split": 1}
    equal = {"openblas_threads_by_setting": {"single": 2, "disagg": 1}, "cpu_count": 2}
    assert DV.equal_threads(equal) is True and "2 for the one engine, 1 for each of the two workers" in DV._threads(equal)
    old = {"openblas_threads_per_process": 1, "cpu_count": 2}  # a file from before: every process had one
    assert DV.equal_threads(old) is False and "unequal threads" in DV._threads(old)
    assert DV.equal_threads({}) is None
