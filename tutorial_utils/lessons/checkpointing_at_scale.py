"""The experiments of notebook 05: checkpointing under DDP and FSDP, run by ``launch``.

Functions taking a ``RankContext`` first run inside a rank; the others run in the caller (the
single-process references). Every rank gets the same seeded model and its contiguous slice of one
seeded global batch, so DDP's averaged gradients must equal the single-process gradients of the
whole batch: that equality is what shows a distributed setup is correct, not merely running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from IPython.display import display
from matplotlib.figure import Figure
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.display.plotting import CATEGORY_COLORS, CATEGORY_NAMES
from tutorial_utils.measurement.gradients import gradients_match, named_gradients
from tutorial_utils.measurement.tracker import CATEGORIES, TensorMemoryTracker
from tutorial_utils.training.distributed import RankContext, launch
from tutorial_utils.units import MB

NUM_CLASSES = 10
HIDDEN_FACTOR = 4
REENTRANT_DDP_ERROR = "Expected to mark a variable ready only once"


@dataclass(frozen=True)
class BlockNetConfig:
    """Size of the deep block model and of the global batch all ranks share."""

    width: int = 128
    depth: int = 8
    global_batch: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("width", "depth", "global_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def check_splits(self, world_size: int) -> None:
        """Every rank must get an equal share, or DDP's average is not the global mean."""
        if self.global_batch % world_size:
            raise ValueError(
                f"global batch {self.global_batch} does not split evenly over {world_size} ranks: "
                f"use a multiple of {world_size}"
            )


# Activations per rank ~ the parameter state (weights, gradients, two Adam moments), so both
# what sharding saves and what checkpointing saves are visible side by side.
DISTRIBUTED_SIZES = {
    "ci": BlockNetConfig(width=128, depth=8, global_batch=1024),
    "cpu": BlockNetConfig(width=256, depth=16, global_batch=2048),
    "gpu": BlockNetConfig(width=512, depth=16, global_batch=4096),
    "article": BlockNetConfig(width=1024, depth=24, global_batch=8192),
}


def sizes_for(profile: Profile, **overrides: int) -> BlockNetConfig:
    """The block model of a profile, with e.g. ``depth=`` or ``global_batch=`` changed."""
    try:
        base = DISTRIBUTED_SIZES[profile.name]
    except KeyError:
        known = ", ".join(DISTRIBUTED_SIZES)
        raise ValueError(
            f"no notebook-05 sizes for profile {profile.name!r}: add it to DISTRIBUTED_SIZES "
            f"(known: {known})"
        ) from None
    return replace(base, **overrides)


def distributed_device_type(profile: Profile) -> str:
    """``cuda`` (NCCL, every visible GPU) in the GPU profiles where CUDA exists, else ``cpu`` (gloo)."""
    return "cuda" if profile.name in ("gpu", "article") and torch.cuda.is_available() else "cpu"


class ResidualBlock(nn.Module):
    """``x + fc2(relu(fc1(x)))``: a transformer-MLP-like block, the unit people checkpoint."""

    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, HIDDEN_FACTOR * width)
        self.fc2 = nn.Linear(HIDDEN_FACTOR * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.relu(self.fc1(x)))


class BlockNet(nn.Module):
    """Input layer, ``depth`` residual blocks, classifier head.

    ``tied_blocks=True`` applies ONE block ``depth`` times (weight sharing, as in ALBERT or a
    recurrent step), so its parameters are used several times in one forward: the case that
    breaks reentrant checkpointing under DDP. ``checkpoint_blocks`` checkpoints every block
    application with ``torch.utils.checkpoint`` and the given ``use_reentrant``.
    """

    def __init__(
        self,
        config: BlockNetConfig,
        tied_blocks: bool = False,
        checkpoint_blocks: bool = False,
        use_reentrant: bool = False,
    ):
        super().__init__()
        self.depth = config.depth
        self.tied_blocks = tied_blocks
        self.checkpoint_blocks = checkpoint_blocks
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(config.width, config.width)
        n_blocks = 1 if tied_blocks else config.depth
        self.blocks = nn.ModuleList(ResidualBlock(config.width) for _ in range(n_blocks))
        self.head = nn.Linear(config.width, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for step in range(self.depth):
            block = self.blocks[0 if self.tied_blocks else step]
            if self.checkpoint_blocks:
                h = checkpoint(block, h, use_reentrant=self.use_reentrant)
            else:
                h = block(h)
        return self.head(h)


def build_model(config: BlockNetConfig, **options: bool) -> BlockNet:
    """The same initial weights on every rank and in the caller: seeded construction."""
    torch.manual_seed(config.seed)
    return BlockNet(config, **options)


def global_batch(config: BlockNetConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """One seeded batch of inputs and labels; every rank builds the same one."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    inputs = torch.randn(config.global_batch, config.width, generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (config.global_batch,), generator=generator)
    return inputs, labels


def rank_slice(
    batch: tuple[torch.Tensor, torch.Tensor], rank: int, world_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous, equal share of the global batch (what a DistributedSampler gives)."""
    size = batch[0].shape[0]
    if size % world_size:
        raise ValueError(f"a batch of {size} does not split evenly over {world_size} ranks")
    share = size // world_size
    return tuple(t[rank * share : (rank + 1) * share] for t in batch)


def single_process_gradients(
    config: BlockNetConfig, tied_blocks: bool = False
) -> dict[str, torch.Tensor]:
    """The reference: gradients of one un-checkpointed model on the whole global batch."""
    model = build_model(config, tied_blocks=tied_blocks)
    inputs, labels = global_batch(config)
    F.cross_entropy(model(inputs), labels).backward()
    return named_gradients(model)


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
            gradients = {name: p.grad.detach().cpu() for name, p in model.named_parameters()}
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
    device_type: str | None = None,
    cases: tuple[DDPCase, ...] = DDP_CASES,
) -> list[DDPCaseSummary]:
    """Run every case under DDP and check each rank's gradients against one process."""
    if world_size is not None:
        config.check_splits(world_size)
    per_rank = launch(run_ddp_cases, config, cases, world_size=world_size, device_type=device_type)
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
    lines = [f"{'case':<36}{'backward':<10}{'gradients == one process'}", "-" * 70]
    for summary in summaries:
        outcome = "FAILED" if summary.error else "ok"
        equal = (
            "-"
            if summary.gradients_equal_single_process is None
            else summary.gradients_equal_single_process
        )
        lines.append(f"{summary.case.name:<36}{outcome:<10}{equal}")
    return "\n".join(lines)


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
    config: BlockNetConfig, world_size: int | None = None, device_type: str | None = None
) -> list[MemoryRecord]:
    """The single-process step here, then every distributed setup on every rank."""
    if world_size is not None:
        config.check_splits(world_size)
    device = "cuda" if device_type == "cuda" else "cpu"
    records = [measure_setup(SINGLE_PROCESS, config, device=device)]
    per_rank = launch(
        measure_distributed_setups, config, world_size=world_size, device_type=device_type
    )
    by_setup = sorted(
        (record for rank_records in per_rank for record in rank_records),
        key=lambda record: (DISTRIBUTED_SETUPS.index(record.setup), record.rank),
    )
    return records + by_setup


TABLE_COLUMNS = (  # heading, width, how to read it from a record
    ("setup", 22, lambda r: r.setup),
    ("rank", 5, lambda r: r.rank),
    ("batch", 6, lambda r: r.local_batch),
    ("params", 8, lambda r: f"{r.mib('parameters'):.2f}"),
    ("grads", 8, lambda r: f"{r.mib('gradients'):.2f}"),
    ("optim", 8, lambda r: f"{r.mib('optimizer_state'):.2f}"),
    ("activ.", 8, lambda r: f"{r.mib('activations'):.2f}"),
    ("peak", 8, lambda r: f"{r.peak_bytes / MB:.2f}"),
    ("buckets", 8, lambda r: f"{r.ddp_bucket_bytes / MB:.2f}"),
    ("loss", 8, lambda r: f"{r.loss:.4f}"),
    ("grad norm", 10, lambda r: f"{r.gradient_norm:.6f}"),
)


def memory_table(records: list[MemoryRecord]) -> str:
    """One line per setup and rank, tracked MiB at the step's peak: the numbers behind the bars.

    "buckets" is DDP's gradient-bucket memory, held outside the step and not in "peak".
    """

    def row(cells) -> str:
        first, *rest = cells
        return f"{first:<{TABLE_COLUMNS[0][1]}}" + "".join(
            f"{cell:>{width}}" for cell, (_, width, _) in zip(rest, TABLE_COLUMNS[1:], strict=True)
        )

    header = row(heading for heading, _, _ in TABLE_COLUMNS)
    lines = [header, "-" * len(header)]
    lines += [row(read(record) for _, _, read in TABLE_COLUMNS) for record in records]
    return "\n".join(lines)


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


def plot_memory_by_setup(records: list[MemoryRecord], title: str = "") -> Figure:
    """Stacked bars of the tracked peak by category, one bar per setup and rank.

    DDP's gradient buckets, held outside the step, sit on top, hatched, so they are not mistaken
    for part of the tracked peak.
    """
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(records)), 4.8))
    # one word per line under each bar: labels as wide as a bar, never over the next one
    labels = [
        "\n".join([*r.setup.replace(" + ", " ").split(), f"rank {r.rank}/{r.world_size}"])
        for r in records
    ]
    positions = range(len(records))
    bottoms = [0.0] * len(records)
    for category in CATEGORIES:
        heights = [r.mib(category) for r in records]
        axes.bar(
            positions,
            heights,
            bottom=bottoms,
            label=CATEGORY_NAMES[category],
            color=CATEGORY_COLORS[category],
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    buckets = [r.ddp_bucket_bytes / MB for r in records]
    if any(buckets):
        axes.bar(
            positions,
            buckets,
            bottom=bottoms,
            color="white",
            edgecolor="grey",
            hatch="//",
            label="DDP buckets (outside the step)",
        )
    tops = [b + k for b, k in zip(bottoms, buckets, strict=True)]
    for position, (total, top) in enumerate(zip(bottoms, tops, strict=True)):
        axes.annotate(f"{total:.1f}", (position, top), ha="center", va="bottom", fontsize=7)
    axes.set_ylim(0, 1.12 * max(tops))  # every bar and its label inside the axes
    axes.set_xlim(-0.6, len(records) - 0.4)
    axes.set_xticks(list(positions), labels, fontsize=7)
    axes.set_ylabel("tracked MiB at the step's peak (per rank)")
    axes.set_title(title or "Memory per rank by category", fontsize=9)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside the bars
    figure.tight_layout()
    return figure


def describe_plan(config: BlockNetConfig, world_size: int) -> str:
    """What a run with these sizes will do, computed instantly (the slider's live feedback)."""
    config.check_splits(world_size)
    per_block = 2 * HIDDEN_FACTOR * config.width**2 + (HIDDEN_FACTOR + 1) * config.width
    n_params = per_block * config.depth + config.width**2 + config.width
    n_params += (config.width + 1) * NUM_CLASSES
    state_mib = 4 * n_params * 4 / MB  # fp32 weights, gradients and two Adam moments
    return (
        f"{config.depth} blocks of width {config.width}: {n_params:,} parameters; "
        f"weights + gradients + Adam state = {state_mib:.1f} MiB per DDP rank, "
        f"{state_mib / world_size:.1f} MiB per FSDP rank; "
        f"global batch {config.global_batch} = {config.global_batch // world_size} per rank"
    )


def memory_comparison_panel(
    config: BlockNetConfig,
    world_size: int,
    device_type: str,
    title: str,
    initial_records: list[MemoryRecord] | None = None,
) -> widgets.VBox:
    """Sliders for depth and global batch, a Run button that re-runs ``compare_memory``."""
    depth = widgets.IntSlider(value=config.depth, min=2, max=4 * config.depth, description="blocks")
    batch_step = world_size * max(1, config.global_batch // (8 * world_size))
    batch = widgets.IntSlider(
        value=config.global_batch,
        min=batch_step,
        max=4 * config.global_batch,
        step=batch_step,  # a multiple of world_size: every rank gets an equal share
        description="global batch",
        style={"description_width": "initial"},
    )
    plan = widgets.Output()
    results = widgets.Output()
    run = widgets.Button(description="Run", button_style="primary")

    def chosen() -> BlockNetConfig:
        return replace(config, depth=depth.value, global_batch=batch.value)

    def show_plan(_change=None) -> None:
        plan.clear_output()
        with plan:
            print(describe_plan(chosen(), world_size))

    def show(records: list[MemoryRecord]) -> None:
        results.clear_output(wait=True)
        with results:
            print(memory_table(records))
            figure = plot_memory_by_setup(records, title)
            display(figure)
            plt.close(figure)

    def on_run(_button=None) -> None:
        run.disabled = True
        try:
            show(compare_memory(chosen(), world_size, device_type))
        finally:
            run.disabled = False

    depth.observe(show_plan, names="value")
    batch.observe(show_plan, names="value")
    run.on_click(on_run)
    show_plan()
    if initial_records:
        show(initial_records)
    return widgets.VBox([widgets.HBox([depth, batch, run]), plan, results])
