"""What the studies' verdict rules share (no MLX): reading stored numbers, and whether the
repeat-to-repeat spread of a figure could flip the comparison that decides a claim.

A stored figure may be a number, null (JSON has no NaN) or missing; :func:`as_float` reads any of
them as a float (NaN when there is none) so a rule can test it with :func:`all_finite` before it
compares. :func:`within_noise` is the noise test every verdict that stores ``within_noise`` uses.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

#: a threshold within this many times the repeat spread of the deciding figure is within noise
NOISE_FACTOR = 3.0


def as_float(x) -> float:
    """A stored number as a float (NaN for null, missing, a bool or text)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")


def finite_or_none(x) -> Optional[float]:
    """A stored number as a float, None where it is not a finite one (what a verdict stores)."""
    x = as_float(x)
    return x if math.isfinite(x) else None


def to_ms(x) -> Optional[float]:
    """Seconds as milliseconds, None where not a finite number."""
    x = as_float(x)
    return 1e3 * x if math.isfinite(x) else None


def rounded(x, nd: int = 3) -> Optional[float]:
    """A number rounded for a verdict's ``measured``, None where not a finite number."""
    x = as_float(x)
    return round(x, nd) if math.isfinite(x) else None


def all_finite(*xs) -> bool:
    """Whether every one of ``xs`` is a finite number."""
    return all(math.isfinite(as_float(x)) for x in xs)


def worst(*spreads) -> Optional[float]:
    """The largest of the known spreads (None: none known)."""
    known = [s for s in spreads if s is not None]
    return max(known) if known else None


def within_noise(value: float, limit: float, s: Optional[float], scale: Optional[float] = None) -> Optional[bool]:
    """Whether :data:`NOISE_FACTOR` times the relative spread ``s`` of a figure of size ``scale``
    (default ``value``) reaches from ``value`` across ``limit``; None without a spread (one repeat)."""
    if s is None or not all_finite(value, limit):
        return None
    return abs(value - limit) <= NOISE_FACTOR * s * abs(value if scale is None else scale)


def repeats_to_resolve(band: float, margin: float, repeats: Optional[int]) -> Optional[int]:
    """How many repeats would narrow a noise band that shrinks as 1/sqrt(repeats) (a band of
    ``band`` at ``repeats``) to below ``margin``, the distance the claim needs resolved; None when
    any of them is unknown or the margin is zero (no number of repeats can resolve a tie)."""
    if not repeats or not all_finite(band, margin) or margin <= 0:
        return None
    return max(int(repeats) + 1, math.ceil(int(repeats) * (band / margin) ** 2))


def paired_band(paired: Sequence[float], floor: float) -> tuple:
    """(median, band) of paired per-repeat ratios: band = max(``floor``, 3 x MAD / sqrt(n)), the
    distance from the median inside which a difference is repeat-to-repeat noise (MAD: median
    absolute deviation of the ratios from their median)."""
    v = [x for x in paired if x is not None and math.isfinite(x)]
    if not v:
        return float("nan"), float("nan")
    med = float(statistics.median(v))
    mad = float(statistics.median([abs(x - med) for x in v]))
    return med, max(floor, 3 * mad / math.sqrt(len(v)))


def noise_outcome(passed: Optional[bool], *, margin: float, band: float, repeats: Optional[int]) -> dict:
    """The verdict of a rule whose figure sits ``margin`` from the claim's threshold (for a null
    claim such as "unchanged": the effect it must rule out), with a noise band of ``band`` (same
    units): inconclusive when the band is wider than the margin, so the run could not see either way;
    else reproduced or not as ``passed`` says (None: not measured). Returns ``verdict``,
    ``within_noise`` and, when inconclusive, ``repeats_to_resolve``."""
    if passed is None or not all_finite(margin, band):
        return {"verdict": "not measured", "within_noise": None}
    if band > abs(margin):
        return {"verdict": "inconclusive", "within_noise": True,
                "repeats_to_resolve": repeats_to_resolve(band, abs(margin), repeats)}
    return {"verdict": "reproduced" if passed else "not reproduced", "within_noise": False}


def run_ratios(num: Sequence, den) -> list:
    """Per-repeat ratios ``num[i] / den[i]`` (``den`` a sequence paired by repeat: the repeats ran
    outermost, so repeat i of each side ran in the same round) or ``num[i] / den`` (a number), keeping
    only the repeats where both are finite and the denominator positive."""
    dens = list(den) if isinstance(den, (list, tuple)) else [den] * len(num or [])
    out = []
    for a, b in zip(num or [], dens):
        a, b = as_float(a), as_float(b)
        if all_finite(a, b) and b > 0:
            out.append(a / b)
    return out


def ratio_band(num: Sequence, den) -> tuple:
    """(band, repeats) of a ratio figure from its per-repeat ratios (:func:`run_ratios`): band =
    3 x MAD / sqrt(n) (:func:`paired_band`, no floor); (None, n) with fewer than two repeats."""
    v = run_ratios(num, den)
    return (paired_band(v, 0.0)[1] if len(v) >= 2 else None), len(v)


def bound_check(x: float, limit: float, band: Optional[float], repeats: Optional[int], *,
                low: Optional[float] = None) -> dict:
    """The outcome of one figure ``x`` held to ``x <= limit`` (and ``x >= low`` where given) with a
    noise band ``band`` (same units as ``x``): :func:`noise_outcome` on the distance to the nearer
    bound; without a band (one repeat) decided on ``x`` alone (``within_noise`` None)."""
    x, limit = as_float(x), as_float(limit)
    if not math.isfinite(x) or math.isnan(limit):  # limit may be inf: a lower bound alone
        return {"verdict": "not measured", "within_noise": None}
    passed = x <= limit and (low is None or x >= low)
    margin = min(limit - x, (x - low) if low is not None else math.inf)
    if band is None or not math.isfinite(band):
        return {"verdict": "reproduced" if passed else "not reproduced", "within_noise": None}
    return noise_outcome(passed, margin=margin, band=band, repeats=repeats)


def combine_outcomes(outcomes: Sequence[dict]) -> dict:
    """One verdict from the outcomes of every comparison a claim needs: not reproduced when any
    failed beyond its band (a failure anywhere outweighs an inconclusive elsewhere), else
    inconclusive when any band reached across its bound (with the most repeats any would need), else
    not measured when any was, else reproduced. ``within_noise`` is None when no comparison had a
    band."""
    vs = [o["verdict"] for o in outcomes]
    v = next((k for k in ("not reproduced", "inconclusive", "not measured") if k in vs), "reproduced" if vs else
             "not measured")
    banded = any(o.get("within_noise") is not None for o in outcomes)
    out = {"verdict": v, "within_noise": (v == "inconclusive") if banded else None}
    need = [o["repeats_to_resolve"] for o in outcomes if o.get("repeats_to_resolve")]
    if v == "inconclusive":
        out["repeats_to_resolve"] = max(need) if need else None
    return out


#: what a rule that decides through :func:`noted` adds to its words
NOISE_RULE = (" Each deciding figure has a noise band from its own repeats: 3 x the median absolute deviation of its "
              "per-repeat values (ratios of the two sides paired by repeat, which ran in the same round) / "
              "sqrt(repeats). A figure nearer its bound than its band is inconclusive, with the repeats that would "
              "resolve it; a failure beyond its band anywhere outweighs an inconclusive elsewhere. One repeat has no "
              "band and is decided on the figure alone.")


def values_band(values: Sequence) -> tuple:
    """(band, repeats) of a figure from its per-repeat values (already a ratio or a percentage):
    3 x MAD / sqrt(n); (None, n) with fewer than two finite values."""
    v = [as_float(x) for x in values or []]
    v = [x for x in v if math.isfinite(x)]
    return (paired_band(v, 0.0)[1] if len(v) >= 2 else None), len(v)


def noted(measured: dict, outcomes: Sequence[dict], bands: dict) -> dict:
    """``outcomes`` combined (:func:`combine_outcomes`) and written into ``measured``:
    ``within_noise``, ``noise_band_x`` (each deciding figure's band, in its own units) and, when
    inconclusive, ``repeats_to_resolve``. Returns the combined outcome for :func:`decided`."""
    out = combine_outcomes(outcomes)
    measured["within_noise"] = out["within_noise"]
    measured["noise_band_x"] = {k: rounded(b, 4) for k, b in bands.items() if b is not None} or None
    if out["verdict"] == "inconclusive":
        measured["repeats_to_resolve"] = out.get("repeats_to_resolve")
    return out


def decided(claim_id: str, passed: Optional[bool], measured, rule: str, fairness: str, evidence: str,
            why_not: str = "a configuration it needs did not run or measured nothing",
            outcome: Optional[dict] = None) -> dict:
    """A verdict record: reproduced / not reproduced as ``passed`` says; "not measured" (with
    ``why_not`` in the rule) when ``passed`` is None. ``outcome`` (:func:`combine_outcomes` of the
    comparisons with their noise bands), where given, decides a measured claim instead: it can make
    it inconclusive, never turn a pass into a failure beyond what ``passed`` says."""
    from mlxlab.core.claims import verdict

    if passed is None:
        return verdict(claim_id, "not measured", measured=measured, rule=f"{rule} Not measured: {why_not.rstrip('.')}.",
                       fairness=fairness, evidence=evidence)
    v = "reproduced" if passed else "not reproduced"
    if outcome is not None and outcome.get("verdict") in ("reproduced", "not reproduced", "inconclusive"):
        v = outcome["verdict"]
    return verdict(claim_id, v, measured=measured, rule=rule, fairness=fairness, evidence=evidence)


def common_prefix(a, b) -> int:
    """How many leading tokens two sequences share (how far two greedy streams agree)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
