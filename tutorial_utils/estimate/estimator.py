"""Will training your model fit your card? Dry runs of one training step, per strategy.

``Workload`` (``estimate.workload``, re-exported here) says what is trained and how (model,
batch, size, precision, optimizer, LoRA); ``estimate`` builds it on meta once and runs a dry run per
checkpointing strategy (``measure_step``: exact tensor bytes by category, FLOPs counted), and
``largest_fit`` finds the longest sequence (a language model) or largest batch (a classifier)
whose step fits a card, by dry runs. A dry run's figures are the tensors PyTorch would allocate;
its allocations and frees, replayed in order through the emulated CUDA caching allocator
(``measurement.allocator``, cuBLAS's workspaces included), give what ``max_memory_allocated`` and
``max_memory_reserved`` would read, and whether the step runs in the card's memory less its CUDA
context (``Card``), the allocator's free-and-retry included.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import Strategy
from tutorial_utils.estimate.breakdown import KeptForBackward
from tutorial_utils.estimate.building import (  # re-exported: the estimator's public names
    batch_for,
    build_model,
    language_model_loss,
    load_config,
    make_optimizer,
    trainer_loss,
)
from tutorial_utils.estimate.card import Card
from tutorial_utils.estimate.forked import mapped
from tutorial_utils.estimate.gpu_step import (
    GpuRun,
    as_gpu_runs,
    describe_rules,
    gpu_run,
    quoted_machine,
)
from tutorial_utils.estimate.workload import (  # re-exported: the estimator's public names
    DTYPES,
    LOOPS,
    LOSSES,
    PRECISIONS,
    QLORA,
    QLORA_RECIPE_NAMES,
    Workload,
    cuda_autocast_precision,
    describe_precision,
)
from tutorial_utils.measurement.allocator import AllocationLog, AllocatorPrediction, replay
from tutorial_utils.measurement.autocast import EmulatedAutocast
from tutorial_utils.measurement.step import Recording, StepReport, measure_step
from tutorial_utils.measurement.tracker import MemoryLimitExceeded

if TYPE_CHECKING:
    from tutorial_utils.estimate.sharded import Sharding

__all__ = [
    "DTYPES",
    "Estimate",
    "LOOPS",
    "LOSSES",
    "Outcome",
    "PRECISIONS",
    "QLORA",
    "QLORA_RECIPE_NAMES",
    "StrategyEstimate",
    "Workload",
    "batch_for",
    "build_model",
    "cuda_autocast_precision",
    "describe_precision",
    "dry_run_and_real_step",
    "estimate",
    "largest_fit",
    "load_config",
    "make_optimizer",
    "predict_allocator",
    "search_largest",
    "train_step",
    "trainer_loss",
]


def train_step(
    model: nn.Module,
    workload: Workload,
    strategy: Strategy,
    *,
    limit_bytes: int | None = None,
    autocast: EmulatedAutocast | None = None,
    round_to_blocks: bool = False,
    record_timeline: bool = False,
    record_allocations: bool = False,
    kept: KeptForBackward | None = None,
) -> StepReport:
    """One tracked training step of ``model`` (meta: a dry run; elsewhere: real) under
    ``strategy``, with the workload's optimizer and precision (``record_timeline``: live bytes
    after every op, to compare two steps op by op; ``record_allocations``: the allocation events,
    for ``predict_allocator``; ``kept``: a language model's activations alive at the loss, by
    region, filled in: ``breakdown``)."""
    device = next(model.parameters()).device.type
    inputs, targets = batch_for(workload, model, device)
    autocast = autocast if autocast is not None else workload.autocast()
    loss_fn: Callable[..., torch.Tensor] = nn.CrossEntropyLoss()
    if workload.is_language_model:
        loss_fn = language_model_loss(workload)
    remove_hooks = None
    if kept is not None and workload.is_language_model:
        from tutorial_utils.estimate.breakdown import recording_regions
        from tutorial_utils.estimate.models import repeated_blocks

        loss_fn, remove_hooks = recording_regions(model, repeated_blocks(model), loss_fn, kept)
    try:
        return measure_step(
            model,
            inputs,
            targets,
            strategy,
            optimizer_factory=lambda _: make_optimizer(workload, model),
            loss_fn=loss_fn,
            device=device,
            time_step=False,
            limit_bytes=limit_bytes,
            autocast=autocast,
            recording=Recording(
                timeline=record_timeline,
                allocations=record_allocations,
                round_to_blocks=round_to_blocks,
            ),
        )
    finally:
        if remove_hooks is not None:
            remove_hooks()


def predict_allocator(log: AllocationLog, card: Card) -> AllocatorPrediction:
    """The step replayed through the card's caching allocator (two steps: the second on the
    first's cache). Where it runs out of memory, the peaks are those it would need (replayed
    without a limit), so the margin says by how much it misses."""
    bounded = _bounded_replay(log, card)
    if bounded.fits:
        return bounded
    needed = _replayed(log, card)()
    return dataclasses.replace(needed, capacity_bytes=card.budget_bytes, out_of_memory=True)


def _bounded_replay(log: AllocationLog, card: Card) -> AllocatorPrediction:
    """The step replayed within the card's budget (``fits`` False where it runs out)."""
    return _replayed(log, card)(capacity_bytes=card.budget_bytes)


def _replayed(log: AllocationLog, card: Card) -> Callable[..., AllocatorPrediction]:
    """``replay`` of ``log`` with the card's allocator settings; capacity still to choose."""
    return functools.partial(
        replay,
        log,
        expandable_segments=card.expandable_segments,
        workspace_bytes=card.workspace_bytes,
    )


# -- every strategy ------------------------------------------------------------------------------


@dataclass
class StrategyEstimate:
    """One strategy's dry run: peak by category, FLOPs, the allocator's predicted counters, and
    whether it fits the card (by the allocator's replay)."""

    strategy: Strategy
    report: StepReport | None  # None for a GPU-only strategy (not measurable here)
    allocator: AllocatorPrediction | None = None
    flops_ratio: float | None = None  # the step's FLOPs / those without checkpointing
    fits: bool | None = None
    largest: int | None = None  # longest sequence / largest batch that fits (None: not searched)
    trials: int = 0
    error: str | None = None  # why the step could not run this way (then ``report`` is None)
    gpu: GpuRun | None = None  # the attention kernels it ran, its predicted seconds
    kept: KeptForBackward | None = None  # a language model's activations at the loss, by region


@dataclass
class Estimate:
    workload: Workload
    card: Card
    model_description: str
    rows: list[StrategyEstimate] = field(default_factory=list)
    seconds: float | None = None  # wall time of the strategies' dry runs
    search_seconds: float | None = None
    model: nn.Module | None = field(default=None, repr=False)  # on meta, for more dry runs
    time_source: str | None = None  # how step times were predicted; None: not predicted
    attention_rules: str = ""  # whose kernel choice the dry runs' attention followed
    sharding: Sharding | None = None  # N GPUs: each row is rank 0's step; None: one GPU


def estimate(
    workload: Workload,
    strategies: Sequence[Strategy],
    card: Card,
    *,
    model: nn.Module | None = None,
    search: bool = True,
    progress: Callable[[str], None] | None = None,
    max_size: int | None = None,
    jobs: int = 1,
    sharding: Sharding | None = None,
) -> Estimate:
    """A dry run of one training step per strategy on the meta device, against ``card``.

    ``search`` also finds the largest size that fits (``search_largest``). ``jobs`` > 1 runs
    the strategies in that many forked processes (Linux; only from a process that has not run
    a backward pass yet, as autograd's threads do not survive a fork: the command line's case).
    ``sharding``: N GPUs (``sharded.Sharding``): each dry run is rank 0's step, the rest alike.
    """
    from tutorial_utils.estimate.models import describe_model

    started = time.perf_counter()
    if sharding is not None:
        sharding.check(workload)
    model = model if model is not None else build_model(workload)
    result = Estimate(workload, card, describe_model(model), model=model, sharding=sharding)
    machine = quoted_machine(card, workload.precision)
    result.time_source = None if machine is None else machine.source
    result.attention_rules = describe_rules(card)
    runnable = [strategy for strategy in strategies if not strategy.gpu_only]
    outcomes = dict(
        zip(runnable, _run_strategies(model, workload, card, runnable, jobs, sharding), strict=True)
    )
    for strategy in strategies:
        if strategy.gpu_only:
            result.rows.append(StrategyEstimate(strategy, None))
            continue
        outcome = outcomes[strategy]
        if isinstance(outcome, str):  # why it could not run
            result.rows.append(StrategyEstimate(strategy, None, error=outcome))
        else:
            report, predicted, gpu, kept = outcome
            result.rows.append(
                StrategyEstimate(
                    strategy, report, predicted, fits=predicted.fits, gpu=gpu, kept=kept
                )
            )
    _flops_ratios(result.rows)
    result.seconds = time.perf_counter() - started
    if search:
        search_largest(result, progress=progress, max_size=max_size)
    return result


def _flops_ratios(rows: list[StrategyEstimate]) -> None:
    """Each measured row's FLOPs over no checkpointing's (when that row is there)."""
    measured = [row for row in rows if row.report is not None and row.report.flops]
    base = next((row for row in measured if row.strategy.kind == "none"), None)
    if base is None or base.report is None or base.report.flops is None:
        return
    for row in measured:
        assert row.report is not None and row.report.flops is not None
        row.flops_ratio = row.report.flops.total / base.report.flops.total


SHORTCUT_BLOCKS = True  # estimate.block_shortcut where it applies; False: every block dry-run
Outcome = tuple[StepReport, AllocatorPrediction, GpuRun, KeptForBackward | None] | str


def _dry_run(
    model: nn.Module,
    workload: Workload,
    strategy: Strategy,
    card: Card,
    sharding: Sharding | None,
    **options: Any,
) -> tuple[StepReport, GpuRun]:
    """One step as ``card``'s GPU runs it (``gpu_run``): one GPU's, or rank 0's of N
    (``sharded.rank_dry_run``, which builds its own model: sharding changes it)."""
    if sharding is not None:
        from tutorial_utils.estimate.sharded import rank_dry_run

        return rank_dry_run(workload, strategy, sharding, card, **options)
    with gpu_run(card, workload.precision) as gpu:
        report = train_step(model, workload, strategy, **options)
    return report, gpu


def _outcome(
    model: nn.Module,
    workload: Workload,
    card: Card,
    sharding: Sharding | None,
    strategy: Strategy,
) -> Outcome:
    """The strategy's dry run and its replay through the card's allocator (the events are
    dropped after it: they are many), or why it could not run (selective checkpointing around
    an in-place op, say)."""
    if (
        SHORTCUT_BLOCKS and sharding is None
    ):  # identical blocks: a few dry-run, the rest written out (exact)
        from tutorial_utils.estimate.block_shortcut import estimate_outcome

        shortcut = estimate_outcome(
            model,
            workload,
            card,
            strategy,
            train_step=train_step,
            predict_allocator=predict_allocator,
        )
        if shortcut is not None:
            return shortcut
    kept = KeptForBackward() if workload.is_language_model else None
    try:
        report, gpu = _dry_run(
            model, workload, strategy, card, sharding, record_allocations=True, kept=kept
        )
    except RuntimeError as failure:
        return str(failure).splitlines()[0]
    assert report.allocations is not None
    predicted = predict_allocator(report.allocations, card)
    return dataclasses.replace(report, allocations=None), predicted, gpu, kept


def _run_strategies(
    model: nn.Module,
    workload: Workload,
    card: Card,
    strategies: Sequence[Strategy],
    jobs: int,
    sharding: Sharding | None = None,
) -> list[Outcome]:
    parts = (model, workload, card, sharding)
    return mapped(_outcome_of, parts, list(strategies), jobs)


def _outcome_of(parts: tuple, strategy: Strategy) -> Outcome:
    model, workload, card, sharding = parts
    return _outcome(model, workload, card, sharding, strategy)


def search_largest(
    result: Estimate,
    *,
    progress: Callable[[str], None] | None = None,
    max_size: int | None = None,
    jobs: int = 1,
) -> Estimate:
    """Fill in each measured strategy's largest size that fits the card (``largest_fit``, each
    trial replayed through the card's allocator), in ``jobs`` forked processes as ``estimate``
    runs its strategies."""
    started = time.perf_counter()
    assert result.model is not None, "estimate() keeps the model it dry-ran"
    rows = [row for row in result.rows if row.report is not None]
    parts = (result.model, result.workload, result.card, result.sharding, progress, max_size)
    found = mapped(_search_one, parts, [(row.strategy, row.report) for row in rows], jobs)
    for row, (largest, trials) in zip(rows, found, strict=True):
        row.largest, row.trials = largest, trials
    result.search_seconds = time.perf_counter() - started
    return result


def _search_one(parts: tuple, task: tuple[Strategy, StepReport]) -> tuple[int, int]:
    model, workload, card, sharding, progress, max_size = parts
    strategy, known = task
    with as_gpu_runs(card):
        return largest_fit(
            model,
            workload,
            strategy,
            card.budget_bytes,
            progress=progress,
            max_size=max_size,
            card=card,
            sharding=sharding,
            known=known,
        )


def largest_fit(
    model: nn.Module,
    workload: Workload,
    strategy: Strategy,
    budget_bytes: int,
    *,
    progress: Callable[[str], None] | None = None,
    max_size: int | None = None,
    card: Card | None = None,
    sharding: Sharding | None = None,
    known: StepReport | None = None,
) -> tuple[int, int]:
    """(largest size that fits, dry runs it took): the longest sequence, in multiples of 256
    tokens, for a language model at the workload's batch; the largest batch for a classifier.

    A line predicts a start (the peak grows about linearly in either): through ``known``, the
    step's dry run at the workload's own size, whose weights, gradients and optimizer state do
    not grow with it; else through two dry runs at 1 and 2 units. ``largest_fitting`` then
    confirms by dry runs: the answer is measured; the line only saves trials. With ``card`` a
    trial fits only when its replay through the card's caching allocator runs too
    (``predict_allocator``; identical blocks dry-run once where ``block_shortcut`` applies).
    ``sharding`` (with ``card``): rank 0's step of N GPUs, its batch per GPU."""
    from tutorial_utils.measurement.batch_search import (
        largest_fitting,
        start_on_line,
        start_past_known,
    )

    lm = workload.is_language_model
    unit = 256 if lm else 1
    default_size = (
        int(getattr(cast(Any, model).config, "max_position_embeddings", 131072)) if lm else 4096
    )
    limit = max((max_size or default_size) // unit, 1)

    def sized(units: int) -> Workload:
        return workload.with_size(size=units * unit) if lm else workload.with_size(batch=units)

    trials = 0

    def fits(units: int) -> bool:
        nonlocal trials
        trials += 1
        if progress is not None:
            what = f"{units * unit:,} tokens" if lm else f"batch {units}"
            progress(f"  {strategy.name}: trying {what}")
        if card is not None and sharding is None and SHORTCUT_BLOCKS:
            from tutorial_utils.estimate.block_shortcut import estimate_outcome

            shortcut = estimate_outcome(
                model,
                sized(units),
                card,
                strategy,
                train_step=train_step,
                predict_allocator=_bounded_replay,
            )
            if shortcut is not None:  # else a dry run that stops at the budget, below
                return shortcut[1].fits
        try:
            report = trial(
                sized(units), limit_bytes=budget_bytes, record_allocations=card is not None
            )
        except MemoryLimitExceeded:
            return False
        return card is None or _replay_fits(report, card)

    def trial(sized_workload: Workload, **options: Any) -> StepReport:
        if sharding is None or card is None:
            return train_step(model, sized_workload, strategy, **options)
        return _dry_run(model, sized_workload, strategy, card, sharding, **options)[0]

    if known is not None:
        start = start_past_known(known, workload.size if lm else workload.batch, budget_bytes)
        start //= unit
    else:
        low, high = (trial(sized(n)).peak_bytes for n in (1, 2))
        if low > budget_bytes:
            return 0, 2
        start = start_on_line(low, high, budget_bytes)
        trials += 2
    best = largest_fitting(fits, limit, start=min(start, limit))
    return best * unit, trials


def _replay_fits(report: StepReport, card: Card) -> bool:
    assert report.allocations is not None
    return _bounded_replay(report.allocations, card).fits


def dry_run_and_real_step(
    workload: Workload, strategy: Strategy, device: str = "cuda"
) -> tuple[StepReport, StepReport]:
    """The same step as a dry run (storages in CUDA's 512-byte blocks, as the allocator counts;
    attention through the kernel ``device``'s GPU picks) and for real on ``device`` (random
    weights from the config; on CUDA the report carries ``torch.cuda.max_memory_allocated`` as
    ``cuda.peak_allocated_bytes``)."""
    from tutorial_utils.measurement.gpu_attention import device_rules, gpu_attention_rules

    with gpu_attention_rules(device_rules(torch.device(device))):  # the GPU's SDPA kernels
        dry = train_step(build_model(workload), workload, strategy, round_to_blocks=True)
    real = train_step(build_model(workload, device=device), workload, strategy)
    return dry, real
