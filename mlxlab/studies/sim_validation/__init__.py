"""Simulator validation (``mlxlab validate-sim``, notebook 07's simulator part): the simulator
against the engine on the same workloads; ``heldout`` (traces nobody tuned for), ``scoring``,
``divergence`` (where the plans part), ``repeat`` (does a profile repeat), ``verdict``, ``charts``."""
from mlxlab.studies.base import Study

STUDY = Study("sim_validation", "Simulator validation", ("sim_validation",), paper="12. Simulator validation",
              command="mlxlab validate-sim", decide="mlxlab.studies.sim_validation.verdict:decide_stored")
