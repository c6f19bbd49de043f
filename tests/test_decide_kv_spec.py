"""The decide functions of notebooks 02 (KV quantization) and 03 (speculative decoding): a stored
document without the keys they read is refused with a message naming them, and a stored document
is decided from its contents as its writer decided it."""

import pytest

from mlxlab.studies.kv_quant import run as KS
from mlxlab.studies.speculation import run as SP
from tests.test_verdicts_kv_spec import SLOW_TTFT, speed_df


@pytest.mark.parametrize("decide, doc, missing", [
    (KS.decide_stored, {"speed": []}, "no ttft, probes"),
    (SP.decide_stored, {"study": {"rows": []}}, "no config, cost"),
    (SP.decide_stored, {"verdicts": []}, "no rows, config, cost"),
])
def test_decide_stored_refuses_a_document_missing_its_keys(decide, doc, missing):
    with pytest.raises(ValueError, match=f"x.json is not a .* result \\({missing}\\)"):
        decide(doc, "x.json")


def test_kv_decide_stored_reads_the_model_note_and_backend_the_notebook_wrote():
    speed = speed_df({256: (100, 70), 4096: (50, 60)})
    vs = KS.verdicts(speed, SLOW_TTFT, {"4": (True, "")}, model="tiny (2.6M parameters, float32)")
    doc = {"speed": speed.to_dict("records"), "ttft": SLOW_TTFT.to_dict("records"),
           "probes": {"4": [True, ""]}, "verdicts": vs}
    assert [(v["verdict"], v["fairness"]) for v in KS.decide_stored(doc)] == [(v["verdict"], v["fairness"]) for v in vs]
    failed = KS.decide_stored({**doc, "probes": {"4": [False, "no kernel"]}, "environment": {"device": "gpu"}})
    assert {v["verdict"] for v in failed} == {"not measurable on this backend"}
    assert all("The backend (Device(gpu, 0))" in v["rule"] for v in failed)


def test_a_kv4_change_the_noise_band_cannot_place_is_inconclusive_not_a_failure():
    from mlxlab.studies.kv_quant.run import _blind

    published = {"low": -38, "high": -23}
    m = {}
    assert _blind(m, -11.1, 65.5, published, 5) == "inconclusive"  # the CPU's case: 65% band, 12 points away
    assert m["within_noise"] is True and m["repeats_to_resolve"] > 5
    m = {}
    assert _blind(m, 10.0, 5.0, published, 5) == "not reproduced" and m["within_noise"] is False  # plainly faster
