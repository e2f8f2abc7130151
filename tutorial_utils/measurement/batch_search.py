"""The second article's experiment as a search: the largest batch whose step fits a budget.

Doubling, then bisection, over ``measure_step`` trials: by the tracked peak on any device (dry
runs on the meta device included), or for real on CUDA under a memory-fraction cap.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, Strategy
from tutorial_utils.measurement.autocast import EmulatedAutocast
from tutorial_utils.measurement.devices import default_device
from tutorial_utils.measurement.dry_run import build_on_meta
from tutorial_utils.measurement.nvml import cuda_unavailable_reason
from tutorial_utils.measurement.step import OptimizerFactory, Recording, StepReport, measure_step
from tutorial_utils.measurement.tracker import MemoryLimitExceeded
from tutorial_utils.units import MiB

__all__ = [
    "BatchTrial",
    "find_max_batch_size",
    "largest_fitting",
    "MaxBatchResult",
    "SearchMode",
    "start_on_line",
    "start_past_known",
]

# "tracked": the tracked peak against the budget, any device; "cuda": a real step under a capped
# CUDA allocator, where running out of memory is the answer
SearchMode = Literal["tracked", "cuda"]


@dataclass
class BatchTrial:
    """One tried batch size."""

    batch_size: int
    fits: bool
    # tracked peak (mode "tracked"; for a trial stopped over budget, the bytes when it stopped, a
    # lower bound) or CUDA peak allocated (mode "cuda"; None when it ran out of memory)
    peak_bytes: int | None
    error: str | None = None  # why it does not fit: stopped over budget, or out of memory


@dataclass
class MaxBatchResult:
    """The largest batch size that fits ``budget_bytes`` and every trial."""

    batch_size: int
    trials: list[BatchTrial]
    budget_bytes: int
    strategy: Strategy = NO_CHECKPOINTING
    mode: SearchMode = "tracked"
    device: str = "cpu"

    def fitting(self) -> list[BatchTrial]:
        return [trial for trial in self.trials if trial.fits]


def _validate_search(
    sample_shape: Sequence[int], budget_bytes: int, mode: str, max_batch: int
) -> None:
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
    if len(sample_shape) == 0 or any(int(side) <= 0 for side in sample_shape):
        raise ValueError(
            "sample_shape is one sample's shape, without the batch (the search chooses it), "
            f"non-empty and positive, e.g. (3, 32, 32); got {sample_shape}"
        )
    if mode not in get_args(SearchMode):
        raise ValueError(f"mode must be 'tracked' or 'cuda', got {mode!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")


def largest_fitting(fits: Callable[[int], bool], max_value: int, start: int = 1) -> int:
    """Largest v in 1..max_value with fits(v) (0 if none), for a monotone ``fits``.

    Galloping from ``start``: steps of 1, 2, 4, ... up while values fit (down while they do not),
    then bisection between the last fit and the first failure. From ``start=1`` that is the
    second article's doubling search (1, 2, 4, 8, ...); from a good prediction, two or three
    trials.
    """
    fits_at, fails_at = 0, max_value + 1
    candidate = min(max(start, 1), max_value)
    step = 1
    if fits(candidate):
        fits_at = candidate
        while fits_at < max_value and fails_at > max_value:
            candidate = min(fits_at + step, max_value)
            if fits(candidate):
                fits_at = candidate
            else:
                fails_at = candidate
            step *= 2
    else:
        fails_at = candidate
        while fails_at > 1 and fits_at == 0:
            candidate = max(fails_at - step, 1)
            if fits(candidate):
                fits_at = candidate
            elif candidate == 1:
                return 0
            else:
                fails_at = candidate
            step *= 2
    while fails_at - fits_at > 1:
        middle = (fits_at + fails_at) // 2
        if fits(middle):
            fits_at = middle
        else:
            fails_at = middle
    return fits_at


def start_on_line(peak_at_one: int, peak_at_two: int, budget_bytes: int) -> int:
    """Where to start ``largest_fitting`` when the peak grows about linearly in the size (a
    batch, or a sequence once attention keeps no s x s matrix): the line through the peaks of
    two steps, at 1 and 2 units, meets the budget here. A prediction that only saves trials."""
    slope = max(peak_at_two - peak_at_one, 1)
    return max(1, math.floor(1 + (budget_bytes - peak_at_one) / slope))


def start_past_known(known: StepReport, size: int, budget_bytes: int) -> int:
    """Where the line through a dry run's peak at ``size`` meets the budget: the weights,
    gradients and optimizer state at its peak stay, the rest grows with the size (batch or
    sequence). A prediction that saves the two dry runs of ``start_on_line``."""
    fixed = sum(
        known.breakdown.get(category, 0)
        for category in ("parameters", "gradients", "optimizer_state")
    )
    growing = max(known.peak_bytes - fixed, 1)
    return max(1, int((budget_bytes - fixed) / growing * size))


def find_max_batch_size(
    make_model: Callable[[], nn.Module],
    sample_shape: Sequence[int],
    budget_bytes: int,
    strategy: Strategy | None = None,
    *,
    num_classes: int = 10,
    device: torch.device | str | None = None,
    mode: SearchMode = "tracked",
    max_batch: int = 256,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    round_to_blocks: bool = False,
    autocast: EmulatedAutocast | None = None,
) -> MaxBatchResult:
    """The largest batch whose training step fits ``budget_bytes``: the second article's experiment.

    Each trial builds a fresh model and optimizer (default SGD, lr 1e-3, momentum 0.9) and runs
    ``measure_step`` on random inputs; ``sample_shape`` is one sample's, without the batch.
    ``mode="tracked"`` compares the tracked peak with the budget on any device, stopping a trial
    as soon as it goes over. ``mode="cuda"`` runs for real under
    ``torch.cuda.set_per_process_memory_fraction(budget / total)`` (which covers everything the
    process holds), an out-of-memory error meaning "does not fit". ``device="meta"``: every trial
    a dry run, any size, well under a second each. No batch fitting is a ``ValueError``.
    """
    _validate_search(sample_shape, budget_bytes, mode, max_batch)
    device = torch.device(device) if device is not None else default_device()
    if mode == "cuda":
        reason = cuda_unavailable_reason()
        if reason is not None or device.type != "cuda":
            raise ValueError(
                f"mode='cuda' needs a CUDA device ({reason or f'device is {device}'}); "
                "use mode='tracked' on this machine"
            )
    search = _Search(
        make_model,
        tuple(sample_shape),
        budget_bytes,
        strategy,
        num_classes,
        device,
        mode,
        loss_fn,
        optimizer_factory,
        Recording(round_to_blocks=round_to_blocks),
        autocast,
    )
    if mode == "cuda":
        best = _search_on_small_card(search.try_batch, max_batch, budget_bytes, device)
    else:
        best = largest_fitting(search.try_batch, max_batch)
    if best == 0:
        raise ValueError(_no_batch_fits(search.trials, budget_bytes))
    return MaxBatchResult(
        best, search.trials, budget_bytes, strategy or NO_CHECKPOINTING, mode, str(device)
    )


@dataclass
class _Search:
    """One batch search's fixed parts; ``try_batch`` runs one trial and keeps it."""

    make_model: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]
    budget_bytes: int
    strategy: Strategy | None
    num_classes: int
    device: torch.device
    mode: SearchMode
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
    optimizer_factory: OptimizerFactory | None
    recording: Recording
    autocast: EmulatedAutocast | None
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    trials: list[BatchTrial] = field(default_factory=list)

    def peak(self, batch_size: int) -> int | None:
        """The trial's peak: tracked, or CUDA peak allocated in mode "cuda"."""
        if self.device.type == "meta":  # a dry run: built there directly, no data drawn
            model = build_on_meta(self.make_model)
            inputs = torch.empty(batch_size, *self.sample_shape, device="meta")
            targets = torch.empty(batch_size, dtype=torch.long, device="meta")
        else:
            model = self.make_model().to(self.device)
            inputs = torch.randn(batch_size, *self.sample_shape, generator=self.generator)
            targets = torch.randint(0, self.num_classes, (batch_size,), generator=self.generator)
        report = measure_step(
            model,
            inputs,
            targets,
            self.strategy,
            optimizer_factory=self.optimizer_factory,
            loss_fn=self.loss_fn,
            device=self.device,
            time_step=False,
            limit_bytes=self.budget_bytes if self.mode == "tracked" else None,
            autocast=self.autocast,
            recording=self.recording,
        )
        if self.mode == "cuda":
            return None if report.cuda is None else report.cuda.peak_allocated_bytes
        return report.peak_bytes

    def try_batch(self, batch_size: int) -> bool:
        """Whether ``batch_size`` fits; a trial that goes over is stopped (tracked) or caught as
        CUDA's out-of-memory error, and its memory freed."""
        if self.mode == "tracked":
            try:
                trial = BatchTrial(batch_size, True, self.peak(batch_size))
            except MemoryLimitExceeded as stopped:
                trial = BatchTrial(batch_size, False, stopped.live_bytes, f"stopped: {stopped}")
        else:
            try:
                trial = BatchTrial(batch_size, True, self.peak(batch_size))
            except torch.OutOfMemoryError as error:
                trial = BatchTrial(batch_size, False, None, str(error).splitlines()[0])
            gc.collect()
            torch.cuda.empty_cache()
        self.trials.append(trial)
        return trial.fits


def _no_batch_fits(trials: Sequence[BatchTrial], budget_bytes: int) -> str:
    """One line: not even one sample fits, by how much, and what to do."""
    single = next(trial for trial in trials if trial.batch_size == 1)  # the search's last try
    if single.peak_bytes is None:  # mode "cuda": out of memory under the cap
        needs = "ran out of memory under the cap"
    else:  # stopped as soon as it went over: a lower bound
        needs = f"needs more than {single.peak_bytes / MiB:,.1f} MiB"
    return (
        f"not even batch 1 fits the budget of {budget_bytes / MiB:,.1f} MiB (its step {needs}): "
        "raise the budget, checkpoint more of the model, or use smaller samples"
    )


def _search_on_small_card(
    try_batch: Callable[[int], bool], max_batch: int, budget_bytes: int, device: torch.device
) -> int:
    """``largest_fitting`` with the CUDA allocator capped at ``budget_bytes``, restored afterwards."""
    total = torch.cuda.get_device_properties(device).total_memory
    if budget_bytes > total:
        raise ValueError(f"budget_bytes={budget_bytes} exceeds the device's {total} bytes")
    previous = torch.cuda.get_per_process_memory_fraction(device)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(budget_bytes / total, device)
    try:
        return largest_fitting(try_batch, max_batch)
    finally:
        torch.cuda.set_per_process_memory_fraction(previous, device)
        torch.cuda.empty_cache()
