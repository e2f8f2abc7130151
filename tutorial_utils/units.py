"""Units shared by every layer: one definition of a megabyte and a gigabyte, and of a ratio between figures.

Figures in this tutorial are MiB (2**20 bytes), and say so: nvidia-smi prints MiB too. Only the
articles' quoted figures keep their "MB" (NVML's MiB, as they printed them).
"""

from __future__ import annotations

__all__ = ["GiB", "MiB", "ratio"]

MiB = 2**20
GiB = 2**30


def ratio(value: float | None, base: float | None) -> float | None:
    """``value / base``; None where either was not measured (or the base is 0), so a missing
    figure stays missing in every table instead of becoming a made-up 0 or inf."""
    return None if value is None or not base else value / base
