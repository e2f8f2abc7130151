"""Which device a step runs on, and how figures name it.

The default is the GPU when there is one; the meta device (a dry run) is named as such, so a
figure never passes a dry run off as a CPU measurement.
"""

from __future__ import annotations

import os

import torch


def default_device() -> torch.device:
    """The GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The device asked for, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device(device: torch.device | str | None = None) -> str:
    """A short hardware label for figure titles and logs."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "meta":
        return f"meta device (dry run) on cpu ({os.cpu_count()} cores, torch {torch.__version__})"
    return f"cpu ({os.cpu_count()} cores, torch {torch.__version__})"
