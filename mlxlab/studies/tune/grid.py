"""The settings ``mlxlab tune`` simulates, and which of them are one schedule on a given trace.

Three grids. ``standard`` (:func:`default_grid`) is the one every committed tune file before
2026-12-06 #15 ran: 10-12 settings. ``full`` (:func:`full_grid`) crosses every knob of every policy
tune runs, the decode-window gate among them. ``wide`` (:func:`wide_grid`) varies each policy's own knob as
well: interleave's chunk size, stall_free's token budget, slo's ITL target and admission_gate's
gate threshold beside its chunk size: 16-19 settings on the committed traces where the standard
grid has 10-12. Simulating a setting costs a fraction of a second while running it on the engine
costs a replay of the trace, so a wider grid
costs tune nothing but the simulation, and an exhaustive engine sweep a run per setting and repeat.

Settings that differ in name can be the same schedule on a trace: admission_gate whose gate is
above the longest prompt holds nothing back, so it is interleave at its chunk size; slo's
``max_chunk`` above any chunk slo chooses changes nothing. :func:`same_schedule` finds them from
the simulation (a deterministic simulator gives identical figures for identical schedules), so tune
confirms distinct settings only and the sweep does not replay one schedule twice. On the CPU's
committed trace (prompts of 100-750 tokens) 3 of the standard grid's 10 settings were such copies
(``data/results/cpu/tune.json``: admission_gate-512 and -1024 simulated exactly as interleave-512
and -1024, slo-1024 as slo-512), and tune confirmed slo-512 and slo-1024 both.
"""

from __future__ import annotations

import json
from typing import Dict, List

GRIDS = ("standard", "wide", "full")


def _fit(chunks: List[int], max_prompt: int) -> List[int]:
    """Chunk sizes below the longest prompt and the smallest one covering it (those above it all run as it)."""
    return [c for c in chunks if c < max_prompt] + [min(c for c in chunks if c >= max_prompt)] \
        if any(c >= max_prompt for c in chunks) else chunks


def _stall_free(b: int, packed: bool, shape_keyed: bool) -> dict:
    from mlxlab.engine.fused import shape_alignment  # one rule for the grid and serve's warning

    return {"label": f"stall_free-{b}", "policy": "stall_free", "chunk_size": 2048,
            "options": {"token_budget": b, **({} if packed else {"fuse": False}),
                        **({"key_align": shape_alignment("stall_free", {"token_budget": b})} if shape_keyed else {})}}


def _slo_options(shape_keyed: bool) -> dict:
    from mlxlab.engine.fused import shape_alignment

    return {"key_align": shape_alignment("slo", {})} if shape_keyed else {}


def default_grid(quick: bool = False, max_prompt: int = 4096, packed: bool = True,
                 shape_keyed: bool = False) -> List[dict]:
    """The standard grid tune simulates: ``label``, ``policy``, ``chunk_size``, ``options``. Chunk sizes
    above the longest prompt are left out (they all run as the longest). ``packed`` False (a device
    where packed steps are slow: :func:`mlxlab.engine.fused.packs_well`): ``stall_free`` runs its
    decode and chunk back to back (``fuse: False``, in its options, so the engine, the simulator and
    the ``serve`` line all run it so). ``shape_keyed`` (a device that prepares attention per exact
    shape: :func:`mlxlab.engine.fused.cold_keying`): ``stall_free``'s chunks end on key lengths
    that are multiples of half its budget (``key_align``), so its shapes repeat prompt after prompt
    instead of following the decode batch to a new one nearly every step, and ``slo``'s (chosen anew
    each step) on multiples of :data:`mlxlab.core.plan.SLO_KEY_ALIGN_SHAPES`. Simulated on the H100
    profiles of coder-1.5b and llama-1b (``probes/key_align_sim.py``), half the budget was the best
    of 8-512 or near it for each ``stall_free`` budget, and 512 the best for ``slo`` on both models."""
    chunks = [64, 256] if quick else [256, 512, 1024, 2048, 4096]
    budgets = [128] if quick else [256, 512, 1024]
    fit = _fit(chunks, max_prompt)
    grid = [{"label": f"interleave-{c}", "policy": "interleave", "chunk_size": c, "options": {}} for c in fit]
    grid += [_stall_free(b, packed, shape_keyed) for b in budgets]
    grid += [{"label": f"slo-{c}", "policy": "slo", "chunk_size": c, "options": _slo_options(shape_keyed)}
             for c in fit[-2:]]
    if not quick:
        grid += [{"label": f"admission_gate-{c}", "policy": "admission_gate", "chunk_size": c, "options": {}}
                 for c in fit[-2:]]
    return grid


def gate_thresholds(max_prompt: int) -> List[int]:
    """admission_gate's ``big_prompt_tokens`` for the wide grid: the two largest powers of two from 256
    below the longest prompt (a gate at or above it holds nothing back), or 256 alone."""
    below = [t for t in (256, 512, 1024, 2048, 4096, 8192, 16384) if t < max_prompt]
    return below[-2:] or [256]


def wide_grid(max_prompt: int = 4096, packed: bool = True, shape_keyed: bool = False) -> List[dict]:
    """The standard grid's policies with each one's own knob varied: interleave at chunk sizes of
    128-4096, stall_free at token budgets of 128-2048 (up to the longest prompt's chunk),
    slo at the largest chunk with ITL targets of 1.5, 2, 3 and 4 times a decode-only step,
    admission_gate at the two largest chunks with the gates of :func:`gate_thresholds`. Labels name
    every knob that differs from the policy's default."""
    fit = _fit([128, 256, 512, 1024, 2048, 4096], max_prompt)
    grid = [{"label": f"interleave-{c}", "policy": "interleave", "chunk_size": c, "options": {}} for c in fit]
    grid += [_stall_free(b, packed, shape_keyed) for b in (128, 256, 512, 1024, 2048) if b <= fit[-1]]
    grid += [{"label": f"slo-{fit[-1]}-x{x:g}", "policy": "slo", "chunk_size": fit[-1],
              "options": {**_slo_options(shape_keyed), "itl_target_x": x}} for x in (1.5, 2.0, 3.0, 4.0)]
    grid += [{"label": f"admission_gate-{c}-gate{t}", "policy": "admission_gate", "chunk_size": c,
              "options": {"big_prompt_tokens": t}} for c in fit[-2:] for t in gate_thresholds(max_prompt)]
    return grid


#: the decode windows (s) the full grid holds open after a big prompt's chunk (``admission_gate_window``)
WINDOWS_S = (0.1, 0.5)


def full_grid(max_prompt: int = 4096, packed: bool = True, shape_keyed: bool = False) -> List[dict]:
    """Every policy tune can run at the cross product of its knobs: the wide grid's interleave and
    stall_free; slo at each of the three largest chunks and each ITL target; admission_gate at the three
    largest chunks and each gate of :func:`gate_thresholds`; and ``admission_gate_window`` (the gate with
    a decode window held open after each chunk of a big prompt, as seed 001 describes its gate) at the two
    largest chunks, the smallest gate and each window of :data:`WINDOWS_S`. 30 settings on the CPU's
    committed trace (prompts up to 750 tokens), 22 of them distinct schedules there (slo's chunk
    cap changes nothing below its own choices): simulating costs tune under a second, an exhaustive
    engine sweep a run per setting and repeat."""
    fit = _fit([128, 256, 512, 1024, 2048, 4096], max_prompt)
    gates = gate_thresholds(max_prompt)
    grid = [g for g in wide_grid(max_prompt, packed, shape_keyed) if g["policy"] in ("interleave", "stall_free")]
    grid += [{"label": f"slo-{c}-x{x:g}", "policy": "slo", "chunk_size": c,
              "options": {**_slo_options(shape_keyed), "itl_target_x": x}} for c in fit[-3:] for x in (1.5, 2.0, 3.0, 4.0)]
    grid += [{"label": f"admission_gate-{c}-gate{t}", "policy": "admission_gate", "chunk_size": c,
              "options": {"big_prompt_tokens": t}} for c in fit[-3:] for t in gates]
    grid += [{"label": f"admission_gate_window-{c}-w{w:g}", "policy": "admission_gate_window", "chunk_size": c,
              "options": {"big_prompt_tokens": gates[0], "window_s": w}} for c in fit[-2:] for w in WINDOWS_S]
    return grid


def make_grid(name: str = "standard", quick: bool = False, max_prompt: int = 4096, packed: bool = True,
              shape_keyed: bool = False) -> List[dict]:
    """The grid called ``name`` (:data:`GRIDS`); ``quick`` keeps the standard grid's small one."""
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; choose one of {', '.join(GRIDS)}")
    if name in ("wide", "full") and not quick:
        return (wide_grid if name == "wide" else full_grid)(max_prompt, packed=packed, shape_keyed=shape_keyed)
    return default_grid(quick, max_prompt, packed=packed, shape_keyed=shape_keyed)


def same_schedule(rows: List[dict]) -> Dict[str, str]:
    """Settings the simulation ran as one schedule: ``{label: the first setting in grid order with the
    same simulated figures}`` for every setting but the first of its group. ``rows``: tune's simulated
    rows (each with its ``summary``, ``objective_s`` and ``slo_ratio``). The simulator is
    deterministic, so identical figures for every tenant mean identical steps."""
    first: Dict[str, str] = {}
    out: Dict[str, str] = {}
    for r in rows:
        key = json.dumps([r.get("summary"), r.get("objective_s"), r.get("slo_ratio")], sort_keys=True, default=str)
        if key in first:
            out[r["label"]] = first[key]
        else:
            first[key] = r["label"]
    return out
