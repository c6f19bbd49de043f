"""Seed 001 at its own scale, on the simulator with the published profile (``mlxlab seed-scale``,
notebook 07). A package of its own, not part of ``roofline``: it is its own command, results file
and claims, and it runs without MLX (the roofline measures on it)."""
from mlxlab.studies.base import Study

STUDY = Study("seed_scale", "Seed 001 at its own scale", ("seed_scale",),
              paper="9. Roofline and the case study at its own scale (seed 001)",
              notebook="07_roofline_and_seed_scale", command="mlxlab seed-scale",
              decide="mlxlab.studies.seed_scale.verdict:decide_stored")
