"""The scheduling study (``mlxlab bench scheduling``): every policy against mlx-lm's
``BatchGenerator`` at the seed's long prompts. ``plan`` (the jobs), ``run``, ``metrics`` (per run),
``result`` (the aggregated table and the study's own goals), ``merge`` (parts pooled run by run),
``verdict`` (the claims)."""
from mlxlab.studies.base import Study

STUDY = Study("scheduling", "Scheduling policies", ("scheduling",),
              paper="7. The stall, the admission gate and the chunk-size trade-off (seed 001)",
              command="mlxlab bench scheduling", decide="mlxlab.studies.scheduling.verdict:decide_stored")
