"""The emulated allocator against ``torch.cuda``: a dry run replayed through the emulated caching
allocator beside ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` of the same step.

The prediction half runs anywhere (``predicted_counters``); ``allocator_rows`` needs the GPU.
"""

from __future__ import annotations

from typing import Annotated

import torch

from tutorial_utils.estimate.estimator import Workload, build_model, train_step
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.gpu_check.estimate import WorkloadRow
from tutorial_utils.gpu_check.report import (
    MEASURED,
    Outcome,
    Shown,
    Table,
    columns_of,
    relative_error,
    tolerance_failures,
)
from tutorial_utils.gpu_check.runner import Budget, Section
from tutorial_utils.gpus import cublas_workspace_bytes as table_workspace_bytes
from tutorial_utils.measurement.allocator import AllocatorPrediction, replay
from tutorial_utils.measurement.gpu_attention import SdpaRules, device_rules, gpu_attention_rules
from tutorial_utils.units import MiB

__all__ = [
    "ALLOCATOR_CHECKS",
    "allocator_failures",
    "AllocatorRow",
    "predicted_counters",
    "SECTION",
]

# (model, batch, size, precision, LoRA rank, strategy): small enough for seconds on any GPU
ALLOCATOR_CHECKS = (
    ("hf:gpt2", 2, 512, "bf16", 0, "none"),
    ("hf:gpt2", 2, 512, "bf16", 0, "every-block"),
    ("hf:llama-3.2-1b", 1, 2048, "bf16", 16, "every-block"),
)
# Not yet compared on a GPU: limits to be set from the first run's errors.
ALLOCATED_TOLERANCE = 0.02
RESERVED_TOLERANCE = 0.05
PREDICTED = "predicted: dry run replayed through the emulated allocator"


class AllocatorRow(WorkloadRow):
    predicted_allocated_mib: Annotated[float, Shown("allocated MiB", "{:.1f}", PREDICTED)]
    cuda_allocated_mib: Annotated[float, Shown("max_memory_allocated MiB", "{:.1f}", MEASURED)]
    allocated_error: Annotated[float | None, Shown("error", "{:+.2%}", PREDICTED)]
    predicted_reserved_mib: Annotated[float, Shown("reserved MiB", "{:.1f}", PREDICTED)]
    cuda_reserved_mib: Annotated[float, Shown("max_memory_reserved MiB", "{:.1f}", MEASURED)]
    reserved_error: Annotated[float | None, Shown("error", "{:+.2%}", PREDICTED)]
    outside_allocator_mib: Annotated[float, Shown("outside the allocator MiB", "{:.0f}", MEASURED)]


ALLOCATOR_COLUMNS = columns_of(AllocatorRow)


def cublas_workspace_bytes(device: torch.device) -> int:
    """cuBLAS's workspace on ``device`` under the installed torch (the GPU table; per call or
    per thread, as its rule says)."""
    return table_workspace_bytes(torch.cuda.get_device_capability(device))


def predicted_counters(
    workload: Workload,
    strategy: str,
    workspace_bytes: int | None = None,
    rules: SdpaRules | None = None,
) -> AllocatorPrediction:
    """The workload's dry run replayed: the first step on an empty cache, the second on the
    first's (no capacity: what the counters read, not whether a card holds it). ``rules``: the
    GPU's SDPA kernel choice (None: the CPU's)."""
    with gpu_attention_rules(rules):
        dry = train_step(
            build_model(workload), workload, parse_strategy(strategy), record_allocations=True
        )
    assert dry.allocations is not None
    return replay(dry.allocations, workspace_bytes=workspace_bytes)


def measured_counters(workload: Workload, strategy: str, device: torch.device) -> dict:
    """The second of two real steps on ``device``, started from an empty allocator (cuBLAS's
    workspaces and the cache released first): its peaks, and what the device holds outside
    PyTorch's allocator (the CUDA context, other processes) at its end."""
    torch.cuda.synchronize(device)
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    model = build_model(workload, device=str(device))
    train_step(model, workload, parse_strategy(strategy))
    second = train_step(model, workload, parse_strategy(strategy))
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    outside = total_bytes - free_bytes - torch.cuda.memory_reserved(device)
    return {
        "allocated": None if second.cuda is None else second.cuda.peak_allocated_bytes,
        "reserved": None if second.cuda is None else second.cuda.peak_reserved_bytes,
        "outside_allocator": outside,
    }


def allocator_rows(device: torch.device, checks: tuple = ALLOCATOR_CHECKS) -> list[AllocatorRow]:
    """Each check's predicted counters beside the measured ones, in MiB, with relative errors."""
    rows: list[AllocatorRow] = []
    workspace_bytes = cublas_workspace_bytes(device)
    for model, batch, size, precision, lora, strategy in checks:
        workload = Workload(model, batch=batch, size=size, precision=precision, lora_rank=lora)
        predicted = predicted_counters(workload, strategy, workspace_bytes, device_rules(device))
        measured = measured_counters(workload, strategy, device)
        rows.append(
            {
                "model": model,
                "shape": f"{batch} x {size}",
                "precision": precision + (f", LoRA {lora}" if lora else ""),
                "strategy": strategy,
                "predicted_allocated_mib": predicted.max_allocated_bytes / MiB,
                "cuda_allocated_mib": measured["allocated"] / MiB,
                "allocated_error": relative_error(
                    predicted.max_allocated_bytes, measured["allocated"]
                ),
                "predicted_reserved_mib": predicted.max_reserved_bytes / MiB,
                "cuda_reserved_mib": measured["reserved"] / MiB,
                "reserved_error": relative_error(
                    predicted.max_reserved_bytes, measured["reserved"]
                ),
                "outside_allocator_mib": measured["outside_allocator"] / MiB,
            }
        )
    return rows


def allocator_failures(rows: list[AllocatorRow]) -> list[str]:
    """A row fails without a measured counter, or off by more than the tolerance."""
    failures = []
    for row in rows:
        label = f"{row['model']} {row['strategy']}"
        for name, error, tolerance in (
            ("allocated", row["allocated_error"], ALLOCATED_TOLERANCE),
            ("reserved", row["reserved_error"], RESERVED_TOLERANCE),
        ):
            failures += tolerance_failures(
                label, error, tolerance, f"no CUDA {name} peak", f"predicted {name}"
            )
    return failures


def allocator_section(budget: Budget) -> Outcome:
    """The emulated caching allocator's two counters against ``torch.cuda``'s on this GPU."""
    rows = allocator_rows(torch.device("cuda"))
    notes = [
        "Predicted: the step's dry run, its allocations and frees replayed through "
        "tutorial_utils.measurement.allocator (baseline, then two steps; cuBLAS workspaces as "
        "the installed torch takes them: tutorial_utils/gpus.py's CUBLAS_RULES). Measured: the second of two real steps after the allocator was emptied. "
        "Outside the allocator: total - free - reserved at its end, i.e. the CUDA context and "
        "anything else on the device (compare with the quoted context in estimate/card.py)."
    ]
    table = Table("The emulated allocator against torch.cuda", ALLOCATOR_COLUMNS, rows)
    return Outcome([table], notes, allocator_failures(rows))


SECTION = Section("allocator", "The emulated allocator against torch.cuda", allocator_section)
