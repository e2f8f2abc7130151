"""Running an ``nn.Sequential`` in checkpointed segments.

``checkpoint_sequential`` splits the modules into ``segments`` runs of equal module count and
checkpoints all but the last, so ``segments=1`` checkpoints nothing; we treat 0 the same way.
With a plain count, ``forward_segments`` does exactly what ``checkpoint_sequential`` does, so a
checkpointed BatchNorm updates its running statistics twice per step (notebooks 02 and 03 show
it); ``keep_batchnorm=True``, or ``segments=EqualSegments(k)`` wherever a strategy is accepted, runs
the same split with the recomputation leaving the statistics alone.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from tutorial_utils.checkpointing.batchnorm import run_keeping_batchnorm


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
    keep_batchnorm: bool = False,
) -> torch.Tensor:
    """``model(x)``, checkpointed in ``segments`` segments when ``segments >= 2``, or as a plan says.

    ``keep_batchnorm``: for a segment count, recompute without updating BatchNorm's statistics a
    second time (strategies such as plans and ``SelectiveCheckpoint`` decide this themselves).
    """
    if isinstance(segments, CheckpointStrategy) and not isinstance(segments, nn.Module):
        return segments.forward(
            model, x, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state
        )
    count = validate_segments(model, segments)
    if count <= 1:
        return model(x)
    if keep_batchnorm:
        return EqualSegments(count).forward(model, x, use_reentrant, preserve_rng_state)
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


@dataclass(frozen=True)
class EqualSegments:
    """``checkpoint_sequential``'s split (equal runs, all but the last checkpointed) with BatchNorm
    kept right: pass ``segments=EqualSegments(k)`` where a segment count is accepted."""

    segments: int

    def forward(
        self,
        model: nn.Sequential,
        x: torch.Tensor,
        use_reentrant: bool = False,
        preserve_rng_state: bool = True,
    ) -> torch.Tensor:
        """``model(x)`` in ``segments`` runs, each but the last under ``checkpoint``."""
        validate_segments(model, self.segments)
        modules = list(model)
        runs = segment_boundaries(len(modules), self.segments)
        for k, (start, end) in enumerate(runs):
            run = functools.partial(run_keeping_batchnorm, modules[start:end])
            if k == len(runs) - 1:
                x = run(x)
            else:
                x = checkpoint(
                    run, x, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state
                )
        return x

    def __str__(self) -> str:
        return f"{self.segments} equal segments, BatchNorm kept"
