"""Number filters of the paper's template: fixed decimals, one unit each, strict about input.

``{{ v | x }}`` -> ``1.08x``; ``pct`` (a value already in percent) and ``fpct`` (a fraction)
-> ``17%``; ``ms`` (seconds in) -> ``49 ms``; ``s`` -> ``0.71 s``; ``tok_s`` -> ``1,086 tok/s``;
``n`` -> ``2,048``; ``mib`` (bytes in) -> ``629 MiB``; ``span`` formats a list as its range with
one of these units (``17-40%``). Each takes the number of decimals as its argument. A ``null``
or a value that is not a number fails the build with the place it came from.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, Iterable, List, Tuple

from mlxlab.core.claims import measured_text  # noqa: F401 - the scorecard and the template use it from here
from mlxlab.paper.context import Node, Null, PaperDataError

#: unit -> (scale applied to the stored value, text after the number, default decimals)
UNITS: Dict[str, Tuple[float, str, int]] = {
    "n": (1.0, "", 0),
    "x": (1.0, "x", 2),
    "pct": (1.0, "%", 0),
    "fpct": (100.0, "%", 0),
    "ms": (1e3, " ms", 0),
    "us": (1e6, " us", 0),
    "s": (1.0, " s", 1),
    "tok_s": (1.0, " tok/s", 0),
    "mib": (1.0 / 2**20, " MiB", 0),
    "gb": (1e-9, " GB", 2),
    "gb_s": (1.0, " GB/s", 0),
}


def number(v: Any, what: str = "a number") -> float:
    """``v`` as a float; a :class:`Null`, bool, string or container is an error naming it."""
    if isinstance(v, Null):
        raise v.fail(what)
    if isinstance(v, Node):
        raise PaperDataError(f"{v.where_from} is a {'list' if isinstance(v.raw, list) else 'dict'}, not {what}")
    if v is None:
        raise PaperDataError(f"got None (a value computed in the template), not {what}")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PaperDataError(f"got {v!r} ({type(v).__name__}), not {what}")
    return float(v)


def _digits(v: float, nd: int, sign: bool = False) -> str:
    s = f"{v:{'+' if sign else ''},.{nd}f}"
    if not s.strip("+-0.,"):  # rounds to zero: no "-0"
        s = ("+" if sign else "") + s.lstrip("+-")
    return s


def fmt(v: Any, unit: str = "n", nd: int = None, sign: bool = False) -> str:
    scale, suffix, default = UNITS[unit]
    nd = default if nd is None else int(nd)
    return _digits(number(v, f"a number (filter {unit})") * scale, nd, sign) + suffix


def span(values: Iterable, unit: str = "n", nd: int = None) -> str:
    """``low-high`` of ``values`` with ``unit`` once at the end (``low to high`` when a bound
    is negative); one distinct value prints alone. An empty list is an error."""
    if unit not in UNITS:
        raise PaperDataError(f"span(): unknown unit {unit!r}; one of {', '.join(UNITS)}")
    if isinstance(values, Node):
        where = values.where_from
        vals = [number(x) for x in values]
    else:
        where = "a list"
        vals = [number(x) for x in values]
    if not vals:
        raise PaperDataError(f"span(): {where} is empty")
    scale, suffix, default = UNITS[unit]
    nd = default if nd is None else int(nd)
    lo, hi = _digits(min(vals) * scale, nd), _digits(max(vals) * scale, nd)
    if lo == hi:
        return lo + suffix
    return f"{lo}{' to ' if lo.startswith('-') or hi.startswith('-') else '-'}{hi}{suffix}"


def median(values: Iterable) -> float:
    vals = [number(x) for x in values]
    if not vals:
        raise PaperDataError(f"median(): {getattr(values, 'where_from', 'a list')} is empty")
    return statistics.median(vals)


def _unit_filter(unit: str) -> Callable:
    def f(v, nd=None, sign=False):
        return fmt(v, unit, nd, sign)

    f.__name__ = unit
    f.__doc__ = f"format as {unit!r}: {UNITS[unit]}"
    return f


def filters() -> Dict[str, Callable]:
    """The template's filters: one per unit, ``span``, ``median``, ``nums`` (floats of a list),
    ``measured`` (a verdict's measured figures in a few words)."""
    out: Dict[str, Callable] = {u: _unit_filter(u) for u in UNITS}
    out.update(span=span, median=median, nums=lambda vs: [number(v) for v in vs],
               measured=lambda m, limit=4: measured_text(m.raw if isinstance(m, Node) else m, limit))
    return out
