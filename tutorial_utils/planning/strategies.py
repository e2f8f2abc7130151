"""Every way to run a step, side by side: no checkpointing, uniform splits, plans, selective,
torch.compile's memory budget.

``strategy_menu`` lists the strategies (``checkpointing.strategy.Strategy``) for one Sequential,
the planner's plans among them, each carrying the cost model's forecast in ``predicted`` where
it has one; ``measure_strategies`` measures each with one training step: real, or a dry run on
meta inputs, one row each with its ``kind`` and its menu ``family``.
"""

from __future__ import annotations

import math
from typing import NotRequired, TypedDict, cast

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.kinds import STRATEGY_KINDS
from tutorial_utils.checkpointing.strategy import (
    Strategy,
    StrategyKind,
    equal_segments,
    offloaded,
    scheduled,
    selective,
)
from tutorial_utils.measurement.step import StepReport, sweep_strategies
from tutorial_utils.measurement.timing import Timing
from tutorial_utils.planning.budget import plan_within
from tutorial_utils.planning.compile_budget import compile_budget_strategy
from tutorial_utils.planning.nested import NestedPlan, nested_from_profile
from tutorial_utils.planning.planner import (
    Plan,
    evaluate_plan,
    plan_from_profile,
    uniform_boundaries,
)
from tutorial_utils.planning.profile import ModelProfile, profile_sequential
from tutorial_utils.units import MiB, ratio

__all__ = ["Family", "family", "measure_strategies", "strategy_menu", "StrategyRow"]

# a family of the menu, as tables and plots group its strategies: one of
# ``checkpointing.kinds.families()`` (a kind's own family, or the variant its row names: sqrt(n)
# among uniform splits, nested among plans)
Family = str


class StrategyRow(TypedDict):
    """One strategy's step as ``measure_strategies`` measures it: a row of a table or a plot."""

    model: str
    checkpointing: str  # the strategy's name
    kind: StrategyKind
    family: Family
    plan: str  # the planner's boundaries, or the segment count
    batch: int
    tracked_peak_mib: float
    added_mib: float  # gradients + activations at the tracked peak: what a plan changes
    predicted_added_mib: float | None  # the cost model's forecast of it, where there is one
    activation_peak_mib: float
    cuda_peak_allocated_mib: float | None
    nvml_used_mib: float | None
    step_seconds: float | None  # None in a dry run
    step_timing: Timing | None
    step_gflop: float | None
    source: str
    # ratios to the first row ("none") and to the best uniform split: set once all are measured
    tracked_peak_ratio: NotRequired[float]
    added_ratio: NotRequired[float]
    step_ratio: NotRequired[float | None]
    flops_ratio: NotRequired[float | None]
    tracked_peak_vs_best_uniform: NotRequired[float | None]
    added_vs_best_uniform: NotRequired[float | None]
    step_vs_best_uniform: NotRequired[float | None]


def sqrt_n_count(n_modules: int) -> int:
    """The sqrt(n) rule's segment count for ``n_modules`` modules (at least 2)."""
    return max(2, round(math.sqrt(n_modules)))


def family(strategy: Strategy, n_modules: int) -> Family:
    """Which of the menu's families ``strategy`` belongs to, for a model of ``n_modules``: its
    kind's own (``checkpointing.kinds``), or the variant a Sequential's menu tells apart."""
    own, *variants = (style.name for style in STRATEGY_KINDS[strategy.kind].families)
    sqrt_n = strategy.kind == "segments" and strategy.segments == sqrt_n_count(n_modules)
    nested = strategy.kind == "plan" and isinstance(strategy.schedule, NestedPlan)
    return variants[0] if variants and (sqrt_n or nested) else own


def strategy_menu(
    model: nn.Sequential,
    sample_input: torch.Tensor,
    *,
    uniform_counts: list[int] | None = None,
    budget_fractions: tuple[float, ...] = (0.5,),
    selective_regions: tuple[int, ...] = (),
    nested_fractions: tuple[float, ...] = (),
    compile_budgets: tuple[float, ...] = (),
) -> list[Strategy]:
    """No checkpointing, uniform splits (default 2..n), sqrt(n), planned plans, nested plans,
    selective, torch.compile's partition at each of ``compile_budgets``, offload.

    Planned budgets sit at ``budget_fractions`` of the way from the least reachable peak to the
    peak without checkpointing (each plan measured to fit its budget, ``planning.budget``; a
    budget no plan meets is left out); the least-peak plan is always included. Their names give the
    budget as bytes added on top of parameters, buffers and batch (activations + gradients), the
    part a plan changes and ``measure_strategies`` reports as ``added_mib``. Nested plans sit at
    ``nested_fractions`` of the way from the nested program's least peak to no checkpointing, and
    are listed only where they differ from one level (some module runs three or more times).
    Offloading is offered only on CUDA, where it means something.
    """
    profile = profile_sequential(model, sample_input)
    n = len(profile)
    sqrt_n = sqrt_n_count(n)
    counts = [k for k in (uniform_counts or range(2, n + 1)) if 2 <= k <= n and k != sqrt_n]
    uniform = {k: evaluate_plan(profile, uniform_boundaries(n, k)) for k in [1, *counts, sqrt_n]}
    menu = [Strategy("none", predicted=uniform[1])]
    menu += [equal_segments(k, name=f"uniform {k}", predicted=uniform[k]) for k in counts]
    menu.append(equal_segments(sqrt_n, name=f"sqrt(n) = {sqrt_n}", predicted=uniform[sqrt_n]))
    least = plan_from_profile(profile)
    menu.append(scheduled(least, "planned, least peak"))
    plain_peak = uniform[1].predicted_peak_bytes
    for fraction in budget_fractions:
        budget = int(
            least.predicted_peak_bytes + fraction * (plain_peak - least.predicted_peak_bytes)
        )
        try:  # a plan whose measured peak keeps the budget; none, if even the least cannot
            plan = plan_within(model, sample_input, profile, budget)
        except ValueError:
            continue
        label = f"planned, budget {(budget - profile.baseline_bytes) / MiB:.1f} MiB added"
        menu.append(scheduled(plan, label))
    menu += _nested_plans(model, sample_input, profile, nested_fractions, plain_peak)
    menu += [selective(regions=k, name=f"selective, {k} regions") for k in selective_regions]
    menu += [compile_budget_strategy(b) for b in compile_budgets]
    if sample_input.device.type == "cuda":
        menu.append(offloaded(name="offload to CPU"))
    places = list(STRATEGY_KINDS)  # the table's order is the menu's
    return sorted(menu, key=lambda strategy: places.index(strategy.kind))


def _nested_plans(
    model: nn.Sequential,
    sample_input: torch.Tensor,
    profile: ModelProfile,
    fractions: tuple[float, ...],
    plain_peak: int,
) -> list[Strategy]:
    """Nested plans at ``fractions`` of the way from their least peak to ``plain_peak``, each
    measured to keep its budget; those that recompute no module twice are one-level plans, left
    out. A budget is named by what it adds, as the one-level plans' are."""
    if not fractions:
        return []
    least = nested_from_profile(profile).predicted_peak_bytes
    menu, seen = [], set()
    for fraction in fractions:
        budget = int(least + fraction * (plain_peak - least))
        try:
            plan = plan_within(model, sample_input, profile, budget, nested_from_profile)
        except ValueError:
            continue
        if not isinstance(plan, NestedPlan) or max(plan.runs) <= 2 or plan.schedule in seen:
            continue
        seen.add(plan.schedule)
        label = f"nested, budget {(budget - profile.baseline_bytes) / MiB:.1f} MiB added"
        menu.append(scheduled(plan, label))
    return menu


def measure_strategies(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    menu: list[Strategy],
    *,
    model_name: str = "",
    repeats: int = 1,
) -> list[StrategyRow]:
    """One ``measure_step`` per strategy (same weights, same batch, a fresh SGD each), as rows.

    Columns follow ``python -m tutorial_utils bench`` (ratios to the first strategy, which should
    be "none"; on the meta device the steps are dry runs, with FLOP ratios instead of time
    ratios), plus ``added_mib`` (gradients + activations at the tracked peak: what the plan
    changes) beside ``predicted_added_mib`` and the ratios to the best uniform split measured.
    """
    records = sweep_strategies(model, inputs, targets, menu, device=inputs.device, repeats=repeats)
    rows = [
        _strategy_row(model_name, s, r, family(s, len(model)))
        for s, r in zip(menu, records, strict=True)
    ]
    base = rows[0]
    uniform = [row for row in rows if row["kind"] == "segments"]
    best = min(uniform, key=lambda row: row["tracked_peak_mib"], default=None)
    for row in rows:
        row["tracked_peak_ratio"] = row["tracked_peak_mib"] / base["tracked_peak_mib"]
        row["added_ratio"] = row["added_mib"] / base["added_mib"]
        row["step_ratio"] = ratio(row["step_seconds"], base["step_seconds"])
        row["flops_ratio"] = ratio(row["step_gflop"], base["step_gflop"])
        row["tracked_peak_vs_best_uniform"] = (
            None if best is None else row["tracked_peak_mib"] / best["tracked_peak_mib"]
        )
        row["added_vs_best_uniform"] = (
            None if best is None else row["added_mib"] / best["added_mib"]
        )
        row["step_vs_best_uniform"] = (
            None if best is None else ratio(row["step_seconds"], best["step_seconds"])
        )
    return rows


def _strategy_row(
    model_name: str, strategy: Strategy, record: StepReport, menu_family: Family
) -> StrategyRow:
    added = record.breakdown["gradients"] + record.breakdown["activations"]
    predicted = cast("Plan | NestedPlan | None", strategy.predicted)
    return {
        "model": model_name,
        "checkpointing": strategy.name,
        "kind": strategy.kind,
        "family": menu_family,
        "plan": str(predicted.boundaries if predicted else strategy.segments or strategy.regions),
        "batch": record.batch_size,
        "tracked_peak_mib": record.peak_bytes / MiB,
        "added_mib": added / MiB,
        "predicted_added_mib": (
            None
            if predicted is None
            else (predicted.predicted_peak_bytes - predicted.baseline_bytes) / MiB
        ),
        "activation_peak_mib": record.activation_peak_bytes / MiB,
        "cuda_peak_allocated_mib": (
            None if record.cuda is None else record.cuda.peak_allocated_bytes / MiB
        ),
        "nvml_used_mib": record.nvml.used_mib,
        "step_seconds": record.seconds,
        "step_timing": record.timing,
        "step_gflop": None if record.flops is None else record.flops.total / 1e9,
        "source": record.source,
    }
