"""BatchNorm's running statistics after one training step under each strategy, against the plain
step's: which strategies update them twice (``checkpointing.batchnorm`` says why and fixes it)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_utils.checkpointing.batchnorm import RunningStats, largest_difference, running_stats
from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, Strategy

__all__ = ["batchnorm_updates"]

ROUNDING = 1e-5  # running statistics closer than this to the plain step's differ by rounding only


def batchnorm_updates(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    strategies: dict[str, Strategy],
) -> str:
    """For each strategy, one training step on a copy: how many BatchNorm layers counted more
    than one update, and how far running statistics are from the plain step's (identical, or the
    largest difference: a second update moves them by the momentum, a decomposed compiled
    BatchNorm only by rounding, whose digits vary with the machine's kernels)."""

    def step(strategy: Strategy) -> RunningStats:
        probe = copy.deepcopy(model).train()
        with strategy.applied(probe):
            output = probe(inputs)
        F.cross_entropy(output, targets).backward()
        return running_stats(probe)

    plain = step(NO_CHECKPOINTING)
    width = max(len(name) for name in strategies)
    lines = [f"{'strategy':<{width}}  {'BatchNorms updated twice':>24}  statistics against plain"]
    for name, strategy in strategies.items():
        stats = step(strategy)
        doubled = sum(int(layer["num_batches_tracked"]) > 1 for layer in stats.values())
        gap = largest_difference(stats, plain)
        verdict = (
            "identical"
            if gap == 0
            else f"rounding only (under {ROUNDING:.0e})"
            if gap < ROUNDING
            else f"differ by up to {gap:.1e}"
        )
        lines.append(f"{name:<{width}}  {doubled:>20} of {len(stats)}  {verdict}")
    return "\n".join(lines)
