"""Section 5, NCCL: an all-reduce over two ranks (``training.distributed.launch``) where two GPUs
are visible; skipped, not failed, on one."""

from __future__ import annotations

import time
from typing import Annotated, TypedDict

import torch
import torch.distributed as dist

from tutorial_utils.gpu_check.report import MEASURED, Outcome, Shown, Table, columns_of
from tutorial_utils.gpu_check.runner import Budget, Section
from tutorial_utils.training.distributed import RankContext, launch

__all__ = ["nccl_rank", "nccl_section", "nccl_skip_reason", "NcclRow", "SECTION"]


class NcclRow(TypedDict):
    rank: Annotated[int, Shown("rank", "{:d}")]
    device: Annotated[str, Shown("device")]
    gpu: Annotated[str, Shown("GPU")]
    backend: Annotated[str, Shown("backend")]
    sum: Annotated[float, Shown("all-reduce sum", "{:g}", MEASURED)]
    all_equal: bool
    expected: Annotated[float, Shown("expected", "{:g}")]
    seconds: Annotated[float, Shown("all-reduce s", "{:.4f}", MEASURED)]


NCCL_COLUMNS = columns_of(NcclRow)


NCCL_RANKS = 2


def nccl_skip_reason(device_count: int) -> str | None:
    """Why the NCCL section cannot run with ``device_count`` GPUs; None when it can."""
    if device_count >= NCCL_RANKS:
        return None
    return f"{'one GPU' if device_count == 1 else f'{device_count} GPUs'} visible"


def nccl_rank(context: RankContext) -> NcclRow:
    """One rank: an all-reduce of rank + 1 over NCCL on its own GPU (a spawned process imports
    this from this module)."""
    tensor = torch.full((1 << 20,), float(context.rank + 1), device=context.device)
    torch.cuda.synchronize(context.device)
    started = time.perf_counter()
    dist.all_reduce(tensor)
    torch.cuda.synchronize(context.device)
    seconds = time.perf_counter() - started
    return {
        "rank": context.rank,
        "device": str(context.device),
        "gpu": torch.cuda.get_device_name(context.device),
        "backend": str(dist.get_backend()),
        "sum": tensor[0].item(),
        "all_equal": bool((tensor == tensor[0]).all().item()),
        "expected": float(sum(range(1, context.world_size + 1))),
        "seconds": seconds,
    }


def nccl_section(budget: Budget) -> Outcome:
    """Section 5: two NCCL ranks through ``training.distributed.launch``, or why not."""
    reason = nccl_skip_reason(torch.cuda.device_count())
    if reason is not None:
        return Outcome(skipped=reason)
    rows: list[NcclRow] = launch(
        nccl_rank, world_size=NCCL_RANKS, device_type="cuda", timeout_s=120
    )
    failures = [
        f"rank {row['rank']}: all-reduce gave {row['sum']:g}, expected {row['expected']:g}"
        for row in rows
        if row["sum"] != row["expected"] or not row["all_equal"]
    ]
    return Outcome([Table(f"{NCCL_RANKS} ranks", NCCL_COLUMNS, rows)], [], failures)


SECTION = Section("nccl", "Two NCCL ranks", nccl_section)
