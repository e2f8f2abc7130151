"""``checkpoint_sequential``'s split of an ``nn.Sequential``: which modules each segment holds.

``checkpoint_sequential`` splits the modules into ``segments`` runs of equal module count and
checkpoints all but the last, so ``segments=1`` checkpoints nothing; we treat 0 the same way.
``strategy.equal_segments(k)`` runs that split.
"""

from __future__ import annotations

import torch.nn as nn

__all__ = ["segment_boundaries", "validate_segments"]


def validate_segments(model: nn.Sequential, segments: object) -> int:
    """``segments`` itself when it is a valid count for ``model``, else a ``ValueError``."""
    n_modules = len(model)
    if isinstance(segments, bool) or not isinstance(segments, int):
        raise ValueError(f"segments must be an integer in 0..{n_modules}, got {segments!r}")
    if not 0 <= segments <= n_modules:
        raise ValueError(
            f"segments={segments} is out of range for a model of {n_modules} modules: "
            f"use 0 or 1 for no checkpointing, or 2..{n_modules}"
        )
    return segments


def segment_boundaries(n_modules: int, segments: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` module ranges ``checkpoint_sequential`` uses (last one not checkpointed)."""
    if segments <= 1:
        return [(0, n_modules)]
    size = n_modules // segments
    bounds = [(start, start + size) for start in range(0, size * (segments - 1), size)]
    bounds.append((size * (segments - 1), n_modules))
    return bounds
