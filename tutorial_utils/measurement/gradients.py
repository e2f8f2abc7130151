"""Gradients taken and compared: the one place that decides whether two backward passes agree.

Checkpointing must change memory and time, never the gradients; every notebook and the GPU check
prove that the same way, with these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, Strategy

__all__ = [
    "compare_gradients",
    "gradients_identical",
    "gradients_match",
    "max_difference",
    "named_gradients",
    "parameter_gradients",
]

RTOL, ATOL = 1e-4, 1e-5  # float32 sums reordered by recomputation stay well inside these


def named_gradients(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """A detached copy of every trainable parameter's gradient by name (None where none arrived)."""
    return {
        name: None if p.grad is None else p.grad.detach().clone()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def gradients_identical(
    first: Mapping[str, torch.Tensor | None], second: Mapping[str, torch.Tensor | None]
) -> bool:
    """Bit for bit: the same parameters, each gradient equal or missing in both (what a
    non-reentrant checkpoint of deterministic CPU ops gives)."""
    if first.keys() != second.keys():
        return False
    return all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in ((first[name], second[name]) for name in first)
    )


def parameter_gradients(
    model: nn.Module,
    inputs: torch.Tensor,
    strategy: Strategy | None = None,
    *,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Parameter gradients of ``output.sum()`` in train mode (Dropout active), seeded first,
    checkpointed as ``strategy`` says (its ``preserve_rng_state`` decides whether a recomputed
    Dropout draws the same mask); parameters left without a gradient are left out."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with (strategy or NO_CHECKPOINTING).applied(model):
        output = model(inputs)
    output.sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


def max_difference(first: Sequence[torch.Tensor], second: Sequence[torch.Tensor]) -> float:
    """Largest absolute elementwise difference between two lists of same-shaped tensors."""
    return max((a - b).abs().max().item() for a, b in zip(first, second, strict=True))


def gradients_match(
    gradients: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    rtol: float = RTOL,
    atol: float = ATOL,
) -> bool:
    """Same parameter names, and every gradient ``allclose`` to the reference."""
    return gradients.keys() == reference.keys() and all(
        torch.allclose(gradients[name], reference[name], rtol=rtol, atol=atol) for name in reference
    )


def compare_gradients(
    reference: Sequence[torch.Tensor], other: Sequence[torch.Tensor]
) -> dict[str, int | bool | float]:
    """Whether two gradient lists are equal, bitwise and within ``RTOL``/``ATOL``: one table row."""
    pairs = list(zip(reference, other, strict=True))
    return {
        "parameters": len(pairs),
        "bitwise": all(torch.equal(a, b) for a, b in pairs),
        "close": all(torch.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in pairs),
        "max_difference": max_difference(reference, other),
    }
