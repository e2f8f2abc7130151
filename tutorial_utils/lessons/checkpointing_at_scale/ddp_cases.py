"""DDP and checkpointing: the reentrant failure, its two fixes, and the launcher's failure cases."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from tutorial_utils.display.tables import text_table
from tutorial_utils.lessons.checkpointing_at_scale.hang_guard import hang_guard_s
from tutorial_utils.lessons.checkpointing_at_scale.model import (
    BlockNetConfig,
    build_model,
    global_batch,
    rank_slice,
    single_process_gradients,
)
from tutorial_utils.measurement.gradients import gradients_match
from tutorial_utils.training.distributed import (
    DeviceType,
    RankContext,
    launch,
    resolve_ranks,
)


@dataclass(frozen=True)
class DDPCase:
    """One way of combining checkpointing with DDP."""

    name: str
    tied_blocks: bool
    checkpoint_blocks: bool
    use_reentrant: bool
    find_unused_parameters: bool = False
    static_graph: bool = False


DDP_CASES = (
    DDPCase("no checkpointing", tied_blocks=True, checkpoint_blocks=False, use_reentrant=False),
    DDPCase(
        "reentrant, block used twice", tied_blocks=True, checkpoint_blocks=True, use_reentrant=True
    ),
    DDPCase(
        "reentrant + find_unused_parameters",
        tied_blocks=False,
        checkpoint_blocks=True,
        use_reentrant=True,
        find_unused_parameters=True,
    ),
    DDPCase(
        "fix: use_reentrant=False", tied_blocks=True, checkpoint_blocks=True, use_reentrant=False
    ),
    DDPCase(
        "fix: static_graph=True",
        tied_blocks=True,
        checkpoint_blocks=True,
        use_reentrant=True,
        static_graph=True,
    ),
)


@dataclass
class DDPCaseResult:
    """What one rank saw for one case: its loss and gradients, or the error DDP raised."""

    case: DDPCase
    rank: int
    loss: float | None
    gradients: dict[str, torch.Tensor] | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def run_ddp_cases(
    ctx: RankContext, config: BlockNetConfig, cases: tuple[DDPCase, ...] = DDP_CASES
) -> list[DDPCaseResult]:
    """In a rank: one forward/backward per case under DDP, errors caught and reported per case."""
    batch = global_batch(config)
    inputs, labels = (t.to(ctx.device) for t in rank_slice(batch, ctx.rank, ctx.world_size))
    results = []
    for case in cases:
        model = build_model(
            config,
            tied_blocks=case.tied_blocks,
            checkpoint_blocks=case.checkpoint_blocks,
            use_reentrant=case.use_reentrant,
        ).to(ctx.device)
        ddp_model = DistributedDataParallel(
            model,
            find_unused_parameters=case.find_unused_parameters,
            static_graph=case.static_graph,
        )
        loss = F.cross_entropy(ddp_model(inputs), labels)
        try:
            loss.backward()
        except RuntimeError as error:
            results.append(DDPCaseResult(case, ctx.rank, None, None, f"RuntimeError: {error}"))
        else:
            gradients = {}
            for name, p in model.named_parameters():
                assert p.grad is not None  # the backward succeeded and every parameter is used
                gradients[name] = p.grad.detach().cpu()
            results.append(DDPCaseResult(case, ctx.rank, loss.item(), gradients, None))
        dist.barrier()  # both ranks finish a case before the next one builds its buckets
    return results


def raise_on_rank(ctx: RankContext, failing_rank: int) -> int:
    """In a rank: ``failing_rank`` raises while the others wait in a collective it never joins.

    Shows what ``launch`` does with a broken rank: one clear error, the waiting ranks stopped.
    """
    if ctx.rank == failing_rank:
        raise ValueError(f"rank {failing_rank} was told to fail")
    dist.all_reduce(torch.ones(1))  # blocks: the failing rank never gets here
    return ctx.rank


def stall_on_rank(ctx: RankContext, stalled_rank: int, seconds: float) -> int:
    """In a rank: ``stalled_rank`` hangs for ``seconds`` before the barrier the others wait in.

    Shows what ``launch`` does with a stuck rank: the deadline stops every rank.
    """
    if ctx.rank == stalled_rank:
        time.sleep(seconds)
    dist.barrier()
    return ctx.rank


@dataclass(frozen=True)
class DDPCaseSummary:
    """One row of the DDP + checkpointing table, from both ranks and the single-process run."""

    case: DDPCase
    failed_on_every_rank: bool
    error: str | None  # rank 0's error, first line
    gradients_equal_single_process: bool | None  # None when the backward failed


def compare_ddp_cases(
    config: BlockNetConfig,
    world_size: int | None = None,
    device_type: DeviceType | None = None,
    cases: tuple[DDPCase, ...] = DDP_CASES,
) -> list[DDPCaseSummary]:
    """Run every case under DDP and check each rank's gradients against one process."""
    world_size, device_type = resolve_ranks(world_size, device_type)
    config.check_splits(world_size)
    per_rank = launch(
        run_ddp_cases,
        config,
        cases,
        world_size=world_size,
        device_type=device_type,
        timeout_s=hang_guard_s(config, len(cases), world_size, device_type),
    )
    summaries = []
    for index, case in enumerate(cases):
        results = [rank_results[index] for rank_results in per_rank]
        equal = None
        if all(result.ok for result in results):
            reference = single_process_gradients(config, tied_blocks=case.tied_blocks)
            equal = all(gradients_match(result.gradients, reference) for result in results)
        first_error = results[0].error.splitlines()[0] if results[0].error else None
        summaries.append(DDPCaseSummary(case, all(not r.ok for r in results), first_error, equal))
    return summaries


def format_ddp_cases(summaries: list[DDPCaseSummary]) -> str:
    """One line per case: what was combined, what happened, whether the gradients are right."""
    rows = [
        (
            summary.case.name,
            "FAILED" if summary.error else "ok",
            "-"
            if summary.gradients_equal_single_process is None
            else summary.gradients_equal_single_process,
        )
        for summary in summaries
    ]
    return text_table(("case", "backward", "gradients == one process"), rows, "lll")


@contextlib.contextmanager
def one_process_group() -> Iterator[None]:
    """A gloo process group of one rank in this process, so a cell can wrap a model in DDP and
    run it here (DDP's hooks and their checks run as on every rank); torn down on exit."""
    if dist.is_initialized():
        raise RuntimeError("a process group already exists here: destroy it first")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
