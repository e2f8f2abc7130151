"""Memory against recompute: the strategies' scatter with its Pareto front, and the sliders."""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.widgets import RunPanel, batch_size_slider, int_slider
from tutorial_utils.estimate.models import (
    decoder_blocks,
)
from tutorial_utils.lessons.checkpointing_a_transformer.strategies import (
    strategy_menu,
    strategy_rows,
)
from tutorial_utils.lessons.choosing_what_to_checkpoint import pareto_front

KIND_STYLES = {
    "none": ("black", "s"),
    "full": ("#4c72b0", "o"),
    "every-n": ("#8c8c8c", "D"),
    "selective": ("#55a868", "^"),
    "offload": ("#8172b3", "v"),
}


def plot_strategies(rows: Sequence[dict], title: str, highlight: str | None = None) -> Figure:
    """Peak against recompute FLOPs for every strategy (dry runs), the Pareto front joined."""
    if any(row["recompute_gflop"] is None for row in rows):
        raise ValueError("rows without FLOPs: plot the rows of a dry run (a model on meta)")
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    plt.close(fig)
    for kind, (color, marker) in KIND_STYLES.items():
        points = [row for row in rows if row["kind"] == kind]
        if points:
            ax.scatter(
                [r["recompute_gflop"] for r in points],
                [r["tracked_peak_mb"] for r in points],
                c=color,
                marker=marker,
                s=50,
                label=kind,
                zorder=3,
            )
    front = pareto_front(rows, "recompute_gflop", "tracked_peak_mb")
    ax.step(
        [r["recompute_gflop"] for r in front],
        [r["tracked_peak_mb"] for r in front],
        where="post",
        color="#c44e52",
        alpha=0.4,
        label="Pareto front",
    )
    labels: dict[tuple[float, float], list[str]] = {}  # strategies on the same point share one
    for row in rows:
        point = (row["recompute_gflop"], row["tracked_peak_mb"])
        labels.setdefault(point, []).append(row["checkpointing"])
    for point, names in labels.items():
        chosen = highlight in names
        ax.annotate(
            " = ".join(names),
            point,
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8 if chosen else 7,
            fontweight="bold" if chosen else "normal",
        )
        if chosen:
            ax.scatter(
                [point[0]],
                [point[1]],
                s=260,
                facecolors="none",
                edgecolors="#c44e52",
                linewidths=2,
                zorder=4,
            )
    ax.set_xlabel("recompute GFLOP per step (counted in the dry run)")
    ax.set_ylabel("tracked peak (MiB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"{title}\n{rows[0]['source']} · {figure_subtitle('meta')}", fontsize=10)
    fig.tight_layout()
    return fig


class StrategyExplorer:
    """Sliders for sequence length, batch and strategy over dry runs of one model on meta.

    ``compute(sequence, batch, strategy)`` runs every strategy at that size once (cached), and
    returns the Pareto plot with the chosen strategy ringed and its row against "none".
    """

    def __init__(
        self, model: nn.Module, title: str, *, sequence: int, batch: int, max_sequence: int
    ):
        self.model = model
        self.title = title
        self.menu = strategy_menu(len(decoder_blocks(model)))
        self.computed: dict[tuple[int, int], list[dict]] = {}
        names = [s.name for s in self.menu]
        strategy = widgets.SelectionSlider(
            options=names,
            value=names[2],
            description="strategy",
            continuous_update=False,
            style={"description_width": "initial"},
            layout=widgets.Layout(width="100%", max_width="640px"),
        )
        controls = {
            "sequence": int_slider("sequence length (tokens)", sequence, 64, max_sequence),
            "batch": batch_size_slider(max_batch=32, value=batch),
            "strategy": strategy,
        }
        self.panel = RunPanel(controls, self.compute, title=title)
        self.widget = self.panel.widget

    def rows(self, sequence: int, batch: int) -> list[dict]:
        key = (sequence, batch)
        if key not in self.computed:
            self.computed[key] = strategy_rows(self.model, self.menu, batch, sequence)
        return self.computed[key]

    def compute(self, sequence: int, batch: int, strategy: str) -> tuple[Figure, str]:
        rows = self.rows(sequence, batch)
        chosen = next(row for row in rows if row["checkpointing"] == strategy)
        figure = plot_strategies(
            rows, f"{self.title}: batch {batch}, sequence {sequence}", highlight=strategy
        )
        text = (
            f"{strategy}: peak {chosen['tracked_peak_mb']:,.0f} MiB ({chosen['peak_ratio']:.2f}x "
            f"none), recompute {chosen['recompute_gflop']:,.0f} GFLOP "
            f"({chosen['flops_ratio']:.2f}x the step's FLOPs without checkpointing)"
        )
        return figure, text
