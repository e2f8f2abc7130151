"""Section 2, the cross-check: the tracker and the dry run against ``torch.cuda.max_memory_allocated``
(the articles' VGG16 and NetA steps), with relative errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypedDict

import torch
import torch.nn as nn

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import Layout, NetA, vgg16_classifier
from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, Strategy, equal_segments
from tutorial_utils.display.tables import cell_text
from tutorial_utils.gpu_check.report import (
    DRY_RUN,
    MEASURED,
    Outcome,
    Shown,
    Table,
    columns_of,
    relative_error,
)
from tutorial_utils.gpu_check.runner import Budget, Section, free_cuda_memory
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.step import (
    OptimizerFactory,
    Recording,
    StepReport,
    default_optimizer,
    measure_step,
)
from tutorial_utils.units import MiB

__all__ = [
    "crosscheck",
    "crosscheck_outcome",
    "CrossCheckRow",
    "CrossCheckStep",
    "dry_run_row",
    "DryRunRow",
    "measure",
    "SECTION",
    "SGD",
    "STEPS",
    "VGG",
]


@dataclass(frozen=True)
class CrossCheckStep:
    """One training step, run the same way on the GPU and as a dry run."""

    name: str
    make_model: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    classes: int
    strategy: Strategy  # NO_CHECKPOINTING for a model that checkpoints itself (NetA)
    optimizer: str
    optimizer_factory: OptimizerFactory


class DryRunRow(TypedDict):
    step: Annotated[str, Shown("step")]
    strategy: Annotated[str, Shown("strategy")]  # the strategy's name
    batch: Annotated[int, Shown("batch", "{:d}")]
    image_size: int
    optimizer: Annotated[str, Shown("optimizer")]
    dry_run_peak_mib: Annotated[float, Shown("peak MiB, 512 B blocks", "{:.1f}", DRY_RUN)]
    dry_run_breakdown_mib: dict[str, float]


class CrossCheckRow(DryRunRow):
    tracked_peak_mib: Annotated[float, Shown("tracked peak MiB", "{:.1f}", MEASURED)]
    cuda_peak_allocated_mib: Annotated[
        float | None, Shown("CUDA peak allocated MiB", "{:.1f}", MEASURED)
    ]
    tracker_error: Annotated[float | None, Shown("tracker error", "{:+.2%}", MEASURED)]
    dry_run_error: Annotated[float | None, Shown("dry-run error", "{:+.2%}", DRY_RUN)]
    cuda_peak_reserved_mib: Annotated[
        float | None, Shown("CUDA peak reserved MiB", "{:.1f}", MEASURED)
    ]
    nvml_used_mib: Annotated[float | None, Shown("NVML used MiB", "{:.0f}", MEASURED)]
    tracked_baseline_mib: float
    cuda_allocated_before_mib: float | None
    step_seconds: Annotated[float | None, Shown("step s", "{:.3f}", MEASURED)]
    breakdown_mib: dict[str, float]
    activation_peak_mib: float
    device: str


CROSSCHECK_COLUMNS = columns_of(CrossCheckRow)


def _vgg16(layout: Layout) -> Callable[[], nn.Module]:
    return lambda: vgg16_classifier(2, layout=layout)


def _neta(use_checkpoint: bool) -> Callable[[], nn.Module]:
    return lambda: NetA(use_checkpoint=use_checkpoint, use_reentrant=False)


VGG_SHAPE, NETA_SHAPE, SGD, ADAM = (32, 3, 224, 224), (31, 3, 224, 224), "SGD momentum", "Adam"
NONE, VGG = NO_CHECKPOINTING, ("VGG16 (article)", _vgg16("article"), VGG_SHAPE, 2)
STEPS = (
    CrossCheckStep(*VGG, NONE, SGD, default_optimizer),
    CrossCheckStep(*VGG, equal_segments(2), SGD, default_optimizer),
    CrossCheckStep(
        "VGG16 (flat)", _vgg16("flat"), VGG_SHAPE, 2, equal_segments(6), SGD, default_optimizer
    ),
    CrossCheckStep("NetA, plain", _neta(False), NETA_SHAPE, 10, NONE, ADAM, adam_optimizer),
    CrossCheckStep("NetA, 5 checkpointed", _neta(True), NETA_SHAPE, 10, NONE, ADAM, adam_optimizer),
)


def dry_run_row(step: CrossCheckStep) -> DryRunRow:
    """The step's dry run on the meta device, storages in 512-byte blocks (no GPU needed)."""
    report = dry_run_step(
        build_on_meta(step.make_model),
        step.input_shape,
        step.strategy,
        optimizer_factory=step.optimizer_factory,
        recording=Recording(round_to_blocks=True),
    )
    return {
        "step": step.name,
        "strategy": step.strategy.name,
        "batch": step.input_shape[0],
        "image_size": step.input_shape[-1],
        "optimizer": step.optimizer,
        "dry_run_peak_mib": report.peak_mib,
        "dry_run_breakdown_mib": report.breakdown_mib,
    }


def measure(step: CrossCheckStep, device: torch.device) -> StepReport:
    """The step for real on ``device`` (random data, fixed seed), fastest of 3 timed steps."""
    torch.manual_seed(0)
    model = step.make_model().to(device)
    inputs = torch.randn(step.input_shape)
    targets = torch.randint(0, step.classes, (step.input_shape[0],))
    return measure_step(
        model,
        inputs,
        targets,
        step.strategy,
        optimizer_factory=step.optimizer_factory,
        device=device,
        repeats=3,
    )


def measured_row(dry_row: DryRunRow, report: StepReport) -> CrossCheckRow:
    """A dry-run row completed with the real step's figures and both relative errors."""
    cuda_before = None if report.cuda is None else report.cuda.allocated_before_bytes
    return {
        **dry_row,
        "tracked_peak_mib": report.peak_mib,
        "cuda_peak_allocated_mib": (
            None if report.cuda is None else report.cuda.peak_allocated_bytes / MiB
        ),
        "cuda_peak_reserved_mib": (
            None if report.cuda is None else report.cuda.peak_reserved_bytes / MiB
        ),
        "nvml_used_mib": report.nvml.used_mib,
        "tracker_error": relative_error(
            report.peak_bytes, None if report.cuda is None else report.cuda.peak_allocated_bytes
        ),
        "dry_run_error": relative_error(
            dry_row["dry_run_peak_mib"],
            (None if report.cuda is None else report.cuda.peak_allocated_bytes / MiB),
        ),
        "tracked_baseline_mib": report.baseline_bytes / MiB,
        "cuda_allocated_before_mib": None if cuda_before is None else cuda_before / MiB,
        "step_seconds": report.seconds,
        "breakdown_mib": report.breakdown_mib,
        "activation_peak_mib": (report.activation_peak_bytes / MiB),
        "device": report.device,
    }


def crosscheck(
    device: torch.device, steps: tuple[CrossCheckStep, ...] = STEPS
) -> list[CrossCheckRow]:
    """One row per step, every figure in MiB; memory is freed between steps."""
    rows = []
    for step in steps:
        rows.append(measured_row(dry_run_row(step), measure(step, device)))
        free_cuda_memory()
    return rows


def crosscheck_outcome(rows: list[CrossCheckRow]) -> Outcome:
    """The cross-check's table and what its columns mean; a row without CUDA figures fails."""
    return Outcome(
        [Table("One training step per row", CROSSCHECK_COLUMNS, rows)],
        [
            "One training step per row (forward, cross-entropy, backward, optimizer step, "
            "optimizer state present before the step). Tracked peak: live tensor bytes of the "
            "real step, followed op by op. Dry run: the same step on the meta device, each "
            "storage rounded up to the CUDA caching allocator's 512-byte blocks. Errors: (peak - "
            "CUDA peak allocated) / CUDA peak allocated (torch.cuda.max_memory_allocated).",
            "Before each step the tracker counted "
            + ", ".join(cell_text(r["tracked_baseline_mib"], "{:.1f} MiB") for r in rows)
            + " while CUDA had "
            + ", ".join(cell_text(r["cuda_allocated_before_mib"], "{:.1f} MiB") for r in rows)
            + " allocated: the difference is memory no tensor owns (e.g. the cuBLAS workspace).",
            "Kernel workspaces allocated and freed inside one op (cuDNN) count in CUDA peak "
            "allocated but are invisible to the tracker and the dry run; NVML adds the CUDA "
            "context and the allocator's cache.",
        ],
        [
            f"{row['step']}, {row['strategy']}: no CUDA peak allocated"
            for row in rows
            if row["cuda_peak_allocated_mib"] is None
        ],
    )


def crosscheck_section(budget: Budget) -> Outcome:
    """Section 2: the tracker and the dry run against ``max_memory_allocated``."""
    return crosscheck_outcome(crosscheck(torch.device("cuda")))


SECTION = Section(
    "crosscheck", "Tracker and dry run against the CUDA allocator", crosscheck_section
)
