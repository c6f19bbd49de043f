"""One-off device probes behind the simulator's cost terms and the engine's comments: run one as
``python -m probes.NAME`` from the project root (``--help`` says what it measures)."""
