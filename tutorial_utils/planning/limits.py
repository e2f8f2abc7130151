"""How close to the limit: a peak that no checkpointing plan can go below, measured module by module.

Checkpointing decides which activations wait for the backward pass; it cannot remove what the
backward pass of each module needs while it runs. When backward reaches module ``m`` of a
Sequential, whatever the plan (one level, nested, or selective inside regions), memory holds:

* the step's baseline: parameters, buffers, optimizer state, the batch and its targets;
* the gradients of every parameter after ``m`` (created earlier in backward, kept for the step);
* module ``m``'s own backward: the tensors it saved (kept or recomputed: a checkpoint recomputes
  a whole region before backward enters it), the gradient of its output, and whatever its backward
  allocates (its input gradient, its parameter gradients, temporaries).

The last part is **measured, not assumed**: each module is run alone on the meta device with an
input like the one it gets in the step, its output handed a fresh gradient, and the peak of its
backward is read by ``TensorMemoryTracker``. A formula would be wrong for composite modules (an
inner ReLU's saved output is freed before the block's input gradient exists), views (``Flatten``
allocates nothing), frozen inputs (no input gradient) and in-place ops; a measurement is not.

The largest sum over the modules is one floor; the optimizer step's own peak (all gradients, the
state, no activations: the same for every plan, measured from a plain step) is the other. The floor
is the larger. It is a true lower bound (``tests/test_limits.py`` checks every plan of small chains
exhaustively); whether a plan reaches it is a measurement: for both articles' models the
planner's least-peak plan does (notebook 04), so there no plan of any kind can do better.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from tutorial_utils.measurement.autocast import (
    EmulatedAutocast,
    ambient_autocast,
    forward_autocast,
    step_kernels,
)
from tutorial_utils.measurement.dry_run import on_meta
from tutorial_utils.measurement.step import OptimizerFactory, measure_step
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.units import MiB

__all__ = ["ModuleBackward", "peak_floor", "PeakFloor"]


@dataclass(frozen=True)
class ModuleBackward:
    """What must be alive during one module's backward, apart from the step's baseline (bytes)."""

    name: str
    backward_peak_bytes: (
        int  # measured: its saved tensors, output gradient, what backward allocates
    )
    gradients_after_bytes: int  # parameter gradients of the modules after it

    @property
    def need_bytes(self) -> int:
        return self.backward_peak_bytes + self.gradients_after_bytes


@dataclass(frozen=True)
class PeakFloor:
    """The floor on a step's peak and where it comes from (bytes)."""

    floor_bytes: int  # max(backward_bytes, optimizer_bytes)
    backward_bytes: int  # the largest need of one module's backward, baseline included
    backward_module: str  # the module where it sits
    optimizer_bytes: int  # the optimizer step's peak, the same for every plan
    baseline_bytes: int  # parameters, buffers, optimizer state, batch and targets
    modules: tuple[ModuleBackward, ...] = ()

    @property
    def floor_mib(self) -> float:
        return self.floor_bytes / MiB

    def describe(self) -> str:
        """One line: the floor and which part sets it."""
        part = (
            f"the backward pass of module {self.backward_module}"
            if self.backward_bytes >= self.optimizer_bytes
            else "the optimizer step"
        )
        return (
            f"floor {self.floor_bytes / MiB:,.1f} MiB, set by {part} "
            f"(backward need {self.backward_bytes / MiB:,.1f} MiB, optimizer step "
            f"{self.optimizer_bytes / MiB:,.1f} MiB, baseline {self.baseline_bytes / MiB:,.1f} MiB)"
        )

    def distance(self, peak_bytes: int) -> str:
        """How far a measured peak is from the floor, in words that do not invent a gap."""
        gap = peak_bytes - self.floor_bytes
        if gap < 0:
            raise ValueError(
                f"a peak of {peak_bytes} B is below the floor of {self.floor_bytes} B: the floor "
                "was computed for another model, batch or optimizer"
            )
        if gap < MiB / 10:
            return f"on the floor ({gap:,} B above it): no plan can do better"
        return (
            f"{gap / MiB:,.1f} MiB above the floor: no plan goes below the floor; whether one "
            "reaches it is not known"
        )


class _InputLike(torch.autograd.Function):
    """A fresh input tensor that requires grad but is not a leaf (in-place modules accept it);
    its backward drops the gradient it receives, as the module before would consume it."""

    @staticmethod
    def forward(ctx, anchor, shape, dtype):
        return torch.empty(shape, dtype=dtype, device=anchor.device)

    @staticmethod
    def backward(ctx, grad):
        return None, None, None


class _FreshOutputGradient(torch.autograd.Function):
    """A scalar whose backward allocates the module output's gradient and lets go of it, so the
    engine frees that gradient when the module's backward has consumed it (as in a real step)."""

    @staticmethod
    def forward(ctx, output):
        ctx.spec = (output.shape, output.dtype, output.device)
        return output.new_zeros(())

    @staticmethod
    def backward(ctx, _grad):
        shape, dtype, device = ctx.spec
        return torch.empty(shape, dtype=dtype, device=device)


_META = torch.device("meta")


def _input_specs(
    model: nn.Sequential, sample: torch.Tensor, autocast: EmulatedAutocast | None
) -> list[tuple]:
    """(shape, dtype, requires_grad) of each module's input in a training forward on meta."""
    specs, x = [], sample
    with torch.random.fork_rng(devices=[]), step_kernels(_META, autocast):
        with forward_autocast(_META, autocast):
            for module in model:
                specs.append((tuple(x.shape), x.dtype, x.requires_grad))
                x = module(x)
    return specs


def _backward_peak(
    module: nn.Module, spec: tuple, first: bool, autocast: EmulatedAutocast | None
) -> int:
    """Peak live bytes of ``module``'s backward alone, above its parameters and buffers (its
    forward under ``autocast``, as in the step)."""
    shape, dtype, requires_grad = spec
    batch = torch.empty(shape, dtype=dtype, device="meta") if first else None
    anchor = torch.empty((), device="meta", requires_grad=True)
    tracker = TensorMemoryTracker(module, inputs=() if batch is None else (batch,))
    with step_kernels(_META, autocast), tracker:
        if batch is not None:
            x = batch  # the batch is in the step's baseline
        elif requires_grad:
            x = _InputLike.apply(anchor, shape, dtype)
        else:
            x = torch.empty(shape, dtype=dtype, device="meta")
        with forward_autocast(_META, autocast):
            output = module(x)
        del x
        if not output.requires_grad:  # a frozen module on a frozen input: no backward
            return 0
        seed = _FreshOutputGradient.apply(output)
        seed_bytes = 2 * seed.untyped_storage().nbytes()  # the scalar and its gradient
        del output
        seed.backward()
    module.zero_grad(set_to_none=True)
    return max(0, tracker.phase_peak_bytes.get("backward", 0) - tracker.baseline_bytes - seed_bytes)


def module_backward_needs(
    model: nn.Sequential, sample_input: torch.Tensor, autocast: EmulatedAutocast | None = None
) -> list[ModuleBackward]:
    """For each module: the measured peak of its backward and the parameter gradients after it."""
    if not isinstance(model, nn.Sequential) or len(model) == 0:
        raise ValueError("peak_floor needs a non-empty nn.Sequential")
    run = on_meta(model).train(model.training)
    sample = torch.empty(sample_input.shape, dtype=sample_input.dtype, device="meta")
    specs = _input_specs(run, sample, autocast)
    needs = []
    for index, (module, spec) in enumerate(zip(run, specs, strict=True)):
        earlier = {id(p) for m in list(run)[: index + 1] for p in m.parameters()}
        later = {
            id(p): p.untyped_storage().nbytes()
            for m in list(run)[index + 1 :]
            for p in m.parameters()
            if p.requires_grad and id(p) not in earlier
        }
        needs.append(
            ModuleBackward(
                f"{index}: {type(module).__name__}",
                _backward_peak(module, spec, index == 0, autocast),
                sum(later.values()),
            )
        )
    return needs


def peak_floor(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    optimizer_factory: OptimizerFactory | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    autocast: EmulatedAutocast | None = None,
) -> PeakFloor:
    """The floor for ``model`` trained on this batch (on the meta device: at any size).

    Measures each module's backward alone and one plain step for the baseline and the optimizer
    step's peak. ``model`` is trained by that step as ``measure_step`` does; pass a meta model to
    leave weights alone. ``autocast`` as in ``measure_step``; left out, an active
    ``torch.autocast`` around the call is emulated in the modules' dry runs.
    """
    autocast = autocast if autocast is not None else ambient_autocast()
    needs = module_backward_needs(model, inputs, autocast)
    plain = measure_step(
        model,
        inputs,
        targets,
        optimizer_factory=optimizer_factory,
        loss_fn=loss_fn,
        autocast=autocast,
    )
    worst = max(needs, key=lambda need: need.need_bytes)
    backward = plain.baseline_bytes + worst.need_bytes
    assert plain.phase_peak_bytes is not None, "measure_step always splits a step by phase"
    optimizer_peak = plain.phase_peak_bytes["optimizer"]
    return PeakFloor(
        floor_bytes=max(backward, optimizer_peak),
        backward_bytes=backward,
        backward_module=worst.name,
        optimizer_bytes=optimizer_peak,
        baseline_bytes=plain.baseline_bytes,
        modules=tuple(needs),
    )
