"""What sharding saves and what checkpointing saves, measured per rank in every setup."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from tutorial_utils.lessons.checkpointing_at_scale.hang_guard import hang_guard_s
from tutorial_utils.lessons.checkpointing_at_scale.model import (
    BlockNetConfig,
    ResidualBlock,
    build_model,
    global_batch,
    rank_slice,
)
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.training.distributed import (
    DeviceType,
    RankContext,
    launch,
    resolve_ranks,
)
from tutorial_utils.units import MB

SINGLE_PROCESS = "single process"
DISTRIBUTED_SETUPS = ("DDP", "DDP + checkpointing", "FSDP", "FSDP + checkpointing")
SETUPS = (SINGLE_PROCESS, *DISTRIBUTED_SETUPS)
WARMUP_STEPS = 2  # Adam's state exists and DDP has rebuilt its buckets before we measure


@dataclass(frozen=True)
class MemoryRecord:
    """Tracked peak of one training step on one rank, split by category (bytes)."""

    setup: str
    rank: int
    world_size: int
    local_batch: int
    peak_bytes: int
    breakdown: dict[str, int]
    loss: float
    gradient_norm: float  # of the whole model: equal in every setup when all compute the same
    ddp_bucket_bytes: int = 0  # DDP's gradient buckets, allocated at wrapping, outside the step

    def mib(self, category: str) -> float:
        return self.breakdown[category] / MB


def checkpoint_every_block(model: nn.Module) -> None:
    """Wrap each ``ResidualBlock`` in torch.distributed's checkpoint wrapper (non-reentrant)."""
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
        ),
        check_fn=lambda module: isinstance(module, ResidualBlock),
    )


def prepare_setup(setup: str, config: BlockNetConfig, device: torch.device) -> nn.Module:
    """The model as ``setup`` trains it: wrapped in DDP, or sharded per block with FSDP2."""
    if setup not in SETUPS:
        raise ValueError(f"unknown setup {setup!r}: use one of {SETUPS}")
    model = build_model(config).to(device)
    if setup.endswith("+ checkpointing"):
        checkpoint_every_block(model)
    if setup.startswith("DDP"):
        return DistributedDataParallel(model)
    if setup.startswith("FSDP"):
        for block in model.blocks:
            fully_shard(block)  # one all-gather per block: only one block is unsharded at a time
        fully_shard(model)
    return model


def gradient_norm(model: nn.Module) -> float:
    """The whole model's gradient norm; sharded gradients are summed over ranks first."""
    squares = torch.zeros((), dtype=torch.float64)
    sharded = False
    for p in model.parameters():
        grad = p.grad
        assert grad is not None  # called after a step, in which every parameter got a gradient
        if isinstance(grad, DTensor):
            grad, sharded = grad.to_local(), True
        squares += grad.detach().double().pow(2).sum().cpu()
    if sharded:
        dist.all_reduce(squares)
    return squares.sqrt().item()


def ddp_bucket_bytes(model: DistributedDataParallel) -> int:
    """Bytes of DDP's gradient buckets, as DDP itself reports them.

    With the default ``gradient_as_bucket_view=False`` DDP copies every gradient into these
    buffers for the all-reduce: a second gradient-sized allocation that exists from wrapping on,
    so a tracker started at the step's beginning does not see it being made.
    """
    sizes = model._get_ddp_logging_data().get("bucket_sizes", "")
    return sum(int(size) for size in str(sizes).split(",") if size.strip())


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, labels: torch.Tensor
) -> float:
    """One plain step; gradients are freed first, as ``zero_grad`` does by default."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(inputs), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def measure_setup(
    setup: str,
    config: BlockNetConfig,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str | None = None,
) -> MemoryRecord:
    """Train ``WARMUP_STEPS`` steps, then track the next one's peak on this rank."""
    device = torch.device(device or "cpu")
    model = prepare_setup(setup, config, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs, labels = (t.to(device) for t in rank_slice(global_batch(config), rank, world_size))
    for _ in range(WARMUP_STEPS):
        train_step(model, optimizer, inputs, labels)
    optimizer.zero_grad(set_to_none=True)
    with TensorMemoryTracker(model, optimizer, inputs=(inputs, labels), device=device) as tracker:
        loss = train_step(model, optimizer, inputs, labels)
    norm = gradient_norm(model)  # after the tracked step: its temporaries are not the step's
    buckets = ddp_bucket_bytes(model) if isinstance(model, DistributedDataParallel) else 0
    return MemoryRecord(
        setup,
        rank,
        world_size,
        inputs.shape[0],
        tracker.peak_bytes,
        dict(tracker.breakdown_at_peak),
        loss,
        norm,
        buckets,
    )


def measure_distributed_setups(
    ctx: RankContext, config: BlockNetConfig, setups: tuple[str, ...] = DISTRIBUTED_SETUPS
) -> list[MemoryRecord]:
    """In a rank: ``measure_setup`` for each distributed setup, one after the other."""
    return [measure_setup(s, config, ctx.rank, ctx.world_size, ctx.device) for s in setups]


def compare_memory(
    config: BlockNetConfig, world_size: int | None = None, device_type: DeviceType | None = None
) -> list[MemoryRecord]:
    """The single-process step here, then every distributed setup on every rank."""
    world_size, device_type = resolve_ranks(world_size, device_type)
    config.check_splits(world_size)
    device = "cuda" if device_type == "cuda" else "cpu"
    records = [measure_setup(SINGLE_PROCESS, config, device=device)]
    steps_per_rank = len(DISTRIBUTED_SETUPS) * (WARMUP_STEPS + 1)
    per_rank = launch(
        measure_distributed_setups,
        config,
        world_size=world_size,
        device_type=device_type,
        timeout_s=hang_guard_s(config, steps_per_rank, world_size, device_type),
    )
    by_setup = sorted(
        (record for rank_records in per_rank for record in rank_records),
        key=lambda record: (DISTRIBUTED_SETUPS.index(record.setup), record.rank),
    )
    return records + by_setup


@dataclass(frozen=True)
class Savings:
    """What each technique saves on rank 0, in MiB, read off the measured records."""

    sharding_parameter_state: float  # DDP -> FSDP: parameters + gradients + optimizer state
    checkpointing_activations_ddp: float  # DDP -> DDP + checkpointing: activations at the peak
    checkpointing_activations_fsdp: float  # FSDP -> FSDP + checkpointing
    both_peak: float  # DDP -> FSDP + checkpointing: the whole tracked peak


def savings(records: list[MemoryRecord]) -> Savings:
    """Rank 0's differences between the setups (positive = less memory)."""
    rank0 = {r.setup: r for r in records if r.rank == 0}
    missing = [setup for setup in DISTRIBUTED_SETUPS if setup not in rank0]
    if missing:
        raise ValueError(f"records lack the setups {missing}: run compare_memory first")

    def state(record: MemoryRecord) -> int:
        return sum(record.breakdown[c] for c in ("parameters", "gradients", "optimizer_state"))

    def activations(setup: str) -> int:
        return rank0[setup].breakdown["activations"]

    return Savings(
        (state(rank0["DDP"]) - state(rank0["FSDP"])) / MB,
        (activations("DDP") - activations("DDP + checkpointing")) / MB,
        (activations("FSDP") - activations("FSDP + checkpointing")) / MB,
        (rank0["DDP"].peak_bytes - rank0["FSDP + checkpointing"].peak_bytes) / MB,
    )
