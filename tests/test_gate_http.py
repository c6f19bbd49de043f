"""Notebook 05's workload over HTTP (mlxlab.studies.admission_gate.http): the seed-001 mix on the engine
in-process and through a background server on the same model object, the same tables side by
side, the same tokens."""

import pytest

from mlxlab.studies.admission_gate.http import compare_over_http, http_workload, run_over_http, side_by_side

pytest.importorskip("openai")


def test_the_workload_runs_in_process_and_over_http_with_the_same_tokens_and_tables(tiny):
    res = run_over_http(tiny, "local", quick=True, model_name="tiny", max_wall_s=120)
    assert res["complete"] and res["same_tokens"] and not res["errors"] and res["model"] == "tiny"
    assert res["url"].startswith("http://127.0.0.1:") and res["policy"] == "admission_gate"
    n = {row["path"]: row["requests"] for row in res["table"] if row["tenant"] == "batch"}
    assert n == {"in-process": 4, "http": 4}  # two workers, four prompts between them
    paths = {}
    for row in res["table"]:
        paths.setdefault(row["path"], []).append(row["tenant"])
    assert paths["in-process"] == paths["http"] and {"chat", "batch"} <= set(paths["http"])
    wide = side_by_side(res)
    assert list(wide.columns.get_level_values(1)[:2]) == ["in-process", "http"]
    assert (wide[("requests", "in-process")] == wide[("requests", "http")]).all()
    assert (wide[("ttft_p50_s", "http")] > 0).all()


def test_a_bad_server_url_is_refused(tiny):
    with pytest.raises(ValueError, match="server_url"):
        compare_over_http(tiny, http_workload(tiny, quick=True), "")
