"""Scheduling-study parts run in separate processes and pooled (mlxlab.studies.scheduling.merge).

The oracle: merging parts must give what the study's own aggregation gives on the same runs, so
a part merged alone reproduces its table exactly, and two parts give the medians and pooled
percentiles of all their runs together."""

import json
import math
import shutil
from pathlib import Path

import pytest

from mlxlab import load_model
from mlxlab.core.results import dumps, jsonable
from mlxlab.studies.scheduling import run as ex
from mlxlab.studies.scheduling.merge import merge_parts, plan_from_record, plan_record
from mlxlab.studies.scheduling.metrics import aggregate
from mlxlab.studies.scheduling.plan import plan_study

OPTS = dict(platform_scale=1 / 128, policies=("interleave",), chunk_sizes=(256,), workers=(1,), warmup=False)


def saved(doc: dict) -> dict:
    """``doc`` as a results file stores and reads it (NaN as null, keys as strings)."""
    return json.loads(dumps(jsonable(doc)))


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


@pytest.fixture(scope="module")
def parts(tiny):
    seen = []
    a = ex.scheduling_study(tiny, repeats=2, keep_runs=True, on_repeat=seen.append, **OPTS)
    b = ex.scheduling_study(tiny, repeats=1, keep_runs=True, **OPTS)
    return saved(a), saved(b), [saved(s) for s in seen]


def same(x, y):
    if isinstance(x, float) and isinstance(y, float):
        return x == pytest.approx(y, rel=1e-12) or (math.isnan(x) and math.isnan(y))
    return x == y


def test_keep_runs_keeps_every_run_and_reports_each_repeat(parts):
    a, _, seen = parts
    assert a["repeats_done"] == 2 and a["plan"]["repeats"] == 2
    assert all(len(v) == 2 for v in a["runs"].values())
    assert set(a["runs"]) == {r["config"] for r in a["table"]}
    # after repeat 1 of 2 the study reported a result of one repeat (the last one is the return value)
    assert len(seen) == 1 and seen[0]["config"]["repeats"] == 1 and seen[0]["repeats_done"] == 1
    assert all(len(v) == 1 for v in seen[0]["runs"].values())


def test_plan_record_round_trips(tiny):
    plan = plan_study(tiny, repeats=2, **{k: v for k, v in OPTS.items()})
    assert plan_from_record(saved(plan_record(plan))) == plan


def test_one_part_merged_alone_is_its_own_result(parts):
    a, _, _ = parts
    m = saved(merge_parts([a]))
    assert m["config"]["repeats"] == 2 and len(m["table"]) == len(a["table"])
    for mine, theirs in zip(m["table"], a["table"]):
        assert mine.keys() == theirs.keys()
        for k in mine:
            assert same(mine[k], theirs[k]), (mine["config"], k)
    assert m["claims"] == a["claims"] and m["references"]["alone_ttft_s"] == a["references"]["alone_ttft_s"]


def test_two_parts_pool_their_runs(parts):
    a, b, _ = parts
    m = merge_parts([a, b])
    assert m["config"]["repeats"] == 3 and [p["repeats"] for p in m["parts"]] == [2, 1]
    rows = {r["config"]: r for r in m["table"]}
    for key, runs in a["runs"].items():
        pooled = runs + b["runs"][key]
        want = aggregate(pooled)
        assert rows[key]["repeats"] == 3 and [r["part"] for r in m["runs"][key]] == [0, 0, 1]
        assert rows[key]["pooled_gaps"] == sum(len(r["contended_gaps_s"]) for r in pooled)
        assert same(rows[key]["chat_worst_gap_s"], want["chat_worst_gap_s"])
        assert same(rows[key]["pooled_itl_p99_s"], want["pooled_itl_p99_s"])
    # the calibration is the parts' median (two parts: their mean), each part's own kept
    cal = [p["calibration"]["solo_itl_s"] for p in (a, b)]
    assert m["references"]["calibration"]["solo_itl_s"] == pytest.approx(sum(cal) / 2)
    assert [p["calibration"]["solo_itl_s"] for p in m["parts"]] == cal


def test_parts_of_other_plans_or_without_runs_are_refused(parts):
    a, b, _ = parts
    other = json.loads(json.dumps(b))
    other["plan"]["seed"] = 7
    with pytest.raises(ValueError, match="another plan.*seed"):
        merge_parts([a, other])
    moved = json.loads(json.dumps(b))
    moved["environment"] = {"git_commit": "0000000"}
    a2 = {**a, "environment": {"git_commit": "1111111"}}
    with pytest.raises(ValueError, match="git_commit"):
        merge_parts([a2, moved])
    bare = {k: v for k, v in a.items() if k != "runs"}
    with pytest.raises(ValueError, match="--keep-runs"):
        merge_parts([bare])
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_parts([])


def test_cli_parts_and_merge(tmp_path, monkeypatch):
    from mlxlab.cli import build_parser

    root = Path(__file__).resolve().parent.parent / "data"
    (tmp_path / "models").mkdir()
    shutil.copy(root / "models" / "tiny.json", tmp_path / "models" / "tiny.json")
    shutil.copytree(root / "claims", tmp_path / "claims")
    monkeypatch.setenv("MLXLAB_DATA", str(tmp_path))
    base = ["bench", "scheduling", "--model", "tiny", "--dtype", "float32", "--scale", str(1 / 128),
            "--workers", "1", "--chunk-sizes", "256", "--policies", "interleave", "mlx_lm", "--platform", "test",
            "--quiet", "--keep-runs"]
    paths = []
    for i, reps in enumerate((2, 1)):
        args = build_parser().parse_args(base + ["--repeats", str(reps), "--name", f"scheduling_part{i + 1}"])
        assert args.func(args) == 0
        paths += sorted((tmp_path / "results" / "test" / "runs").glob(f"*/scheduling_part{i + 1}.json"))
    assert len(paths) == 2
    args = build_parser().parse_args(["bench", "scheduling", "--merge", *map(str, paths), "--name", "scheduling"])
    assert args.func(args) == 0
    (merged,) = (tmp_path / "results" / "test" / "runs").glob("*/scheduling.json")
    doc = json.loads(merged.read_text())
    part = json.loads(paths[0].read_text())
    assert doc["config"]["repeats"] == 3 and all(r["repeats"] == 3 for r in doc["table"])
    # the merged file carries the parts' machine, and says what merged it
    assert doc["environment"]["device_name"] == part["environment"]["device_name"]
    assert doc["environment"]["merged_from"] == list(map(str, paths)) and "merged_by" in doc["environment"]
    assert [v["claim"] for v in doc["verdicts"]] == ["mlx-interleave-matches"]
    assert doc["parameters"]["repeats"] == 3
