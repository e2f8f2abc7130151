"""Where setup.sh installs torch from, and why: the CPU build where no NVIDIA driver is present.

PyPI's torch for x86_64 Linux is the CUDA build: 3.2 GB of `nvidia-*` wheels and 0.9 GB of triton
that a machine without an NVIDIA GPU never uses. PyTorch's own CPU index has the same versions
without them (about 0.2 GB). Prints two lines for setup.sh: the pip index options (possibly
empty) and the reason, said to the user.

Usage: python scripts/torch_source.py
"""

from __future__ import annotations

import shutil
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_INDEX = "https://pypi.org/simple"


def nvidia_driver_present() -> bool:
    """An NVIDIA driver is loaded (its /proc entry) or its tool is installed."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def reachable(url: str, timeout_s: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except OSError:
        return False


def torch_source(
    driver: Callable[[], bool] = nvidia_driver_present,
    can_reach: Callable[[str], bool] = reachable,
) -> tuple[list[str], str]:
    """pip options for torch and the reason for them."""
    if driver():
        return [], "an NVIDIA driver is present: the CUDA build from PyPI (about 4 GB with CUDA)"
    if can_reach(f"{CPU_INDEX}/torch/"):
        options = ["--index-url", CPU_INDEX, "--extra-index-url", PYPI_INDEX]
        return options, f"no NVIDIA driver: the CPU build from {CPU_INDEX} (about 0.2 GB)"
    return [], (
        f"no NVIDIA driver, but {CPU_INDEX} is unreachable: the default build from the "
        "configured index (the CUDA build on PyPI, about 4 GB, runs on the CPU too)"
    )


def main() -> int:
    options, reason = torch_source()
    print(" ".join(options))
    print(reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
