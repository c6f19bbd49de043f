"""The ``decide`` of the prefill-step and engine-bench studies: a document without the stored
measurements they read is refused with a clear error (tests/test_rederive.py decides every
committed file again)."""

from pathlib import Path

import pytest

from mlxlab.studies.engine_bench.verdict import decide_stored as decide_bench
from mlxlab.studies.prefill_step.run import decide_stored as decide_prefill


@pytest.mark.parametrize("decide, name, missing", [
    (decide_prefill, "prefill_step_size.json", "no sweep, protocol, decode, accuracy"),
    (decide_bench, "bench_engine.json", "no presets, nor model"),
    (decide_bench, "overview_bench.json", "no presets, nor model"),
])
def test_a_document_without_its_measurements_is_refused(decide, name, missing):
    with pytest.raises(ValueError, match=f"{name} is not an? .* result \\({missing}"):
        decide({"parameters": {}, "verdicts": []}, Path(name))
