"""What the HTTP path costs (``mlxlab bench serve``: ``mlxlab serve`` against the in-process engine
on the same model object) and how it compares with ``mlx_lm.server`` (``mlxlab bench http``,
``against``: both servers on one model directory, the seed-001 scene over HTTP), and how it holds up
for a while under faults (``mlxlab bench soak``, ``soak``: ``serve_soak``)."""
from mlxlab.studies.base import Study

# http_levers_*: bench http runs of one preset's scene that move one lever (the documents' tokens, chunk sizes),
# kept apart from the preset files (serve_http_*) that the table and README headline show
STUDY = Study("serving", "The HTTP path", ("serve_overhead", "serve_http", "serve_soak", "http_levers"),
              paper="10. The engine against mlx-lm",
              command="mlxlab bench serve", decide="mlxlab.studies.serving.run:decide_stored")
