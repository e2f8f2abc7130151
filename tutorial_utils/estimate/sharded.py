"""What each of N GPUs holds under FSDP2 or DDP: one rank's training step, predicted in one process.

The step runs on fake tensors (``FakeTensorMode``: shapes, no memory) over PyTorch's fake process
group of ``world_size`` ranks (``measurement.fake_ranks``), so the sharding is PyTorch's own:

* **FSDP2**: the real ``fully_shard`` on every repeated block, then on the root, as notebook 05
  and torchtitan do. Each rank keeps its (padded) shard of the parameters, gradients and
  optimizer state; a block's parameters are all-gathered just before it runs and, with
  ``reshard_after_forward`` (PyTorch's default: every module but the root), freed after its
  forward and gathered again for its backward;
  gradients are reduce-scattered. ``ShardedStepTracker`` follows the storages FSDP2 resizes.
* **DDP**: every rank holds the whole model, its gradients and optimizer state, plus DDP's
  gradient buckets. Real DDP cannot be built on fake tensors (its constructor reads parameter
  values to check them across ranks), so the step runs without the wrapper and the buckets are
  added as PyTorch assigns them (``dist._compute_bucket_assignment_by_size``, the rule DDP's
  reducer uses when it rebuilds its buckets after the first step: a first bucket of 1 MiB, then
  ``bucket_cap_mb``, default 25 MiB, in backward order); with ``gradient_as_bucket_view=False``
  (the default) they are separate from the gradients. ``tests/test_sharded.py`` holds the result
  equal to real DDP over the fake group on real tensors, from its third step on.

The figures are tensor bytes of rank 0 (every rank alike where the sizes divide evenly), a
prediction: the communication library's own buffers (NCCL's, gloo's) are not tensors and are not
in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.blocks import repeated_blocks
from tutorial_utils.checkpointing.strategy import OFFLOAD_NOTE, Strategy
from tutorial_utils.estimate.card import Card
from tutorial_utils.estimate.estimator import (
    Estimate,
    Workload,
    batch_for,
    build_model,
    make_optimizer,
)
from tutorial_utils.measurement.allocator import AllocationLog, AllocatorPrediction
from tutorial_utils.measurement.fake_ranks import BUFFER_CATEGORIES, ShardedStepTracker, fake_ranks
from tutorial_utils.measurement.phases import step_phase
from tutorial_utils.measurement.step import next_token_loss
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import GiB

__all__ = [
    "Batch",
    "COLUMNS",
    "DDP_BUCKET_CAP_MB",
    "RankReport",
    "SHARDS",
    "Shard",
    "ddp_bucket_sizes",
    "estimate_rank",
    "rank_allocator",
    "rank_step",
    "rank_table",
    "run_sharded",
]


Shard = Literal["fsdp2", "ddp"]
SHARDS: tuple[Shard, ...] = get_args(Shard)
DDP_BUCKET_CAP_MB = 25  # DistributedDataParallel's default bucket_cap_mb

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class RankReport:
    """One rank's predicted training step: ``peak_bytes`` is the most it holds at once (what it
    keeps between steps and the step's tensors); ``breakdown`` splits that peak into
    ``CATEGORIES`` and ``BUFFER_CATEGORIES``; ``forward_backward_peak_bytes`` is the peak before
    the optimizer step. ``baseline_bytes`` is held on entering the step (the parameters' shard,
    optimizer state, DDP's buckets, the batch)."""

    shard: Shard
    world_size: int
    peak_bytes: int
    forward_backward_peak_bytes: int
    baseline_bytes: int
    breakdown: dict[str, int]
    ddp_buckets: int = 0  # how many gradient buckets DDP makes (0 under FSDP2)
    allocations: AllocationLog | None = None  # the tracked step's events, when recorded

    @property
    def forward_backward_above_start_bytes(self) -> int:
        """The forward-and-backward peak above what was alive before it (the batch among that):
        what notebook 05's ``peak_bytes`` reads on a rank where the step is predicted with
        ``follow_resizes=False``, as ``LiveBytes`` sees it; under DDP from the third step on
        (the second allocates the buckets DDP's reducer rebuilds)."""
        return self.forward_backward_peak_bytes - self.baseline_bytes


def ddp_bucket_sizes(
    parameters: Sequence[torch.Tensor], bucket_cap_mb: float = DDP_BUCKET_CAP_MB
) -> list[int]:
    """Bytes of each of DDP's gradient buckets for these trainable parameters, as its reducer
    rebuilds them after the first step (backward order, a 1 MiB first bucket)."""
    import torch.distributed as dist

    if not parameters:
        return []
    ordered = list(reversed(parameters))  # gradients become ready roughly last layer first
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, int(bucket_cap_mb * 2**20)]
    buckets, _ = dist._compute_bucket_assignment_by_size(ordered, limits, [False] * len(ordered))
    return [sum(ordered[i].numel() * ordered[i].element_size() for i in b) for b in buckets]


def rank_step(
    build: Callable[[], nn.Module],
    blocks: Callable[[nn.Module], Sequence[nn.Module]],
    batch: Callable[[nn.Module], Batch],
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    optimizer_factory: Callable[[nn.Module], torch.optim.Optimizer],
    *,
    world_size: int,
    shard: Shard,
    checkpointing: Callable[[nn.Module], contextlib.AbstractContextManager] | None = None,
    reshard_after_forward: bool | None = None,
    follow_resizes: bool = True,
    record_allocations: bool = False,
) -> RankReport:
    """Rank 0's training step among ``world_size``, on fake tensors over the fake process group.

    ``build()`` makes the model on the meta device (it becomes fake CPU tensors);
    ``blocks(model)`` are the modules FSDP2 shards one by one before the root; ``batch(model)``
    gives this rank's inputs and targets; ``checkpointing(model)`` is entered around the step (a
    strategy's ``applied``). One untracked step creates the optimizer's state, then one step
    (forward, backward, optimizer step) is tracked. ``follow_resizes=False`` leaves FSDP2's
    storage resizes unseen, as a tracker of ops alone (``tools.LiveBytes``) does."""
    if shard not in SHARDS:
        raise ValueError(f"--shard must be one of {', '.join(SHARDS)}, got {shard!r}")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    with fake_ranks(world_size):
        mesh = init_device_mesh("cpu", (world_size,))  # outside fake mode: it reads rank ids
        model = build()
        if any(t.device.type != "meta" for t in [*model.parameters(), *model.buffers()]):
            raise ValueError("build() must make the model on the meta device (no memory)")
        with FakeTensorMode(allow_non_fake_inputs=True):
            _to_fake_cpu(model)
            with checkpointing(model) if checkpointing else contextlib.nullcontext():
                bucket_bytes = _wrapped(model, blocks, shard, mesh, reshard_after_forward)
                buckets = [torch.empty(n, dtype=torch.uint8) for n in bucket_bytes]
                optimizer = optimizer_factory(model)
                inputs, targets = batch(model)
                _step(model, inputs, targets, loss_fn, optimizer)  # the optimizer's state
                optimizer.zero_grad(set_to_none=True)
                tracker = ShardedStepTracker(
                    model,
                    optimizer,
                    inputs=(inputs, targets, *buckets),
                    follow_resizes=follow_resizes,
                    record_allocations=record_allocations,
                )
                tracker.mark(buckets, "buckets")
                with tracker:
                    _step(model, inputs, targets, loss_fn, optimizer)
                optimizer.zero_grad(set_to_none=True)
    report = _rank_report(tracker, shard, world_size, len(bucket_bytes))
    return dataclasses.replace(report, allocations=tracker.allocations)


def _wrapped(
    model: nn.Module,
    blocks: Callable[[nn.Module], Sequence[nn.Module]],
    shard: Shard,
    mesh: Any,
    reshard_after_forward: bool | None,
) -> list[int]:
    """FSDP2's ``fully_shard`` on every block, then the root; or DDP's bucket sizes (bytes)."""
    if shard == "ddp":
        return ddp_bucket_sizes([p for p in model.parameters() if p.requires_grad])
    fully_shard = _fully_shard()
    options: dict[str, Any] = {"mesh": mesh}
    if reshard_after_forward is not None:  # else PyTorch's default
        options["reshard_after_forward"] = reshard_after_forward
    for block in blocks(model):
        fully_shard(block, **options)
    fully_shard(model, **options)
    return []


def _rank_report(
    tracker: ShardedStepTracker, shard: Shard, world_size: int, ddp_buckets: int
) -> RankReport:
    breakdown = {**tracker.breakdown_at_peak, **tracker.buffers_at_peak}
    forward_backward = max(
        (peak for phase, peak in tracker.phase_peak_bytes.items() if phase != "optimizer"),
        default=tracker.baseline_bytes,
    )
    return RankReport(
        shard=shard,
        world_size=world_size,
        peak_bytes=tracker.peak_bytes,
        forward_backward_peak_bytes=forward_backward,
        baseline_bytes=tracker.baseline_bytes,
        breakdown={c: breakdown[c] for c in (*CATEGORIES, *BUFFER_CATEGORIES)},
        ddp_buckets=ddp_buckets,
    )


def _to_fake_cpu(model: nn.Module) -> None:
    """``model``'s meta tensors replaced by fake CPU tensors (sizes, no memory), shared (tied)
    parameters still shared: ``to_empty`` alone unties them (an LM's embedding and head)."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, parameter in module._parameters.items():
            if parameter is not None:
                places.setdefault(id(parameter), []).append((module, name))
    model.to_empty(device="cpu")
    for (first, first_name), *others in places.values():
        for module, name in others:
            module._parameters[name] = first._parameters[first_name]


def _refuse_autocast(workload: Workload) -> None:
    if workload.precision.startswith("amp-"):
        raise ValueError(
            "--gpus with --precision amp-*: not predicted (FSDP2 takes mixed precision as its own "
            "MixedPrecisionPolicy); use fp32, bf16 or fp16"
        )


def _fully_shard() -> Callable[..., Any]:
    """FSDP2's ``fully_shard``: public from torch 2.6, under ``_composable`` before."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def _step(model, inputs, targets, loss_fn, optimizer) -> None:
    with step_phase("forward"):
        loss = loss_fn(model(inputs), targets)
    with step_phase("backward"):
        loss.backward()
    with step_phase("optimizer"):
        optimizer.step()


def estimate_rank(
    workload: Workload, strategy: Strategy, world_size: int, shard: Shard
) -> RankReport:
    """One rank's step of ``workload`` (its batch per GPU) under ``shard`` and ``strategy``."""
    _refuse_autocast(workload)
    if strategy.gpu_only:
        raise ValueError(f"{strategy.name!r} is {OFFLOAD_NOTE}")
    loss_fn = next_token_loss if workload.is_language_model else nn.CrossEntropyLoss()
    return rank_step(
        functools.partial(build_model, workload),
        repeated_blocks,
        lambda model: batch_for(workload, model, "cpu"),
        loss_fn,
        functools.partial(make_optimizer, workload),
        world_size=world_size,
        shard=shard,
        checkpointing=strategy.applied,
        record_allocations=True,
    )


COLUMNS = {  # headers of at most 7 characters, so that the table fits 120 columns
    "parameters": "params",
    "gradients": "grads",
    "optimizer_state": "optim",
    "activations": "activ",
    "all_gather": "gather",
    "reduce_scatter": "scatter",
    "buckets": "buckets",
}


def rank_allocator(report: RankReport, card: Card) -> AllocatorPrediction:
    """The rank's step replayed through the card's caching allocator (``predict_allocator``)."""
    from tutorial_utils.estimate.estimator import predict_allocator

    if report.allocations is None:
        raise ValueError("the rank's allocations were not recorded (record_allocations=True)")
    return predict_allocator(report.allocations, card)


def rank_table(
    workload: Workload,
    rows: Sequence[tuple[Strategy, RankReport | str]],
    card: Card,
    world_size: int,
    shard: Shard,
) -> str:
    """Each strategy's per-rank peak and its categories, headed by how they were obtained."""
    from tutorial_utils.estimate.report import describe_workload

    how = {
        "fsdp2": "FSDP2 fully_shard on every block, then the root (PyTorch's default resharding)",
        "ddp": f"DDP (gradient buckets: first 1 MiB, then {DDP_BUCKET_CAP_MB} MiB)",
    }[shard]
    lines = [
        f"{world_size} GPUs, {how}; what each rank holds (rank 0; batch {workload.batch} per GPU)",
        describe_workload(Estimate(workload, card, "")),
        "predicted (dry run on fake tensors over PyTorch's fake process group, one process); GiB; "
        "by category at the rank's peak (gather, scatter: FSDP2's all-gather and reduce-scatter "
        "buffers; buckets: DDP's); alloc, reserved: the rank's allocations replayed through "
        "the emulated caching allocator (no NCCL buffers); smi: reserved + the CUDA context; "
        "margin: the budget less reserved; attention: the CPU's SDPA kernel, not --gpu's",
        card.describe(),
        "",
        f"{'strategy':<24}"
        + "".join(f" {label:>7}" for label in COLUMNS.values())
        + f" {'peak/rank':>9} {'alloc':>6} {'reserved':>8} {'smi':>6} {'margin':>6}",
    ]
    for strategy, report in rows:
        if isinstance(report, str):
            lines.append(f"{strategy.name:<24} {report}")
            continue
        cells = "".join(f" {report.breakdown[c] / GiB:>7,.2f}" for c in COLUMNS)
        replayed = rank_allocator(report, card)
        lines.append(
            f"{strategy.name:<24}{cells} {report.peak_bytes / GiB:>9,.2f}"
            f" {replayed.max_allocated_bytes / GiB:>6,.2f}"
            f" {replayed.max_reserved_bytes / GiB:>8,.2f}"
            f" {(replayed.max_reserved_bytes + card.context_bytes) / GiB:>6,.2f}"
            f" {(replayed.margin_bytes or 0) / GiB:>+6,.2f}"
        )
    return "\n".join(part for line in lines for part in textwrap.wrap(line, 120) or [""])


def run_sharded(
    workload: Workload,
    strategies: Sequence[Strategy],
    card: Card,
    world_size: int | None,
    shard: str | None,
) -> int:
    """The command's ``--gpus N --shard fsdp2|ddp``: one row per strategy, printed."""
    if world_size is None or shard is None:
        raise ValueError("--gpus and --shard go together: e.g. --gpus 8 --shard fsdp2")
    if shard not in SHARDS:
        raise ValueError(f"--shard must be one of {', '.join(SHARDS)}, got {shard!r}")
    _refuse_autocast(workload)
    print(f"predicting rank 0 of {world_size} on fake tensors...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    rows: list[tuple[Strategy, RankReport | str]] = []
    for strategy in strategies:
        if strategy.gpu_only:
            rows.append((strategy, OFFLOAD_NOTE))
            continue
        rows.append((strategy, estimate_rank(workload, strategy, world_size, shard)))
    print(rank_table(workload, rows, card, world_size, shard))
    print(f"\ndry runs of the strategies: {time.perf_counter() - started:.1f} s")
    return 0
