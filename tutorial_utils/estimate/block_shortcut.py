"""Identical blocks, dry-run once: a step of N repeated blocks from dry runs of a few.

A language model's decoder layers are copies of one block (same parameters, same options), so
its dry run repeats one block's ops N times. ``shortcut_outcome`` dry-runs the same step with
the model cut to k, k+p and k+2p blocks (p: the strategy's period, 2 for "every 2nd block"):

* every figure of the step (peak bytes, breakdown, FLOPs, kept activations, predicted seconds)
  must grow by the same amount from k to k+p as from k+p to k+2p; it is then extended to N;
* the allocation events of k+p blocks must be those of k blocks with chunks inserted (a block's
  forward, its backward, its gradients and optimizer state); each free must point at its
  allocation by a rule that holds at k, k+p and k+2p blocks (the same block, the one before,
  the mirror block of the backward pass...). The events of N blocks are then written out in
  full and replayed through the card's allocator, so ``max_memory_reserved`` is replayed, not
  extended (the allocator's segments grow in steps, never linearly).

Where any of this does not hold, where the blocks differ (sliding-window layers between full
ones, say), or where the three runs would dry-run more than ``MAX_TRACED_SHARE`` of the blocks
(each run pays the logits, the loss and the optimizer again), it answers None and the caller
dry-runs all N blocks. ``tests/test_block_shortcut.py`` holds the shortcut equal to the full dry
run, to the byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.blocks import decoder_layers
from tutorial_utils.checkpointing.strategy import Strategy
from tutorial_utils.estimate.repeated_events import extend_log, inserted
from tutorial_utils.measurement.allocator import AllocationLog
from tutorial_utils.measurement.step import StepReport
from tutorial_utils.measurement.tracker import CATEGORIES

__all__ = [
    "MAX_TRACED_SHARE",
    "cut_to",
    "estimate_outcome",
    "flatten",
    "MIN_SAVED_BLOCKS",
    "Traced",
    "identical_blocks",
    "shortcut_outcome",
]

MIN_SAVED_BLOCKS = 4  # fewer blocks saved than this: dry-run them all (nothing to gain)
# Each cut run still pays the embeddings, the logits, the loss and the optimizer once. Measured
# on an 8 B Llama with LoRA (32 blocks, 4,096 tokens), CPU seconds of the shortcut against the
# full dry run: every block 0.9 (3 + 4 + 5 blocks) against 1.8; no checkpointing 0.9 (5 + 6 + 7)
# against 1.3; every 2nd block 1.5 (6 + 8 + 10) against 1.6, no gain: it dry-runs in full.
MAX_TRACED_SHARE = 0.6


def _base_blocks(strategy: Strategy) -> int:
    """Blocks every cut model keeps: the first, some middle ones, the last. The inserted
    blocks must sit between regular ones (the first block's events differ: its input is the
    embeddings'). Checkpointing each block, one regular block on each side is enough (3).
    Without checkpointing, a block's forward frees a tensor of the block two before it, and
    with a period of 2 a chunk is two blocks: two regular blocks before the chunk (5)."""
    return 3 if strategy.kind != "none" and max(strategy.every, 1) == 1 else 5


@dataclass
class Traced:
    """One dry run's figures, flattened (``numbers``), and its allocation events."""

    numbers: dict[str, int | float]
    log: AllocationLog
    kernels: list[str]
    report: StepReport  # with the op-by-op timeline


# -- the blocks -----------------------------------------------------------------------------------


_SET_PER_RUN = ("gradient_checkpointing", "training")  # each dry run sets them on its blocks


def _signature(block: nn.Module) -> tuple:
    """What makes two blocks run the same ops: module types, tensors' shapes and dtypes, and the
    simple settings of every submodule (a layer's index aside)."""
    parts: list[Any] = []
    for name, module in block.named_modules():
        settings = sorted(
            (key, value)
            for key, value in vars(module).items()
            if not key.startswith("_")
            and "idx" not in key
            and key not in _SET_PER_RUN
            and isinstance(value, (bool, int, float, str, type(None)))
        )
        parts.append((name, type(module).__name__, tuple(settings)))
    for name, tensor in [*block.named_parameters(), *block.named_buffers()]:
        parts.append((name, tuple(tensor.shape), tensor.dtype, tensor.requires_grad))
    return tuple(parts)


def identical_blocks(model: nn.Module) -> tuple[nn.Module, str, list[nn.Module]] | None:
    """(the module holding the blocks, its attribute, the blocks) when a model's repeated blocks
    sit in one ``nn.ModuleList`` and are identical; else None."""
    blocks = decoder_layers(model)
    if len(blocks) < 2:
        return None
    for parent in model.modules():
        for attribute, child in parent.named_children():
            if isinstance(child, nn.ModuleList) and list(child) == blocks:
                first = _signature(blocks[0])
                if all(_signature(block) == first for block in blocks[1:]):
                    return parent, attribute, blocks
                return None
    return None


@contextlib.contextmanager
def cut_to(
    parent: nn.Module, attribute: str, blocks: list[nn.Module], count: int
) -> Iterator[None]:
    """Inside the ``with``, the model runs its first ``count - 1`` blocks and its last one."""
    original = getattr(parent, attribute)
    setattr(parent, attribute, nn.ModuleList([*blocks[: count - 1], blocks[-1]]))
    try:
        yield
    finally:
        setattr(parent, attribute, original)


# -- figures that grow by a block at a time -------------------------------------------------------


def _extend_numbers(traced: list[Traced], copies: int) -> dict[str, int | float] | None:
    """Each figure at ``copies`` insertions, when it grows by equal steps over the three runs
    (sums: FLOPs, bytes kept at the loss, seconds; the peaks come from ``_extend_timeline``)."""
    first, second, third = (t.numbers for t in traced)
    if not first.keys() == second.keys() == third.keys():
        return None
    extended: dict[str, int | float] = {}
    for key, value in first.items():
        step, again = second[key] - value, third[key] - second[key]
        if isinstance(value, int) and step != again:
            return None
        if abs(step - again) > 1e-9 * max(abs(third[key]), 1e-30):
            return None
        extended[key] = value + copies * step
    return extended


# -- the peaks, op by op ----------------------------------------------------------------------------


def _op_tokens(report: StepReport) -> list[tuple]:
    """Each op as (name, phase, change of each category's bytes)."""
    assert report.timeline is not None and report.category_timeline is not None
    tokens = []
    before: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
    for event, after in zip(report.timeline, report.category_timeline, strict=True):
        tokens.append(((event.op, event.phase), tuple(after[c] - before[c] for c in CATEGORIES)))
        before = after
    return tokens


def _peaks(
    tokens: list[tuple], start: dict[str, int], baseline_bytes: int
) -> dict[str, int | float] | None:
    """``peak_bytes``, the breakdown at it, ``phase_peak_bytes`` and ``activation_peak_bytes``
    as the tracker reads them, from the ops' changes (``start``: each category's bytes at the
    first op, less its own change)."""
    live = dict(start)
    peak, at_peak = baseline_bytes, None
    phases: dict[str, int] = {}
    activations = live["activations"]
    for (_, phase), change in tokens:
        for category, delta in zip(CATEGORIES, change, strict=True):
            live[category] += delta
        total = sum(live.values())
        if total > phases.get(phase, -1):
            phases[phase] = total
        if total > peak:
            peak, at_peak = total, dict(live)
        activations = max(activations, live["activations"])
    if at_peak is None:
        return None
    numbers: dict[str, int | float] = {"peak_bytes": peak, "activation_peak_bytes": activations}
    numbers.update({f"breakdown.{c}": at_peak[c] for c in CATEGORIES})
    numbers.update({f"phase_peak_bytes.{p}": value for p, value in phases.items()})
    return numbers


def _extend_peaks(reports: list[StepReport], copies: int) -> dict[str, int | float] | None:
    """The peak figures of the step with ``copies`` insertions, the ops' timeline extended and
    read again; None unless reading it gives each run's own figures."""
    runs = [_op_tokens(report) for report in reports]
    starts: list[dict[str, int]] = []
    for report, tokens in zip(reports, runs, strict=True):
        assert report.category_timeline is not None
        first = report.category_timeline[0]
        start: dict[str, int] = {
            str(c): first[c] - tokens[0][1][i] for i, c in enumerate(CATEGORIES)
        }
        reported: dict[str, int | float] = {}
        for name in _PEAK_FIELDS:
            flatten(name, getattr(report, name), reported)
        if _peaks(tokens, start, report.baseline_bytes) != reported:
            return None
        starts.append(start)
    found = inserted(runs)
    if found is None or not all(s == starts[0] for s in starts):
        return None
    baseline = reports[0].baseline_bytes + copies * (
        reports[1].baseline_bytes - reports[0].baseline_bytes
    )
    return _peaks(found.tokens(copies), starts[0], baseline)


_PEAK_FIELDS = ("peak_bytes", "breakdown", "activation_peak_bytes", "phase_peak_bytes")


# -- the step -------------------------------------------------------------------------------------


def shortcut_outcome(
    model: nn.Module,
    strategy: Strategy,
    trace: Callable[[], Traced],
) -> tuple[dict[str, int | float], AllocationLog, list[str]] | None:
    """The step's figures, events and attention kernels at the model's N blocks from ``trace``
    (one dry run of the model as it is at the call) at k, k+p and k+2p blocks; None where the
    blocks are not identical, too few would be saved, or the runs do not follow one pattern."""
    found = identical_blocks(model)
    if found is None:
        return None
    parent, attribute, blocks = found
    total, period, base = len(blocks), max(strategy.every, 1), _base_blocks(strategy)
    smallest = base + (total - base) % period
    traced = 3 * smallest + 3 * period
    if total - (smallest + 2 * period) < MIN_SAVED_BLOCKS or traced > MAX_TRACED_SHARE * total:
        return None
    runs = []
    for count in (smallest, smallest + period, smallest + 2 * period):
        with cut_to(parent, attribute, blocks, count):
            runs.append(trace())
    copies = (total - smallest) // period
    numbers = _extend_numbers(runs, copies)
    peaks = _extend_peaks([t.report for t in runs], copies)
    log = extend_log([t.log for t in runs], copies)
    kernels = _extend_kernels([t.kernels for t in runs], copies)
    if numbers is None or peaks is None or log is None or kernels is None:
        return None
    return {**numbers, **peaks}, log, kernels


def _extend_kernels(runs: list[list[str]], copies: int) -> list[str] | None:
    """The attention kernels, one name per call, extended as the calls are."""
    found = inserted([[(name, ()) for name in run] for run in runs])
    return None if found is None else [name for name, _ in found.tokens(copies)]


def flatten(prefix: str, value: Any, into: dict[str, int | float]) -> None:
    """Numbers of a report (dataclasses, dicts, numbers) under dotted names."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        into[prefix] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{prefix}.{key}", item, into)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            flatten(f"{prefix}.{item.name}", getattr(value, item.name), into)
    elif isinstance(value, torch.Tensor):
        raise TypeError(f"{prefix}: a tensor in a report")


def estimate_outcome(
    model: nn.Module,
    workload: Any,
    card: Any,
    strategy: Strategy,
    *,
    train_step: Callable[..., StepReport],
    predict_allocator: Callable[[AllocationLog, Any], Any],
) -> Any:
    """``estimator``'s outcome of one strategy (report, allocator, GPU run, kept activations) by
    the shortcut, with the estimator's own ``train_step`` and ``predict_allocator``; None where
    it does not apply (the caller then dry-runs every block)."""
    from tutorial_utils.estimate.breakdown import KeptForBackward
    from tutorial_utils.estimate.gpu_step import gpu_run

    runs: list[tuple[Any, Any, Any]] = []

    def trace() -> Traced:
        kept = KeptForBackward() if workload.is_language_model else None
        with gpu_run(card, workload.precision) as gpu:
            report = train_step(
                model,
                workload,
                strategy,
                record_allocations=True,
                record_timeline=True,
                kept=kept,
            )
        runs.append((report, gpu, kept))
        numbers: dict[str, int | float] = {}
        flatten("baseline_bytes", report.baseline_bytes, numbers)
        flatten("flops", report.flops, numbers)
        flatten("kept", kept, numbers)
        flatten("gpu.predicted_seconds", gpu.predicted_seconds, numbers)
        assert report.allocations is not None
        return Traced(numbers, report.allocations, list(gpu.kernels), report)

    try:
        shortcut = shortcut_outcome(model, strategy, trace)
    except RuntimeError:  # the step cannot run this way: the full dry run says why
        return None
    if shortcut is None:
        return None
    numbers, log, kernels = shortcut
    report, gpu, kept = runs[0]
    report = dataclasses.replace(
        report,
        allocations=None,
        timeline=None,
        category_timeline=None,
        **{name: _rebuilt(name, getattr(report, name), numbers) for name in _REPORT_NUMBERS},
    )
    if kept is not None:
        kept = _rebuilt("kept", kept, numbers)
    gpu = dataclasses.replace(
        gpu, kernels=kernels, predicted_seconds=numbers.get("gpu.predicted_seconds")
    )
    return report, predict_allocator(log, card), gpu, kept


_REPORT_NUMBERS = (
    "peak_bytes",
    "breakdown",
    "activation_peak_bytes",
    "baseline_bytes",
    "flops",
    "phase_peak_bytes",
)


def _rebuilt(prefix: str, value: Any, numbers: dict[str, int | float]) -> Any:
    """``value`` with every number ``flatten`` found in it replaced by ``numbers``'."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return numbers[prefix]
    if isinstance(value, dict):
        return {key: _rebuilt(f"{prefix}.{key}", item, numbers) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            item.name: _rebuilt(f"{prefix}.{item.name}", getattr(value, item.name), numbers)
            for item in dataclasses.fields(value)
        }
        return dataclasses.replace(value, **changes)
    return value
