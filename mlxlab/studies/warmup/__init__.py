"""Warm-up and memory (seed 000, notebook 04): cold starts in fresh processes, warm-up modes and
the allocator's cache limit."""
from mlxlab.studies.base import Study

STUDY = Study("warmup", "Warm-up and memory", ("warmup_memory",), paper="6. Warm-up and memory (seed 000)",
              notebook="04_warmup_and_memory", command="mlxlab rescore-warmup",
              decide="mlxlab.studies.warmup.run:decide_stored")
