"""What the HTTP path costs (``mlxlab bench serve``: ``mlxlab serve`` against the in-process engine
on the same model object) and how it compares with ``mlx_lm.server`` (``mlxlab bench http``,
``against``: both servers on one model directory, the seed-001 scene over HTTP)."""
from mlxlab.studies.base import Study

STUDY = Study("serving", "The HTTP path", ("serve_overhead", "serve_http"), paper="10. The engine against mlx-lm",
              command="mlxlab bench serve", decide="mlxlab.studies.serving.run:decide_stored")
