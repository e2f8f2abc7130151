"""Notebook 03, section 6: BatchNorm running statistics under checkpointing, and two fixes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tutorial_utils.articles.models import NetA
from tutorial_utils.checkpointing.batchnorm import (
    RunningStats,
    compensate_momentum,
    freeze_stats_during_recompute,
    running_stats,
    updates_per_step,
)
from tutorial_utils.lessons.cifar10_neta.card import Batch
from tutorial_utils.lessons.cifar10_neta.strategies import train_step

# -- BatchNorm under checkpointing -----------------------------------------------------------


def batchnorm_runs(
    batches: Sequence[Batch], use_reentrant: bool = False, seed: int = 0
) -> dict[str, RunningStats]:
    """BatchNorm statistics after training NetA on ``batches``: plain, checkpointed, both fixes.

    Every run starts from the same seed, sees the same batches and takes Adam steps.
    """
    if not batches:
        raise ValueError("batches is empty: pass a few (inputs, targets) pairs")

    def run(use_checkpoint: bool, fix: str | None) -> RunningStats:
        torch.manual_seed(seed)
        model = NetA(use_checkpoint=use_checkpoint, use_reentrant=use_reentrant)
        model.to(batches[0][0].device)
        if fix == "momentum":
            compensate_momentum(model, updates_per_step(model, *batches[0]))
        elif fix == "freeze":
            freeze_stats_during_recompute(model)
        optimizer = torch.optim.Adam(model.parameters(), 1e-3)
        for inputs, targets in batches:
            train_step(model, optimizer, inputs, targets)
        return running_stats(model)

    return {
        "plain": run(False, None),
        "checkpoint": run(True, None),
        "checkpoint + momentum fix": run(True, "momentum"),
        "checkpoint + frozen recompute": run(True, "freeze"),
    }
