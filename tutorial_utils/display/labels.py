"""Point labels that do not collide: each goes to the first nearby spot where it fits.

Strategies with nearly the same memory and time sit on top of each other in a Pareto plot, and a
fixed offset draws their names over one another. Placing each label at the first of a few
candidate offsets where it overlaps no label placed before, and stays inside the axes, keeps every
name readable without hand-tuned positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from tutorial_utils.display.figure_check import agg_renderer

# (dx, dy) in points, alignment: right-above first, then the other sides, then further out
CANDIDATE_OFFSETS = [
    (dx * scale, dy * scale)
    for scale in (1, 2.6, 4.2)
    for dx, dy in ((5, 4), (5, -4), (-5, 4), (-5, -4), (0, 7), (0, -7))
]


def _horizontal(dx: float) -> str:
    return "left" if dx > 0 else "right" if dx < 0 else "center"


def _vertical(dy: float) -> str:
    return "bottom" if dy > 0 else "top"


def _overlap_area(first: Bbox, second: Bbox) -> float:
    meet = Bbox.intersection(first, second)
    return 0.0 if meet is None else meet.width * meet.height


def annotate_points(
    ax: Axes, points: Sequence[tuple[float, float, str]], fontsize: float = 7
) -> list[Annotation]:
    """Label each ``(x, y, text)`` at the first candidate offset where the label overlaps no
    earlier label and stays inside the axes (else where it overlaps least). Call it after the
    figure's layout is final (``tight_layout``): placement is measured in pixels."""
    renderer = agg_renderer(cast(Figure, ax.figure))  # the notebooks' axes are on a Figure
    inside = ax.get_window_extent(renderer)
    placed: list[Bbox] = []
    labels = []
    for x, y, text in points:
        best: tuple[float, Annotation, Bbox] | None = None
        for dx, dy in CANDIDATE_OFFSETS:
            label = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=fontsize,
                ha=_horizontal(dx),
                va=_vertical(dy),
            )
            box = label.get_window_extent(renderer)
            outside = box.width * box.height - _overlap_area(box, inside)
            cost = outside + sum(_overlap_area(box, other) for other in placed)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, label, box)
            else:
                label.remove()
            if cost == 0:
                break
        assert best is not None  # CANDIDATE_OFFSETS is not empty
        placed.append(best[2])
        labels.append(best[1])
    return labels
