"""Text labels beside points, placed so that they overlap neither each other nor the chart's marks.

Vega has no collision avoidance for text. Where a chart's scales have fixed domains, each point's pixel
position is known before Vega draws it, so :func:`place_labels` can put every label beside its point where
it covers no other label and no mark, moving it up or down by whole lines where it must (draw a leader
line then: ``moved``). The contention figure and the tune figure use it."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

CHAR_W, LINE_H = 5.6, 12.0  # a 10 px label's width per character and its height (DejaVu Sans), pixels


def box_overlap(a: Tuple[float, ...], b: Tuple[float, ...]) -> float:
    """The area two boxes (x0, y0, x1, y1) share."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def place_labels(points: Sequence[Tuple[float, float]], texts: Sequence[str], width: float, height: float,
                 gap: float = 7.0, radius: float = 5.0, rows: int = 8,
                 obstacles: Sequence[Tuple[float, float]] = ()) -> List[dict]:
    """For points at pixel positions ``points`` (x right, y down) in a ``width`` x ``height`` panel, where
    each label goes: a dict with ``x``, ``y`` (the text's anchor, its vertical middle), ``align``
    ("left" or "right") and ``moved`` (it left its point's row: draw a leader). Tries beside the point
    (right, then left), then up to ``rows`` rows above and below; takes the first spot inside the panel
    that overlaps no label placed so far, no point and none of ``obstacles`` (the chart's other marks),
    or else the least bad one (outside the panel is worst, then overlapping a label, then a mark).
    Points are taken top to bottom."""
    dots = [(x - radius, y - radius, x + radius, y + radius) for x, y in list(points) + list(obstacles)]
    placed: List[Tuple[float, ...]] = []
    spots: Dict[int, dict] = {}
    steps = [0] + [s * k for k in range(1, rows + 1) for s in (-1, 1)]
    for i in sorted(range(len(points)), key=lambda i: (points[i][1], points[i][0])):
        (x, y), w = points[i], CHAR_W * len(texts[i]) + 2
        best = None
        for k in steps:
            ty = y + k * LINE_H
            for align in ("left", "right"):
                x0 = x + gap if align == "left" else x - gap - w
                box = (x0, ty - LINE_H / 2, x0 + w, ty + LINE_H / 2)
                outside = max(0.0, -box[0]) + max(0.0, box[2] - width) + max(0.0, -box[1]) + max(0.0, box[3] - height)
                cost = (1e4 * outside + 10 * sum(box_overlap(box, b) for b in placed)
                        + sum(box_overlap(box, b) for j, b in enumerate(dots) if j != i))
                if best is None or cost < best[0]:
                    best = (cost, box, align, ty, k)
            if best[0] == 0:
                break
        _, box, align, ty, k = best
        placed.append(box)
        spots[i] = {"x": box[0] if align == "left" else box[2], "y": ty, "align": align, "moved": k != 0}
    return [spots[i] for i in range(len(points))]
