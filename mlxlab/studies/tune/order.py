"""The order tune's engine runs go in: the confirmation's and the sweep's repeats
(:func:`run_order`)."""

from __future__ import annotations

import random
from typing import Sequence


def run_order(items: Sequence, r: int, order: str = "shuffle") -> list:
    """``items`` in the order repeat ``r`` runs them: ``"shuffle"``, a permutation drawn for that
    repeat from a fixed seed (the same every run, so a resumed sweep runs the same order), or
    ``"rotation"``, each repeat moved on by one (sweeps stored before 2026-12-06 #11). Under rotation a
    setting follows the same one in nearly every repeat, and what ran before in the process moves a
    setting's tail: on an H100, llama-1b's admission_gate-4096 gave the chat a 7.9 ms ITL p99 run
    first and 50-71 ms in each repeat after the same predecessor (``data/results/h100/
    tune_llama-3.2-1b_before_shape_cold.json``); a shuffle spreads that over the repeats' range."""
    if order not in ("shuffle", "rotation"):
        raise ValueError(f"order must be shuffle or rotation, got {order!r}")
    items = list(items)
    if order == "rotation" or not items:
        k = r % len(items) if items else 0
        return items[k:] + items[:k]
    random.Random(f"mlxlab-tune-order:{r}").shuffle(items)
    return items
