"""The engine against mlx-lm: exactness, single and batched speed (``mlxlab bench engine``,
notebook 00) and the decode limit (the bare loop, ``bench engine --limit``)."""
from mlxlab.studies.base import Study

STUDY = Study("engine_bench", "The engine against mlx-lm", ("bench_engine", "overview_bench"),
              paper="10. The engine against mlx-lm", notebook="00_overview", command="mlxlab bench engine",
              decide="mlxlab.studies.engine_bench.verdict:decide_stored")
