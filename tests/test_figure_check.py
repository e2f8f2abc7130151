"""The readability check finds what a learner would see as broken, and passes what is not."""

from __future__ import annotations

import io
import math

import matplotlib
import pytest
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure

from tutorial_utils.display.figure_check import (
    UnreadableFigure,
    agg_renderer,
    check_figures_when_shown,
    figure_problems,
)

matplotlib.use("Agg")


def clean_figure() -> Figure:
    figure = Figure(figsize=(6, 4))
    ax = figure.subplots()
    ax.bar(["a", "b"], [1.0, 2.0], label="bars")
    ax.plot([0, 1], [0.5, 1.5], marker="o", label="line")
    ax.set_ylim(0, 2.5)
    ax.set_xlabel("strategy")
    ax.set_ylabel("peak (MiB)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle("clean")
    figure.tight_layout()
    return figure


def test_a_clean_figure_has_no_problems() -> None:
    assert figure_problems(clean_figure()) == []


def test_a_bar_above_the_y_limit_is_reported_as_cut_off() -> None:
    figure = clean_figure()
    figure.axes[0].set_ylim(0, 1.5)  # the 2.0 bar now ends above the axes
    problems = figure_problems(figure)
    assert any("bar" in problem and "cut off" in problem for problem in problems), problems


def test_a_point_outside_the_x_limit_is_reported() -> None:
    figure = clean_figure()
    figure.axes[0].set_xlim(-0.5, 0.5)
    assert any("line 'line' is cut off" in problem for problem in figure_problems(figure))


def test_overlapping_annotations_are_reported_and_separated_ones_are_not() -> None:
    figure = clean_figure()
    ax = figure.axes[0]
    ax.annotate("planned, budget 140.8 MiB", (0, 1.0))
    ax.annotate("planned, budget 154.3 MiB", (0.02, 1.02))
    problems = figure_problems(figure)
    assert any("overlaps" in problem and "154.3" in problem for problem in problems), problems
    ax.texts[-1].set_position((0.02, 2.2))
    assert not any("overlaps" in problem for problem in figure_problems(figure))


def test_crowded_rotated_tick_labels_overlap_but_spaced_ones_do_not() -> None:
    figure = Figure(figsize=(4, 3))
    ax = figure.subplots()
    names = [f"features.{i}" for i in range(40)]
    ax.bar(names, range(40))
    ax.set_ylim(0, 45)
    ax.tick_params(axis="x", rotation=45)
    assert any("overlaps" in problem for problem in figure_problems(figure))
    ax.set_xticks(range(0, 40, 8), names[::8])
    figure.tight_layout()
    assert not any("overlaps" in problem for problem in figure_problems(figure))


def test_a_legend_inside_the_axes_over_the_data_is_reported() -> None:
    figure = clean_figure()
    ax = figure.axes[0]
    ax.legend(loc="center")  # over the bars' bodies
    assert any("legend covers" in problem for problem in figure_problems(figure))


def test_printing_an_unreadable_figure_raises_once_the_check_is_on(monkeypatch) -> None:
    monkeypatch.setattr(FigureCanvasBase, "print_figure", FigureCanvasBase.print_figure)
    check_figures_when_shown()
    check_figures_when_shown()  # idempotent: one wrapper, not two
    clean_figure().savefig(io.BytesIO(), format="png")
    figure = clean_figure()
    figure.axes[0].set_ylim(0, 1.0)
    with pytest.raises(UnreadableFigure, match="'clean' is hard to read: .*bar 'bars' is cut off"):
        figure.savefig(io.BytesIO(), format="png")


def test_labels_of_nearly_coincident_points_are_placed_apart() -> None:
    from tutorial_utils.display.labels import annotate_points

    figure = Figure(figsize=(5, 3.5))
    ax = figure.subplots()
    points = [(1.0, 1.0, "none"), (1.0, 1.003, "selective, 9 regions"), (1.001, 0.998, "uniform 2")]
    ax.scatter([p[0] for p in points], [p[1] for p in points])
    ax.set_xlim(0.9, 1.1)
    ax.set_ylim(0.9, 1.1)
    ax.set_xlabel("time")
    ax.set_ylabel("peak (MiB)")
    figure.tight_layout()
    for x, y, text in points:  # the fixed offset used before: labels on top of each other
        ax.annotate(text, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=7)
    assert any("overlaps" in problem for problem in figure_problems(figure))
    for label in list(ax.texts):
        label.remove()
    labels = annotate_points(ax, points)
    assert [label.get_text() for label in labels] == [p[2] for p in points]
    assert figure_problems(figure) == []


def test_a_label_sits_nearest_its_own_point_or_has_a_leader_line_to_it() -> None:
    from matplotlib.text import Text

    from tutorial_utils.display.labels import NEAREST_RING, annotate_points

    figure = Figure(figsize=(5, 3.5))
    ax = figure.subplots()
    labelled = [(1.0, 1.0, "uniform 2"), (1.0, 1.002, "uniform 3")]
    # unlabelled neighbours (other families) where the nearest labels would sit
    unlabelled = [(1.0 + dx, 1.0 + dy) for dx in (-0.004, 0.004) for dy in (-0.003, 0.003, 0.005)]
    xs, ys = zip(*([(x, y) for x, y, _ in labelled] + unlabelled), strict=True)
    ax.scatter(xs, ys)
    ax.set_xlim(0.95, 1.05)
    ax.set_ylim(0.95, 1.05)
    figure.tight_layout()
    labels = annotate_points(ax, labelled)
    renderer = agg_renderer(figure)
    markers = ax.transData.transform(list(zip(xs, ys, strict=True)))
    for label, (x, y, _) in zip(labels, labelled, strict=True):
        box = Text.get_window_extent(label, renderer)  # the text alone, without its leader line
        gaps = [
            math.hypot(max(box.x0 - px, 0, px - box.x1), max(box.y0 - py, 0, py - box.y1))
            for px, py in markers
        ]
        own = gaps[[p[:2] for p in labelled].index((x, y))]
        nearest_is_own = min(gaps) == own
        far = math.hypot(*label.xyann) > NEAREST_RING
        assert (label.arrow_patch is not None) == (far or not nearest_is_own), label.get_text()
    assert any(label.arrow_patch is not None for label in labels)  # the neighbours force one out
    assert figure_problems(figure) == []
