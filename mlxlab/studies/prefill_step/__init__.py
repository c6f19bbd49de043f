"""Prefill step size (seed 000, notebook 01): the sweep, the case study's protocol in fresh
processes in both orders, decode and output after each step size."""
from mlxlab.studies.base import Study

STUDY = Study("prefill_step", "Prefill step size", ("prefill_step_size",), paper="3. Prefill step size (seed 000)",
              notebook="01_prefill_step_size", decide="mlxlab.studies.prefill_step.run:decide_stored")
