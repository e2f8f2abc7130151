"""What the driver and the GPU's allocator say about GPU memory; None with a reason elsewhere.

Three CUDA figures, three meanings:

* NVML "used" (``nvml_used_mib``): the number ``nvidia-smi`` and the first article print. It is the
  whole device's used memory: the CUDA context (hundreds of MiB), cuDNN/cuBLAS workspaces, the
  caching allocator's reserved-but-free blocks, and other processes. That is why it is larger than
  ``max_memory_allocated`` and why it hardly moves when a step frees tensors.
* CUDA allocated (``torch.cuda.memory_allocated`` / ``max_memory_allocated``): bytes in live
  tensors (rounded to 512-byte blocks) plus allocator-served workspaces: what the tracker mirrors.
* CUDA reserved (``memory_reserved`` / ``max_memory_reserved``): what the caching allocator holds
  from the driver, allocated or cached for reuse.

On Apple's GPU (``mps``) torch keeps no peak counters, so two readings are taken after the step
and labelled as MPS readings: ``torch.mps.current_allocated_memory`` (bytes in live tensors) and
``driver_allocated_memory`` (all the Metal driver holds for this process, cached blocks included).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch

from tutorial_utils.measurement.devices import MPS_UNTESTED, mps_available
from tutorial_utils.units import MiB

__all__ = [
    "device_readings",
    "DeviceReadings",
    "cuda_readings",
    "cuda_unavailable_reason",
    "CudaReadings",
    "MPS_LABEL",
    "mps_readings",
    "MpsReadings",
    "nvml_driver_version",
    "nvml_index",
    "nvml_used_mib",
    "NvmlReading",
]

DeviceReadings = Literal["cuda", "mps"]  # the optional parts of a StepReport, in ``missing``
MPS_LABEL = f"MPS readings after the step (torch.mps; {MPS_UNTESTED})"


class NvmlReading(NamedTuple):
    """NVML's used memory of one device in MiB, or None and why."""

    used_mib: float | None
    reason: str | None = None


@dataclass(frozen=True)
class CudaReadings:
    """The CUDA caching allocator's counters around a tracked step (bytes)."""

    peak_allocated_bytes: int  # torch.cuda.max_memory_allocated over the step
    peak_reserved_bytes: int  # torch.cuda.max_memory_reserved over the step
    allocated_before_bytes: int  # torch.cuda.memory_allocated before the step


@dataclass(frozen=True)
class MpsReadings:
    """Apple's GPU after a step (torch.mps keeps no peaks), in bytes."""

    allocated_bytes: int  # torch.mps.current_allocated_memory(): live tensors
    driver_allocated_bytes: int  # torch.mps.driver_allocated_memory(): what Metal holds

    def describe(self, tracked_peak_bytes: int) -> str:
        """The two readings, labelled as MPS readings, beside the tracked peak."""
        return (
            f"{MPS_LABEL}: {self.allocated_bytes / MiB:,.1f} MiB in tensors, "
            f"{self.driver_allocated_bytes / MiB:,.1f} MiB held by the Metal driver "
            f"(tracked peak {tracked_peak_bytes / MiB:,.1f} MiB)"
        )


@functools.lru_cache(maxsize=1)
def _nvml() -> tuple[Any, str | None]:  # pynvml has no type hints
    """The initialised ``pynvml`` module once per process, or None and the reason it is absent."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return None, f"no NVIDIA driver reachable through NVML ({error})"
    return pynvml, None


def _nvml_handle(nvml, device_index: int):
    """The NVML handle of the CUDA device ``device_index``, matched by UUID when CUDA knows it.

    CUDA's and NVML's device numbers differ when ``CUDA_VISIBLE_DEVICES`` reorders devices.
    """
    if torch.cuda.is_available() and device_index < torch.cuda.device_count():
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except nvml.NVMLError:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


def nvml_used_mib(device_index: int = 0) -> NvmlReading:
    """Device memory in use as ``nvidia-smi`` reports it (see the module docstring for why it is
    larger than the tensors alive); None with a one-line reason where there is no NVIDIA driver."""
    nvml, reason = _nvml()
    if nvml is None:
        return NvmlReading(None, reason)
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(_nvml_handle(nvml, device_index))
    except nvml.NVMLError as error:
        return NvmlReading(None, f"NVML could not read device {device_index} ({error})")
    return NvmlReading(info.used / MiB, None)


def nvml_driver_version() -> str | None:
    """The NVIDIA driver's version as ``nvidia-smi`` prints it (e.g. "580.159.03"), which torch
    does not report; None where there is no NVIDIA driver."""
    nvml, _ = _nvml()
    if nvml is None:
        return None
    version = nvml.nvmlSystemGetDriverVersion()
    return version.decode() if isinstance(version, bytes) else version


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA figures are absent, or None when CUDA is usable."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    return f"no CUDA device visible (torch {torch.__version__} built for CUDA {torch.version.cuda})"


def cuda_readings(
    device: torch.device | str | int | None, allocated_before_bytes: int
) -> CudaReadings | str:
    """The allocator's peaks since the last reset, with what was allocated before the step; off
    CUDA, the one-line reason there are none."""
    reason = cuda_unavailable_reason()
    if reason is None and device is not None and torch.device(device).type != "cuda":
        reason = f"device {device} is not a CUDA device"
    if reason is not None:
        return reason
    return CudaReadings(
        peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
        peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
        allocated_before_bytes=allocated_before_bytes,
    )


def nvml_index(device: torch.device | str | int | None) -> int:
    """The CUDA index of ``device`` (the current device when unspecified)."""
    if isinstance(device, int):
        return device
    if device is not None and torch.device(device).index is not None:
        return torch.device(device).index
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def mps_readings(device: torch.device | str | None) -> MpsReadings | str:
    """The two readings torch.mps gives (no peaks exist there); off Apple's GPU, the one-line
    reason there are none."""
    if device is None or torch.device(device).type != "mps":
        return f"device {device} is not Apple's GPU (mps)"
    if not mps_available():
        return "torch.backends.mps.is_available() is False"
    return MpsReadings(
        allocated_bytes=torch.mps.current_allocated_memory(),
        driver_allocated_bytes=torch.mps.driver_allocated_memory(),
    )


def device_readings(
    device: torch.device, allocated_before: int | None
) -> tuple[CudaReadings | None, NvmlReading, MpsReadings | None, dict[DeviceReadings, str]]:
    """What the device itself says after a step: CUDA's peaks, NVML, torch.mps; None elsewhere,
    and why, by part (a ``StepReport``'s ``cuda``, ``nvml``, ``mps`` and ``missing``)."""
    cuda = cuda_readings(device, allocated_before or 0)
    mps = mps_readings(device)
    missing: dict[DeviceReadings, str] = {}
    if isinstance(cuda, str):
        missing["cuda"] = cuda
    else:
        assert allocated_before is not None, "the peaks were reset on this CUDA device"
    if isinstance(mps, str):
        missing["mps"] = mps
    nvml = (
        nvml_used_mib(nvml_index(device))
        if device.type == "cuda"
        else NvmlReading(None, f"device {device} is not a CUDA device")
    )
    return (
        None if isinstance(cuda, str) else cuda,
        nvml,
        None if isinstance(mps, str) else mps,
        missing,
    )
