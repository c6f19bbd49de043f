"""Roofline (seed 001, notebook 07): bandwidth, decode against its ceiling, KV bytes per token,
placed beside the other platforms' committed points."""
from mlxlab.studies.base import Study

STUDY = Study("roofline", "Roofline", ("roofline",), paper="9. Roofline and the case study at its own scale (seed 001)",
              notebook="07_roofline_and_seed_scale",
              decide="mlxlab.studies.roofline.verdict:decide_stored")
