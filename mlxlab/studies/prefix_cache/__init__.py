"""Prefix cache (seed 001, notebook 06): restore against prefill, session capacity, the disk
tier (``disk``) and quantized caches in it (``kvquant``)."""
from mlxlab.studies.base import Study

STUDY = Study("prefix_cache", "Prefix cache", ("prefix_cache",), paper="8. Prefix cache (seed 001)",
              notebook="06_prefix_cache",
              decide="mlxlab.studies.prefix_cache.verdict:decide_stored")
