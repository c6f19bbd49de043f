"""Scheduling policies: what runs in the next step.

Pure Python with no MLX import, so the same policy objects drive the real engine and the
simulator, and tests exercise them on synthetic state without a model. A policy sees a
:class:`mlxlab.core.plan.SchedulerState` and returns a :class:`mlxlab.core.plan.StepPlan`.
"""

from __future__ import annotations

import inspect
from typing import Callable, Dict

from mlxlab.core.plan import SchedulerState, StepPlan, check_plan
from mlxlab.policies.admission_gate import AdmissionGate
from mlxlab.policies.base import Interleave, Policy, PrefillFirst
from mlxlab.policies.decode_window import DecodeWindowGate
from mlxlab.policies.slo import SLOChunking
from mlxlab.policies.stall_free import StallFree

__all__ = ["POLICIES", "Policy", "PrefillFirst", "Interleave", "AdmissionGate", "StallFree", "SLOChunking",
           "DecodeWindowGate", "make_policy", "with_key_align", "next_plan"]


POLICIES: Dict[str, Callable[..., Policy]] = {
    PrefillFirst.name: PrefillFirst,
    Interleave.name: Interleave,
    AdmissionGate.name: AdmissionGate,
    StallFree.name: StallFree,
    SLOChunking.name: SLOChunking,
    DecodeWindowGate.name: DecodeWindowGate,
}


def make_policy(policy: "str | Policy", **kwargs) -> Policy:
    """A policy object from a name in :data:`POLICIES` (with its keyword options) or as given."""
    if isinstance(policy, Policy):
        if kwargs:
            raise ValueError("policy options are only accepted with a policy name")
        return policy
    try:
        factory = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(POLICIES)}") from None
    return factory(**kwargs)


def with_key_align(policy: "str | Policy", key_align: int, options: dict) -> dict:
    """``options`` for a policy named ``policy``, with the executor's ``key_align`` added when the
    policy takes one and the caller did not set it: one knob turns both the executor's padding and
    the policy's chunk alignment off (``key_align=1``)."""

    factory = POLICIES.get(policy) if isinstance(policy, str) else None
    if factory is None or "key_align" in options or "key_align" not in inspect.signature(factory).parameters:
        return options
    return {**options, "key_align": key_align}


def next_plan(policy: Policy, state: SchedulerState) -> StepPlan:
    """The policy's plan for ``state`` (an empty plan when nothing waits or decodes), checked
    with :func:`check_plan`: what every executor asks before a step."""
    plan = policy.schedule(state) if (state.prefill_queue or state.decoding) else StepPlan()
    check_plan(plan, state)
    return plan
