"""The stall, the admission gate and the chunk-size trade-off (seed 001, notebook 05): ``plan``
in ``run`` (the grid of policies, chunk sizes and workers), ``http`` (the same scene over
``mlxlab serve``), ``verdict``, ``charts``."""
from mlxlab.studies.base import Study

STUDY = Study("admission_gate", "The admission gate", ("admission_gate",),
              paper="7. The stall, the admission gate and the chunk-size trade-off (seed 001)",
              notebook="05_admission_gate", decide="mlxlab.studies.admission_gate.verdict:decide_stored")
