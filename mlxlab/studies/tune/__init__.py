"""``mlxlab tune``: serving settings for a model and a trace, found by the simulator on a device
profile, confirmed on the engine beside mlx-lm's ``BatchGenerator``, and checked against an
exhaustive engine sweep (``--sweep``): ``slo.py`` (SLOs, the frontier, the choice), ``run.py``
(profile, grid, confirmation, sweep, the serve command), ``verdict.py`` (regret, rank, speed) and
``charts.py`` (the frontier figure)."""
from mlxlab.studies.base import Study

STUDY = Study("tune", "Tuning for a trace", ("tune",), paper="13. Tuning for your traffic", notebook="09_tune",
              command="mlxlab tune",
              decide="mlxlab.studies.tune.verdict:decide_stored", charts="mlxlab.studies.tune.charts:tune_chart")
