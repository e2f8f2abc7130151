"""Notebook 02's panel: the flat layout's segment counts, at the article's size or this machine's."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.checkpointing.segments import (
    validate_segments,
)
from tutorial_utils.display.plotting import figure_subtitle, plot_breakdown, plot_segment_sweep
from tutorial_utils.lessons.vgg16_dogcat.activations import (
    dry_run_sweep,
    format_sweep,
    sequential_splits,
)
from tutorial_utils.measurement.step import SweepRecord, sweep_strategies

__all__ = ["ARTICLE_SCALE", "MACHINE_SCALE", "SCALES", "SegmentExplorer", "sqrt_rule"]

# -- the flat layout, explored ---------------------------------------------------------------


ARTICLE_SCALE = "the article's size: 224 px (dry run)"
MACHINE_SCALE = "this machine: the profile's size (real steps)"
SCALES = (ARTICLE_SCALE, MACHINE_SCALE)


@dataclass
class SegmentExplorer:
    """Training steps of one model at (scale, segments, batch size), kept as they are measured.

    Two scales: real steps on this machine at the profile's size (``make_batch``: memory and
    time), or dry runs at the article's 224 px (exact memory and FLOPs, any batch, in a fraction
    of a second). ``show(segments, batch_size, scale)`` measures what is missing (the chosen
    count, the plain run and ``initial_counts``) and returns the table, the sweep figure and the
    breakdown of the chosen setting against the plain run: what the notebook's panel displays.
    """

    model: nn.Sequential
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    initial_counts: Sequence[int] = (0, 2)
    records: dict[tuple[str, int, int], SweepRecord] = field(default_factory=dict)

    def measure(
        self, segment_counts: Sequence[int], batch_size: int, scale: str = MACHINE_SCALE
    ) -> list[SweepRecord]:
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
        missing = [s for s in segment_counts if (scale, s, batch_size) not in self.records]
        if missing:
            for segments in missing:
                validate_segments(self.model, segments)
            if scale == ARTICLE_SCALE:
                measured = dry_run_sweep(self.model, batch_size, missing)
            else:
                inputs, targets = self.make_batch(batch_size)
                measured = sweep_strategies(self.model, inputs, targets, sequential_splits(missing))
            for segments, record in zip(missing, measured, strict=True):  # one record per count
                self.records[(scale, segments, batch_size)] = record
        return [self.records[(scale, s, batch_size)] for s in segment_counts]

    def measured_at(self, batch_size: int, scale: str) -> list[SweepRecord]:
        return [
            r
            for (c, _, b), r in sorted(self.records.items(), key=lambda item: item[0][1])
            if b == batch_size and c == scale
        ]

    def show(
        self, segments: int, batch_size: int, scale: str = MACHINE_SCALE
    ) -> tuple[str, Figure, Figure]:
        self.measure(sorted({0, segments, *self.initial_counts}), batch_size, scale)
        measured = self.measured_at(batch_size, scale)
        plain = self.records[(scale, 0, batch_size)]
        size = "224 px" if scale == ARTICLE_SCALE else "the profile's size"
        subtitle = f"flat VGG16, {size}, batch {batch_size} · {figure_subtitle(plain.device)}"
        sweep = plot_segment_sweep(measured, n_modules=len(self.model), subtitle=subtitle)
        breakdown = plot_breakdown(
            {
                "no checkpointing": plain,
                f"segments={segments}": self.records[(scale, segments, batch_size)],
            },
            subtitle=subtitle,
        )
        text = f"batch {batch_size}, {scale}\n" + format_sweep(measured, chosen=segments)
        return text, sweep, breakdown


def sqrt_rule(n_modules: int) -> int:
    """The segment count nearest sqrt(n), notebook 01's optimum for equal layers."""
    return max(2, round(math.sqrt(n_modules)))
