"""The claims files and the verdict records that every results file stores."""

import json

import pytest

from mlxlab.core import claims as C
from mlxlab.core.results import environment_block, save_results


def test_every_claim_is_complete_and_names_its_experiment():
    cs = C.load_claims()
    assert {c.study for c in cs.values()} == {"seed-000", "seed-001", "mlxlab"}
    # the issue asks for every distinct claim of the two case studies: about thirty
    assert sum(c.study.startswith("seed") for c in cs.values()) >= 30
    for c in cs.values():
        assert c.claim.strip() and c.published_text().strip() and c.experiments
        assert c.testable or c.why_not


def test_every_committed_claim_says_what_carries_over_to_a_mac():
    from mlxlab.paper.render import typed_figures

    for c in C.load_claims().values():
        assert isinstance(c.on_a_mac, str) and c.on_a_mac.strip(), c.id
        # a judgement, not a measurement: no figure typed into it (the results files hold those)
        assert typed_figures(c.on_a_mac) == [], (c.id, typed_figures(c.on_a_mac))


_CLAIM = """study: test
claims:
  - id: t-one
    claim: One claim.
    published: {value: 1, unit: x}
    condition: {}
    experiment: roofline
    on_a_mac: Carries over.
  - id: t-two
    claim: Another claim.
    published: {value: 2, unit: x}
    condition: {}
    experiment: roofline
"""


@pytest.mark.parametrize("tail, message", [
    ("", r"test\.yaml: claim t-two lacks \['on_a_mac'\] \(on_a_mac: a sentence or two on what"),
    ("    on_a_mac: '  '\n", r"test\.yaml: claim t-two has an empty on_a_mac"),
    ("    on_a_mac:\n", r"test\.yaml: claim t-two has an empty on_a_mac"),
])
def test_a_claim_without_its_mac_line_fails_loading_naming_claim_and_file(tmp_path, tail, message):
    (tmp_path / "test.yaml").write_text(_CLAIM + tail)
    with pytest.raises(ValueError, match=message):
        C.load_claims(tmp_path)
    (tmp_path / "test.yaml").write_text(_CLAIM + "    on_a_mac: Does not carry over.\n")
    assert C.load_claims(tmp_path)["t-two"].on_a_mac == "Does not carry over."


def test_verdict_rejects_unknown_claims_and_verdicts_and_empty_rules():
    with pytest.raises(KeyError, match="did you mean s000-step-prefill-480"):
        C.verdict("s000-step-prefil-480", "reproduced", measured=1, rule="r", fairness="f")
    with pytest.raises(ValueError, match="not one of"):
        C.verdict("s000-step-prefill-480", "sort of", measured=1, rule="r", fairness="f")
    with pytest.raises(ValueError, match="rule must say something"):
        C.verdict("s000-step-prefill-480", "artifact", measured=1, rule=" ", fairness="f")
    v = C.verdict("s000-step-prefill-480", "artifact", measured={"gain_pct": 2.0}, rule="r", fairness="f")
    assert v["published"] == "33 to 71 % prefill tok/s" and v["study"] == "seed-000"


def test_untestable_claims_get_not_measured_with_the_files_reason():
    v = C.not_testable("s001-ssd-weights")
    assert v["verdict"] == "not measured" and "SSD" in v["rule"]
    with pytest.raises(ValueError, match="is testable"):
        C.not_testable("s000-step-prefill-480")


def test_save_results_stores_checked_verdicts_parameters_and_provenance(tmp_path):
    v = C.verdict("s000-step-decode", "reproduced", measured={"change_pct": 0.4}, rule="r", fairness="f")
    p = save_results("prefill_step_size", {"x": 1}, folder=tmp_path, verdicts=[v], parameters={"repeats": 5})
    doc = json.loads(p.read_text())
    assert doc["verdicts"][0]["claim"] == "s000-step-decode" and doc["parameters"] == {"repeats": 5}
    env = doc["environment"]
    for key in ("git_commit", "git_dirty", "mlx_env", "blas", "mlx", "mlx_lm", "device", "platform", "written_at"):
        assert key in env
    # a verdict filed under an experiment that does not test its claim is refused, and nothing is written
    with pytest.raises(ValueError, match="not by 'kv_quantization'"):
        save_results("kv_quantization", {}, folder=tmp_path, verdicts=[v])
    assert not (tmp_path / "kv_quantization.json").exists()
    with pytest.raises(ValueError, match="decided twice"):
        save_results("prefill_step_size", {}, folder=tmp_path, verdicts=[v, v])


def test_environment_records_mlx_variables(monkeypatch):
    monkeypatch.setenv("MLX_USE_CUDA_GRAPHS", "0")
    assert environment_block()["mlx_env"]["MLX_USE_CUDA_GRAPHS"] == "0"


def test_the_stored_command_line_holds_no_machine_path():
    from mlxlab.core.paths import ROOT
    from mlxlab.core.results import command_line

    assert command_line([str(ROOT / ".venv/bin/mlxlab"), "bench", "engine", "--out", str(ROOT / "build/x")]) == \
        ["mlxlab", "bench", "engine", "--out", "build/x"]
    assert command_line(["/usr/lib/python3/site-packages/ipykernel_launcher.py", "-f", "kernel-1.json"]) is None
