"""Notebook 03, section 2: which checkpoint mode needs the article's requires-grad line."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from tutorial_utils.articles.models import NetA

# -- the article's requires-grad line ---------------------------------------------------------


@dataclass
class TrickOutcome:
    """One backward through NetA with a checkpoint mode, the line kept or removed."""

    use_reentrant: bool
    trick: bool
    checkpointed: str
    backward: str  # "ok" or the first line of the error
    parameters_without_grad: int
    warnings: int


def requires_grad_trick_outcomes(inputs: torch.Tensor, targets: torch.Tensor) -> list[TrickOutcome]:
    """Backward through NetA in each mode with and without the article's line.

    Checkpointing all five segments and only the first one: reentrant checkpoint without the line
    either fails or silently leaves the first segment's parameters without gradients.
    """
    outcomes = []
    for use_reentrant in (True, False):
        for trick in (True, False):
            for segments, label in ((True, "all 5"), ({0}, "seg0 only")):
                torch.manual_seed(0)
                model = NetA(segments, use_reentrant=use_reentrant, input_requires_grad_trick=trick)
                model.to(inputs.device)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        nn.functional.cross_entropy(model(inputs), targets).backward()
                        result = "ok"
                    except RuntimeError as error:
                        result = str(error).splitlines()[0]
                missing = sum(p.grad is None for p in model.parameters())
                outcomes.append(
                    TrickOutcome(use_reentrant, trick, label, result, missing, len(caught))
                )
    return outcomes


def format_trick_outcomes(outcomes: Sequence[TrickOutcome]) -> str:
    """A table of ``requires_grad_trick_outcomes``."""
    lines = [f"{'mode':<14} {'line':<8} {'checkpointed':<13} {'no grad':>7}  backward"]
    for o in outcomes:
        mode = "reentrant" if o.use_reentrant else "non-reentrant"
        line = "kept" if o.trick else "removed"
        lines.append(
            f"{mode:<14} {line:<8} {o.checkpointed:<13} "
            f"{o.parameters_without_grad:>7}  {o.backward}"
        )
    return "\n".join(lines)
