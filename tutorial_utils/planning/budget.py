"""A budget is a promise: the plan returned for a budget is measured, and fits it.

The planner's cost model predicts a plan's peak; a prediction can miss (temporaries it leaves out,
a layer that saves more than its profile showed). So ``plan_checkpoints`` measures the plan it
chose by a dry run of the quantity the model predicts (forward, loss and backward on a meta copy:
parameters, buffers, batch, gradients and activations; no optimizer state) and, where the measured
peak is over the budget, tightens the budget by the miss and plans again, until a plan fits or no
plan does, which it then says plainly with the smallest peak it measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn as nn

from tutorial_utils.measurement.dry_run import model_for_sample, on_meta
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.planning.nested import NestedPlan, nested_from_profile
from tutorial_utils.planning.planner import Plan, plan_from_profile
from tutorial_utils.planning.profile import ModelProfile, profile_sequential
from tutorial_utils.planning.roofline import Machine
from tutorial_utils.units import MiB

__all__ = ["measured_plan_peak", "plan_checkpoints", "plan_within"]

MAX_REPLANS = 8  # each round tightens by the last miss; a handful always settles in practice


def measured_plan_peak(
    model: nn.Sequential, sample_input: torch.Tensor, plan: Plan | NestedPlan
) -> int:
    """Tracked peak of forward, loss and backward under ``plan``, as a dry run of ``model``.

    The loss is cross-entropy against class 0 for a (batch, classes) output, the mean square of
    the output otherwise: either way backward starts from a gradient the size of the output, as
    the cost model assumes. ``model`` and its weights are left untouched.
    """
    run = on_meta(model)
    run.train()
    x = torch.empty(sample_input.shape, dtype=sample_input.dtype, device="meta")
    with TensorMemoryTracker(run, inputs=(x,), device="meta") as tracker:
        output = plan.forward(run, x)
        if output.dim() == 2:
            target = torch.zeros(output.shape[0], dtype=torch.long, device="meta")
            loss = nn.functional.cross_entropy(output, target)
        else:
            loss = output.square().mean()
        loss.backward()
    run.zero_grad(set_to_none=True)
    return tracker.peak_bytes


def plan_within(
    model: nn.Sequential,
    sample_input: torch.Tensor,
    profile: ModelProfile,
    budget_bytes: int | None,
    planner: Callable[[ModelProfile, int | None], Plan | NestedPlan] = plan_from_profile,
) -> Plan | NestedPlan:
    """The planner's choice on ``profile`` for ``budget_bytes``, measured, re-planned until its
    measured peak fits (see the module docstring); a ``ValueError`` when no plan fits.
    ``planner``: one level (``plan_from_profile``) or nested (``nested_from_profile``)."""
    if budget_bytes is None:  # the least-peak plan: nothing to keep, only to measure
        plan = planner(profile, None)
        return dataclasses.replace(
            plan, measured_peak_bytes=measured_plan_peak(model, sample_input, plan)
        )
    target = budget_bytes
    for _ in range(MAX_REPLANS):
        try:
            plan = planner(profile, target)
        except ValueError as error:
            if target == budget_bytes:
                raise
            raise ValueError(
                f"no plan fits the budget of {budget_bytes / MiB:.1f} MiB as measured: the planner's "
                f"cheapest plans measure above it ({error}); raise the budget or shrink the batch"
            ) from None
        measured = measured_plan_peak(model, sample_input, plan)
        plan = dataclasses.replace(plan, measured_peak_bytes=measured)
        if measured <= budget_bytes:
            return plan
        target -= measured - budget_bytes  # tighten by the miss and plan again
    raise ValueError(
        f"no plan found within {MAX_REPLANS} re-plans whose measured peak fits "
        f"{budget_bytes / MiB:.1f} MiB (last: {measured / MiB:.1f} MiB): raise the budget"
    )


def plan_checkpoints(
    model: nn.Sequential,
    sample_input: torch.Tensor,
    budget_bytes: int | None = None,
    *,
    nested: bool = False,
    machine: Machine | None = None,
) -> Plan | NestedPlan:
    """Profile ``model`` on ``sample_input``, choose where to checkpoint, and measure the choice.

    With ``budget_bytes``: the plan of least recompute cost whose **measured** peak fits (a
    ``ValueError`` says when none does). Without: the plan of least predicted peak, the fastest
    among equals. Either way the returned plan carries its measured peak beside the prediction.
    Budgets count what the prediction counts: optimizer state comes on top. ``nested=True``
    searches schedules that may recompute a module several times (``planning.nested``).
    A meta sample dry-runs a meta copy of a model that lives elsewhere; with a ``machine``
    (``planning.roofline``) a plan made on meta weighs recompute by predicted seconds, not FLOPs.
    """
    model = model_for_sample(model, sample_input)
    profile = profile_sequential(model, sample_input, machine=machine)
    planner = nested_from_profile if nested else plan_from_profile
    return plan_within(model, sample_input, profile, budget_bytes, planner)
