"""Notebook 03's Going deeper: the article's 2.5 GB card at its own 224 px, by dry run.

One dry run per batch gives a table of step peaks; every budget is then a lookup, so a slider over
the card's reserve (what the card keeps from tensors) redraws at once.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import ipywidgets as widgets
import torch.nn as nn
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import NetA
from tutorial_utils.articles.quoted import NETA_ARTICLE
from tutorial_utils.display.widgets import PanelBox, int_slider, result_outputs
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.step import DRY_RUN_LABEL
from tutorial_utils.units import MiB

__all__ = [
    "ARTICLE_MAX_BATCH",
    "CARD_MODELS",
    "PeakTable",
    "article_card_tables",
    "dry_run_peak_table",
    "largest_batches",
    "reserve_panel",
    "reserve_view",
]

ARTICLE_MAX_BATCH = NETA_ARTICLE.max_batch  # {"no checkpoint": 23, "checkpoint": 31}
CARD_MODELS: dict[str, Callable[[], NetA]] = {  # keyed as ARTICLE_MAX_BATCH
    "no checkpoint": partial(NetA, use_checkpoint=False, use_reentrant=False),
    "checkpoint": partial(NetA, use_checkpoint=True, use_reentrant=False),
}


@dataclass(frozen=True)
class PeakTable:
    """A NetA training step's dry-run peak (Adam) at batch 1, 2, ... up to the first batch over
    the card. The peak grows with the batch, so the largest batch under a budget is a bisection."""

    label: str
    image_size: int
    card_bytes: int
    peaks: tuple[int, ...]  # peaks[b - 1]: the step's peak at batch b; only the last is over

    def largest_batch(self, budget_bytes: int) -> int:
        """The largest batch whose step fits ``budget_bytes`` (0 when not even one sample does)."""
        if not 0 <= budget_bytes <= self.card_bytes:
            raise ValueError(
                f"budget_bytes must be in 0..{self.card_bytes} (the card the table was built "
                f"for), got {budget_bytes}: build a table for a larger card"
            )
        return bisect_right(self.peaks, budget_bytes)

    def describe(self) -> str:
        per_sample = (self.peaks[-1] - self.peaks[0]) / max(1, len(self.peaks) - 1)
        return (
            f"{self.label:<14} peak {self.peaks[0] / MiB:6.1f} MiB at batch 1, "
            f"+{per_sample / MiB:.1f} MiB per sample; largest batch in the whole "
            f"{self.card_bytes / MiB:.0f} MiB: {self.largest_batch(self.card_bytes)}"
        )


def dry_run_peak_table(
    label: str,
    make_model: Callable[[], nn.Module],
    image_size: int = NETA_ARTICLE.image_size,
    card_bytes: int = NETA_ARTICLE.card_bytes,
    max_batch: int = 256,
) -> PeakTable:
    """Dry runs at batch 1, 2, ... until one is over ``card_bytes``, with Adam as the article."""
    if image_size < 1 or card_bytes < 1:
        raise ValueError(
            f"image_size and card_bytes must be positive, got {image_size}, {card_bytes}"
        )
    peaks: list[int] = []
    while not peaks or peaks[-1] <= card_bytes:
        if len(peaks) == max_batch:
            raise ValueError(
                f"batch {max_batch} still fits {card_bytes / MiB:.0f} MiB: raise max_batch"
            )
        shape = (len(peaks) + 1, 3, image_size, image_size)
        report = dry_run_step(build_on_meta(make_model), shape, optimizer_factory=adam_optimizer)
        peaks.append(report.peak_bytes)
    return PeakTable(label, image_size, card_bytes, tuple(peaks))


def article_card_tables(
    image_size: int = NETA_ARTICLE.image_size, card_bytes: int = NETA_ARTICLE.card_bytes
) -> dict[str, PeakTable]:
    """``dry_run_peak_table`` for NetA plain and with all five segments checkpointed."""
    return {
        label: dry_run_peak_table(label, make, image_size, card_bytes)
        for label, make in CARD_MODELS.items()
    }


def _card_of(tables: Mapping[str, PeakTable], labels: Mapping[str, int] | None = None) -> int:
    """The card every table was built for; the tables must hold every label of ``labels``."""
    cards = {table.card_bytes for table in tables.values()}
    if len(cards) != 1:
        raise ValueError(f"need tables built for one card, got cards {sorted(cards)} bytes")
    missing = set(labels or ()) - set(tables)
    if missing:
        raise ValueError(f"no table for {sorted(missing)}: build them with article_card_tables()")
    return cards.pop()


def largest_batches(tables: Mapping[str, PeakTable], reserve_mib: int) -> dict[str, int]:
    """Each table's largest batch when the card keeps ``reserve_mib`` MiB for itself."""
    card = _card_of(tables)
    if not 0 <= reserve_mib <= card // MiB:
        raise ValueError(f"reserve_mib must be in 0..{card // MiB}, got {reserve_mib}")
    return {label: table.largest_batch(card - reserve_mib * MiB) for label, table in tables.items()}


def _plot_peak_tables(
    tables: Mapping[str, PeakTable], reserve_mib: int, quoted: Mapping[str, int]
) -> Figure:
    """Step peak against batch per table, the card, the budget left by the reserve, the largest
    batch under it (a star) and the article's batch (a dotted line)."""
    card_mib = _card_of(tables, quoted) / MiB
    batches = largest_batches(tables, reserve_mib)
    figure = Figure(figsize=(7.5, 4.4))
    axis = figure.subplots()
    axis.axhline(card_mib, color="gray", linestyle=":", label=f"the card: {card_mib:.0f} MiB")
    budget = f"tensor budget: {card_mib - reserve_mib:.0f} MiB"
    axis.axhline(card_mib - reserve_mib, color="black", linestyle="--", label=budget)
    for index, (label, table) in enumerate(tables.items()):
        color, best = f"C{index}", batches[label]
        peaks_mib = [peak / MiB for peak in table.peaks]
        axis.plot(range(1, len(peaks_mib) + 1), peaks_mib, ".-", color=color, label=label)
        if best:
            star = f"{label}: largest {best}"
            axis.plot(best, peaks_mib[best - 1], "*", color=color, markersize=14, label=star)
        article = f"{label}: article {quoted[label]}"
        axis.axvline(quoted[label], color=color, linestyle=":", label=article)
    axis.set_xlabel("batch size")
    axis.set_ylabel("step peak (MiB)")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper left")
    size = next(iter(tables.values())).image_size
    figure.suptitle(
        f"NetA at {size} px, Adam: the largest batch with a {reserve_mib} MiB reserve\n{DRY_RUN_LABEL}",
        fontsize=11,
    )
    figure.tight_layout()
    return figure


def reserve_view(
    tables: Mapping[str, PeakTable], reserve_mib: int, quoted: Mapping[str, int] = ARTICLE_MAX_BATCH
) -> tuple[str, Figure]:
    """The reserve panel's callback: the largest batches beside the article's, and the plot."""
    card_mib = _card_of(tables, quoted) // MiB
    batches = largest_batches(tables, reserve_mib)

    def gain(found: Mapping[str, int]) -> str:
        plain, checkpointed = found["no checkpoint"], found["checkpoint"]
        return f"x{checkpointed / plain:.2f}" if plain else "n/a (no batch fits without checkpoint)"

    lines = [
        f"reserve {reserve_mib} MiB: tensor budget {card_mib - reserve_mib} MiB of the {card_mib} MiB card",
        f"largest batch, {DRY_RUN_LABEL}:",
        *(
            f"  {label:<14} {batch:>5}   (the article: {quoted[label]})"
            for label, batch in batches.items()
        ),
        f"  {'gain':<14} {gain(batches):>5}   (the article: {gain(quoted)})",
    ]
    return "\n".join(lines), _plot_peak_tables(tables, reserve_mib, quoted)


def reserve_panel(
    tables: Mapping[str, PeakTable], value: int = 0, max_reserve_mib: int | None = None
) -> PanelBox:
    """A reserve slider (up to half the card by default) that redraws ``reserve_view`` at once."""
    top = _card_of(tables) // MiB // 2 if max_reserve_mib is None else max_reserve_mib
    slider = int_slider("reserve: card memory not left to tensors (MiB)", value, 0, top)
    output = widgets.Output()

    def show(reserve_mib: int) -> None:
        output.outputs = result_outputs(reserve_view(tables, reserve_mib))

    slider.observe(lambda change: show(change["new"]), names="value")
    show(value)
    box = PanelBox([slider, output])
    box.keep_picture(output.outputs)
    return box
