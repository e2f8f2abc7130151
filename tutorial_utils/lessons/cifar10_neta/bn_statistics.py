"""Notebook 03's Going deeper: BatchNorm's statistics under checkpointing, with the package's two
fixes (compensated momentum, hooks), in both checkpoint modes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from tutorial_utils.articles.models import NetA
from tutorial_utils.checkpointing.batchnorm import (
    RunningStats,
    compensate_momentum,
    counter_ratio,
    freeze_stats_during_recompute,
    running_stats,
    stats_match,
    updates_per_step,
)
from tutorial_utils.display.tables import text_table

__all__ = ["batchnorm_runs", "format_batchnorm_runs"]

Batch = tuple[torch.Tensor, torch.Tensor]


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
        model.train()
        for inputs, targets in batches:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        return running_stats(model)

    return {
        "plain": run(False, None),
        "checkpoint": run(True, None),
        "checkpoint + momentum fix": run(True, "momentum"),
        "checkpoint + frozen recompute": run(True, "freeze"),
    }


def format_batchnorm_runs(runs: dict[str, RunningStats], reference: str = "plain") -> str:
    """Each run against ``reference``: counters, running mean and variance, everything."""
    base = runs[reference]
    rows = [
        (
            label,
            f"x{counter_ratio(stats, base):.0f}",
            stats_match(stats, base, counters=False),
            stats_match(stats, base),
        )
        for label, stats in runs.items()
    ]
    header = ("run", "counter vs plain", "mean and variance match plain", "everything matches")
    return text_table(header, rows)
