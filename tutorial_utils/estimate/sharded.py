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

Mixed precision (``--precision amp-*``), as the libraries run it:

* **FSDP2**: ``fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype, reduce_dtype))``
  (torchtitan's ``parallelize_llama``; its defaults bf16 and fp32). The sharded parameters and
  Adam's state stay fp32; each unit's parameters are all-gathered in ``param_dtype`` and computed
  with in it (no autocast); gradients are reduce-scattered in ``reduce_dtype`` into an fp32 shard.
  FSDP2's own code does all of it on the fake tensors.
* **DDP**: the forward and the loss under ``torch.autocast`` (emulated: ``EmulatedAutocast``, the
  CUDA cast policy by default): fp32 parameters, gradients and buckets, plus the low-precision
  copies autocast caches during the forward (and, checkpointed, again during recomputation).

``tests/test_sharded.py`` holds both to the byte against 2 real gloo ranks on the CPU (under
``torch.autocast("cpu")`` for DDP, the emulation's CPU policy beside it).

``rank_dry_run`` is the single-GPU pipeline's dry run for a rank (``estimator.estimate(...,
sharding=Sharding(...))``): the same report, replay, margin, largest-fit search, predicted time
(the rank's own ops; collectives are not timed) and attention kernel of ``--gpu``'s GPU.

The figures are tensor bytes of rank 0 (every rank alike where the sizes divide evenly), a
prediction: the communication library's own buffers (NCCL's, gloo's) are not tensors and are not
in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.blocks import repeated_blocks
from tutorial_utils.checkpointing.strategy import OFFLOAD_NOTE, Strategy
from tutorial_utils.estimate.breakdown import KeptForBackward, recording_regions
from tutorial_utils.estimate.building import (
    batch_for,
    build_model,
    language_model_loss,
    make_optimizer,
)
from tutorial_utils.estimate.card import Card
from tutorial_utils.estimate.gpu_step import GpuRun, StepRoofline, as_gpu_runs, quoted_machine
from tutorial_utils.estimate.workload import DTYPES, QLORA, Workload
from tutorial_utils.measurement.allocator import AllocationLog
from tutorial_utils.measurement.autocast import EmulatedAutocast
from tutorial_utils.measurement.fake_ranks import BUFFER_CATEGORIES, ShardedStepTracker, fake_ranks
from tutorial_utils.measurement.gpu_attention import recording_kernels
from tutorial_utils.measurement.meta_attention import unpacked_dry_run_batches
from tutorial_utils.measurement.phases import step_phase
from tutorial_utils.measurement.step import StepReport
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import MiB

__all__ = [
    "Batch",
    "DDP_BUCKET_CAP_MB",
    "REDUCE_DTYPES",
    "RankReport",
    "SHARDS",
    "Shard",
    "Sharding",
    "ddp_bucket_sizes",
    "estimate_rank",
    "rank_dry_run",
    "rank_step",
]


Shard = Literal["fsdp2", "ddp"]
SHARDS: tuple[Shard, ...] = get_args(Shard)
DDP_BUCKET_CAP_MB = 25  # DistributedDataParallel's default bucket_cap_mb
REDUCE_DTYPES = ("fp32", "bf16", "fp16")  # MixedPrecisionPolicy.reduce_dtype's spellings
_TORCH = f"torch {torch.__version__.split('+')[0]}"

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Sharding:
    """How one step is spread over ``world_size`` GPUs: FSDP2's ``fully_shard`` or DDP, and
    with ``--precision amp-*`` how each runs mixed precision (``mixed_precision``,
    ``autocast``). ``reduce_dtype``: FSDP2's gradient reduce-scatter dtype under amp-*."""

    world_size: int
    shard: Shard
    reduce_dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"--gpus must be at least 1, got {self.world_size}")
        if self.shard not in SHARDS:
            raise ValueError(f"--shard must be one of {', '.join(SHARDS)}, got {self.shard!r}")
        if self.reduce_dtype not in REDUCE_DTYPES:
            raise ValueError(
                f"--reduce-dtype must be one of {', '.join(REDUCE_DTYPES)}, got {self.reduce_dtype!r}"
            )

    def check(self, workload: Workload) -> None:
        """Refuse what is not emulated, in one line."""
        if workload.precision == QLORA and self.shard == "fsdp2":
            raise ValueError(
                "--precision nf4 with --shard fsdp2 is not emulated (FSDP-QLoRA shards the 4-bit "
                "weights in bnb_4bit_quant_storage's dtype); --shard ddp or one GPU"
            )

    def mixed_precision(self, workload: Workload) -> Any | None:
        """FSDP2's ``MixedPrecisionPolicy`` under amp-*: the fp32 sharded parameters are
        all-gathered in ``param_dtype`` (the amp dtype) and computed with; gradients are
        reduce-scattered in ``reduce_dtype``; no autocast (torchtitan's way). None otherwise."""
        if self.shard != "fsdp2" or not workload.precision.startswith("amp-"):
            return None
        return _policy_class()(
            param_dtype=DTYPES[workload.precision[4:]], reduce_dtype=DTYPES[self.reduce_dtype]
        )

    def autocast(self, workload: Workload) -> EmulatedAutocast | None:
        """The forward's autocast: DDP's under amp-* (and QLoRA's TRL recipes); none under
        FSDP2's ``MixedPrecisionPolicy``."""
        return None if self.mixed_precision(workload) is not None else workload.autocast()

    def describe(self, workload: Workload) -> str:
        """How the step is spread and cast, with the library functions that do it."""
        if self.shard == "ddp":
            how = (
                f"DDP ({_TORCH} DistributedDataParallel; gradient buckets: first 1 MiB, then "
                f"{DDP_BUCKET_CAP_MB} MiB)"
            )
            if workload.precision.startswith("amp-"):
                how += ", forward under torch.autocast: fp32 weights, gradients and buckets"
        else:
            how = f"FSDP2 ({_TORCH} fully_shard on every block, then the root)"
            if workload.precision.startswith("amp-"):
                how += (
                    f", MixedPrecisionPolicy(param_dtype={workload.precision[4:]}, "
                    f"reduce_dtype={self.reduce_dtype}): fp32 sharded weights, "
                    f"{workload.precision[4:]} all-gathered copies, no autocast"
                )
        return f"{self.world_size} GPUs, {how}; rank 0, batch {workload.batch} per GPU"


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
    activation_peak_bytes: int = 0  # most activations/other bytes alive at any moment
    phase_peak_bytes: dict[str, int] | None = None  # tracked peak within each phase

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
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, int(bucket_cap_mb * MiB)]  # DDP's MB are MiB
    buckets, _ = dist._compute_bucket_assignment_by_size(ordered, limits, [False] * len(ordered))
    return [sum(ordered[i].numel() * ordered[i].element_size() for i in b) for b in buckets]


@dataclass(frozen=True)
class _Precision:
    """How a rank's step casts: FSDP2's policy (``fully_shard(mp_policy=...)``) or autocast."""

    mp_policy: Any | None = None
    autocast: EmulatedAutocast | None = None


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
    mp_policy: Any | None = None,
    autocast: EmulatedAutocast | None = None,
    limit_bytes: int | None = None,
    tracked_context: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> RankReport:
    """Rank 0's training step among ``world_size``, on fake tensors over the fake process group.

    ``build()`` makes the model on the meta device (it becomes fake CPU tensors);
    ``blocks(model)`` are the modules FSDP2 shards one by one before the root; ``batch(model)``
    gives this rank's inputs and targets; ``checkpointing(model)`` is entered around the step (a
    strategy's ``applied``). One untracked step creates the optimizer's state, then one step
    (forward, backward, optimizer step) is tracked, inside ``tracked_context()`` when given (a
    FLOP counter, a roofline). ``follow_resizes=False`` leaves FSDP2's storage resizes unseen,
    as a tracker of ops alone (``tools.LiveBytes``) does. ``mp_policy``: FSDP2's
    ``MixedPrecisionPolicy``; ``autocast``: the forward and the loss under the emulated
    autocast (DDP's mixed precision); ``limit_bytes``: stop with ``MemoryLimitExceeded``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    precision = _Precision(mp_policy, autocast)
    track = {
        "follow_resizes": follow_resizes,
        "record_allocations": record_allocations,
        "limit_bytes": limit_bytes,
    }
    with (
        fake_ranks(world_size),
        _casts(autocast),
        _attention_on_fake_cpu(),
        unpacked_dry_run_batches(),
    ):
        mesh = init_device_mesh("cpu", (world_size,))  # outside fake mode: it reads rank ids
        model = _on_meta(build(), shard)
        with FakeTensorMode(allow_non_fake_inputs=True):
            _to_fake_cpu(model)
            with checkpointing(model) if checkpointing else contextlib.nullcontext():
                bucket_bytes = _wrapped(
                    model, blocks, shard, mesh, reshard_after_forward, precision
                )
                optimizer = optimizer_factory(model)
                inputs = batch(model)
                step = functools.partial(_step, model, inputs, loss_fn, optimizer, autocast)
                tracker = _two_steps(
                    step, (model, optimizer, inputs), bucket_bytes, tracked_context, track
                )
    report = _rank_report(tracker, shard, world_size, len(bucket_bytes))
    return dataclasses.replace(report, allocations=tracker.allocations)


def _two_steps(
    step: Callable[[], None],
    parts: tuple[nn.Module, torch.optim.Optimizer, Batch],
    bucket_bytes: list[int],
    tracked_context: Callable[[], contextlib.AbstractContextManager] | None,
    track: dict[str, Any],
) -> ShardedStepTracker:
    """One untracked step (the optimizer's state), then one tracked, DDP's buckets held."""
    model, optimizer, inputs = parts
    buckets = [torch.empty(n, dtype=torch.uint8) for n in bucket_bytes]
    step()
    optimizer.zero_grad(set_to_none=True)
    tracker = ShardedStepTracker(model, optimizer, inputs=(*inputs, *buckets), **track)
    tracker.mark(buckets, "buckets")
    with tracked_context() if tracked_context else contextlib.nullcontext(), tracker:
        step()
    optimizer.zero_grad(set_to_none=True)
    return tracker


def _on_meta(model: nn.Module, shard: str) -> nn.Module:
    """``model``, checked to be on the meta device (no memory), for a known ``shard``."""
    if shard not in SHARDS:
        raise ValueError(f"--shard must be one of {', '.join(SHARDS)}, got {shard!r}")
    if any(t.device.type != "meta" for t in [*model.parameters(), *model.buffers()]):
        raise ValueError("build() must make the model on the meta device (no memory)")
    return model


def _casts(autocast: EmulatedAutocast | None) -> contextlib.AbstractContextManager:
    """The emulated autocast's kernels for both steps (recomputation happens in backward)."""
    return autocast.kernels() if autocast is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _attention_on_fake_cpu() -> Iterator[None]:
    """SDPA on the fake CPU tensors through the kernel the dry run's GPU rules pick (the CPU's
    without a GPU named), as ``meta_attention`` does for meta tensors: autograd then saves
    what that kernel saves, and the kernel is recorded for the table."""
    from tutorial_utils.measurement.meta_attention import _attention_on_meta

    library = torch.library.Library("aten", "IMPL")
    library.impl("scaled_dot_product_attention", _attention_on_meta, "AutogradCPU")
    try:
        yield
    finally:
        library._destroy()


def _wrapped(
    model: nn.Module,
    blocks: Callable[[nn.Module], Sequence[nn.Module]],
    shard: Shard,
    mesh: Any,
    reshard_after_forward: bool | None,
    precision: _Precision,
) -> list[int]:
    """FSDP2's ``fully_shard`` on every block, then the root; or DDP's bucket sizes (bytes)."""
    if shard == "ddp":
        return ddp_bucket_sizes([p for p in model.parameters() if p.requires_grad])
    fully_shard = _fully_shard()
    options: dict[str, Any] = {"mesh": mesh}
    if reshard_after_forward is not None:  # else PyTorch's default
        options["reshard_after_forward"] = reshard_after_forward
    if precision.mp_policy is not None:
        options["mp_policy"] = precision.mp_policy
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
        activation_peak_bytes=tracker.activation_peak_bytes,
        phase_peak_bytes=dict(tracker.phase_peak_bytes),
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


def _fully_shard() -> Callable[..., Any]:
    """FSDP2's ``fully_shard``: public from torch 2.6, under ``_composable`` before."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def _policy_class() -> Callable[..., Any]:
    """FSDP2's ``MixedPrecisionPolicy``, where ``_fully_shard`` finds ``fully_shard``."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy


def _step(model, batch: Batch, loss_fn, optimizer, autocast=None) -> None:
    """Forward and loss (under ``autocast`` when given, as an AMP loop runs them), backward,
    optimizer step."""
    inputs, targets = batch
    with step_phase("forward"), autocast.enabled() if autocast else contextlib.nullcontext():
        loss = loss_fn(model(inputs), targets)
    with step_phase("backward"):
        loss.backward()
    with step_phase("optimizer"):
        optimizer.step()


def estimate_rank(
    workload: Workload,
    strategy: Strategy,
    world_size: int,
    shard: Shard,
    **options: Any,
) -> RankReport:
    """One rank's step of ``workload`` (its batch per GPU) under ``shard`` and ``strategy``, in
    the workload's precision (``Sharding``), with its training loop's loss. ``options`` go to
    ``rank_step`` (``limit_bytes``, ``tracked_context``, ``reduce_dtype``: FSDP2's under amp-*;
    ``kept``: a language model's activations alive at the loss, by region, filled in from the
    tracked step, as ``estimator.train_step`` fills them for one GPU)."""
    sharding = Sharding(world_size, shard, options.pop("reduce_dtype", "fp32"))
    sharding.check(workload)
    if strategy.gpu_only:
        raise ValueError(f"{strategy.name!r} is {OFFLOAD_NOTE}")
    loss_fn: Callable[..., torch.Tensor] = nn.CrossEntropyLoss()
    if workload.is_language_model:
        loss_fn = language_model_loss(workload)
    build: Callable[[], nn.Module] = functools.partial(build_model, workload)
    kept = options.pop("kept", None)
    if kept is not None and workload.is_language_model:
        build, loss_fn = _recording_kept(build, loss_fn, kept)
    autocast = sharding.autocast(workload)
    wrap = autocast.checkpoint_context_fn if autocast is not None else None
    return rank_step(
        build,
        repeated_blocks,
        lambda model: batch_for(workload, model, "cpu"),
        loss_fn,
        functools.partial(make_optimizer, workload),
        world_size=world_size,
        shard=shard,
        checkpointing=lambda model: strategy.applied(model, wrap),
        record_allocations=True,
        mp_policy=sharding.mixed_precision(workload),
        autocast=autocast,
        **options,
    )


def _recording_kept(
    build: Callable[[], nn.Module],
    loss_fn: Callable[..., torch.Tensor],
    kept: KeptForBackward,
) -> tuple[Callable[[], nn.Module], Callable[..., torch.Tensor]]:
    """``build`` and ``loss_fn`` that fill ``kept`` at each step's loss (``recording_regions``,
    its hooks put on the model before ``fully_shard`` wraps it; the tracked step's stays)."""
    recording: dict[str, Callable[..., torch.Tensor]] = {}

    def built() -> nn.Module:
        model = build()
        recording["loss"], _ = recording_regions(model, repeated_blocks(model), loss_fn, kept)
        return model

    def loss(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        return recording["loss"](outputs, targets)

    return built, loss


def rank_dry_run(
    workload: Workload,
    strategy: Strategy,
    sharding: Sharding,
    card: Card,
    *,
    limit_bytes: int | None = None,
    record_allocations: bool = True,
    kept: KeptForBackward | None = None,
) -> tuple[StepReport, GpuRun]:
    """``estimate_rank`` as the single-GPU pipeline takes a dry run: ``estimator.train_step``'s
    report (the breakdown gains ``BUFFER_CATEGORIES``; FLOPs counted) and what ``gpu_step.gpu_run``
    gives (the card's attention kernels, the rank's predicted seconds: its own ops, by the
    roofline; the collectives are not timed)."""
    from tutorial_utils.measurement.flops import StepFlopCounter

    flops = StepFlopCounter()
    machine = quoted_machine(card, workload.precision)
    roofline = StepRoofline(machine) if machine is not None else contextlib.nullcontext()
    with as_gpu_runs(card), recording_kernels() as kernels:
        report = estimate_rank(
            workload,
            strategy,
            sharding.world_size,
            sharding.shard,
            reduce_dtype=sharding.reduce_dtype,
            limit_bytes=limit_bytes,
            tracked_context=lambda: _entered(flops, roofline),
            kept=kept,
        )
    seconds = roofline.seconds if isinstance(roofline, StepRoofline) else None
    step = StepReport(
        peak_bytes=report.peak_bytes,
        breakdown=dict(report.breakdown),
        activation_peak_bytes=report.activation_peak_bytes,
        baseline_bytes=report.baseline_bytes,
        seconds=None,
        strategy=strategy,
        batch_size=workload.batch,
        device="meta",  # fake tensors: a dry run, as on meta
        flops=flops.result(),
        phase_peak_bytes=report.phase_peak_bytes,
        allocations=report.allocations if record_allocations else None,
    )
    return step, GpuRun(list(kernels), seconds)


@contextlib.contextmanager
def _entered(*contexts: contextlib.AbstractContextManager) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield
