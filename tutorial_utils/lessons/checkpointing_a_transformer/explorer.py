"""Memory against recompute, with sliders: every strategy dry-run at the batch and sequence you pick.

A dry run is a prediction (exact tensor bytes and FLOPs on the meta device, no time), so the
figure and the table say so. The models are the notebook's own, built once on meta."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.widgets import RunPanel, int_slider, wide_layout
from tutorial_utils.estimate.models import decoder_blocks
from tutorial_utils.lessons.checkpointing_a_transformer.models import CausalLM
from tutorial_utils.lessons.checkpointing_a_transformer.strategies import (
    LMStrategyRow,
    rows_table,
    strategy_rows,
    transformer_menu,
)

__all__ = ["StrategyExplorer", "plot_strategies"]


def plot_strategies(rows: Sequence[LMStrategyRow], title: str) -> Figure:
    """Two bars per strategy: its predicted peak and the FLOPs it recomputes (dry runs)."""
    if any(row["recompute_gflop"] is None for row in rows):
        raise ValueError("rows without FLOPs: plot the rows of a dry run (a model on meta)")
    names = [row["checkpointing"] for row in rows][::-1]  # "none" on top
    fig, (peak_ax, flops_ax) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    plt.close(fig)  # detached: shown once by the panel
    peak_ax.barh(names, [row["tracked_peak_mib"] for row in rows][::-1], color="#4c72b0")
    peak_ax.set_xlabel("tracked peak (MiB, predicted)")
    flops_ax.barh(names, [row["recompute_gflop"] for row in rows][::-1], color="#c44e52")
    flops_ax.set_xlabel("recomputed GFLOP per step (counted)")
    for ax in (peak_ax, flops_ax):
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlim(left=0)
    fig.suptitle(f"{title}\n{rows[0]['source']} · {figure_subtitle('meta')}", fontsize=10)
    fig.tight_layout()
    return fig


class StrategyExplorer:
    """A model, a batch and a sequence length; Run dry-runs every strategy of the lesson's menu
    there (cached per choice) and returns the bars and the table."""

    def __init__(
        self,
        models: Mapping[str, CausalLM],
        *,
        batch: int,
        sequence: int,
        max_batch: int = 64,
        max_sequence: int = 16384,
    ):
        self.models = dict(models)
        self.computed: dict[tuple[str, int, int], list[LMStrategyRow]] = {}
        names = list(self.models)
        controls = {
            "batch": int_slider("batch", batch, 1, max_batch),
            "sequence": int_slider("sequence length (tokens)", sequence, 2, max_sequence),
            "model": widgets.Dropdown(
                options=names, value=names[0], description="model", layout=wide_layout()
            ),
        }
        self.panel = RunPanel(controls, self.compute, title="Every strategy, dry-run (predicted)")
        self.widget = self.panel.widget

    def rows(self, model: str, batch: int, sequence: int) -> list[LMStrategyRow]:
        """Every strategy's row at this size (dry runs, computed once per choice)."""
        lm = self.models[model]
        context = getattr(lm.config, "max_position_embeddings", None)
        if context is not None and sequence > context:
            raise ValueError(f"{model} reads at most {context:,} tokens (its context)")
        key = (model, batch, sequence)
        if key not in self.computed:
            menu = transformer_menu(len(decoder_blocks(lm)))
            self.computed[key] = strategy_rows(lm, menu, batch, sequence)
        return self.computed[key]

    def compute(self, batch: int, sequence: int, model: str) -> tuple[Figure, str]:
        rows = self.rows(model, batch, sequence)
        heading = f"{model}, batch {batch} x {sequence}"
        return plot_strategies(rows, heading), f"{heading}\n{rows_table(rows)}"
