"""The oldest PyTorch the dry run is tested on, checked before it reaches torch's internals.

A dry run leans on internals that move between releases (``AutogradMeta`` registrations, the
fused attention kernels' names, FLOP formulas). Every notebook passed on torch 2.9.1 (Python
3.12), 2.11.0 (Python 3.13, Colab's), 2.14.1 and 2.15.0 (Python 3.11): an older torch gets one
line saying what to install, not a crash deep inside a step.
"""

from __future__ import annotations

import re

import torch

__all__ = ["require_tested_torch", "torch_release"]

OLDEST_TESTED_TORCH = (2, 9)


def torch_release(version: str) -> tuple[int, int]:
    """``"2.9.1+cu128"`` -> ``(2, 9)``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"cannot read a torch version from {version!r}")
    return int(found.group(1)), int(found.group(2))


def require_tested_torch(version: str = torch.__version__) -> None:
    """Raise a one-line error where ``version`` is older than the oldest torch tested here."""
    if torch_release(version) < OLDEST_TESTED_TORCH:
        oldest = ".".join(map(str, OLDEST_TESTED_TORCH))
        raise RuntimeError(
            f"tutorial_utils needs torch >= {oldest} (found {version}): "
            f"pip install -U 'torch>={oldest}' 'torchvision>=0.24'"
        )
