"""The order tune's engine runs go in: the confirmation's and the sweep's repeats
(:func:`run_order`)."""

from __future__ import annotations

import random
from typing import Sequence


ORDERS = ("shuffle", "rotation", "balanced")


def williams_row(n: int, r: int) -> list:
    """Row ``r`` of a Williams design over ``n`` items (indices): over ``n`` rows (``2n`` for an odd ``n``,
    each row then also reversed) every item comes first once and follows every other item once, so what ran
    just before a run, and where in the repeat it ran, falls on every item alike."""
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    row = [(b + r) % n for b in base]
    return row[::-1] if n % 2 and (r // n) % 2 else row


def run_order(items: Sequence, r: int, order: str = "shuffle") -> list:
    """``items`` in the order repeat ``r`` runs them: ``"shuffle"``, a permutation drawn for that
    repeat from a fixed seed (the same every run, so a resumed sweep runs the same order); ``"balanced"``,
    row ``r`` of a Williams design (:func:`williams_row`; tune's confirmation since 2026-12-07: with three
    candidates and the baseline the shuffle's seeds put the third candidate first in 4 of the first 5
    repeats, right after the baseline in every one: ``probes/confirm_order.py``); or
    ``"rotation"``, each repeat moved on by one (sweeps stored before 2026-12-06 #11). Under rotation a
    setting follows the same one in nearly every repeat, and what ran before in the process moves a
    setting's tail: on an H100, llama-1b's admission_gate-4096 gave the chat a 7.9 ms ITL p99 run
    first and 50-71 ms in each repeat after the same predecessor (``data/results/h100/
    tune_llama-3.2-1b_before_shape_cold.json``); a shuffle spreads that over the repeats' range."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    items = list(items)
    if order == "balanced" and items:
        return [items[i] for i in williams_row(len(items), r)]
    if order == "rotation" or not items:
        k = r % len(items) if items else 0
        return items[k:] + items[:k]
    random.Random(f"mlxlab-tune-order:{r}").shuffle(items)
    return items
