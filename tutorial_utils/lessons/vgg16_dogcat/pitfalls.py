"""Notebook 02's caveats (Going deeper): reentrant mode, Dropout, the last segment."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

from tutorial_utils.checkpointing.segments import segment_boundaries, validate_segments

__all__ = [
    "SegmentGradients",
    "dropout_segments",
    "forward_call_counts",
    "gradients_per_segment",
    "raised_by_torch",
]

# -- pitfalls --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentGradients:
    """How many of a segment's parameter tensors received a gradient."""

    start: int
    end: int
    checkpointed: bool
    with_gradient: int
    parameters: int


def gradients_per_segment(
    model: nn.Sequential,
    inputs: torch.Tensor,
    segments: int,
    *,
    use_reentrant: bool | None,
    input_requires_grad: bool,
) -> tuple[list[SegmentGradients], list[str]]:
    """Run torch's ``checkpoint_sequential`` forward + backward; count gradients per segment.

    ``use_reentrant=None`` leaves the argument out, to show torch's default. Returns the counts
    and the warnings torch raised (their text only, without file and line); warnings raised by
    anything else meanwhile (a Jupyter kernel's own deprecations, say) are not torch's to show.
    """
    validate_segments(model, segments)
    model.zero_grad(set_to_none=True)
    x = inputs.detach().clone().requires_grad_(input_requires_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mode = {} if use_reentrant is None else {"use_reentrant": use_reentrant}
        output = checkpoint_sequential(model, max(segments, 1), x, **mode)
        output.sum().backward()
    bounds = segment_boundaries(len(model), segments)
    counts = []
    for position, (start, end) in enumerate(bounds):
        parameters = [p for module in model[start:end] for p in module.parameters()]
        counts.append(
            SegmentGradients(
                start,
                end,
                segments >= 2 and position < len(bounds) - 1,
                sum(p.grad is not None for p in parameters),
                len(parameters),
            )
        )
    model.zero_grad(set_to_none=True)
    return counts, [str(w.message) for w in caught if raised_by_torch(w)]


def raised_by_torch(warning: warnings.WarningMessage) -> bool:
    """Raised in torch, or by torch on behalf of this module's call (``stacklevel`` names the
    caller): not a Jupyter kernel's own deprecation that happened to fire meanwhile."""
    return warning.filename == __file__ or "torch" in Path(warning.filename).parts


def dropout_segments(model: nn.Sequential, segments: int) -> list[tuple[int, int, bool]]:
    """``(start, end, checkpointed)`` of the segments that contain a Dropout."""
    bounds = segment_boundaries(len(model), segments)
    return [
        (start, end, segments >= 2 and position < len(bounds) - 1)
        for position, (start, end) in enumerate(bounds)
        if any(isinstance(module, nn.Dropout) for module in model[start:end])
    ]


def forward_call_counts(
    model: nn.Sequential, inputs: torch.Tensor, segments: int, *, use_reentrant: bool = False
) -> list[int]:
    """How often each module's forward completed in one forward + backward through torch's
    ``checkpoint_sequential`` (``segments=0``: a plain call). 2 = recomputed during backward."""
    counts = [0] * len(model)
    handles = [
        module.register_forward_hook(lambda *_, i=index: counts.__setitem__(i, counts[i] + 1))
        for index, module in enumerate(model)
    ]
    model.zero_grad(set_to_none=True)
    x = inputs.detach().clone().requires_grad_(use_reentrant)
    try:
        if segments == 0:
            output = model(x)
        else:
            output = checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant)
        output.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return counts
