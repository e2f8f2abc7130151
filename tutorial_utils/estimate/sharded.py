"""What each of N GPUs holds under FSDP2 or DDP: one rank's training step, predicted in one process.

The step runs on fake tensors (``FakeTensorMode``: shapes, no memory) over PyTorch's fake process
group of ``world_size`` ranks (``measurement.fake_ranks``), so the sharding is PyTorch's own:

* **FSDP2**: the real ``fully_shard`` on every repeated block, then on the root, as notebook 05
  and torchtitan do. Each rank keeps its (padded) shard of the parameters, gradients and
  optimizer state; a block's parameters are all-gathered just before it runs and, with
  ``reshard_after_forward``, freed after its forward and gathered again for its backward;
  gradients are reduce-scattered. ``ShardedStepTracker`` follows the storages FSDP2 resizes.
* **DDP**: every rank holds the whole model, its gradients and optimizer state, plus DDP's
  gradient buckets. Real DDP cannot be built on fake tensors (its constructor reads parameter
  values to check them across ranks), so the step runs without the wrapper and the buckets are
  added as PyTorch assigns them (``dist._compute_bucket_assignment_by_size``, the rule DDP's
  reducer uses when it rebuilds its buckets after the first step: a first bucket of 1 MiB, then
  ``bucket_cap_mb``, default 25 MiB, in backward order); with ``gradient_as_bucket_view=False``
  (the default) they are separate from the gradients. ``tests/test_sharded.py`` holds the result
  equal to real DDP over the fake group on real tensors.

The figures are tensor bytes of rank 0 (every rank alike where the sizes divide evenly), a
prediction: the communication library's own buffers (NCCL's, gloo's) are not tensors and are not
in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn as nn

from tutorial_utils.measurement.fake_ranks import BUFFER_CATEGORIES, ShardedStepTracker, fake_ranks
from tutorial_utils.measurement.phases import step_phase
from tutorial_utils.measurement.tracker import CATEGORIES

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
    batch_bytes: int
    breakdown: dict[str, int]
    ddp_buckets: int = 0  # how many gradient buckets DDP makes (0 under FSDP2)

    @property
    def forward_backward_above_start_bytes(self) -> int:
        """The forward-and-backward peak above what was alive before it, the batch included:
        what notebook 05's ``peak_bytes`` reads on a rank."""
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
    reshard_after_forward: bool = True,
    follow_resizes: bool = True,
) -> RankReport:
    """Rank 0's training step among ``world_size``, on fake tensors over the fake process group.

    ``build()`` makes the model (on meta or anywhere: it is rebuilt as fake CPU tensors);
    ``blocks(model)`` are the modules FSDP2 shards one by one before the root; ``batch(model)``
    gives this rank's inputs and targets; ``checkpointing(model)`` is entered around the step (a
    strategy's ``applied``). One untracked step creates the optimizer's state, then one step
    (forward, backward, optimizer step) is tracked. ``follow_resizes=False`` leaves FSDP2's
    storage resizes unseen, as a tracker of ops alone (``tools.LiveBytes``) does."""
    if shard not in SHARDS:
        raise ValueError(f"--shard must be one of {', '.join(SHARDS)}, got {shard!r}")
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    with fake_ranks(world_size):
        mesh = init_device_mesh("cpu", (world_size,))  # outside fake mode: it reads rank ids
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = build()
            if not all(isinstance(t, FakeTensor) for t in [*model.parameters(), *model.buffers()]):
                model.to_empty(device="cpu")  # built on meta: fake CPU tensors, no memory
            with checkpointing(model) if checkpointing else contextlib.nullcontext():
                bucket_bytes: list[int] = []
                if shard == "fsdp2":
                    fully_shard = _fully_shard()
                    for block in blocks(model):
                        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
                    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
                else:
                    trained = [p for p in model.parameters() if p.requires_grad]
                    bucket_bytes = ddp_bucket_sizes(trained)
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
                )
                tracker.mark(buckets, "buckets")
                with tracker:
                    _step(model, inputs, targets, loss_fn, optimizer)
                optimizer.zero_grad(set_to_none=True)
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
        batch_bytes=inputs.nbytes + targets.nbytes,
        breakdown={c: breakdown[c] for c in (*CATEGORIES, *BUFFER_CATEGORIES)},
        ddp_buckets=len(bucket_bytes),
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
