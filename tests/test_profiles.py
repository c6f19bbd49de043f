"""Profiles: measured on the real engine (:func:`mlxlab.sim.measure.profile_device` on ``tiny``),
published (the seed-001 case study's, :mod:`mlxlab.sim.published`), and their files
(:mod:`mlxlab.sim.profiles`). What a measured profile is checked for is its shape, never its
speed: the cells it promised, the fields the fit needs, a fit with non-negative coefficients."""

import argparse
import json

import numpy as np
import pytest

from mlxlab import load_model
from mlxlab.cli.sim import register
from mlxlab.core.costmodel import FEATURES, record_features
from mlxlab.sim import Simulator
from mlxlab.sim.fit import TIMING_KINDS, fit_report
from mlxlab.sim.measure import profile_device
from mlxlab.sim.profiles import cost_model_from_dict, load_profile, save_profile
from mlxlab.sim.published import SEED001_NAME, seed001_cost_model, seed001_profile

GRID = dict(prefill_tokens=(16, 64), contexts=(0, 128), decode_batches=(1, 2), decode_contexts=(16, 128), repeats=2,
            fill_chunk=64)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


@pytest.fixture(scope="module")
def measured(tiny):
    return profile_device(tiny, **GRID)


def test_a_measured_profile_has_every_kind_of_step(measured):
    prof = measured
    kinds = {r["kind"] for r in prof["records"]}
    assert kinds == {"fill", "prefill", "decode", "mixed", "packed", "rebatch", "tail", "overhead", "start",
                     "join_chunk", "fresh"}
    assert all(r["duration_s"] > 0 for r in prof["records"])
    # a packed cell ran as one forward, its back-to-back twin as two; both carry the same sizes
    assert {r["fused"] for r in prof["records"] if r["kind"] == "packed"} == {True}
    assert {r["fused"] for r in prof["records"] if r["kind"] == "mixed"} == {False}
    twins = [r for r in prof["records"] if "after join" not in r.get("cell", "")]  # the join group packs alone
    assert sorted(r["prefill_tokens"] for r in twins if r["kind"] == "packed") == \
        sorted(r["prefill_tokens"] for r in twins if r["kind"] == "mixed")
    rebatch = [r for r in prof["records"] if r["kind"] == "rebatch"]
    assert {bool(r.get("join_tokens")) for r in rebatch} == {True, False}  # the join of 2 rows, the drop to 1
    # the join group: a 16-token row decodes beside a 128-token one that joined it, reading the
    # long row's width (2 x 129 and up) with its left padding; the join and the drop each timed
    # in a decode-only step and in a packed one, once per repeat (single steps: each cell a median)
    beside = [r for r in prof["records"] if r.get("cell") == "decode b2 decode c16+128"]
    assert beside and all(r["decode_kv_tokens"] >= 2 * 129 > r["decode_context_tokens"] for r in beside)
    cells = {r.get("cell") for r in prof["records"]}
    for case, kind in (("decode", "rebatch"), ("packed", "join_chunk")):
        joins = [r for r in prof["records"] if r.get("cell") == f"join {case} c16+128"]
        drops = [r for r in prof["records"] if r.get("cell") == f"drop {case} c16+128"]
        assert [(r["kind"], r["joined"], r["decode_batch"], r["join_tokens"]) for r in joins] == [(kind, 1, 2, 256)] * 2
        assert [(r["kind"], r["dropped"], r["decode_batch"]) for r in drops] == [(kind, 1, 1)] * 2
        assert f"start {case} c16+128" in cells
        assert {c["n"] for c in prof["cells"] if c["cell"] in (f"join {case} c16+128", f"start {case} c16+128")} == {2}
    assert prof["grid"]["join_contexts"] == [128]
    assert prof["skipped"] == []


def test_a_profile_times_changes_of_a_ragged_batch_and_first_uses_of_a_chunk_size(measured):
    recs = measured["records"]
    # rows of 16, 53, 90 and 128 tokens join one batch one by one and leave it again: every change
    # timed alone, once per repeat, each ragged one reading its padding
    ragged = {}
    for r in recs:
        if r.get("cell", "").startswith("ragged "):
            ragged.setdefault(r["cell"], []).append(r)
    assert sorted(ragged) == ["ragged drop b1", "ragged drop b2", "ragged drop b3", "ragged join b2",
                              "ragged join b3", "ragged join b4"]
    assert all(len(v) == GRID["repeats"] and v[0]["kind"] == "rebatch" for v in ragged.values())
    for b in (2, 3, 4):
        j = ragged[f"ragged join b{b}"][0]
        assert j["joined"] == 1 and j["decode_batch"] == b and j["decode_kv_tokens"] == j["join_tokens"]
        assert j["decode_kv_tokens"] > j["decode_context_tokens"]  # left padding: a ragged batch
        assert record_features(j)[FEATURES.index("ragged_change_rows")] == b
    d3 = ragged["ragged drop b3"][0]
    # filter copies the three kept rows at the old width: the 128-token row's, which left
    assert d3["dropped"] == 1 and d3["drop_tokens"] % 3 == 0 and d3["drop_tokens"] // 3 > 128
    assert d3["decode_kv_tokens"] > d3["decode_context_tokens"]
    assert record_features(ragged["ragged drop b1"][0])[FEATURES.index("ragged_change_rows")] == 0  # one row: even
    # every chunk size counts as cold once, at its first use in the profile (the warm-up's included);
    # the fresh sizes (3/4 of the grid's, on the alignment: 8 and 48) run twice, cold then warm
    fresh = [(r["prefill_tokens"], r["cold_chunks"]) for r in recs if r["kind"] == "fresh"]
    assert fresh == [(8, 1), (8, 0), (48, 1), (48, 0)]
    assert all(r["cold_chunks"] == 0 for r in recs if r["kind"] in ("prefill", "mixed", "packed"))
    seen, cold = set(), []
    for r in recs:  # a size is cold at most once, and only where no recorded step had run it before
        sizes = [c[0] + (c[2] if len(c) > 2 else 0) for c in r.get("prefill_chunks") or []]
        if r.get("cold_chunks"):
            assert not set(sizes) <= seen
            cold += sizes
        seen |= set(sizes)
    assert len(cold) == len(set(cold)) and {8, 48} <= set(cold)


def test_every_kind_of_step_is_measured_in_every_pass_over_the_grid(measured):
    """A profile makes ``repeats`` passes, each running every group once, so no kind of step is
    measured in one block of time; ``drift`` reads each pass against the profile's medians."""
    kinds_by_pass = {}
    for r in measured["records"]:
        kinds_by_pass.setdefault(r["pass"], set()).add(r["kind"])
    assert sorted(kinds_by_pass) == list(range(GRID["repeats"]))
    for p in range(GRID["repeats"]):
        assert {"prefill", "decode", "mixed", "rebatch", "start"} <= kinds_by_pass[p]
    d = measured["drift"]
    assert d["passes"] == GRID["repeats"] and set(d["by_kind"]) >= {"decode", "prefill"}
    assert all(len(v) == GRID["repeats"] and all(x > 0 for x in v) for v in d["by_kind"].values())


def test_pass_drift_reads_a_slow_pass_against_the_profile():
    from mlxlab.sim.fit import pass_drift
    recs = [{"kind": k, "cell": f"{k} {i}", "duration_s": t * (1.5 if p == 1 else 1.0), "pass": p}
            for p in (0, 1, 2) for k in ("decode", "prefill") for i, t in enumerate((0.01, 0.02, 0.04))]
    d = pass_drift(recs)
    assert d["passes"] == 3
    assert d["by_kind"]["decode"] == pytest.approx([1.0, 1.5, 1.0])
    assert d["spread"] == pytest.approx(0.5)
    assert pass_drift([{k: v for k, v in r.items() if k != "pass"} for r in recs])["passes"] == 0


def test_a_measured_profile_has_the_cells_it_promised(measured):
    """Every (chunk, context) and (batch, decode context) of the grid is a cell, each cell's
    record is a median over its steps, and every step-cost record has the fields the fit reads."""
    cells = {c["cell"]: c for c in measured["cells"]}
    want = []
    for c in GRID["contexts"]:  # after the context, one chunk of each size, back to back
        at = c
        for n in GRID["prefill_tokens"]:
            want.append((n, at))
            at += n
    got = [(c["prefill_tokens"], c["prefill_context_tokens"]) for c in measured["cells"] if c["kind"] == "prefill"]
    assert sorted(got) == sorted(want)
    for b in GRID["decode_batches"]:
        for c in GRID["decode_contexts"]:
            cell = cells[f"decode b{b} c{c}"]
            assert cell["decode_batch"] == b and cell["n"] >= 2
            assert cell["duration_s"] == pytest.approx(float(np.median(
                [r["duration_s"] for r in measured["records"] if r.get("cell") == f"decode b{b} c{c}"])))
    assert sum(c["n"] for c in measured["cells"]) == len(measured["records"])
    for r in measured["records"]:
        if r["kind"] in TIMING_KINDS:
            continue
        assert {"cell", "duration_s", "engine_duration_s", "decode_batch", "decode_context_tokens",
                "prefill_tokens", "prefill_context_tokens"} <= set(r), r["kind"]
        assert record_features(r).shape == measured["cost_model"].coef.shape


def test_a_measured_profile_is_fitted_to_its_cells(tmp_path, measured):
    prof = measured
    cm = prof["cost_model"]
    assert cm.fitted and (cm.coef >= 0).all()
    # the two timing parameters are the medians of their cells: a forward's tail after Python
    # returns, the host time between steps
    tails = [c["duration_s"] for c in prof["cells"] if c["kind"] == "tail"]
    overhead = [r["duration_s"] for r in prof["records"] if r["kind"] == "overhead"]
    assert tails and overhead
    assert cm.tail_s == pytest.approx(float(np.median(tails))) and cm.tail_s > 0
    assert cm.overhead_s == pytest.approx(float(np.median(overhead))) and cm.overhead_s > 0
    assert prof["coefficients"]["tail_s"] == cm.tail_s
    # the fit report is the model's error on the cells (and on every record), per kind
    assert prof["fit"] == fit_report(cm, prof["cells"]) and prof["fit_raw"] == fit_report(cm, prof["records"])
    assert {"all", "prefill", "decode", "rebatch"} <= set(prof["fit"])
    assert all(e["median"] <= e["p90"] <= e["max"] for e in prof["fit"].values())
    path = save_profile(prof, path=tmp_path / "cpu-tiny.json")
    doc = json.loads(path.read_text())
    assert {"platform", "git_commit", "written_at"} <= set(doc["environment"])
    back = load_profile(path)
    assert np.allclose(back.coef, cm.coef) and (back.tail_s, back.overhead_s) == (cm.tail_s, cm.overhead_s)
    assert Simulator(str(path)).cost_model.coef.tolist() == cm.coef.tolist()


def test_a_bad_grid_is_refused_before_anything_runs(tiny):
    for bad in (dict(repeats=0), dict(prefill_tokens=()), dict(decode_batches=(0,)), dict(contexts=(-1,))):
        with pytest.raises(ValueError):
            profile_device(tiny, **{**GRID, **bad})


def test_load_profile_names_the_saved_profiles_when_one_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    save_profile(seed001_profile(), path=tmp_path / "profiles" / "x-y.json")
    with pytest.raises(ValueError, match="saved profiles: x-y"):
        load_profile("nope")
    assert np.allclose(load_profile("x-y").coef, seed001_profile()["cost_model"].coef)
    assert "environment" not in json.loads((tmp_path / "profiles" / "x-y.json").read_text())  # derived, not measured


def test_seed001_profile_reproduces_the_floor_and_decode_rate():
    prof = seed001_profile()
    for name, fig in prof["figures"].items():
        assert fig["provenance"] and fig["kind"] in ("published", "assumed"), name
    cm = prof["cost_model"]
    assert np.allclose(cost_model_from_dict({"cost_model": cm.as_dict()}).coef, cm.coef)
    assert np.allclose(seed001_cost_model().coef, cm.coef)  # the saved file matches the derivation
    # the 60k prompt alone in one chunk: ~44 s (within 5%)
    floor = Simulator(cm, chunk_size=60_000, max_context=262_144)
    big = floor.submit([1] * 60_000, 1)
    floor.run()
    assert big.ttft_s == pytest.approx(44.0, rel=0.05)
    # one chat stream at ~23k context: ~65 tok/s (within 10%)
    chat = Simulator(cm, chunk_size=2048, max_context=262_144)
    r = chat.submit([1] * 23_000, 64)
    chat.run()
    assert 1.0 / float(np.median(r.itl_s)) == pytest.approx(65.0, rel=0.10)
    # 2,048-token chunks at document scale take 1-2 s
    for ctx in (10_000, 25_000):
        assert 1.0 <= cm.predict(0, 0, [(2048, ctx)]) <= 2.0


def test_cli_profile_writes_the_seed001_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["profile", "--seed001", "--save"])
    assert args.func(args) == 0
    doc = json.loads((tmp_path / "profiles" / f"{SEED001_NAME}.json").read_text())
    assert doc["cost_model"]["coef"] == pytest.approx(seed001_profile()["cost_model"].coef.tolist())
    assert all("provenance" in f for f in doc["figures"].values())
    assert np.allclose(load_profile("seed001-m4max-35b").coef, seed001_profile()["cost_model"].coef)


def test_the_warm_up_meets_every_decode_batch_size_before_the_first_pass(tiny, monkeypatch):
    # on mlx's CUDA backend a decode batch size's first step compiles kernels (30 s on an H200) and its
    # first mixed steps run cold though their chunk shapes are warm: the warm-up must take that, not pass 0
    import mlxlab.sim.measure as measure

    seen = []
    real = measure.decode_group

    def spy(bench, c, batches):
        seen.append((bench.recording, c, tuple(sorted(int(b) for b in batches))))
        return real(bench, c, batches)

    monkeypatch.setattr(measure, "decode_group", spy)
    grid = dict(GRID, decode_batches=(1, 3), decode_contexts=(16,), contexts=(0,), repeats=1)
    profile_device(tiny, **grid, measure_overhead=False)
    warm = [s for s in seen if not s[0]]
    assert warm == [(False, 16, (1, 3))]
    assert [s for s in seen if s[0]] == [(True, 16, (1, 3))]
