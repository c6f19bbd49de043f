"""Prefill and decode on their own compute (seed 001, notebook 08, ``mlxlab bench disagg``): two
processes over ``mx.distributed`` (``run``, ``worker``), the simulated split (``sim``) and the
seed's scene on it (``seed``), ``verdict``, ``charts``."""
from mlxlab.studies.base import Study

STUDY = Study("disagg", "Disaggregation", ("disagg",), paper="11. Prefill and decode on their own compute (seed 001)",
              notebook="08_disaggregation", command="mlxlab bench disagg",
              decide="mlxlab.studies.disagg.verdict:decide_stored", charts="mlxlab.studies.disagg.charts:disagg_chart")
