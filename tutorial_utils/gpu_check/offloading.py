"""Section 4, offloading: one step with ``offloaded()`` (saved tensors in pinned host memory)
and one without: peaks, times, gradients."""

from __future__ import annotations

from typing import Annotated, TypedDict

import torch

from tutorial_utils.articles.models import vgg16_classifier
from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, offloaded
from tutorial_utils.gpu_check.report import MEASURED, Column, Outcome, Shown, Table, columns_of
from tutorial_utils.gpu_check.runner import Budget, Section, free_cuda_memory
from tutorial_utils.measurement.gradients import compare_gradients, parameter_gradients
from tutorial_utils.measurement.step import measure_step
from tutorial_utils.units import MiB

__all__ = ["offloading_outcome", "OffloadRow", "SECTION"]


class OffloadRow(TypedDict):
    step: Annotated[str, Shown("step")]
    tracked_peak_mib: Annotated[float, Shown("tracked peak MiB", "{:.1f}", MEASURED)]
    cuda_peak_allocated_mib: Annotated[
        float | None, Shown("CUDA peak allocated MiB", "{:.1f}", MEASURED)
    ]
    step_seconds: Annotated[float | None, Shown("step s", "{:.3f}", MEASURED)]


OFFLOAD_COLUMNS = columns_of(OffloadRow)


OFFLOAD_SHAPE = (32, 3, 224, 224)
GRADIENT_COLUMNS = [
    Column("parameters", "parameters", "{:d}"),
    Column("bitwise equal", "bitwise", "{}", MEASURED),
    Column("within rtol 1e-4, atol 1e-5", "close", "{}", MEASURED),
    Column("largest difference", "max_difference", "{:.3g}", MEASURED),
]


def offloading_outcome(rows: list[OffloadRow], gradients: dict) -> Outcome:
    """Both steps' peaks and the gradient comparison; offloading must lower the CUDA peak and
    leave the gradients as they were."""
    plain, offloaded = rows
    failures = []
    # on CUDA both peaks are measured; a None would raise, and the section fail, as it should
    if not offloaded["cuda_peak_allocated_mib"] < plain["cuda_peak_allocated_mib"]:  # type: ignore[operator]
        failures.append("offloading did not lower the CUDA peak allocated")
    if not gradients["close"]:
        failures.append(f"gradients differ by up to {gradients['max_difference']:.3g}")
    return Outcome(
        [
            Table(
                "One step of VGG16 (flat), 224 px, batch 32, SGD momentum", OFFLOAD_COLUMNS, rows
            ),
            Table("Gradients, offloaded against plain", GRADIENT_COLUMNS, [gradients]),
        ],
        [
            "Offloading (torch.autograd.graph.save_on_cpu, pinned) keeps every saved tensor in "
            "host memory between forward and backward: no recompute. Gradients compared with "
            "cuDNN deterministic, the same weights and the same dropout seed."
        ],
        failures,
    )


def offloading_section(budget: Budget) -> Outcome:
    """Section 4: the package's offloading against the plain step on the GPU."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = vgg16_classifier(2, layout="flat").to(device)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(OFFLOAD_SHAPE, generator=generator)
    targets = torch.randint(0, 2, (OFFLOAD_SHAPE[0],), generator=generator)
    rows: list[OffloadRow] = []
    for strategy in (NO_CHECKPOINTING, offloaded(name="saved tensors offloaded to the CPU")):
        report = measure_step(model, inputs, targets, strategy, device=device, repeats=3)
        rows.append(
            {
                "step": "plain" if strategy.kind == "none" else strategy.name,
                "tracked_peak_mib": report.peak_mib,
                "cuda_peak_allocated_mib": (
                    None if report.cuda is None else report.cuda.peak_allocated_bytes / MiB
                ),
                "step_seconds": report.seconds,
            }
        )
        free_cuda_memory()
    inputs = inputs.to(device)
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        plain_gradients = parameter_gradients(
            model, inputs
        )  # notebook 02's: Dropout drawn after seed 0
        offloaded_gradients = parameter_gradients(model, inputs, offloaded())
    return offloading_outcome(rows, compare_gradients(plain_gradients, offloaded_gradients))


SECTION = Section("offloading", "Offloading saved activations to the CPU", offloading_section)
