"""Point labels that do not collide: each goes to the first nearby spot where it fits.

Strategies with nearly the same memory and time sit on top of each other in a Pareto plot, and a
fixed offset draws their names over one another. Placing each label at the first of a few
candidate offsets where it overlaps no label placed before, stays inside the axes, and lies nearer
its own point than any other, keeps every name readable without hand-tuned positions. A label
that had to go further out, or that still lies nearer a neighbour, gets a thin leader line to its
point, so it is not read as the neighbour's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from tutorial_utils.display.figure_check import agg_renderer

__all__ = ["annotate_points", "NEAREST_RING"]

# (dx, dy) in points, alignment: right-above first, then the other sides, then further out
CANDIDATE_OFFSETS = [
    (dx * scale, dy * scale)
    for scale in (1, 2.6, 4.2)
    for dx, dy in ((5, 4), (5, -4), (-5, 4), (-5, -4), (0, 7), (0, -7))
]
NEAREST_RING = 8.0  # points: offsets up to this sit beside their point and need no leader line
SAME_POINT_PX = 1.0  # markers this close are drawn on top of each other and share one label
LEADER_LINE = {"arrowstyle": "-", "color": "0.45", "linewidth": 0.6, "shrinkA": 0, "shrinkB": 2}


def _horizontal(dx: float) -> str:
    return "left" if dx > 0 else "right" if dx < 0 else "center"


def _vertical(dy: float) -> str:
    return "bottom" if dy > 0 else "top"


def _overlap_area(first: Bbox, second: Bbox) -> float:
    meet = Bbox.intersection(first, second)
    return 0.0 if meet is None else meet.width * meet.height


def _data_points_px(ax: Axes) -> np.ndarray:
    """Every marker the axes draw (scatter offsets, line vertices with markers), in pixels."""
    found = [np.empty((0, 2))]
    for collection in ax.collections:
        if not isinstance(collection, PathCollection):  # scatter's markers, not filled areas
            continue
        offsets = np.asarray(collection.get_offsets(), dtype=float).reshape(-1, 2)
        found.append(collection.get_offset_transform().transform(offsets))
    for line in ax.lines:
        if line.get_marker() not in (None, "None", "", " "):
            found.append(line.get_transform().transform(np.asarray(line.get_xydata(), float)))
    return np.concatenate(found)


def _distances_to_box(box: Bbox, points: np.ndarray) -> np.ndarray:
    """Each point's distance (pixels) to the nearest edge of ``box``, 0 inside it."""
    dx = np.maximum.reduce([box.x0 - points[:, 0], np.zeros(len(points)), points[:, 0] - box.x1])
    dy = np.maximum.reduce([box.y0 - points[:, 1], np.zeros(len(points)), points[:, 1] - box.y1])
    return np.hypot(dx, dy)


def _strangers_nearer(box: Bbox, own: np.ndarray, others: np.ndarray) -> int:
    """How many other points sit nearer the label than its own point: a reader would pair the
    label with the nearest marker."""
    if not len(others):
        return 0
    own_distance = _distances_to_box(box, own.reshape(1, 2))[0]
    return int(np.count_nonzero(_distances_to_box(box, others) < own_distance))


def _annotate(
    ax: Axes,
    text: str,
    point: tuple[float, float],
    offset: tuple[float, float],
    fontsize: float,
    leader_line: bool = False,
) -> Annotation:
    dx, dy = offset
    return ax.annotate(
        text,
        point,
        xytext=offset,
        textcoords="offset points",
        fontsize=fontsize,
        ha=_horizontal(dx),
        va=_vertical(dy),
        arrowprops=LEADER_LINE if leader_line else None,
    )


def annotate_points(
    ax: Axes, points: Sequence[tuple[float, float, str]], fontsize: float = 7
) -> list[Annotation]:
    """Label each ``(x, y, text)`` at the first candidate offset where the label overlaps no
    earlier label, stays inside the axes and is nearer its point than any other marker (else
    where it overlaps least, then has the fewest nearer markers, with a leader line). Call it
    after the figure's layout is final (``tight_layout``) and its data are drawn: placement is
    measured in pixels."""
    renderer = agg_renderer(cast(Figure, ax.figure))  # the notebooks' axes are on a Figure
    inside = ax.get_window_extent(renderer)
    markers = _data_points_px(ax)
    placed: list[Bbox] = []
    labels = []
    for x, y, text in points:
        own = ax.transData.transform((x, y))
        others = markers[np.hypot(*(markers - own).T) > SAME_POINT_PX]
        # cost: (area over other labels or outside the axes, other points nearer than its own);
        # a label that cannot be read is worse than one that needs a leader line
        best: tuple[tuple[float, int], Annotation, Bbox, tuple[float, float]] | None = None
        for dx, dy in CANDIDATE_OFFSETS:
            label = _annotate(ax, text, (x, y), (dx, dy), fontsize)
            box = label.get_window_extent(renderer)
            outside = box.width * box.height - _overlap_area(box, inside)
            cost = (
                outside + sum(_overlap_area(box, other) for other in placed),
                _strangers_nearer(box, own, others),
            )
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, label, box, (dx, dy))
            else:
                label.remove()
            if cost == (0, 0):
                break
        assert best is not None  # CANDIDATE_OFFSETS is not empty
        (_, strangers), label, box, (dx, dy) = best
        if strangers or np.hypot(dx, dy) > NEAREST_RING:  # draw the line back to its point
            label.remove()
            label = _annotate(ax, text, (x, y), (dx, dy), fontsize, leader_line=True)
        placed.append(box)
        labels.append(label)
    return labels
