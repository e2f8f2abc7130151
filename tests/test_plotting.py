"""Every figure renders headless from real measurements and labels its axes with units."""

from __future__ import annotations

import matplotlib
import pytest
import torch
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.display.figure_check import figure_problems
from tutorial_utils.display.plotting import (
    plot_breakdown,
    plot_histories,
    plot_segment_sweep,
)
from tutorial_utils.measurement.step import Recording, measure_step, sweep_strategies
from tutorial_utils.training.loop import EpochRecord, History

matplotlib.use("Agg")


def chain(n_blocks: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(n_blocks) for m in (nn.Linear(16, 16), nn.ReLU())])


def batch(size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, 16), torch.randint(0, 16, (size,))


def assert_labelled(figure: Figure) -> None:
    """Every axes has an x and a y label with a unit (or a count) in it, and a title names the profile."""
    assert isinstance(figure, Figure)
    assert "profile" in figure._suptitle.get_text()
    for ax in figure.axes:
        assert ax.get_ylabel()
        assert ax.get_xlabel() or ax.get_shared_x_axes().get_siblings(ax) != [ax]
        assert "(" in ax.get_ylabel()  # a unit, e.g. (MiB), (s), (%)
    figure.canvas.draw()  # really renders
    assert figure_problems(figure) == []  # and nothing overlaps or is cut off


def test_breakdown():
    inputs, targets = batch()
    reports = {
        f"segments={s}": measure_step(chain(), inputs, targets, equal_segments(s)) for s in (0, 4)
    }
    figure = plot_breakdown(reports)
    assert_labelled(figure)
    assert len(figure.axes[0].patches) == 4 * len(reports)  # one stacked piece per category


def test_segment_sweep_marks_sqrt_n():
    model = chain()
    records = sweep_strategies(model, *batch(), [equal_segments(k) for k in (0, 2, 4)])
    figure = plot_segment_sweep(records, n_modules=len(model))
    assert_labelled(figure)
    assert len(figure.axes) == 3  # memory and time axes, and the activation panel
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert any("sqrt(n) = 4.0" in text for text in legend)


def test_histories_three_panels():
    def history(label, scale):
        records = [
            EpochRecord(
                epoch=e,
                train_accuracy=None if e == 1 else 50.0 + e,
                train_loss=1.0 / e,
                val_accuracy=48.0 + e,
                val_loss=1.1 / e,
                seconds=scale * e,
                samples_per_second=100.0 / scale,
            )
            for e in (1, 2, 3)
        ]
        return History(label, records)

    figure = plot_histories({"plain": history("plain", 1.0), "checkpointed": history("ckpt", 1.3)})
    assert_labelled(figure)
    assert len(figure.axes) == 3


@pytest.mark.parametrize("plot", [plot_breakdown, plot_segment_sweep, plot_histories])
def test_empty_input_is_a_clear_error(plot):
    with pytest.raises(ValueError, match="empty"):
        plot({} if plot is not plot_segment_sweep else [])


def test_step_timelines_stack_categories_and_mark_phases():
    from tutorial_utils.display.plotting import plot_step_timelines

    model = chain()
    inputs, targets = batch()
    reports = {
        f"segments={s}": measure_step(
            model, inputs, targets, equal_segments(s), recording=Recording(timeline=True)
        )
        for s in (0, 4)
    }
    figure = plot_step_timelines(reports)
    assert "measured: real step on cpu" in figure._suptitle.get_text()
    memory_axes = [ax for ax in figure.axes if ax.get_title()]
    assert [ax.get_title() for ax in memory_axes] == list(reports)
    assert all(len(ax.collections) == 4 for ax in memory_axes)  # one stacked area per category
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "phase: recompute" in legend and "optimizer state" in legend
    figure.canvas.draw()
    with pytest.raises(ValueError, match=r"recording=Recording\(timeline=True\)"):
        plot_step_timelines({"plain": measure_step(model, inputs, targets)})
    with pytest.raises(ValueError, match="empty"):
        plot_step_timelines({})
