"""Notebook 02's panel: the flat VGG16's segment counts, at the article's size or this machine's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.segments import validate_segments
from tutorial_utils.checkpointing.strategy import Strategy, equal_segments
from tutorial_utils.display.plotting import figure_subtitle, plot_breakdown, plot_segment_sweep
from tutorial_utils.display.tables import text_table
from tutorial_utils.measurement.dry_run import on_meta
from tutorial_utils.measurement.step import SweepRecord, sweep_strategies
from tutorial_utils.units import MiB

__all__ = [
    "ARTICLE_SCALE",
    "MACHINE_SCALE",
    "SCALES",
    "SegmentExplorer",
    "Sizes",
    "dry_run_sweep",
    "format_sweep",
    "sizes_for",
]

ARTICLE_SCALE = "the article's size: 224 px (dry run)"
MACHINE_SCALE = "this machine: the profile's size (real steps)"
SCALES = (ARTICLE_SCALE, MACHINE_SCALE)


@dataclass(frozen=True)
class Sizes:
    """What notebook 02's panel measures first, fewer where the profile is small."""

    sweep_counts: tuple[int, ...]


def sizes_for(profile: Profile) -> Sizes:
    """The panel's first segment counts. (Section 1 sizes itself by device, so a learner's copy
    of its cells needs no profile.)"""
    if profile.name == "ci":
        return Sizes((0, 2, 6))
    if profile.name == "cpu":
        return Sizes((0, 2, 4, 6, 10))
    return Sizes((0, 2, 4, 6, 8, 10, 20))  # gpu and article


def _splits(segment_counts: Sequence[int]) -> list[Strategy]:
    """``checkpoint_sequential(model, k, x)`` for each count ``k``, as strategies."""
    return [equal_segments(k, keep_batchnorm=False) for k in segment_counts]


def dry_run_sweep(
    model: nn.Sequential, batch_size: int, segment_counts: Sequence[int]
) -> list[SweepRecord]:
    """One step per ``checkpoint_sequential`` count at the article's 224 px, as dry runs on a meta
    copy of ``model``: exact bytes and FLOPs, no time."""
    inputs = torch.empty(batch_size, 3, 224, 224, device="meta")
    targets = torch.empty(batch_size, dtype=torch.long, device="meta")
    return sweep_strategies(on_meta(model), inputs, targets, _splits(segment_counts), device="meta")


def format_sweep(records: Sequence[SweepRecord], chosen: int | None = None) -> str:
    """A sweep as a table, ratios to its plain record; time measured, or FLOPs in a dry run."""
    plain = next(r for r in records if r.strategy.kind == "none")
    rows = []
    for record in sorted(records, key=lambda r: r.strategy.segments):
        if plain.dry_run:
            assert record.flops is not None and plain.flops is not None  # dry runs count FLOPs
            work = f"{record.flops.total / 1e9:,.0f}"
            time_ratio = record.flops.overhead_vs(plain.flops)
        else:  # sweep_strategies times every step of a real sweep
            assert record.seconds is not None and plain.seconds is not None
            work, time_ratio = f"{record.seconds:.2f}", record.seconds / plain.seconds
        rows.append(
            (
                record.strategy.segments,
                f"{record.peak_bytes / MiB:,.1f}",
                f"{record.breakdown['activations'] / MiB:,.1f}",
                work,
                f"{record.peak_bytes / plain.peak_bytes:.3f}",
                f"{time_ratio:.2f}" + ("  <- chosen" if record.strategy.segments == chosen else ""),
            )
        )
    work_title, ratio_title = (
        ("GFLOP", "time/plain (FLOPs)") if plain.dry_run else ("step s", "time/plain")
    )
    header = ("segments", "peak MiB", "activations MiB", work_title, "peak/plain", ratio_title)
    return plain.source + "\n" + text_table(header, rows, "rrrrrl")


@dataclass
class SegmentExplorer:
    """Training steps of one model at (scale, segments, batch size), kept as they are measured.

    Two scales: real steps on this machine at the profile's size (``make_batch``: memory and
    time), or dry runs at the article's 224 px (exact memory and FLOPs, any batch, in a fraction
    of a second). ``show(segments, batch_size, scale)`` measures what is missing and returns what
    the panel displays: the table, the sweep figure and the chosen count's breakdown.
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
                measured = sweep_strategies(self.model, inputs, targets, _splits(missing))
            for segments, record in zip(missing, measured, strict=True):  # one record per count
                self.records[(scale, segments, batch_size)] = record
        return [self.records[(scale, s, batch_size)] for s in segment_counts]

    def show(
        self, segments: int, batch_size: int, scale: str = MACHINE_SCALE
    ) -> tuple[str, Figure, Figure]:
        self.measure(sorted({0, segments, *self.initial_counts}), batch_size, scale)
        measured = [
            r for (c, s, b), r in sorted(self.records.items()) if (c, b) == (scale, batch_size)
        ]
        plain = self.records[(scale, 0, batch_size)]
        size = "224 px" if scale == ARTICLE_SCALE else "the profile's size"
        subtitle = f"flat VGG16, {size}, batch {batch_size} · {figure_subtitle(plain.device)}"
        sweep = plot_segment_sweep(measured, n_modules=len(self.model), subtitle=subtitle)
        chosen = self.records[(scale, segments, batch_size)]
        breakdown = plot_breakdown(
            {"no checkpointing": plain, f"segments={segments}": chosen}, subtitle=subtitle
        )
        text = f"batch {batch_size}, {scale}\n" + format_sweep(measured, chosen=segments)
        return text, sweep, breakdown
