"""Which device a step runs on, how figures name it, and how to wait for it.

The default is the NVIDIA GPU when there is one, else the CPU: Apple's GPU (``mps``) is detected
and named but never chosen by default, since dry runs give the articles' scale on any laptop and a
learner opts in with ``device="mps"``. The meta device (a dry run) is named as such, so a figure
never passes a dry run off as a CPU measurement.
"""

from __future__ import annotations

import os
import platform

import torch

__all__ = [
    "default_device",
    "describe_device",
    "hardware_line",
    "mps_available",
    "mps_status",
    "MPS_UNTESTED",
    "resolve_device",
    "synchronize",
]

# Apple's GPU code paths are tested with torch.mps's calls faked: no Mac has run them yet.
MPS_UNTESTED = "never run on a Mac here"


def default_device() -> torch.device:
    """The GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The device asked for, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    return default_device()


def mps_available() -> bool:
    """Apple's GPU is usable: torch was built with MPS and this Mac's macOS supports it."""
    backend = getattr(torch.backends, "mps", None)
    return backend is not None and backend.is_available()


def mps_status() -> str | None:
    """One line on Apple's GPU for the setup cell; None where torch has no MPS (not a Mac)."""
    backend = getattr(torch.backends, "mps", None)
    if backend is None or not backend.is_built():
        return None
    if not backend.is_available():
        return "Apple's GPU (mps): torch has MPS, but this Mac cannot use it (macOS 12.3 or later)"
    return (
        "Apple's GPU (mps) is available: pass device='mps' to run a real step on it; the cpu "
        f"profile stays the default, since dry runs give the articles' scale ({MPS_UNTESTED})"
    )


def describe_device(device: torch.device | str | None = None) -> str:
    """A short hardware label for figure titles and logs."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "mps":
        return f"mps (Apple GPU, torch {torch.__version__}; {MPS_UNTESTED})"
    if device.type == "meta":
        return f"meta device (dry run) on cpu ({os.cpu_count()} cores, torch {torch.__version__})"
    return f"cpu ({os.cpu_count()} cores, torch {torch.__version__})"


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has finished its queued work, so a time or a memory reading covers it.

    CUDA and MPS run kernels asynchronously; the CPU and the meta device have nothing to wait for.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def hardware_line(device: torch.device | str | None = None) -> str:
    """What the figures were measured on."""
    return (
        f"{describe_device(device)}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs visible, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)"
    )
