"""The ``decide`` of the prefix-cache, roofline and seed-scale studies: a document without the
stored measurements they read is refused with a clear error (tests/test_rederive.py decides every
committed file again)."""

import json
from pathlib import Path

import pytest

from mlxlab.studies.prefix_cache.verdict import decide_stored as decide_prefix
from mlxlab.studies.roofline.verdict import decide_stored as decide_roofline
from mlxlab.studies.seed_scale.verdict import decide_stored as decide_seed


@pytest.mark.parametrize("decide, name, missing", [
    (decide_prefix, "prefix_cache.json", "no restore, capacity, disk, kvquant, max_context_tokens"),
    (decide_roofline, "roofline.json", "no here, kv"),
    (decide_seed, "seed_scale.json", "no floor_s, solo_itl_s, curves, chunk_doc_s, calibration, config"),
])
def test_a_document_without_its_measurements_is_refused(decide, name, missing):
    with pytest.raises(ValueError, match=f"{name} is not an? .* result \\({missing}"):
        decide({"verdicts": []}, Path(name))


def test_the_old_prefix_cache_layout_is_refused():
    """The H200's first prefix_cache.json (restore and warm_vs_cold only, no verdicts) is not notebook 06's."""
    path = Path(__file__).resolve().parent.parent / "data" / "results" / "h200" / "prefix_cache.json"
    if not path.is_file():
        pytest.skip("no old-layout file")
    with pytest.raises(ValueError, match="no capacity"):
        decide_prefix(json.loads(path.read_text()), path)
