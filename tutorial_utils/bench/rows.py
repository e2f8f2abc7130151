"""The bench's shared parts: the articles' sizes, a bench row and its ratios to the step without
checkpointing, the table columns' type."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NotRequired, TypedDict

import torch

from tutorial_utils.articles.models import (
    NETA_SEGMENTS,
)
from tutorial_utils.articles.quoted import NETA_ARTICLE
from tutorial_utils.display.tables import Column
from tutorial_utils.measurement.step import (
    StepReport,
)
from tutorial_utils.units import MiB, ratio

__all__ = [
    "add_ratios",
    "ARTICLE_BATCH",
    "ARTICLE_CARD_BYTES",
    "ARTICLE_SEGMENTS",
    "ARTICLE_SIDE",
    "bench_row",
    "BenchRow",
    "CIFAR_CLASSES",
    "Columns",
    "counted_gflop",
    "DEEP_CHAIN_BATCH",
    "DEEP_CHAIN_PAIRS",
    "DOGCAT_CLASSES",
    "FLAT_MODULES",
    "FLAT_SEGMENTS",
    "image_batch",
    "NETA_ARTICLE_BATCHES",
    "NETA_CHECKPOINTED",
    "NETA_SETTINGS",
    "RatioFigure",
    "RatioKey",
    "ROW_COLUMNS",
    "segment_rows",
    "SELECTIVE_REGIONS",
    "VGG16_ARTICLE",
    "VGG16_FLAT",
]

DOGCAT_CLASSES, CIFAR_CLASSES = 2, 10
ARTICLE_SEGMENTS = (0, 2)
FLAT_MODULES = 40
FLAT_SEGMENTS = (0, 2, 4, round(math.sqrt(FLAT_MODULES)), 10)  # sqrt(40 modules) ~ 6

ARTICLE_SIDE, ARTICLE_BATCH = 224, 64  # the first article's VGG16 step
SELECTIVE_REGIONS = (4, 6, 10)
NETA_ARTICLE_BATCHES = (23, 31)  # the second article's largest batches, plain and checkpointed
ARTICLE_CARD_BYTES = NETA_ARTICLE.card_bytes
DEEP_CHAIN_PAIRS, DEEP_CHAIN_BATCH = 128, 4096  # issue 23's chain: 257 modules

VGG16_ARTICLE, VGG16_FLAT = "VGG16 (article, 10 modules)", "VGG16 (flat, 40 modules)"
NETA_CHECKPOINTED = f"{NETA_SEGMENTS} checkpointed segments"
NETA_SETTINGS = {"none": False, NETA_CHECKPOINTED: True}  # each setting: use_checkpoint


class BenchRow(TypedDict):
    """One step of a bench table (``bench_row``): MiB, seconds and GFLOP, None where not measured."""

    model: str
    checkpointing: str
    batch: int
    tracked_peak_mib: float
    activation_peak_mib: float | None  # None on the floor row: a bound, not a step
    cuda_peak_allocated_mib: NotRequired[float | None]  # this and the next two: not on the floor
    nvml_used_mib: NotRequired[float | None]
    step_seconds: NotRequired[float | None]
    step_gflop: float | None
    source: str
    # ratios to the same model without checkpointing (``add_ratios``)
    tracked_peak_ratio: NotRequired[float | None]
    activation_peak_ratio: NotRequired[float | None]
    cuda_peak_allocated_ratio: NotRequired[float | None]
    step_ratio: NotRequired[float | None]
    flops_ratio: NotRequired[float | None]


RatioFigure = Literal[
    "tracked_peak_mib",
    "activation_peak_mib",
    "cuda_peak_allocated_mib",
    "step_seconds",
    "step_gflop",
]

RatioKey = Literal[
    "tracked_peak_ratio",
    "activation_peak_ratio",
    "cuda_peak_allocated_ratio",
    "step_ratio",
    "flops_ratio",
]

# Each figure and the key of its ratio to the step without checkpointing.
RATIO_OF: dict[RatioFigure, RatioKey] = {
    "tracked_peak_mib": "tracked_peak_ratio",
    "activation_peak_mib": "activation_peak_ratio",
    "cuda_peak_allocated_mib": "cuda_peak_allocated_ratio",
    "step_seconds": "step_ratio",
    "step_gflop": "flops_ratio",
}


def image_batch(batch: int, side: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(batch, 3, side, side, generator=generator),
        torch.randint(0, classes, (batch,), generator=generator),
    )


def bench_row(model: str, setting: str, record: StepReport) -> BenchRow:
    return {
        "model": model,
        "checkpointing": setting,
        "batch": record.batch_size,
        "tracked_peak_mib": record.peak_bytes / MiB,
        "activation_peak_mib": record.activation_peak_bytes / MiB,
        "cuda_peak_allocated_mib": (
            None if record.cuda is None else record.cuda.peak_allocated_bytes / MiB
        ),
        "nvml_used_mib": record.nvml.used_mib,
        "step_seconds": record.seconds,
        "step_gflop": None if record.flops is None else record.flops.total / 1e9,
        "source": record.source,
    }


def add_ratios(rows: list[BenchRow], base: BenchRow | None = None) -> list[BenchRow]:
    """Each figure divided by the same figure of ``base`` (default: the first row, which should be
    the model without checkpointing); None where either is absent."""
    base = rows[0] if base is None else base
    for row in rows:
        for name, ratio_key in RATIO_OF.items():
            row[ratio_key] = ratio(row.get(name), base.get(name))
    return rows


def segment_rows(
    model: str, reports: Sequence[StepReport], gflop: Sequence[float] | None = None
) -> list[BenchRow]:
    """One row per equal-segment split of ``model``, named by its segments, with ratios to the
    first (no checkpointing); ``gflop``: each step's GFLOP by dry run, beside a measured step."""
    rows = [bench_row(model, f"{r.strategy.segments} segments", r) for r in reports]
    for row, step_gflop in zip(
        rows, gflop if gflop is not None else [None] * len(rows), strict=True
    ):
        if step_gflop is not None:
            row["step_gflop"] = step_gflop
    return add_ratios(rows)


def counted_gflop(report: StepReport) -> float:
    """The GFLOP a dry run counted (every dry run counts them)."""
    if report.flops is None:
        raise ValueError(f"no FLOPs were counted in this {report.source} step")
    return report.flops.total / 1e9


Columns = Sequence[Column]  # markdown tables (display.tables): n/a where a figure is absent here
# what every bench table starts with: the row's step and its tracked peak
ROW_COLUMNS: Columns = (
    ("model", "model", "{}"),
    ("checkpointing", "checkpointing", "{}"),
    ("batch", "batch", "{}"),
    ("tracked_peak_mib", "tracked peak MiB", "{:.1f}"),
)
