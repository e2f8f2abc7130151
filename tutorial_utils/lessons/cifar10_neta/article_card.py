"""Notebook 03's Going deeper: the article's 2.5 GB card at its own 224 px, by dry run.

Peak tables (one dry run per batch), the reserves that would give the article's 23 and 31 (and a
slider over them), and reentrant against non-reentrant checkpointing at the article's batch.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import groupby

import ipywidgets as widgets
import torch.nn as nn
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import NetA
from tutorial_utils.articles.quoted import NETA_ARTICLE
from tutorial_utils.display.plotting import plot_step_timelines
from tutorial_utils.display.tables import text_table
from tutorial_utils.display.widgets import PanelBox, int_slider, result_outputs
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.step import DRY_RUN_LABEL, Recording
from tutorial_utils.units import MiB

__all__ = [
    "ARTICLE_CARD_BYTES",
    "ARTICLE_IMAGE_SIZE",
    "ARTICLE_MAX_BATCH",
    "CARD_MODELS",
    "MAX_RESERVE_MIB",
    "PeakTable",
    "REENTRANT_CHECKPOINT",
    "ReserveFit",
    "ReserveRun",
    "SEG0_CHANNELS",
    "article_card_tables",
    "article_step_timelines",
    "checkpoint_modes",
    "dry_run_peak_table",
    "largest_batches",
    "plot_peak_tables",
    "reserve_fit",
    "reserve_panel",
    "reserve_view",
]

ARTICLE_CARD_BYTES = NETA_ARTICLE.card_bytes
ARTICLE_IMAGE_SIZE = NETA_ARTICLE.image_size
ARTICLE_MAX_BATCH = NETA_ARTICLE.max_batch  # {"no checkpoint": 23, "checkpoint": 31}
CARD_MODELS: dict[str, Callable[[], NetA]] = {  # keyed as ARTICLE_MAX_BATCH
    "no checkpoint": partial(NetA, use_checkpoint=False, use_reentrant=False),
    "checkpoint": partial(NetA, use_checkpoint=True, use_reentrant=False),
}
REENTRANT_CHECKPOINT = partial(NetA, use_checkpoint=True, use_reentrant=True)  # the article's mode
SEG0_CHANNELS = 64  # seg0 is layer1 alone: conv-BN-ReLU, 64 channels at full resolution
MAX_RESERVE_MIB = ARTICLE_CARD_BYTES // MiB // 2  # the reserve slider's end: half the card


@dataclass(frozen=True)
class PeakTable:
    """The dry-run peak of one NetA training step (Adam) at every batch from 1 up to the first
    batch over the card, so that the largest batch under any budget up to the card is a lookup.

    The lookup is exact because the peak grows with the batch: activations scale with it, while
    weights, gradients and Adam's state stay the same.
    """

    label: str
    image_size: int
    card_bytes: int
    peaks: tuple[int, ...]  # peaks[b - 1]: the step's peak at batch b; only the last is over
    seconds: float  # wall time to build the table on this machine

    def largest_batch(self, budget_bytes: int) -> int:
        """The largest batch whose step fits ``budget_bytes`` (0 when not even one sample does)."""
        if not 0 <= budget_bytes <= self.card_bytes:
            raise ValueError(
                f"budget_bytes must be in 0..{self.card_bytes} (the card the table was built "
                f"for), got {budget_bytes}: build a table for a larger card"
            )
        return bisect_right(self.peaks, budget_bytes)

    @property
    def bytes_per_sample(self) -> float:
        """What one more sample adds to the peak, on average over the table."""
        return (self.peaks[-1] - self.peaks[0]) / max(1, len(self.peaks) - 1)

    def describe(self) -> str:
        return (
            f"{self.label:<14} peak {self.peaks[0] / MiB:6.1f} MiB at batch 1, "
            f"+{self.bytes_per_sample / MiB:.1f} MiB per sample; largest batch in the whole "
            f"{self.card_bytes / MiB:.0f} MiB: {self.largest_batch(self.card_bytes)}"
        )


def dry_run_peak_table(
    label: str,
    make_model: Callable[[], nn.Module],
    image_size: int = ARTICLE_IMAGE_SIZE,
    card_bytes: int = ARTICLE_CARD_BYTES,
    max_batch: int = 256,
) -> PeakTable:
    """Dry runs at batch 1, 2, ... until one is over ``card_bytes``, with Adam (lr 1e-3) as in
    the article and in ``find_max_batch_size``; each costs a fraction of a second at 224 px."""
    if image_size < 1 or card_bytes < 1:
        raise ValueError(
            f"image_size and card_bytes must be positive, got {image_size}, {card_bytes}"
        )
    started = time.perf_counter()
    peaks: list[int] = []
    while not peaks or peaks[-1] <= card_bytes:
        if len(peaks) == max_batch:
            raise ValueError(
                f"batch {max_batch} still fits {card_bytes / MiB:.0f} MiB: raise max_batch"
            )
        shape = (len(peaks) + 1, 3, image_size, image_size)
        report = dry_run_step(build_on_meta(make_model), shape, optimizer_factory=adam_optimizer)
        peaks.append(report.peak_bytes)
    return PeakTable(label, image_size, card_bytes, tuple(peaks), time.perf_counter() - started)


def article_card_tables(
    image_size: int = ARTICLE_IMAGE_SIZE, card_bytes: int = ARTICLE_CARD_BYTES
) -> dict[str, PeakTable]:
    """``dry_run_peak_table`` for NetA plain and with all five segments checkpointed."""
    return {
        label: dry_run_peak_table(label, make, image_size, card_bytes)
        for label, make in CARD_MODELS.items()
    }


def _card_of(tables: Mapping[str, PeakTable], labels: Iterable[str] = ()) -> int:
    """The card every table was built for; the tables must include ``labels``."""
    cards = {table.card_bytes for table in tables.values()}
    if len(cards) != 1:
        raise ValueError(f"need tables built for one card, got cards {sorted(cards)} bytes")
    missing = set(labels) - set(tables)
    if missing:
        raise ValueError(f"no table for {sorted(missing)}: build them with article_card_tables()")
    return cards.pop()


def largest_batches(tables: Mapping[str, PeakTable], reserve_mib: int) -> dict[str, int]:
    """Each table's largest batch when the card keeps ``reserve_mib`` MiB for itself."""
    card = _card_of(tables)
    if not 0 <= reserve_mib <= card // MiB:
        raise ValueError(f"reserve_mib must be in 0..{card // MiB}, got {reserve_mib}")
    return {label: table.largest_batch(card - reserve_mib * MiB) for label, table in tables.items()}


@dataclass(frozen=True)
class ReserveRun:
    """Consecutive whole-MiB reserves under which every table's largest batch stays the same."""

    first_mib: int
    last_mib: int
    batches: dict[str, int]


@dataclass(frozen=True)
class ReserveFit:
    """Every whole-MiB reserve of the card against the article's largest batches."""

    runs: tuple[ReserveRun, ...]  # reserve 0 up to the whole card, in order
    quoted: dict[str, int]

    def miss(self, run: ReserveRun) -> int:
        """How many batches the run is off the quoted ones, in total."""
        return sum(abs(run.batches[label] - batch) for label, batch in self.quoted.items())

    def matching(self, label: str) -> list[ReserveRun]:
        """The runs whose ``label`` batch is the article's."""
        return [run for run in self.runs if run.batches[label] == self.quoted[label]]

    @property
    def reproducing(self) -> list[ReserveRun]:
        """The runs that give every quoted batch at once (empty: no reserve does)."""
        return [run for run in self.runs if self.miss(run) == 0]

    @property
    def closest(self) -> list[ReserveRun]:
        """The runs with the smallest miss."""
        least = min(self.miss(run) for run in self.runs)
        return [run for run in self.runs if self.miss(run) == least]

    def describe(self) -> str:
        lines = [f"reserves (whole MiB) that give the article's largest batch, {DRY_RUN_LABEL}:"]
        for label, batch in self.quoted.items():
            runs = self.matching(label)
            if not runs:
                lines.append(f"  {label} = {batch}: no reserve in 0..{self.runs[-1].last_mib} MiB")
                continue
            others = ", ".join(
                f"{other} {_span(run.batches[other] for run in runs)}"
                for other in self.quoted
                if other != label
            )
            lines.append(
                f"  {label} = {batch}: reserve {runs[0].first_mib}..{runs[-1].last_mib} MiB "
                f"(there {others})"
            )
        if self.reproducing:
            spans = ", ".join(f"{r.first_mib}..{r.last_mib} MiB" for r in self.reproducing)
            lines.append(f"all at once: reserve {spans}")
        else:
            closest = "; ".join(
                f"{r.first_mib}..{r.last_mib} MiB: "
                + ", ".join(f"{label} {batch}" for label, batch in r.batches.items())
                for r in self.closest
            )
            lines.append(
                f"all at once: no reserve. Closest, {self.miss(self.closest[0])} batches off in "
                f"total: {closest}"
            )
        return "\n".join(lines)


def _span(values: Iterable[int]) -> str:
    values = sorted(set(values))
    return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"


def reserve_fit(
    tables: Mapping[str, PeakTable], quoted: Mapping[str, int] = ARTICLE_MAX_BATCH
) -> ReserveFit:
    """Scan every whole-MiB reserve 0..card (lookups only) for those that give the quoted batches."""
    card_mib = _card_of(tables, quoted) // MiB
    by_reserve = [(mib, largest_batches(tables, mib)) for mib in range(card_mib + 1)]
    runs = []
    for _, group in groupby(by_reserve, key=lambda item: tuple(item[1].values())):
        members = list(group)
        runs.append(ReserveRun(members[0][0], members[-1][0], members[0][1]))
    return ReserveFit(tuple(runs), dict(quoted))


def _gain(batches: Mapping[str, int]) -> str:
    plain, checkpointed = batches["no checkpoint"], batches["checkpoint"]
    return f"x{checkpointed / plain:.2f}" if plain else "n/a (no batch fits without checkpoint)"


def plot_peak_tables(
    tables: Mapping[str, PeakTable],
    reserve_mib: int,
    quoted: Mapping[str, int] = ARTICLE_MAX_BATCH,
) -> Figure:
    """Step peak against batch for each table, the card, the tensor budget left by the reserve,
    the largest batch under it (a star) and the article's batch (a dotted line)."""
    card = _card_of(tables, quoted)
    batches = largest_batches(tables, reserve_mib)
    budget_mib = card / MiB - reserve_mib
    figure = Figure(figsize=(7.5, 4.4))
    axis = figure.subplots()
    axis.axhline(card / MiB, color="gray", linestyle=":", label=f"the card: {card / MiB:.0f} MiB")
    axis.axhline(
        budget_mib, color="black", linestyle="--", label=f"tensor budget: {budget_mib:.0f} MiB"
    )
    for index, (label, table) in enumerate(tables.items()):
        color = f"C{index}"
        sizes = range(1, len(table.peaks) + 1)
        axis.plot(sizes, [peak / MiB for peak in table.peaks], ".-", color=color, label=label)
        best = batches[label]
        if best:
            axis.plot(
                best,
                table.peaks[best - 1] / MiB,
                "*",
                color=color,
                markersize=14,
                label=f"{label}: largest {best}",
            )
        axis.axvline(
            quoted[label], color=color, linestyle=":", label=f"{label}: article {quoted[label]}"
        )
    axis.set_xlabel("batch size")
    axis.set_ylabel("step peak (MiB)")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper left")
    size = next(iter(tables.values())).image_size
    figure.suptitle(
        f"NetA at {size} px, Adam: the largest batch with a {reserve_mib} MiB reserve\n"
        f"{DRY_RUN_LABEL}",
        fontsize=11,
    )
    figure.tight_layout()
    return figure


def reserve_view(
    tables: Mapping[str, PeakTable],
    reserve_mib: int,
    quoted: Mapping[str, int] = ARTICLE_MAX_BATCH,
) -> tuple[str, Figure]:
    """The reserve panel's callback: the largest batches beside the article's, and the plot."""
    card_mib = _card_of(tables, quoted) // MiB
    batches = largest_batches(tables, reserve_mib)
    lines = [
        f"reserve {reserve_mib} MiB: tensor budget {card_mib - reserve_mib} MiB of the "
        f"{card_mib} MiB card",
        f"largest batch, {DRY_RUN_LABEL}:",
        *(
            f"  {label:<14} {batch:>5}   (the article: {quoted[label]})"
            for label, batch in batches.items()
        ),
        f"  {'gain':<14} {_gain(batches):>5}   (the article: {_gain(quoted)})",
    ]
    return "\n".join(lines), plot_peak_tables(tables, reserve_mib, quoted)


def reserve_panel(
    tables: Mapping[str, PeakTable], value: int = 0, max_reserve_mib: int = MAX_RESERVE_MIB
) -> PanelBox:
    """A reserve slider that redraws ``reserve_view`` on every change (lookups: instant)."""
    slider = int_slider("reserve: card memory not left to tensors (MiB)", value, 0, max_reserve_mib)
    output = widgets.Output()

    def show(reserve_mib: int) -> None:
        output.outputs = result_outputs(reserve_view(tables, reserve_mib))

    slider.observe(lambda change: show(change["new"]), names="value")
    show(value)
    box = PanelBox([slider, output])
    box.keep_picture(output.outputs)
    return box


def checkpoint_modes(tables: Mapping[str, PeakTable], batch: int = 23) -> str:
    """Peak at ``batch`` and largest batch on the whole card, plain, non-reentrant checkpoint (the
    tables) and reentrant checkpoint, the mode the article ran (PyTorch's default then); then how
    many of ``seg0``'s full-resolution tensors per sample reentrant holds beyond non-reentrant."""
    card = _card_of(tables, ARTICLE_MAX_BATCH)
    covered = min(len(table.peaks) for table in tables.values())
    if not 1 <= batch <= covered:
        raise ValueError(f"batch must be in 1..{covered} (what the tables cover), got {batch}")
    size = next(iter(tables.values())).image_size
    reentrant = dry_run_step(
        build_on_meta(REENTRANT_CHECKPOINT),
        (batch, 3, size, size),
        optimizer_factory=adam_optimizer,
    )
    search = find_max_batch_size(
        REENTRANT_CHECKPOINT,
        (3, size, size),
        card,
        device="meta",
        optimizer_factory=adam_optimizer,
    )
    plain, checkpointed = tables["no checkpoint"], tables["checkpoint"]
    rows = [
        ("no checkpoint", plain.peaks[batch - 1], plain.largest_batch(card)),
        (
            "checkpoint, non-reentrant",
            checkpointed.peaks[batch - 1],
            checkpointed.largest_batch(card),
        ),
        ("checkpoint, reentrant (the article's)", reentrant.peak_bytes, search.batch_size),
    ]
    header = ("NetA, Adam", f"peak MiB at batch {batch}", f"largest batch in {card // MiB} MiB")
    table = text_table(header, [(label, f"{peak / MiB:.1f}", most) for label, peak, most in rows])
    gap = reentrant.peak_bytes - checkpointed.peaks[batch - 1]
    seg0_tensor = SEG0_CHANNELS * size * size * 4  # one sample's float32 output of layer1's conv
    return (
        f"NetA at {size} px, {DRY_RUN_LABEL}:\n{table}\n"
        f"reentrant - non-reentrant at batch {batch}: {gap / MiB:.1f} MiB = {batch} x "
        f"{gap / batch / MiB:.2f} MiB; one sample's {SEG0_CHANNELS}-channel {size} px tensor: "
        f"{seg0_tensor / MiB:.2f} MiB"
    )


def article_step_timelines(
    batch: int = ARTICLE_MAX_BATCH["checkpoint"], image_size: int = ARTICLE_IMAGE_SIZE
) -> Figure:
    """One step of NetA plain and checkpointed at the same batch, op by op, by dry run."""
    reports = {
        f"{label}, batch {batch}, {image_size} px": dry_run_step(
            build_on_meta(make),
            (batch, 3, image_size, image_size),
            optimizer_factory=adam_optimizer,
            recording=Recording(timeline=True),
        )
        for label, make in CARD_MODELS.items()
    }
    return plot_step_timelines(reports)
