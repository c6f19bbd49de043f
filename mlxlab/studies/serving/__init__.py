"""What the HTTP path costs (``mlxlab bench serve``): ``mlxlab serve`` against the in-process
engine on the same model object."""
from mlxlab.studies.base import Study

STUDY = Study("serving", "The HTTP path", ("serve_overhead",), paper="10. The engine against mlx-lm",
              command="mlxlab bench serve", decide="mlxlab.studies.serving.run:decide_stored")
