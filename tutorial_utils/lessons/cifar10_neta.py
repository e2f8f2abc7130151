"""Notebook 03's experiments on the second article's NetA, as functions the tests can call.

- which checkpoint mode needs the article's ``y + torch.zeros(1, requires_grad=True)`` line;
- BatchNorm running statistics with and without checkpointing, with the two fixes of
  ``batchnorm_recompute``;
- checkpointing against gradient accumulation at the same effective batch: memory, time,
  gradients and BatchNorm statistics;
- the "which segments to checkpoint" panel: peak memory, step time and the largest batch;
- the article's experiment at its own size (224 px, 2.5 GB) by dry run, with the card's reserve
  as a slider.
"""

from __future__ import annotations

import copy
import time
import warnings
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby

import ipywidgets as widgets
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tutorial_utils.articles.models import NETA_SEGMENTS, NetA, count_parameters
from tutorial_utils.articles.quoted import NETA_ARTICLE
from tutorial_utils.checkpointing.batchnorm import (
    RunningStats,
    compensate_momentum,
    freeze_stats_during_recompute,
    relative_distance,
    running_stats,
    updates_per_step,
)
from tutorial_utils.display.plotting import figure_subtitle, plot_step_timelines
from tutorial_utils.display.widgets import RunPanel, budget_slider, int_slider, result_outputs
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.flops import StepFlopCounter
from tutorial_utils.measurement.gradients import relative_gap
from tutorial_utils.measurement.step import DRY_RUN_LABEL, adam_optimizer
from tutorial_utils.measurement.timing import Timing, time_interleaved, time_verdict
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.training.loop import test_model
from tutorial_utils.units import MB

ARTICLE_CARD_BYTES = NETA_ARTICLE.card_bytes
ARTICLE_IMAGE_SIZE = NETA_ARTICLE.image_size
ARTICLE_MAX_BATCH = NETA_ARTICLE.max_batch
SEGMENT_LAYERS = ("layer1", "layer2-3", "layer4-5", "layer6-7", "layer8 + pool + linear")
Batch = tuple[torch.Tensor, torch.Tensor]


def card_budget(image_size: int, card_bytes: int = ARTICLE_CARD_BYTES) -> int:
    """The article's card scaled to ``image_size``: the same room for weights, gradients and Adam
    state, the room for activations shrunk with the pixel count (activations scale with it)."""
    if image_size < 1:
        raise ValueError(f"image_size must be positive, got {image_size}")
    static = 4 * 4 * count_parameters(NetA())  # fp32 weights, gradients, Adam's two moments
    return int(static + (card_bytes - static) * (image_size / ARTICLE_IMAGE_SIZE) ** 2)


# -- the article's requires-grad line ---------------------------------------------------------


@dataclass
class TrickOutcome:
    """One backward through NetA with a checkpoint mode, the line kept or removed."""

    use_reentrant: bool
    trick: bool
    checkpointed: str
    backward: str  # "ok" or the first line of the error
    parameters_without_grad: int
    warnings: int


def requires_grad_trick_outcomes(inputs: torch.Tensor, targets: torch.Tensor) -> list[TrickOutcome]:
    """Backward through NetA in each mode with and without the article's line.

    Checkpointing all five segments and only the first one: reentrant checkpoint without the line
    either fails or silently leaves the first segment's parameters without gradients.
    """
    outcomes = []
    for use_reentrant in (True, False):
        for trick in (True, False):
            for segments, label in ((True, "all 5"), ({0}, "seg0 only")):
                torch.manual_seed(0)
                model = NetA(segments, use_reentrant=use_reentrant, input_requires_grad_trick=trick)
                model.to(inputs.device)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        nn.functional.cross_entropy(model(inputs), targets).backward()
                        result = "ok"
                    except RuntimeError as error:
                        result = str(error).splitlines()[0]
                missing = sum(p.grad is None for p in model.parameters())
                outcomes.append(
                    TrickOutcome(use_reentrant, trick, label, result, missing, len(caught))
                )
    return outcomes


def format_trick_outcomes(outcomes: Sequence[TrickOutcome]) -> str:
    """A table of ``requires_grad_trick_outcomes``."""
    lines = [f"{'mode':<14} {'line':<8} {'checkpointed':<13} {'no grad':>7}  backward"]
    for o in outcomes:
        mode = "reentrant" if o.use_reentrant else "non-reentrant"
        line = "kept" if o.trick else "removed"
        lines.append(
            f"{mode:<14} {line:<8} {o.checkpointed:<13} "
            f"{o.parameters_without_grad:>7}  {o.backward}"
        )
    return "\n".join(lines)


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
        lambda: _synchronize(device),
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
        "step peak MB",
        "activation peak MB",
        "ms per sample",
        "peak vs plain",
        f"fits {budget_bytes / MB:.0f} MB",
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


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gradient_gap(strategy: Strategy, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """||g - g_plain|| / ||g_plain|| for the first step's gradients, from the same weights."""

    def gradients(chosen: Strategy) -> list[torch.Tensor]:
        model = chosen.build(device=inputs.device).train()
        accumulate_gradients(model, inputs, targets, chosen.micro_batches)
        return [p.grad for p in model.parameters()]

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
                run.losses.append(
                    train_step(model, optimizer, inputs, targets, strategy.micro_batches)
                )
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


# -- BatchNorm under checkpointing -----------------------------------------------------------


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
        for inputs, targets in batches:
            train_step(model, optimizer, inputs, targets)
        return running_stats(model)

    return {
        "plain": run(False, None),
        "checkpoint": run(True, None),
        "checkpoint + momentum fix": run(True, "momentum"),
        "checkpoint + frozen recompute": run(True, "freeze"),
    }


# -- which segments to checkpoint ------------------------------------------------------------


@dataclass
class SegmentChoice:
    """One step's memory and time at one batch size, and the largest batch under the budget."""

    segments: frozenset[int]
    cost: StrategyCost
    budget_bytes: int
    max_batch: int

    def describe(self) -> str:
        chosen = ", ".join(f"seg{i}" for i in sorted(self.segments)) or "none"
        cost = self.cost
        return (
            f"checkpointed: {chosen}\n"
            f"batch {cost.batch_size}: step peak {cost.peak_mb:.1f} MB, activation peak "
            f"(forward + backward) {cost.activation_bytes / MB:.1f} MB, "
            f"step {cost.timing.describe()}\n"
            f"largest batch within {self.budget_bytes / MB:.0f} MB: {self.max_batch}"
        )


def evaluate_segment_choice(
    segments: Iterable[int],
    budget_bytes: int,
    batch_size: int,
    image_size: int,
    max_batch: int = 256,
    device: torch.device | str = "cpu",
) -> SegmentChoice:
    """``strategy_cost`` and ``find_max_batch_size`` for NetA, the chosen segments checkpointed."""
    chosen = frozenset(segments)
    if not chosen <= set(range(NETA_SEGMENTS)):
        raise ValueError(f"NetA segments are 0..{NETA_SEGMENTS - 1}, got {sorted(chosen)}")
    generator = torch.Generator().manual_seed(0)
    inputs = torch.rand(batch_size, 3, image_size, image_size, generator=generator)
    targets = torch.randint(0, 10, (batch_size,), generator=generator)
    strategy = Strategy(f"segments {sorted(chosen)}", chosen)
    cost = strategy_cost(strategy, inputs.to(device), targets.to(device), repeats=1)
    search = find_max_batch_size(
        lambda: NetA(use_checkpoint=chosen, use_reentrant=False),
        (3, image_size, image_size),
        budget_bytes,
        max_batch=max_batch,
        device=device,
    )
    return SegmentChoice(chosen, cost, budget_bytes, search.batch_size)


def segment_checkboxes(
    checked: Iterable[int] = range(NETA_SEGMENTS),
) -> dict[str, widgets.Checkbox]:
    """One Checkbox per NetA segment, keyed seg0..seg4 as ``segment_panel``'s compute expects."""
    checked = set(checked)
    return {
        f"seg{i}": widgets.Checkbox(value=i in checked, description=f"seg{i}: {layers}")
        for i, layers in enumerate(SEGMENT_LAYERS)
    }


def segment_panel(
    batch_size: int,
    image_size: int,
    budget_mb: float,
    max_batch: int = 256,
    device: torch.device | str = "cpu",
) -> RunPanel:
    """Budget slider and five segment checkboxes; Run measures the choice."""

    def compute(budget_mb: float, **checked: bool) -> str:
        segments = {int(name[3:]) for name, on in checked.items() if on}
        choice = evaluate_segment_choice(
            segments, int(budget_mb * MB), batch_size, image_size, max_batch, device
        )
        return choice.describe()

    static_mb = 4 * 4 * count_parameters(NetA()) / MB
    controls = {
        "budget_mb": budget_slider(
            max_mb=round(2 * budget_mb), value=round(budget_mb), min_mb=round(static_mb)
        ),
        **segment_checkboxes(),
    }
    return RunPanel(controls, compute, title="Which NetA segments to checkpoint")


# -- the article's card at its own size, by dry run -------------------------------------------

CARD_MODELS: dict[str, Callable[[], NetA]] = {  # keyed as ARTICLE_MAX_BATCH
    "no checkpoint": partial(NetA, use_checkpoint=False, use_reentrant=False),
    "checkpoint": partial(NetA, use_checkpoint=True, use_reentrant=False),
}
REENTRANT_CHECKPOINT = partial(NetA, use_checkpoint=True, use_reentrant=True)  # the article's mode
MAX_RESERVE_MIB = ARTICLE_CARD_BYTES // MB // 2  # the reserve slider's end: half the card


@dataclass(frozen=True)
class PeakTable:
    """The dry-run peak of one NetA training step (Adam) at every batch from 1 up to the first
    batch over the card, so that the largest batch under any budget up to the card is a lookup.

    The lookup is exact because the peak grows with the batch: activations scale with it, while
    weights, gradients and Adam's state stay the same.
    """

    label: str
    image_size: int
    card_bytes: int
    peaks: tuple[int, ...]  # peaks[b - 1]: the step's peak at batch b; only the last is over
    seconds: float  # wall time to build the table on this machine

    def largest_batch(self, budget_bytes: int) -> int:
        """The largest batch whose step fits ``budget_bytes`` (0 when not even one sample does)."""
        if not 0 <= budget_bytes <= self.card_bytes:
            raise ValueError(
                f"budget_bytes must be in 0..{self.card_bytes} (the card the table was built "
                f"for), got {budget_bytes}: build a table for a larger card"
            )
        return bisect_right(self.peaks, budget_bytes)

    @property
    def bytes_per_sample(self) -> float:
        """What one more sample adds to the peak, on average over the table."""
        return (self.peaks[-1] - self.peaks[0]) / max(1, len(self.peaks) - 1)

    def describe(self) -> str:
        return (
            f"{self.label:<14} peak {self.peaks[0] / MB:6.1f} MiB at batch 1, "
            f"+{self.bytes_per_sample / MB:.1f} MiB per sample; largest batch in the whole "
            f"{self.card_bytes / MB:.0f} MiB: {self.largest_batch(self.card_bytes)}"
        )


def dry_run_peak_table(
    label: str,
    make_model: Callable[[], nn.Module],
    image_size: int = ARTICLE_IMAGE_SIZE,
    card_bytes: int = ARTICLE_CARD_BYTES,
    max_batch: int = 256,
) -> PeakTable:
    """Dry runs at batch 1, 2, ... until one is over ``card_bytes``, with Adam (lr 1e-3) as in
    the article and in ``find_max_batch_size``; each costs a fraction of a second at 224 px."""
    if image_size < 1 or card_bytes < 1:
        raise ValueError(
            f"image_size and card_bytes must be positive, got {image_size}, {card_bytes}"
        )
    started = time.perf_counter()
    peaks: list[int] = []
    while not peaks or peaks[-1] <= card_bytes:
        if len(peaks) == max_batch:
            raise ValueError(
                f"batch {max_batch} still fits {card_bytes / MB:.0f} MiB: raise max_batch"
            )
        shape = (len(peaks) + 1, 3, image_size, image_size)
        report = dry_run_step(build_on_meta(make_model), shape, optimizer_factory=adam_optimizer)
        peaks.append(report.peak_bytes)
    return PeakTable(label, image_size, card_bytes, tuple(peaks), time.perf_counter() - started)


def article_card_tables(
    image_size: int = ARTICLE_IMAGE_SIZE, card_bytes: int = ARTICLE_CARD_BYTES
) -> dict[str, PeakTable]:
    """``dry_run_peak_table`` for NetA plain and with all five segments checkpointed."""
    return {
        label: dry_run_peak_table(label, make, image_size, card_bytes)
        for label, make in CARD_MODELS.items()
    }


def _card_of(tables: Mapping[str, PeakTable], labels: Iterable[str] = ()) -> int:
    """The card every table was built for; the tables must include ``labels``."""
    cards = {table.card_bytes for table in tables.values()}
    if len(cards) != 1:
        raise ValueError(f"need tables built for one card, got cards {sorted(cards)} bytes")
    missing = set(labels) - set(tables)
    if missing:
        raise ValueError(f"no table for {sorted(missing)}: build them with article_card_tables()")
    return cards.pop()


def largest_batches(tables: Mapping[str, PeakTable], reserve_mib: int) -> dict[str, int]:
    """Each table's largest batch when the card keeps ``reserve_mib`` MiB for itself."""
    card = _card_of(tables)
    if not 0 <= reserve_mib <= card // MB:
        raise ValueError(f"reserve_mib must be in 0..{card // MB}, got {reserve_mib}")
    return {label: table.largest_batch(card - reserve_mib * MB) for label, table in tables.items()}


@dataclass(frozen=True)
class ReserveRun:
    """Consecutive whole-MiB reserves under which every table's largest batch stays the same."""

    first_mib: int
    last_mib: int
    batches: dict[str, int]


@dataclass(frozen=True)
class ReserveFit:
    """Every whole-MiB reserve of the card against the article's largest batches."""

    runs: tuple[ReserveRun, ...]  # reserve 0 up to the whole card, in order
    quoted: dict[str, int]

    def miss(self, run: ReserveRun) -> int:
        """How many batches the run is off the quoted ones, in total."""
        return sum(abs(run.batches[label] - batch) for label, batch in self.quoted.items())

    def matching(self, label: str) -> list[ReserveRun]:
        """The runs whose ``label`` batch is the article's."""
        return [run for run in self.runs if run.batches[label] == self.quoted[label]]

    @property
    def reproducing(self) -> list[ReserveRun]:
        """The runs that give every quoted batch at once (empty: no reserve does)."""
        return [run for run in self.runs if self.miss(run) == 0]

    @property
    def closest(self) -> list[ReserveRun]:
        """The runs with the smallest miss."""
        least = min(self.miss(run) for run in self.runs)
        return [run for run in self.runs if self.miss(run) == least]

    def describe(self) -> str:
        lines = [f"reserves (whole MiB) that give the article's largest batch, {DRY_RUN_LABEL}:"]
        for label, batch in self.quoted.items():
            runs = self.matching(label)
            if not runs:
                lines.append(f"  {label} = {batch}: no reserve in 0..{self.runs[-1].last_mib} MiB")
                continue
            others = ", ".join(
                f"{other} {_span(run.batches[other] for run in runs)}"
                for other in self.quoted
                if other != label
            )
            lines.append(
                f"  {label} = {batch}: reserve {runs[0].first_mib}..{runs[-1].last_mib} MiB "
                f"(there {others})"
            )
        if self.reproducing:
            spans = ", ".join(f"{r.first_mib}..{r.last_mib} MiB" for r in self.reproducing)
            lines.append(f"all at once: reserve {spans}")
        else:
            closest = "; ".join(
                f"{r.first_mib}..{r.last_mib} MiB: "
                + ", ".join(f"{label} {batch}" for label, batch in r.batches.items())
                for r in self.closest
            )
            lines.append(
                f"all at once: no reserve. Closest, {self.miss(self.closest[0])} batches off in "
                f"total: {closest}"
            )
        return "\n".join(lines)


def _span(values: Iterable[int]) -> str:
    values = sorted(set(values))
    return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"


def reserve_fit(
    tables: Mapping[str, PeakTable], quoted: Mapping[str, int] = ARTICLE_MAX_BATCH
) -> ReserveFit:
    """Scan every whole-MiB reserve 0..card (lookups only) for those that give the quoted batches."""
    card_mib = _card_of(tables, quoted) // MB
    by_reserve = [(mib, largest_batches(tables, mib)) for mib in range(card_mib + 1)]
    runs = []
    for _, group in groupby(by_reserve, key=lambda item: tuple(item[1].values())):
        members = list(group)
        runs.append(ReserveRun(members[0][0], members[-1][0], members[0][1]))
    return ReserveFit(tuple(runs), dict(quoted))


def _gain(batches: Mapping[str, int]) -> str:
    plain, checkpointed = batches["no checkpoint"], batches["checkpoint"]
    return f"x{checkpointed / plain:.2f}" if plain else "n/a (no batch fits without checkpoint)"


def plot_peak_tables(
    tables: Mapping[str, PeakTable],
    reserve_mib: int,
    quoted: Mapping[str, int] = ARTICLE_MAX_BATCH,
) -> Figure:
    """Step peak against batch for each table, the card, the tensor budget left by the reserve,
    the largest batch under it (a star) and the article's batch (a dotted line)."""
    card = _card_of(tables, quoted)
    batches = largest_batches(tables, reserve_mib)
    budget_mib = card / MB - reserve_mib
    figure = Figure(figsize=(7.5, 4.4))
    axis = figure.subplots()
    axis.axhline(card / MB, color="gray", linestyle=":", label=f"the card: {card / MB:.0f} MiB")
    axis.axhline(
        budget_mib, color="black", linestyle="--", label=f"tensor budget: {budget_mib:.0f} MiB"
    )
    for index, (label, table) in enumerate(tables.items()):
        color = f"C{index}"
        sizes = range(1, len(table.peaks) + 1)
        axis.plot(sizes, [peak / MB for peak in table.peaks], ".-", color=color, label=label)
        best = batches[label]
        if best:
            axis.plot(
                best,
                table.peaks[best - 1] / MB,
                "*",
                color=color,
                markersize=14,
                label=f"{label}: largest {best}",
            )
        axis.axvline(
            quoted[label], color=color, linestyle=":", label=f"{label}: article {quoted[label]}"
        )
    axis.set_xlabel("batch size")
    axis.set_ylabel("step peak (MiB)")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper left")
    size = next(iter(tables.values())).image_size
    figure.suptitle(
        f"NetA at {size} px, Adam: the largest batch with a {reserve_mib} MiB reserve\n"
        f"{DRY_RUN_LABEL}",
        fontsize=11,
    )
    figure.tight_layout()
    return figure


def reserve_view(
    tables: Mapping[str, PeakTable],
    reserve_mib: int,
    quoted: Mapping[str, int] = ARTICLE_MAX_BATCH,
) -> tuple[str, Figure]:
    """The reserve panel's callback: the largest batches beside the article's, and the plot."""
    card_mib = _card_of(tables, quoted) // MB
    batches = largest_batches(tables, reserve_mib)
    lines = [
        f"reserve {reserve_mib} MiB: tensor budget {card_mib - reserve_mib} MiB of the "
        f"{card_mib} MiB card",
        f"largest batch, {DRY_RUN_LABEL}:",
        *(
            f"  {label:<14} {batch:>5}   (the article: {quoted[label]})"
            for label, batch in batches.items()
        ),
        f"  {'gain':<14} {_gain(batches):>5}   (the article: {_gain(quoted)})",
    ]
    return "\n".join(lines), plot_peak_tables(tables, reserve_mib, quoted)


def reserve_panel(
    tables: Mapping[str, PeakTable], value: int = 0, max_reserve_mib: int = MAX_RESERVE_MIB
) -> widgets.VBox:
    """A reserve slider that redraws ``reserve_view`` on every change (lookups: instant)."""
    slider = int_slider("reserve: card memory not left to tensors (MiB)", value, 0, max_reserve_mib)
    output = widgets.Output()

    def show(reserve_mib: int) -> None:
        output.outputs = result_outputs(reserve_view(tables, reserve_mib))

    slider.observe(lambda change: show(change["new"]), names="value")
    show(value)
    return widgets.VBox([slider, output])


def checkpoint_modes(tables: Mapping[str, PeakTable], batch: int = 23) -> str:
    """Peak at ``batch`` and largest batch on the whole card, plain, non-reentrant checkpoint (the
    tables) and reentrant checkpoint, the mode the article ran (PyTorch's default then)."""
    card = _card_of(tables, ARTICLE_MAX_BATCH)
    covered = min(len(table.peaks) for table in tables.values())
    if not 1 <= batch <= covered:
        raise ValueError(f"batch must be in 1..{covered} (what the tables cover), got {batch}")
    size = next(iter(tables.values())).image_size
    reentrant = dry_run_step(
        build_on_meta(REENTRANT_CHECKPOINT),
        (batch, 3, size, size),
        optimizer_factory=adam_optimizer,
    )
    search = find_max_batch_size(REENTRANT_CHECKPOINT, (3, size, size), card, device="meta")
    rows = {
        "no checkpoint": (
            tables["no checkpoint"].peaks[batch - 1],
            tables["no checkpoint"].largest_batch(card),
        ),
        "checkpoint, non-reentrant": (
            tables["checkpoint"].peaks[batch - 1],
            tables["checkpoint"].largest_batch(card),
        ),
        "checkpoint, reentrant (the article's)": (reentrant.peak_bytes, search.batch_size),
    }
    lines = [
        f"NetA at {size} px, Adam, {DRY_RUN_LABEL}:",
        f"{'':<38} {f'peak at batch {batch}':>18} {f'largest in {card // MB} MiB':>20}",
    ]
    lines += [
        f"{label:<38} {peak / MB:>14.1f} MiB {largest:>20}"
        for label, (peak, largest) in rows.items()
    ]
    return "\n".join(lines)


def article_step_timelines(
    batch: int = ARTICLE_MAX_BATCH["checkpoint"], image_size: int = ARTICLE_IMAGE_SIZE
) -> Figure:
    """One step of NetA plain and checkpointed at the same batch, op by op, by dry run."""
    reports = {
        f"{label}, batch {batch}, {image_size} px": dry_run_step(
            build_on_meta(make),
            (batch, 3, image_size, image_size),
            optimizer_factory=adam_optimizer,
            record_timeline=True,
        )
        for label, make in CARD_MODELS.items()
    }
    return plot_step_timelines(reports)
