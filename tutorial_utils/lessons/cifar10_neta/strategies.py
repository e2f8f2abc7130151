"""Notebook 03, section 5: checkpointing against gradient accumulation at the same batch."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn as nn
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tutorial_utils.articles.models import NetA
from tutorial_utils.checkpointing.batchnorm import (
    RunningStats,
    freeze_stats_during_recompute,
    relative_distance,
    running_stats,
)
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.lessons.cifar10_neta.card import Batch
from tutorial_utils.measurement.devices import synchronize
from tutorial_utils.measurement.flops import StepFlopCounter
from tutorial_utils.measurement.gradients import relative_gap
from tutorial_utils.measurement.timing import Timing, time_interleaved, time_verdict
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.training.loop import test_model
from tutorial_utils.units import MB

# -- one training step, plain or with gradient accumulation ------------------------------------


def accumulate_gradients(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    micro_batches: int = 1,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> float | None:
    """Forward and backward over ``micro_batches`` slices whose gradients add up to the batch's.

    Each slice's loss is weighted by its share of the batch, so the summed gradient is the one of
    the batch's mean loss, as in one pass. Returns that mean loss (None in a dry run on the meta
    device, where losses have no value).
    """
    if not 1 <= micro_batches <= len(inputs):
        raise ValueError(f"micro_batches must be in 1..{len(inputs)}, got {micro_batches}")
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    losses = []
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True):
        loss = loss_fn(model(x), y) * (len(x) / len(inputs))
        loss.backward()
        losses.append(loss.detach())
    return None if inputs.device.type == "meta" else sum(loss.item() for loss in losses)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    micro_batches: int = 1,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> float | None:
    """The article's step (zero_grad, forward, backward, optimizer step), in one pass over the
    batch or accumulated over ``micro_batches`` slices. Returns the batch's mean loss (None on
    the meta device)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = accumulate_gradients(model, inputs, targets, micro_batches, loss_fn)
    optimizer.step()
    return loss


# -- the strategies compared -------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    """How a batch of B is trained: checkpointing or not, in how many passes, BatchNorm fixed."""

    label: str
    use_checkpoint: bool | frozenset[int]  # as NetA takes it: all, none, or these segments
    micro_batches: int = 1
    freeze_bn_recompute: bool = False

    def build(self, seed: int = 0, device: torch.device | str = "cpu") -> NetA:
        torch.manual_seed(seed)
        model = NetA(use_checkpoint=self.use_checkpoint, use_reentrant=False).to(device)
        if self.freeze_bn_recompute:
            freeze_stats_during_recompute(model)
        return model


PLAIN = Strategy("plain, one pass of B", False)
CHECKPOINT = Strategy("checkpoint, one pass of B", True)
CHECKPOINT_FIXED = Strategy("checkpoint + BN fix, one pass of B", True, freeze_bn_recompute=True)
ACCUMULATION = Strategy("accumulation, 2 passes of B/2", False, micro_batches=2)
STRATEGIES = (PLAIN, CHECKPOINT, CHECKPOINT_FIXED, ACCUMULATION)


@dataclass
class StrategyCost:
    """Memory, time and work of one optimizer step of a strategy."""

    label: str
    batch_size: int
    micro_batch: int
    peak_bytes: int  # tracked peak of the whole step, every pass included
    activation_bytes: int  # the most activation bytes alive during the forward/backward passes
    timing: Timing  # every timed step; the fastest is the estimate, the range the noise
    gflop: float  # forward, backward and recomputation of one step (FLOP formulas, counted)

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / MB

    @property
    def seconds_per_sample(self) -> float:
        return self.timing.fastest / self.batch_size


def strategy_costs(
    strategies: Sequence[Strategy], inputs: torch.Tensor, targets: torch.Tensor, repeats: int = 3
) -> list[StrategyCost]:
    """Each strategy's step: one warm-up step (creates Adam's state), ``repeats`` timed steps
    taken in turns with the other strategies' (a busy spell slows all of them alike), then one
    tracked step and, tracked apart with its FLOPs counted, its forward and backward passes: the
    optimizer step's own temporaries (Adam's, about the size of the weights) would otherwise hide
    the activations of small batches.
    """
    device = inputs.device
    prepared = []
    for strategy in strategies:
        model = strategy.build(device=device)
        optimizer = torch.optim.Adam(model.parameters(), 1e-3)
        train_step(model, optimizer, inputs, targets, strategy.micro_batches)
        prepared.append((strategy, model, optimizer))
    timings = time_interleaved(
        {
            strategy.label: partial(
                train_step, model, optimizer, inputs, targets, strategy.micro_batches
            )
            for strategy, model, optimizer in prepared
        },
        repeats,
        lambda: synchronize(device),
    )
    costs = []
    for strategy, model, optimizer in prepared:
        optimizer.zero_grad(set_to_none=True)
        step = TensorMemoryTracker(model, optimizer, inputs=(inputs, targets), device=device)
        with step:
            train_step(model, optimizer, inputs, targets, strategy.micro_batches)
        optimizer.zero_grad(set_to_none=True)
        passes = TensorMemoryTracker(model, optimizer, inputs=(inputs, targets), device=device)
        with passes, StepFlopCounter() as counter:
            accumulate_gradients(model, inputs, targets, strategy.micro_batches)
        optimizer.zero_grad(set_to_none=True)
        costs.append(
            StrategyCost(
                strategy.label,
                len(inputs),
                len(inputs) // strategy.micro_batches,
                step.peak_bytes,
                passes.activation_peak_bytes,
                timings[strategy.label],
                counter.result().total / 1e9,
            )
        )
    return costs


def strategy_cost(
    strategy: Strategy, inputs: torch.Tensor, targets: torch.Tensor, repeats: int = 3
) -> StrategyCost:
    """`strategy_costs` of one strategy."""
    return strategy_costs([strategy], inputs, targets, repeats)[0]


def format_costs(costs: Sequence[StrategyCost], budget_bytes: int) -> str:
    """A table of ``strategy_cost`` results, ratios to the first row, and whether each fits; the
    time ratio is read against the repeats' noise and the FLOP ratio."""
    first = costs[0]
    columns = (
        "batch",
        "per pass",
        "step peak MiB",
        "activation peak MiB",
        "ms per sample",
        "peak vs plain",
        f"fits {budget_bytes / MB:.0f} MiB",
    )
    header = f"{'strategy':<36} " + " ".join(columns) + "  time vs plain (fastest of repeats)"
    widths = [len(name) for name in columns]
    lines = [header]
    for c in costs:
        cells = (
            f"{c.batch_size}",
            f"{c.micro_batch}",
            f"{c.peak_mb:.1f}",
            f"{c.activation_bytes / MB:.1f}",
            f"{1000 * c.seconds_per_sample:.2f}",
            f"{c.peak_bytes / first.peak_bytes:.2f}",
            "yes" if c.peak_bytes <= budget_bytes else "no",
        )
        verdict = time_verdict(c.timing, first.timing, c.gflop / first.gflop)
        lines.append(
            f"{c.label:<36} "
            + " ".join(f"{cell:>{w}}" for cell, w in zip(cells, widths, strict=True))
            + f"  {verdict}"
        )
    return "\n".join(lines)


def gradient_gap(strategy: Strategy, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """||g - g_plain|| / ||g_plain|| for the first step's gradients, from the same weights."""

    def gradients(chosen: Strategy) -> list[torch.Tensor]:
        model = chosen.build(device=inputs.device).train()
        accumulate_gradients(model, inputs, targets, chosen.micro_batches)
        grads = []
        for p in model.parameters():
            assert p.grad is not None  # every NetA parameter feeds the loss, so backward set it
            grads.append(p.grad)
        return grads

    return relative_gap(gradients(strategy), gradients(PLAIN))


LOSS_WINDOW = 10  # the last optimizer steps whose training losses are averaged


@dataclass
class StrategyTraining:
    """A short training run: the loss and BatchNorm statistics after every step, test figures.

    ``losses`` are training-mode losses, normalized by each pass's own batch statistics (B/2 for
    accumulation); ``recent_eval_loss`` is the loss on the last `LOSS_WINDOW` batches after
    training in eval mode (running statistics), which compares the strategies on equal terms.
    """

    label: str
    losses: list[float] = field(default_factory=list)
    stats: list[RunningStats] = field(default_factory=list)
    test_accuracy: float = float("nan")
    test_loss: float = float("nan")
    recent_eval_loss: float = float("nan")
    model: nn.Module | None = None  # the trained network, for questions asked afterwards

    @property
    def recent_train_loss(self) -> float:
        """The mean training-mode loss of the last `LOSS_WINDOW` steps (one step is noise)."""
        recent = self.losses[-LOSS_WINDOW:]
        return sum(recent) / len(recent)


def train_strategies(
    strategies: Iterable[Strategy],
    batches: Sequence[Batch],
    test_loader: Iterable,
    epochs: int = 1,
    seed: int = 0,
) -> dict[str, StrategyTraining]:
    """Train each strategy from the same seed on the same batches; test in eval mode at the end."""
    if not batches:
        raise ValueError("batches is empty: pass a few (inputs, targets) pairs")
    device = batches[0][0].device
    loss_fn = nn.CrossEntropyLoss()
    runs = {}
    for strategy in strategies:
        model = strategy.build(seed, device)
        optimizer = torch.optim.Adam(model.parameters(), 1e-3)
        run = StrategyTraining(strategy.label)
        for _ in range(epochs):
            for inputs, targets in batches:
                loss = train_step(model, optimizer, inputs, targets, strategy.micro_batches)
                assert loss is not None  # None only on the meta device; training uses real data
                run.losses.append(loss)
                run.stats.append(running_stats(model))
        run.test_accuracy, run.test_loss = test_model(model, test_loader, loss_fn, device)
        _, run.recent_eval_loss = test_model(model, batches[-LOSS_WINDOW:], loss_fn, device)
        run.model = model
        runs[strategy.label] = run
    return runs


def batch_statistics_loss(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int = 1
) -> float:
    """The training-mode loss of fixed weights on one batch, BatchNorm normalizing each of
    ``micro_batches`` slices by its own statistics; no step, running statistics untouched."""
    if not 1 <= micro_batches <= len(inputs):
        raise ValueError(f"micro_batches must be in 1..{len(inputs)}, got {micro_batches}")
    probe = copy.deepcopy(model).train()
    with torch.no_grad():
        return sum(
            nn.functional.cross_entropy(probe(x), y).item() * len(x) / len(inputs)
            for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True)
        )


def describe_batch_statistics_effect(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> str:
    """One trained network's training-mode loss on one batch, normalized as a whole and in
    halves: why accumulation's training losses are not comparable with one pass's."""
    whole = batch_statistics_loss(model, inputs, targets)
    halves = batch_statistics_loss(model, inputs, targets, 2)
    return (
        f"the same weights on one batch of {len(inputs)}, training mode, no step: loss "
        f"{whole:.4f} with BatchNorm statistics of the whole batch, {halves:.4f} with each half's"
    )


def format_trainings(runs: dict[str, StrategyTraining], reference: str) -> str:
    """Training losses (train and eval mode), test figures and BN-statistics distance to the
    reference run."""
    base = runs[reference]
    columns = (
        f"train loss, last {LOSS_WINDOW} steps",
        "same batches, eval mode",
        "test acc %",
        "test loss",
        "BN stats vs " + reference.split(",")[0],
    )
    lines = [f"{'strategy':<36} " + " ".join(columns)]
    for label, run in runs.items():
        cells = (
            f"{run.recent_train_loss:.4f}",
            f"{run.recent_eval_loss:.4f}",
            f"{run.test_accuracy:.1f}",
            f"{run.test_loss:.4f}",
            f"{relative_distance(run.stats[-1], base.stats[-1]):.2e}",
        )
        lines.append(
            f"{label:<36} "
            + " ".join(f"{cell:>{len(name)}}" for cell, name in zip(cells, columns, strict=True))
        )
    return "\n".join(lines)


def plot_bn_trajectories(
    runs: dict[str, StrategyTraining],
    reference: str,
    layer: str = "layer1.1",
    device: torch.device | str | None = None,
) -> Figure:
    """Left: one BatchNorm's mean running variance after each step. Right: every BatchNorm's
    statistics' relative distance to the reference run, step by step. Each run has its own
    marker, so runs that coincide stay visible."""
    figure = Figure(figsize=(12, 4.2))
    left, right = figure.subplots(1, 2)
    base = runs[reference]
    for index, (label, run) in enumerate(runs.items()):
        steps = range(1, len(run.stats) + 1)
        marker = "osx^vD"[index % 6]
        style = f"{marker}--" if label == reference else f"{marker}-"
        left.plot(
            steps,
            [float(s[layer]["running_var"].mean()) for s in run.stats],
            style,
            color=f"C{index}",
            label=label,
            fillstyle="none",
        )
        if label != reference:
            right.plot(
                steps,
                [relative_distance(s, b) for s, b in zip(run.stats, base.stats, strict=True)],
                f"{marker}-",
                color=f"C{index}",
                label=label,
                fillstyle="none",
            )
    left.set_ylabel(f"{layer} running_var, mean over channels")
    right.set_ylabel(f"relative distance to '{reference}'")
    for axis in (left, right):
        axis.set_xlabel("optimizer step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(
        f"BatchNorm running statistics per step\n{figure_subtitle(device)}", fontsize=11
    )
    figure.tight_layout()
    return figure
