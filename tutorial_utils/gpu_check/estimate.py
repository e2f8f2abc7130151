"""The estimate command against the CUDA allocator: ``python -m tutorial_utils estimate``'s dry run
of a step beside ``max_memory_allocated`` of the same step on the GPU."""

from __future__ import annotations

from typing import Annotated, TypedDict

import torch

from tutorial_utils.gpu_check.report import (
    DRY_RUN,
    MEASURED,
    Outcome,
    Shown,
    Table,
    columns_of,
    relative_error,
    tolerance_failures,
)
from tutorial_utils.gpu_check.runner import Budget, Section, free_cuda_memory
from tutorial_utils.units import MiB

__all__ = [
    "WorkloadRow",
    "ESTIMATE_CHECKS",
    "estimate_outcome",
    "estimate_rows",
    "EstimateRow",
    "SECTION",
]

# (workload, strategy) pairs ``python -m tutorial_utils estimate`` answers, small enough for any
# GPU: a LoRA Llama under CUDA autocast (the emulated cast policy), a fully trained GPT-2 in bf16,
# a ResNet-50 under autocast with selective checkpointing.
ESTIMATE_CHECKS = (
    ("hf:llama-3.2-1b", 1, 1024, "amp-bf16", 16, "every-block"),
    ("hf:gpt2", 2, 512, "bf16", 0, "none"),
    ("torchvision:resnet50", 16, 224, "amp-bf16", 0, "selective"),
)
ESTIMATE_TOLERANCE = 0.02  # kernels' workspaces (cuBLAS, cuDNN) are in CUDA's peak only


class WorkloadRow(TypedDict):
    """What ran, as the estimate and the allocator sections' tables both begin."""

    model: Annotated[str, Shown("model")]
    shape: Annotated[str, Shown("batch x size")]
    precision: Annotated[str, Shown("precision")]
    strategy: Annotated[str, Shown("strategy")]


class EstimateRow(WorkloadRow):
    estimate_mib: Annotated[float, Shown("estimate MiB, 512 B blocks", "{:.1f}", DRY_RUN)]
    tracked_peak_mib: Annotated[float, Shown("tracked peak MiB", "{:.1f}", MEASURED)]
    cuda_peak_allocated_mib: Annotated[
        float | None, Shown("CUDA peak allocated MiB", "{:.1f}", MEASURED)
    ]
    estimate_error: Annotated[float | None, Shown("estimate error", "{:+.2%}", DRY_RUN)]


ESTIMATE_COLUMNS = columns_of(EstimateRow)


def estimate_rows(device: torch.device, checks: tuple = ESTIMATE_CHECKS) -> list[EstimateRow]:
    """Each check's estimate (a dry run) beside the same step run on ``device``."""
    from tutorial_utils.estimate.estimator import Workload, dry_run_and_real_step
    from tutorial_utils.estimate.strategies import parse_strategy

    rows: list[EstimateRow] = []
    for model, batch, size, precision, lora, strategy in checks:
        workload = Workload(model, batch=batch, size=size, precision=precision, lora_rank=lora)
        dry, real = dry_run_and_real_step(workload, parse_strategy(strategy), str(device))
        cuda = None if real.cuda is None else real.cuda.peak_allocated_bytes
        rows.append(
            {
                "model": model,
                "shape": f"{batch} x {size}",
                "precision": precision + (f", LoRA {lora}" if lora else ""),
                "strategy": strategy,
                "estimate_mib": dry.peak_bytes / MiB,
                "tracked_peak_mib": real.peak_bytes / MiB,
                "cuda_peak_allocated_mib": None if cuda is None else cuda / MiB,
                "estimate_error": relative_error(dry.peak_bytes, cuda),
            }
        )
        free_cuda_memory()
    return rows


def estimate_outcome(rows: list[EstimateRow]) -> Outcome:
    """Fails a row without a CUDA peak, or whose estimate is off by more than the tolerance."""
    failures = []
    for row in rows:
        label = f"{row['model']} {row['strategy']}"
        failures += tolerance_failures(
            label, row["estimate_error"], ESTIMATE_TOLERANCE, "no CUDA peak allocated", "estimate"
        )
    notes = [
        "Estimate: python -m tutorial_utils estimate's dry run of the step (meta device; "
        "autocast emulated with CUDA's cast policy), storages in 512-byte blocks. Measured: the "
        "same step on the GPU, random weights from the config. Error: (estimate - CUDA peak "
        f"allocated) / CUDA peak allocated; a row fails beyond {ESTIMATE_TOLERANCE:.0%}."
    ]
    return Outcome([Table("Estimates against the GPU", ESTIMATE_COLUMNS, rows)], notes, failures)


def estimate_section(budget: Budget) -> Outcome:
    """``python -m tutorial_utils estimate`` against ``max_memory_allocated``."""
    return estimate_outcome(estimate_rows(torch.device("cuda")))


SECTION = Section("estimate", "The estimate command against the CUDA allocator", estimate_section)
