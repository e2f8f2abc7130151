"""Section 1, hardware: each GPU (name, compute capability, memory, NVML's used MiB through the
package's reader beside the driver's free/total) and the software stack's versions."""

from __future__ import annotations

import platform
from typing import Annotated, TypedDict

import torch

from tutorial_utils.gpu_check.report import MEASURED, Column, Outcome, Shown, Table, columns_of
from tutorial_utils.gpu_check.runner import Budget, Section
from tutorial_utils.measurement.nvml import nvml_driver_version, nvml_used_mib
from tutorial_utils.units import MiB

__all__ = ["GpuRow", "SECTION"]


class GpuRow(TypedDict):
    index: Annotated[int, Shown("GPU")]
    name: Annotated[str, Shown("name")]
    capability: Annotated[str, Shown("compute capability")]
    multiprocessors: Annotated[int, Shown("multiprocessors", "{:d}", MEASURED)]
    total_mib: Annotated[float, Shown("total MiB", "{:.0f}", MEASURED)]
    driver_used_mib: Annotated[float, Shown("used MiB (cudaMemGetInfo)", "{:.0f}", MEASURED)]
    nvml_used_mib: Annotated[float | None, Shown("used MiB (NVML)", "{:.0f}", MEASURED)]


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int such as 2708 before
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def hardware_section(budget: Budget) -> Outcome:
    """Each GPU and the software stack, with NVML's used memory beside the driver's free/total."""
    gpus: list[GpuRow] = []
    failures = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        nvml = nvml_used_mib(index)
        if nvml.used_mib is None:
            failures.append(f"NVML could not be read on GPU {index}: {nvml.reason}")
        gpus.append(
            {
                "index": index,
                "name": properties.name,
                "capability": f"{properties.major}.{properties.minor}",
                "multiprocessors": properties.multi_processor_count,
                "total_mib": total / MiB,
                "driver_used_mib": (total - free) / MiB,
                "nvml_used_mib": nvml.used_mib,
            }
        )
    versions = {
        "driver": nvml_driver_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": _nccl_version(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    return Outcome(
        [
            Table(
                f"GPUs ({len(gpus)} visible)",
                columns_of(GpuRow),
                gpus,
            ),
            Table(
                "Versions",
                [Column(name, name) for name in versions],
                [versions],
            ),
        ],
        [
            "Both used figures are the whole device's (the CUDA context, the allocator's cache, "
            "other processes), read before any section allocated tensors."
        ],
        failures,
    )


SECTION = Section("hardware", "Hardware", hardware_section)
