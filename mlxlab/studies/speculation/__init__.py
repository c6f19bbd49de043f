"""Speculative decoding (seed 000, notebook 03, ``mlxlab bench speculation``): the trained
byte-level pair, where a draft pays, and greedy exactness (``exactness``)."""
from mlxlab.studies.base import Study

STUDY = Study("speculation", "Speculative decoding", ("speculation",), paper="5. Speculative decoding (seed 000)",
              notebook="03_speculative_decoding", command="mlxlab bench speculation",
              decide="mlxlab.studies.speculation.verdict:decide_stored")
