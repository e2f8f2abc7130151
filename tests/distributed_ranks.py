"""Rank functions for the tests of ``training.distributed.launch``: a spawned rank imports its
function by name, so they live at the top level of an importable module, not in a test."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tutorial_utils.training.distributed import RankContext


def raise_on_rank(ctx: RankContext, failing_rank: int) -> int:
    """``failing_rank`` raises while the others wait in a collective it never joins."""
    if ctx.rank == failing_rank:
        raise ValueError(f"rank {failing_rank} was told to fail")
    dist.all_reduce(torch.ones(1))  # blocks: the failing rank never gets here
    return ctx.rank


def stall_on_rank(ctx: RankContext, stalled_rank: int, seconds: float) -> int:
    """``stalled_rank`` hangs for ``seconds`` before the barrier the others wait in."""
    if ctx.rank == stalled_rank:
        time.sleep(seconds)
    dist.barrier()
    return ctx.rank
