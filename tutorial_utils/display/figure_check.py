"""Is a figure readable? Overlapping labels, clipped data and legends over data, found by rendering.

A learner sees a figure at the size JupyterLab shows it; a label drawn over another or a bar cut
off by its axis breaks the figure's point without any error. `figure_problems` renders a figure
with Agg and reads the renderer's bounding boxes. `check_figures_when_shown` makes every figure a
process prints (notebook display, `savefig`) raise `UnreadableFigure` instead: the test command
turns it on for the notebooks (`TUTORIAL_CHECK_FIGURES=1`), so every figure they draw is checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backend_bases import FigureCanvasBase, RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import Collection, PathCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from numpy.typing import ArrayLike

__all__ = [
    "agg_renderer",
    "CHECK_FIGURES_ENV",
    "check_figures_when_shown",
    "figure_problems",
    "UnreadableFigure",
]

CHECK_FIGURES_ENV = "TUTORIAL_CHECK_FIGURES"  # "1": every figure shown is checked
TOLERANCE_PX = 1.0  # overlaps or overhangs smaller than this are rendering noise, not problems


class UnreadableFigure(ValueError):
    """A figure that would be shown with overlapping labels or clipped data."""


def figure_problems(figure: Figure) -> list[str]:
    """What makes ``figure`` hard to read, one line each; empty when nothing does."""
    renderer = agg_renderer(figure)
    problems = _overlapping_texts(figure, renderer)
    for ax in figure.axes:
        if ax.get_visible():
            problems += _clipped_data(ax, renderer) + _legend_over_data(ax, renderer)
    return problems


def check_figures_when_shown() -> None:
    """From now on, printing an unreadable figure (display or savefig) raises `UnreadableFigure`."""
    if getattr(FigureCanvasBase.print_figure, "checks_figures", False):
        return
    original = FigureCanvasBase.print_figure

    def print_checked_figure(self: FigureCanvasBase, *args, **kwargs):
        problems = figure_problems(self.figure)
        if problems:
            title = _figure_title(self.figure)
            raise UnreadableFigure(f"figure {title!r} is hard to read: " + "; ".join(problems))
        return original(self, *args, **kwargs)

    setattr(print_checked_figure, "checks_figures", True)  # noqa: B010 (a mark on a function)
    setattr(FigureCanvasBase, "print_figure", print_checked_figure)  # noqa: B010 (a patch)


def agg_renderer(figure: Figure) -> RendererBase:
    """An Agg renderer that has drawn ``figure`` (its own canvas left in place): text extents
    measured with it are the ones a PNG of the figure shows."""
    canvas = figure.canvas
    renderer = FigureCanvasAgg(figure).get_renderer()
    try:
        figure.draw(renderer)
    finally:
        figure.set_canvas(canvas)
    return renderer


def _figure_title(figure: Figure) -> str:
    heading = getattr(figure, "_suptitle", None)  # get_suptitle() is matplotlib 3.8+
    suptitle = heading.get_text() if heading else ""
    if suptitle:
        return suptitle.splitlines()[0]
    return next((ax.get_title() for ax in figure.axes if ax.get_title()), "untitled")


def _drawn_texts(figure: Figure) -> Iterator[Text]:
    """Every text the figure draws: tick labels only for ticks inside the view, none empty."""
    tick_labels: set[int] = set()
    drawn: list[Text] = []
    for ax in figure.axes:
        for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            low, high = min(low, high), max(low, high)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                labels = (tick.label1, tick.label2)
                tick_labels.update(id(label) for label in labels)
                span = (high - low) * 1e-9
                if ax.get_visible() and low - span <= tick.get_loc() <= high + span:
                    drawn += [label for label in labels if label.get_visible()]
    for text in figure.findobj(Text):
        if id(text) not in tick_labels and text.get_visible():
            drawn.append(text)
    return (text for text in drawn if text.get_text().strip() and _ancestors_visible(text))


def _ancestors_visible(text: Text) -> bool:
    axes = text.axes
    if axes is not None and not axes.get_visible():
        return False
    legend = _legend_of(text)
    return legend is None or legend.get_visible()


def _legend_of(text: Text) -> Legend | None:
    for ax in text.figure.axes if text.figure else []:
        legend = ax.get_legend()
        if legend is not None and any(t is text for t in legend.get_texts()):
            return legend
    for legend in text.figure.legends if text.figure else []:
        if any(t is text for t in legend.get_texts()):
            return legend
    return None


def _corners(text: Text, renderer: RendererBase) -> np.ndarray:
    """The four corners of the text's own (rotated) box, in display pixels (an annotation's
    leader line is not text: it may pass near other labels)."""
    box = Text.get_window_extent(text, renderer)
    angle = math.radians(text.get_rotation() % 180)
    if "\n" in text.get_text() or min(abs(math.sin(angle)), abs(math.cos(angle))) < 1e-6:
        return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    width, height, _ = renderer.get_text_width_height_descent(
        text.get_text(), text.get_fontproperties(), ismath=False
    )
    along = np.array([math.cos(angle), math.sin(angle)])
    across = np.array([-math.sin(angle), math.cos(angle)])
    center = np.array([(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2])
    half_w, half_h = along * width / 2, across * height / 2
    return np.array(
        [
            center - half_w - half_h,
            center + half_w - half_h,
            center + half_w + half_h,
            center - half_w + half_h,
        ]
    )


def _boxes_overlap(first: np.ndarray, second: np.ndarray) -> bool:
    """Separating-axis test of two convex quadrilaterals, with `TOLERANCE_PX` of slack."""
    for corners in (first, second):
        for i in range(2):
            edge = corners[i + 1] - corners[i]
            normal = np.array([-edge[1], edge[0]])
            length = np.hypot(*normal)
            if length == 0:
                continue
            normal /= length
            a, b = first @ normal, second @ normal
            if min(a.max(), b.max()) - max(a.min(), b.min()) <= TOLERANCE_PX:
                return False
    return True


def _overlapping_texts(figure: Figure, renderer: RendererBase) -> list[str]:
    texts = list(_drawn_texts(figure))
    corners = [_corners(text, renderer) for text in texts]
    problems = []
    for i, first in enumerate(texts):
        for j in range(i + 1, len(texts)):
            if _boxes_overlap(corners[i], corners[j]):
                problems.append(
                    f"text {_short(first)!r} overlaps {_short(texts[j])!r}{_where(first)}"
                )
    return problems


def _short(text: Text) -> str:
    words = " ".join(text.get_text().split())
    return words if len(words) <= 40 else words[:37] + "..."


def _where(artist) -> str:
    title = artist.axes.get_title() if getattr(artist, "axes", None) is not None else ""
    return f" (in axes {title!r})" if title else ""


def _inside(points: np.ndarray, box: Bbox) -> np.ndarray:
    """Which finite display points lie within ``box`` widened by `TOLERANCE_PX`."""
    x, y = points[:, 0], points[:, 1]
    return (
        (x >= box.x0 - TOLERANCE_PX)
        & (x <= box.x1 + TOLERANCE_PX)
        & (y >= box.y0 - TOLERANCE_PX)
        & (y <= box.y1 + TOLERANCE_PX)
    )


def _finite(points: ArrayLike) -> np.ndarray:
    points = np.asarray(points, dtype=float).reshape(-1, 2)
    return points[np.isfinite(points).all(axis=1)]


def _data_points(ax: Axes, renderer: RendererBase) -> Iterator[tuple[str, np.ndarray, bool]]:
    """(name, display points, clipped by the axes) for every line, bar and scatter in ``ax``."""
    for line in ax.lines:
        xy = np.asarray(line.get_xydata())
        if line.get_visible() and len(xy):
            name = f"line {line.get_label()!r}"
            points = line.get_transform().transform(_finite(xy))
            yield name, points, line.get_clip_on()
    for patch in ax.patches:
        if patch.get_visible() and isinstance(patch, Rectangle):
            box = patch.get_window_extent(renderer)
            x_mid = (box.x0 + box.x1) / 2
            points = _finite([[x_mid, box.y0], [x_mid, box.y1], [box.x0, box.y1], [box.x1, box.y1]])
            yield _bar_name(patch), points, patch.get_clip_on()
    for collection in ax.collections:
        if collection.get_visible():
            yield _collection_points(ax, collection)


def _bar_name(patch: Rectangle) -> str:
    """A bar's legend label, or its bar group's (``ax.bar(..., label=...)`` labels the group)."""
    labels = [patch.get_label()]
    if patch.axes is not None:
        labels += [
            c.get_label() for c in patch.axes.containers if patch in getattr(c, "patches", ())
        ]
    label = next((str(label) for label in labels if label and not str(label).startswith("_")), None)
    return f"bar {label!r}" if label else "bar (unlabelled)"


def _collection_points(ax: Axes, collection: Collection) -> tuple[str, np.ndarray, bool]:
    name = f"{type(collection).__name__} {collection.get_label()!r}"
    if isinstance(collection, PathCollection):
        offsets = _finite(collection.get_offsets())
        points = collection.get_offset_transform().transform(offsets) if len(offsets) else offsets
    else:
        limits = collection.get_datalim(ax.transData)
        corners = [[limits.x0, limits.y0], [limits.x1, limits.y1]] if limits.width >= 0 else []
        points = ax.transData.transform(_finite(corners)) if corners else np.empty((0, 2))
    return name, _finite(points), collection.get_clip_on()


def _clipped_data(ax: Axes, renderer: RendererBase) -> list[str]:
    problems = []
    for name, points, clipped in _data_points(ax, renderer):
        if clipped and len(points) and not _inside(points, ax.bbox).all():
            problems.append(f"{name} is cut off by its axes' limits{_where_axes(ax)}")
    return problems


def _where_axes(ax: Axes) -> str:
    return f" (axes {ax.get_title()!r})" if ax.get_title() else ""


def _legend_over_data(ax: Axes, renderer: RendererBase) -> list[str]:
    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return []
    box = legend.get_window_extent(renderer)
    if not box.overlaps(ax.bbox):
        return []
    covered = [
        name
        for name, points, _ in _data_points(ax, renderer)
        if not name.startswith("bar") and _inside(points, box).any()
    ]
    for patch in ax.patches:
        if patch.get_visible() and isinstance(patch, Rectangle):
            bar = patch.get_window_extent(renderer)
            if bar.width > 0 and bar.height > 0 and _overlap_px(bar, box) > TOLERANCE_PX:
                covered.append(_bar_name(patch))
    return [f"the legend covers {name}{_where_axes(ax)}" for name in dict.fromkeys(covered)]


def _overlap_px(first: Bbox, second: Bbox) -> float:
    """The smaller side of the two boxes' intersection (0 when they do not meet)."""
    meet = Bbox.intersection(first, second)
    return 0.0 if meet is None else min(meet.width, meet.height)
