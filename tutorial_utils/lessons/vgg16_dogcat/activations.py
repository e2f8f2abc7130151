"""Notebook 02, section 2 and Going deeper: a step op by op, where VGG16 keeps its activations
(measured by ``measurement.saved_tensors.saved_activations``, drawn here), dry-run sweeps."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.checkpointing.strategy import Strategy, equal_segments
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.measurement.dry_run import on_meta
from tutorial_utils.measurement.saved_tensors import ActivationAccount
from tutorial_utils.measurement.step import (
    Recording,
    StepReport,
    SweepRecord,
    measure_step,
    sweep_strategies,
)
from tutorial_utils.units import MiB

__all__ = [
    "ARTICLE_BATCH",
    "ARTICLE_INPUT",
    "after_forward_bytes",
    "article_batch",
    "best_uniform_split",
    "checkpointed_flops_ratio",
    "dry_run_sweep",
    "format_sweep",
    "plot_saved_activations",
    "sequential_splits",
    "step_timelines",
]

# -- where the activations sit ---------------------------------------------------------------


def plot_saved_activations(accounts: dict[str, ActivationAccount]) -> Figure:
    """Saved activation MiB per top-level module, one panel per input size."""
    fig, axes = plt.subplots(1, len(accounts), figsize=(6.5 * len(accounts), 4.2), squeeze=False)
    plt.close(fig)
    for ax, (title, account) in zip(axes[0], accounts.items(), strict=True):
        values = [layer.saved_bytes / MiB for layer in account.layers]
        colors = [_KIND_COLORS.get(layer.kind, "#777777") for layer in account.layers]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xlabel("top-level module index (flat layout)")
        ax.set_ylabel("saved for backward (MiB)")
        ax.set_title(f"{title}: {account.total_saved_bytes / MiB:.1f} MiB in all", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _KIND_COLORS.values()]
    axes[0][-1].legend(handles, list(_KIND_COLORS), fontsize=8)
    fig.suptitle("Where VGG16 keeps its activations\n" + figure_subtitle(), fontsize=11)
    fig.tight_layout()
    return fig


_KIND_COLORS = {
    "Conv2d": "#4c72b0",
    "ReLU": "#dd8452",
    "MaxPool2d": "#55a868",
    "Linear": "#c44e52",
    "Dropout": "#8172b3",
}


# -- one step, op by op, and sweeps, as dry runs at the article's size ------------------------

ARTICLE_INPUT = (3, 224, 224)  # the first article's images
ARTICLE_BATCH = 64


def checkpointed_flops_ratio(
    model: nn.Sequential, batch_size: int, image_size: int, segments: int = 2
) -> float:
    """Checkpointed over plain FLOPs of one training step, by dry run at the given size: the
    slowdown to expect when time is proportional to work."""
    inputs = torch.empty(batch_size, 3, image_size, image_size, device="meta")
    targets = torch.empty(batch_size, dtype=torch.long, device="meta")
    reports = step_timelines(model, inputs, targets, (0, segments))
    plain, checkpointed = reports["segments=0"], reports[f"segments={segments}"]
    assert checkpointed.flops is not None and plain.flops is not None  # dry runs count FLOPs
    return checkpointed.flops.overhead_vs(plain.flops)


def step_timelines(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    segment_counts: Sequence[int] = (0, 2),
) -> dict[str, StepReport]:
    """One training step per segment count with its op-by-op timeline, keyed "segments=k".

    ``inputs`` on the meta device make these dry runs (the model is copied there); elsewhere they
    are real steps of ``model`` itself, on the inputs' device.
    """
    run = on_meta(model) if inputs.device.type == "meta" else model
    return {
        f"segments={segments}": measure_step(
            run,
            inputs,
            targets,
            equal_segments(segments, keep_batchnorm=False),
            time_step=False,
            recording=Recording(timeline=True),
        )
        for segments in segment_counts
    }


def after_forward_bytes(report: StepReport) -> int:
    """Live tracked bytes when the forward pass (and the loss) is done, from a step's timeline."""
    forward = [event.current_bytes for event in report.timeline or () if event.phase == "forward"]
    if not forward:
        raise ValueError(
            "no forward ops in the timeline: measure with recording=Recording(timeline=True)"
        )
    return forward[-1]


def article_batch(batch_size: int = ARTICLE_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the article's shape on the meta device: shapes only, no memory."""
    return (
        torch.empty(batch_size, *ARTICLE_INPUT, device="meta"),
        torch.empty(batch_size, dtype=torch.long, device="meta"),
    )


def dry_run_sweep(
    model: nn.Sequential, batch_size: int, segment_counts: Sequence[int]
) -> list[SweepRecord]:
    """``sweep_strategies`` at the article's 224 px on a meta copy of ``model``, one
    ``checkpoint_sequential`` split per count: exact bytes, FLOPs."""
    inputs, targets = article_batch(batch_size)
    return sweep_strategies(
        on_meta(model), inputs, targets, sequential_splits(segment_counts), device="meta"
    )


def sequential_splits(segment_counts: Sequence[int]) -> list[Strategy]:
    """``checkpoint_sequential(model, k, x)`` for each count ``k``, as strategies."""
    return [equal_segments(k, keep_batchnorm=False) for k in segment_counts]


def best_uniform_split(records: Sequence[SweepRecord]) -> SweepRecord:
    """The measured record with the lowest tracked peak (fewest segments on ties)."""
    return min(records, key=lambda r: (r.peak_bytes, r.strategy.segments))


def format_sweep(records: Sequence[SweepRecord], chosen: int | None = None) -> str:
    """A sweep as a table, ratios to its plain record; time measured, or FLOPs in a dry run."""
    plain = next(r for r in records if r.strategy.kind == "none")
    dry = plain.dry_run
    time_title = "GFLOP" if dry else "step s"
    ratio_title = "time/plain (FLOPs)" if dry else "time/plain"
    lines = [
        plain.source,
        f"{'segments':>8} {'peak MiB':>9} {'activations MiB':>15} {time_title:>8}"
        f" {'peak/plain':>11} {ratio_title:>19}",
    ]
    for record in sorted(records, key=lambda r: r.strategy.segments):
        if dry:
            assert record.flops is not None and plain.flops is not None  # dry runs count FLOPs
            work = f"{record.flops.total / 1e9:>8,.0f}"
            time_ratio = record.flops.overhead_vs(plain.flops)
        else:
            # sweep_strategies times every strategy of a real sweep
            assert record.seconds is not None and plain.seconds is not None
            work, time_ratio = f"{record.seconds:>8.2f}", record.seconds / plain.seconds
        mark = "  <- chosen" if record.strategy.segments == chosen else ""
        lines.append(
            f"{record.strategy.segments:>8} {record.peak_bytes / MiB:>9,.1f}"
            f" {record.breakdown['activations'] / MiB:>15,.1f} {work}"
            f" {record.peak_bytes / plain.peak_bytes:>11.3f} {time_ratio:>19.2f}{mark}"
        )
    return "\n".join(lines)
