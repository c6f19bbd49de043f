"""The paper's appendix (the former paper/results.md) is generated from data/results: each
committed H200 probe and validation gets its table."""
import json
from pathlib import Path

from mlxlab.paper.context import ResultsStore
from mlxlab.paper.tables import appendix_markdown

H200 = Path(__file__).resolve().parent.parent / "data" / "results" / "h200"


def test_appendix_has_a_table_for_each_probe_on_file():
    store = ResultsStore()
    text = appendix_markdown(store)
    expected = {"chunk_probe.json": "One prefill chunk by its exact size",
                "decode_probe.json": "A lone stream's decode",
                "presize_probe.json": "KV cache sized up front or grown",
                "align_ab.json": "The engine with aligned chunks",
                "decode_modes.json": "engine runs against profile shares"}
    for name, heading in expected.items():
        assert ((H200 / name).exists()) == (heading in text), name
        if (H200 / name).exists():  # and the file counts as used (the provenance lists it)
            assert f"data/results/h200/{name}" in store.used
    if (H200 / "align_ab.json").exists():  # every row of the A/B is in the table, with its ratio
        rows = json.loads((H200 / "align_ab.json").read_text())["rows"]
        section = text[text.index("The engine with aligned chunks"):]
        assert section.count("| chat+") >= len(rows)


def test_appendix_has_every_validation_on_file():
    """Each sim_validation*.json gets its own table (the latest run first); a re-scoring says
    which runs it scored. The appendix sits one heading level below the paper's sections."""
    text = appendix_markdown(ResultsStore())
    section = text[text.index("### Simulator against engine"):]
    for p in sorted(H200.glob("sim_validation*.json")):
        heading = "#### h200\n" if p.stem == "sim_validation" else f"#### h200: {p.stem}\n"
        assert heading in section, p.name
        if p.stem.endswith("_rescored"):
            assert "scored again by this version" in section[section.index(heading):]
    if (H200 / "sim_validation.json").exists():
        assert section.index("#### h200\n") < min(section.index(f"#### h200: {p.stem}")
                                                  for p in H200.glob("sim_validation_*.json"))
    assert not any(line.startswith("## ") for line in text.splitlines())
