"""Memory and time of one training step, on any device: the measurements behind every figure.

``measure_step`` runs forward, backward and an optimizer step under the ``TensorMemoryTracker``
(tracked peak, any device) and, on CUDA, reads the allocator's peaks and NVML beside it (on
Apple's GPU, torch.mps's two readings after the step). ``sweep_strategies`` measures one model
under several checkpointing strategies, timed in turns. (The batch search built on ``measure_step`` is
``batch_search.find_max_batch_size``; dry runs of any model, ``dry_run.dry_run_step``.)

Both accept the ``meta`` device: a model and inputs there make a **dry run**, the same step with
shapes and no data, whose tensor bytes are exact (``tests/test_dry_run.py`` proves them equal to a
real step's) and whose time does not exist: ``seconds`` is None and FLOPs stand in for it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, Strategy
from tutorial_utils.measurement.allocator import AllocationLog
from tutorial_utils.measurement.autocast import (
    EmulatedAutocast,
    ambient_autocast,
    forward_autocast,
    outside_autocast,
    step_kernels,
)
from tutorial_utils.measurement.devices import synchronize
from tutorial_utils.measurement.flops import StepFlopCounter, StepFlops
from tutorial_utils.measurement.meta_attention import dry_run_context
from tutorial_utils.measurement.nvml import (
    CudaReadings,
    DeviceReadings,
    MpsReadings,
    NvmlReading,
    device_readings,
)
from tutorial_utils.measurement.phases import step_phase
from tutorial_utils.measurement.timing import Timing, time_interleaved, time_repeats
from tutorial_utils.measurement.tracker import (
    MemoryLimitExceeded,
    TensorMemoryTracker,
    TimelineEvent,
)
from tutorial_utils.units import MiB

__all__ = [
    "Recording",
    "default_optimizer",
    "DRY_RUN_LABEL",
    "measure_step",
    "next_token_loss",
    "OptimizerFactory",
    "prime_optimizer_state",
    "StepReport",
    "sweep_strategies",
    "SweepRecord",
]

DRY_RUN_LABEL = "dry run (meta device): exact tensor bytes, no time"
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class Recording:
    """What a tracked step keeps beyond its peak and breakdown (``measure_step``'s
    ``recording=``): ``timeline``, the op-by-op timeline with bytes per category; ``allocations``,
    the allocation events a CUDA caching allocator would see (``measurement.allocator.replay``);
    ``round_to_blocks``, every storage counted in CUDA's 512-byte blocks; ``count_flops``, the
    FLOPs of each phase (None: in a dry run only, where there is no time to measure)."""

    timeline: bool = False
    allocations: bool = False
    round_to_blocks: bool = False
    count_flops: bool | None = None


@dataclass
class StepReport:
    """One training step's tracked memory and time; the device's own readings beside them.

    Bytes unless the name says otherwise; None where absent (``missing`` says why for the
    CUDA and MPS readings, ``nvml.reason`` for NVML)."""

    peak_bytes: int  # tracked peak of live tensor bytes, baseline included
    breakdown: dict[str, int]  # the tracked peak split by CATEGORIES
    activation_peak_bytes: int  # most activations/other bytes alive at any moment of the step
    baseline_bytes: int  # tracked bytes alive before the step (parameters, optimizer state, inputs)
    seconds: float | None  # fastest wall time of an untracked step (None when not timed)
    strategy: Strategy  # how the step was checkpointed (NO_CHECKPOINTING for None)
    batch_size: int
    device: str
    timing: Timing | None = None  # every timed repeat, for the spread beside ``seconds``
    flops: StepFlops | None = None  # counted in dry runs (or with Recording(count_flops=True))
    phase_peak_bytes: dict[str, int] | None = None  # tracked peak within each phase
    rounded_to_blocks: bool = False  # every storage counted in 512-byte CUDA blocks
    timeline: list[TimelineEvent] | None = None  # op by op, with Recording(timeline=True)
    category_timeline: list[dict[str, int]] | None = None  # bytes per category, op by op
    allocations: AllocationLog | None = None  # allocations and frees in order, when recorded
    cuda: CudaReadings | None = None  # on CUDA
    nvml: NvmlReading = NvmlReading(None, "not read")  # on CUDA, where NVML answers
    mps: MpsReadings | None = None  # on Apple's GPU
    missing: dict[DeviceReadings, str] = field(default_factory=dict)  # why that part is None

    @property
    def dry_run(self) -> bool:
        """True for a step on the meta device: exact tensor bytes, no time."""
        return self.device == "meta"

    @property
    def source(self) -> str:
        """How the figures were obtained, for every label that shows them."""
        if self.dry_run:
            return DRY_RUN_LABEL
        return f"measured: real step on {self.device}"

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MiB

    @property
    def breakdown_mib(self) -> dict[str, float]:
        return {name: value / MiB for name, value in self.breakdown.items()}


def default_optimizer(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The first article's optimizer: SGD, lr 1e-3, momentum 0.9."""
    return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9)


def next_token_loss(outputs: Any, token_ids: torch.Tensor) -> torch.Tensor:
    """A causal language model's loss: position t predicts token t+1 (as ``labels=`` computes it).

    ``outputs`` is the model's output (``.logits`` is read when present, as on a ``transformers``
    model) and ``token_ids`` the input ids, so ``measure_step(model, ids, ids, loss_fn=...)``
    trains a model whose forward takes token ids.
    """
    logits = getattr(outputs, "logits", outputs)[:, :-1]
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), token_ids[:, 1:].reshape(-1)
    )


def prime_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create lazily allocated optimizer state with one step on zero gradients.

    Zero gradients leave the weights of SGD (momentum or not) and Adam unchanged, apart from
    weight decay; Adam's step counter advances by one. Gradients are None afterwards.
    """
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter.grad is None and parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _model_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _step_device(
    model: nn.Module, inputs: torch.Tensor, device: torch.device | str | None
) -> torch.device:
    """Where the step runs: ``device``, else the model's; meta inputs need a model there too."""
    device = torch.device(device) if device is not None else _model_device(model)
    if inputs.device.type == "meta" and device.type != "meta":
        raise ValueError(
            f"the inputs are on the meta device (shapes, no values) and the model on {device}: for "
            f"a dry run call dry_run_step(model, {tuple(inputs.shape)}), which runs a meta copy "
            f"and leaves your model alone; for a real step pass inputs on {device}"
        )
    return device


def _forward(
    model: nn.Module, inputs: torch.Tensor, strategy: Strategy, autocast: EmulatedAutocast | None
) -> torch.Tensor:
    """``model(inputs)`` checkpointed as ``strategy`` says; in a dry run under the emulated
    autocast, recomputation re-enters the emulation (a real device re-enters its own)."""
    on_meta = inputs.device.type == "meta"
    wrap = autocast.checkpoint_context_fn if autocast is not None and on_meta else None
    with strategy.applied(model, wrap):
        return model(inputs)


def _forward_backward_step(
    model, inputs, targets, strategy, optimizer, loss_fn, autocast=None
) -> None:
    """Forward, loss, backward, optimizer step; gradients are expected to be None on entry.

    On the meta device attention takes the kernel a CPU step would (``dry_run_context``). With
    ``autocast`` the forward and the loss run under it, as in an AMP training loop; a caller's own
    ``torch.autocast`` is off for the rest (``outside_autocast``)."""
    on_meta = inputs.device.type == "meta"
    with (
        dry_run_context() if on_meta else contextlib.nullcontext(),
        outside_autocast(inputs.device),
    ):
        with step_phase("forward"), forward_autocast(inputs.device, autocast):
            outputs = _forward(model, inputs, strategy, autocast)
            loss = loss_fn(outputs, targets)
        with step_phase("backward"):
            loss.backward()
        with step_phase("optimizer"):
            optimizer.step()


def _untracked_step(model, inputs, targets, strategy, optimizer, loss_fn, autocast=None) -> None:
    """One whole training step from any gradients, as a training loop takes it: what is timed."""
    optimizer.zero_grad(set_to_none=True)
    _forward_backward_step(model, inputs, targets, strategy, optimizer, loss_fn, autocast)


def _on_device(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model moved to ``device`` in training mode (in place), and the batch moved there."""
    model.to(device).train()
    return inputs.to(device), targets.to(device)


def _optimizer(factory: OptimizerFactory | None, model: nn.Module) -> torch.optim.Optimizer:
    """``factory`` (default: the first article's SGD) over the model's parameters."""
    if isinstance(factory, torch.optim.Optimizer):
        raise TypeError(
            "optimizer_factory takes a function of the parameters, not an optimizer: pass e.g. "
            "optimizer_factory=lambda params: torch.optim.AdamW(params, lr=1e-4)"
        )
    return (factory if factory is not None else default_optimizer)(model.parameters())


def _state_and_time(
    step: Callable[[], None],
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    repeats: int | None,
) -> tuple[float | None, Timing | None]:
    """The optimizer's lazily created state, made by one warm-up step before ``repeats`` timed
    steps (the fastest and all of them), or without timing (``repeats`` None) by a step on zero
    gradients (``prime_optimizer_state``)."""
    if repeats is None:
        prime_optimizer_state(optimizer)
        return None, None
    step()
    timing = time_repeats(step, repeats, functools.partial(synchronize, device))
    return timing.fastest, timing


def _reset_cuda_peaks(device: torch.device) -> int | None:
    """Reset CUDA's peak counters before the tracked step; the bytes allocated then (CUDA only)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _tracked(
    step: Callable[[], None],
    tracker: TensorMemoryTracker,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    autocast: EmulatedAutocast | None,
    count_flops: bool,
) -> StepFlops | None:
    """``step`` under the tracker (and the FLOP counter); gradients None again if it stops."""
    counter = StepFlopCounter() if count_flops else None
    try:
        with step_kernels(device, autocast), tracker:
            with counter if counter is not None else contextlib.nullcontext():
                step()
    except MemoryLimitExceeded:
        optimizer.zero_grad(set_to_none=True)
        raise
    synchronize(device)
    return None if counter is None else counter.result()


def measure_step(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    strategy: Strategy | None = None,
    *,
    optimizer_factory: OptimizerFactory | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    device: torch.device | str | None = None,
    repeats: int = 1,
    time_step: bool = True,
    limit_bytes: int | None = None,
    autocast: EmulatedAutocast | None = None,
    recording: Recording = Recording(),
) -> StepReport:
    """Memory and time of one training step (forward, loss, backward, optimizer step).

    Like any later step of a training loop: the optimizer's lazy state is made first (by a
    warm-up step with ``time_step``, then ``repeats`` timed steps, the fastest reported; else by
    an optimizer step on zero gradients). Then one step runs under the tracker, CUDA's peaks reset,
    gradients set to None before and after. The model is trained for real. ``limit_bytes`` stops
    the tracked step with ``MemoryLimitExceeded``. ``strategy`` None: no checkpointing (NetA
    checkpoints itself). Defaults: the first article's SGD and cross-entropy. On meta: a dry run,
    FLOPs instead of time. ``recording``: what else is kept (``Recording``). ``autocast``: mixed
    precision (emulated on meta; an active ``torch.autocast`` around a dry run is followed).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    strategy = strategy if strategy is not None else NO_CHECKPOINTING
    strategy.check(model)
    device = _step_device(model, inputs, device)
    dry_run = device.type == "meta"
    inputs, targets = _on_device(model, inputs, targets, device)
    optimizer = _optimizer(optimizer_factory, model)
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    autocast = ambient_autocast(device) if autocast is None else autocast
    parts = (model, inputs, targets, strategy, optimizer, loss_fn, autocast)
    seconds, timing = _state_and_time(  # a dry run has no time to measure
        functools.partial(_untracked_step, *parts),
        optimizer,
        device,
        repeats if time_step and not dry_run else None,
    )
    optimizer.zero_grad(set_to_none=True)
    allocated_before = _reset_cuda_peaks(device)
    tracker = _step_tracker(model, optimizer, (inputs, targets), device, limit_bytes, recording)
    step = functools.partial(_forward_backward_step, *parts)
    count_flops = dry_run if recording.count_flops is None else recording.count_flops
    flops = _tracked(step, tracker, optimizer, device, autocast, count_flops)
    readings = device_readings(device, allocated_before)  # before the gradients go
    optimizer.zero_grad(set_to_none=True)
    return _report(tracker, strategy, len(inputs), device, (seconds, timing), flops, readings)


def _step_tracker(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
    limit_bytes: int | None,
    recording: Recording,
) -> TensorMemoryTracker:
    """The tracker of the measured step: what ``recording`` asks it to keep."""
    return TensorMemoryTracker(
        model,
        optimizer,
        inputs=tensors,
        device=device,
        limit_bytes=limit_bytes,
        round_to_blocks=recording.round_to_blocks,
        record_timeline=recording.timeline,
        record_allocations=recording.allocations,
    )


def _report(
    tracker: TensorMemoryTracker,
    strategy: Strategy,
    batch_size: int,
    device: torch.device,
    times: tuple[float | None, Timing | None],
    flops: StepFlops | None,
    readings: tuple[
        CudaReadings | None, NvmlReading, MpsReadings | None, dict[DeviceReadings, str]
    ],
) -> StepReport:
    """The tracked step's figures, its time, and what the device itself read after it."""
    cuda, nvml, mps, missing = readings
    recorded = tracker.record_timeline
    return StepReport(
        peak_bytes=tracker.peak_bytes,
        breakdown=dict(tracker.breakdown_at_peak),
        activation_peak_bytes=tracker.activation_peak_bytes,
        baseline_bytes=tracker.baseline_bytes,
        seconds=times[0],
        strategy=strategy,
        batch_size=batch_size,
        device=str(device),
        timing=times[1],
        flops=flops,
        phase_peak_bytes=dict(tracker.phase_peak_bytes),
        rounded_to_blocks=tracker.round_to_blocks,
        timeline=list(tracker.timeline) if recorded else None,
        category_timeline=list(tracker.category_timeline) if recorded else None,
        allocations=tracker.allocations,
        cuda=cuda,
        nvml=nvml,
        mps=mps,
        missing=missing,
    )


# -- strategy sweeps --------------------------------------------------------------------------


@dataclass
class SweepRecord(StepReport):
    """One strategy of a sweep: its ``StepReport`` plus ratios to the run without checkpointing
    (the first strategy of kind "none") in the same sweep."""

    peak_ratio: float | None = None
    time_ratio: float | None = None


def _time_counts_in_turns(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    strategies: list[Strategy],
    optimizers: list[torch.optim.Optimizer],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    device: torch.device,
    repeats: int,
) -> dict[int, Timing]:
    """One warm-up step per strategy (it creates the optimizer's state), then ``repeats`` timed
    steps of every strategy in turns, keyed by the strategy's position."""
    model.to(device).train()
    inputs, targets = inputs.to(device), targets.to(device)
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    steps: dict[int, Callable[[], None]] = {}
    for index, (strategy, optimizer) in enumerate(zip(strategies, optimizers, strict=True)):
        strategy.check(model)
        steps[index] = functools.partial(
            _untracked_step, model, inputs, targets, strategy, optimizer, loss_fn
        )
        steps[index]()  # warm-up: creates the optimizer's state
    return time_interleaved(steps, repeats, functools.partial(synchronize, device))


def _reuse(optimizer: torch.optim.Optimizer) -> OptimizerFactory:
    """A factory that hands back ``optimizer`` (made, and warmed up, for these parameters)."""
    return lambda _parameters: optimizer


def sweep_strategies(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    strategies: Iterable[Strategy],
    *,
    optimizer_factory: OptimizerFactory | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    device: torch.device | str | None = None,
    repeats: int = 1,
    round_to_blocks: bool = False,
) -> list[SweepRecord]:
    """``measure_step`` under each strategy on the same model and inputs, side by side.

    Each strategy gets a fresh optimizer (default SGD, lr 1e-3, momentum 0.9) and starts with the
    gradients set to None. ``repeats`` timed steps per strategy, taken in turns across them
    (a busy spell of the machine slows all of them alike); the fastest is reported and every
    repeat kept in ``timing``. On the meta device every step is a dry run (no time ratios;
    FLOPs in each record).
    """
    chosen = list(strategies)
    if not chosen:
        raise ValueError("strategies is empty: pass e.g. [equal_segments(k) for k in (0, 2, 4)]")
    factory = optimizer_factory if optimizer_factory is not None else default_optimizer
    device = _step_device(model, inputs, device)
    optimizers = [factory(model.parameters()) for _ in chosen]
    timings = (
        {}
        if device.type == "meta"
        else _time_counts_in_turns(
            model, inputs, targets, chosen, optimizers, loss_fn, device, repeats
        )
    )
    records = []
    for index, (strategy, optimizer) in enumerate(zip(chosen, optimizers, strict=True)):
        model.zero_grad(set_to_none=True)
        report = measure_step(
            model,
            inputs,
            targets,
            strategy,
            optimizer_factory=_reuse(optimizer),  # its state made in the warm-up
            loss_fn=loss_fn,
            device=device,
            time_step=False,
            recording=Recording(round_to_blocks=round_to_blocks),
        )
        if index in timings:
            report.timing, report.seconds = timings[index], timings[index].fastest
        records.append(SweepRecord(**vars(report)))
    plain = next((r for r in records if r.strategy.kind == "none"), None)
    if plain is not None:
        for record in records:
            record.peak_ratio = record.peak_bytes / plain.peak_bytes
            if record.seconds is not None and plain.seconds:
                record.time_ratio = record.seconds / plain.seconds
    return records
