"""Running an ``nn.Sequential`` in checkpointed segments.

``checkpoint_sequential`` splits the modules into ``segments`` runs of equal module count and
checkpoints all but the last, so ``segments=1`` checkpoints nothing; we treat 0 the same way.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential


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


@runtime_checkable
class CheckpointStrategy(Protocol):
    """Anything that runs a Sequential's forward its own way: a planner's ``Plan``, selective
    checkpointing, offloading. Accepted wherever a segment count is."""

    def forward(
        self, model: nn.Sequential, x: torch.Tensor, use_reentrant: bool, preserve_rng_state: bool
    ) -> torch.Tensor: ...


# what every step, sweep and training loop accepts: a segment count (0 or 1 = no checkpointing)
# or a strategy that runs the forward its own way
Segments = int | CheckpointStrategy


def forward_segments(
    model: nn.Sequential,
    x: torch.Tensor,
    segments: Segments,
    *,
    use_reentrant: bool = False,
    preserve_rng_state: bool = True,
) -> torch.Tensor:
    """``model(x)``, checkpointed in ``segments`` segments when ``segments >= 2``, or as a plan says."""
    if isinstance(segments, CheckpointStrategy) and not isinstance(segments, nn.Module):
        return segments.forward(
            model, x, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state
        )
    count = validate_segments(model, segments)
    if count <= 1:
        return model(x)
    return checkpoint_sequential(
        model,
        count,
        x,
        use_reentrant=use_reentrant,
        preserve_rng_state=preserve_rng_state,
    )


def segment_boundaries(n_modules: int, segments: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` module ranges ``checkpoint_sequential`` uses (last one not checkpointed)."""
    if segments <= 1:
        return [(0, n_modules)]
    size = n_modules // segments
    bounds = [(start, start + size) for start in range(0, size * (segments - 1), size)]
    bounds.append((size * (segments - 1), n_modules))
    return bounds
