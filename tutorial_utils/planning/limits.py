"""How close to the limit: a peak that no choice of checkpoint boundaries can go below.

Checkpointing decides which activations wait for the backward pass; it cannot remove what the
backward pass of each module needs at the moment it runs. When the backward pass reaches module
``m`` of a Sequential, whatever the plan, memory holds at least:

* the step's baseline: parameters, buffers, optimizer state, the batch and its targets;
* the gradients of every parameter after ``m`` (already accumulated);
* every tensor module ``m`` saved for its backward (kept or recomputed, all present at once when
  its first backward op runs: a checkpoint recomputes a region before backward enters it);
* the gradient of module ``m``'s output, which its backward consumes.

The largest of these over the modules is one floor. The other is the optimizer step's own peak:
all gradients, the state and whatever the step allocates, with every activation already freed,
so it is the same for every plan (measured, from a plain step). The floor is the larger of the
two. It is not always reachable (a plan must also keep segment inputs), which is the point: the
distance from a plan to the floor is what any smarter plan could still win.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from tutorial_utils.measurement.step import OptimizerFactory, default_optimizer, measure_step
from tutorial_utils.planning.planner import ModelProfile, profile_sequential
from tutorial_utils.units import MB


@dataclass(frozen=True)
class PeakFloor:
    """The floor on a step's peak and where it comes from (bytes)."""

    floor_bytes: int  # max(backward_bytes, optimizer_bytes)
    backward_bytes: int  # the largest working set of one module's backward, baseline included
    backward_module: str  # the module where it sits
    optimizer_bytes: int  # the optimizer step's peak, the same for every plan
    baseline_bytes: int  # parameters, buffers, optimizer state, batch and targets

    @property
    def floor_mb(self) -> float:
        return self.floor_bytes / MB

    def describe(self) -> str:
        """One line: the floor and which part sets it."""
        part = (
            f"the backward pass of {self.backward_module}"
            if self.backward_bytes >= self.optimizer_bytes
            else "the optimizer step"
        )
        return (
            f"floor {self.floor_bytes / MB:,.1f} MB, set by {part} "
            f"(backward working set {self.backward_bytes / MB:,.1f} MB, optimizer step "
            f"{self.optimizer_bytes / MB:,.1f} MB, baseline {self.baseline_bytes / MB:,.1f} MB)"
        )


def backward_working_sets(profile: ModelProfile, baseline_bytes: int) -> list[int]:
    """For each module, the bytes that must be alive when its backward pass starts."""
    layers = profile.layers
    sets = []
    for m, layer in enumerate(layers):
        saved = (
            layer.internal_bytes
            + layer.input_bytes * (layer.saves_input and m > 0)  # the batch is in the baseline
            + layer.output_bytes * layer.saves_output
        )
        output_grad = layer.output_bytes or layer.input_bytes  # a view's output: its input's size
        grads_after = sum(later.parameter_bytes for later in layers[m + 1 :])
        sets.append(baseline_bytes + grads_after + saved + output_grad)
    return sets


def peak_floor(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    optimizer_factory: OptimizerFactory | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> PeakFloor:
    """The floor for ``model`` trained on this batch (on the meta device: at any size).

    Profiles the modules and measures one plain step for the baseline and the optimizer step's
    peak. ``model`` is trained by that step as ``measure_step`` does; pass a meta model to leave
    weights alone.
    """
    factory = optimizer_factory if optimizer_factory is not None else default_optimizer
    profile = profile_sequential(model, inputs)
    plain = measure_step(model, inputs, targets, 0, factory(model.parameters()), loss_fn)
    sets = backward_working_sets(profile, plain.baseline_bytes)
    worst = max(range(len(sets)), key=sets.__getitem__)
    optimizer_peak = plain.phase_peak_bytes["optimizer"]
    return PeakFloor(
        floor_bytes=max(sets[worst], optimizer_peak),
        backward_bytes=sets[worst],
        backward_module=profile.layers[worst].name,
        optimizer_bytes=optimizer_peak,
        baseline_bytes=plain.baseline_bytes,
    )
