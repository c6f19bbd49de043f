"""The simulator: the engine's policies and queues on a virtual clock, charged to a step-time cost
model measured on the machine (profiles) or published (the case study's)."""

from mlxlab.sim.simulator import Simulator, simulate

__all__ = ["Simulator", "simulate"]
