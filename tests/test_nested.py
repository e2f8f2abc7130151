"""Nested checkpoint schedules: the dynamic program is optimal (checked against every schedule of
small chains), its plans run as nested checkpoints with the plain step's gradients, keep their
budgets as measured, and meet the issue's goal on a deep Tanh chain."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_utils.checkpointing.batchnorm import running_stats
from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, scheduled
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step, meta_copy
from tutorial_utils.planning.budget import plan_checkpoints
from tutorial_utils.planning.nested import (
    NestedProgram,
    nested_from_profile,
    nested_plan,
    one_level_schedule,
    runs_per_module,
    simulate,
)
from tutorial_utils.planning.planner import plan_from_profile
from tutorial_utils.planning.profile import LayerCost, ModelProfile, profile_sequential
from tutorial_utils.planning.strategies import family, measure_strategies, strategy_menu

KIB = 1024


def every_schedule(s, e):
    """Every nested schedule of modules s..e-1 (a child never spans the rest of its parent)."""
    if s == e:
        yield ()
        return
    for rest in every_schedule(s + 1, e):
        yield (("plain", s), *rest)
    for k in range(s + 1, e):
        for inner in every_schedule(s, k):
            for rest in every_schedule(k, e):
                yield (("child", s, k, inner), *rest)


def synthetic_profile(seed: int, n: int) -> ModelProfile:
    """A chain of unequal modules (sizes in KiB), some saving inputs, some outputs."""
    generator = torch.Generator().manual_seed(seed)

    def pick(*options):
        return options[int(torch.randint(len(options), (1,), generator=generator))]

    layers, size = [], 8 * KIB
    for i in range(n):
        out = pick(4, 8, 16) * KIB
        layers.append(
            LayerCost(
                name=f"{i}",
                input_bytes=size,
                output_bytes=out,
                saves_input=pick(True, False),
                saves_output=pick(True, False),
                internal_bytes=pick(0, 0, 4 * KIB),
                parameter_bytes=KIB,
                forward_seconds=None,
                forward_flops=pick(1, 2, 5) * 1000,
            )
        )
        size = out
    return ModelProfile(tuple(layers), baseline_bytes=64 * KIB)


@pytest.mark.parametrize("seed", range(4))
def test_the_program_is_optimal_against_every_schedule(seed):
    profile = synthetic_profile(seed, 5)
    schedules = list(every_schedule(0, 5))
    outcomes = [simulate(profile, s) for s in schedules]
    plain_peak = simulate(profile, tuple(("plain", i) for i in range(5)))[0]
    program = NestedProgram(profile, plain_peak)
    assert program.slot == 4 * KIB  # the sizes' common divisor: memory is exact here
    for budget in range(0, plain_peak + 1, 4 * KIB):
        fitting = [cost for peak, cost in outcomes if peak <= budget]
        best = min(fitting, default=math.inf)
        assert program.cost_at(budget) == pytest.approx(best, rel=1e-5), budget
        if fitting:
            chosen = program.schedule(budget // program.slot)
            peak, cost = simulate(profile, chosen)
            assert peak <= budget and cost == pytest.approx(best, rel=1e-5)


def test_one_level_plans_are_schedules_and_nested_never_does_worse():
    profile = synthetic_profile(7, 6)
    one_level = plan_from_profile(profile)
    peak, _ = simulate(profile, one_level_schedule(one_level.boundaries))
    program = NestedProgram(profile, peak)
    assert math.isfinite(program.cost_at(peak))
    schedule = one_level_schedule(one_level.boundaries)
    assert list(one_level.runs) == runs_per_module(schedule, len(profile))  # the same counts
    schedule = one_level_schedule([(0, 3, True), (3, 6, False)])
    assert runs_per_module(schedule, 6) == [2, 2, 2, 1, 1, 1]
    nested = (("child", 0, 4, (("child", 0, 2, (("plain", 0), ("plain", 1))), ("plain", 2),
                               ("plain", 3))), ("plain", 4), ("plain", 5))  # fmt: skip
    assert runs_per_module(nested, 6) == [3, 3, 2, 2, 1, 1]


def _deep_chain(pairs: int, width: int) -> nn.Sequential:
    layers = []
    for _ in range(pairs):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _with_batchnorm_and_dropout() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(32, 32),
        nn.Tanh(),
        nn.Linear(32, 32),
        nn.BatchNorm1d(32),
        nn.Tanh(),
        nn.Linear(32, 10),
    )


def test_a_nested_plan_gives_the_plain_gradients_and_batchnorm_statistics():
    model = _with_batchnorm_and_dropout()
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
    profile = profile_sequential(model, x)
    plan = nested_from_profile(profile)  # least peak: nests as deep as it pays
    assert plan.depth >= 2
    results = []
    for strategy in (NO_CHECKPOINTING, scheduled(plan)):
        probe = copy.deepcopy(model).train()
        torch.manual_seed(1)
        F.cross_entropy(strategy.run(probe, x), y).backward()
        results.append(([p.grad for p in probe.parameters()], running_stats(probe)))
    (plain_grads, plain_stats), (nested_grads, nested_stats) = results
    assert all(
        torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_grads, nested_grads, strict=True)
    )
    for name, stats in plain_stats.items():
        assert all(torch.equal(stats[k], nested_stats[name][k]) for k in stats)


def test_plan_checkpoints_nested_keeps_its_budget_as_measured():
    model = build_on_meta(lambda: _deep_chain(16, 64))
    x = torch.empty(256, 64, device="meta")
    least = plan_checkpoints(model, x)
    budget = least.measured_peak_bytes - 1  # below what one level reaches
    plan = plan_checkpoints(model, x, budget, nested=True)
    assert plan.depth >= 2
    assert plan.measured_peak_bytes <= budget
    report = dry_run_step(model, (256, 64), scheduled(plan))
    assert report.peak_bytes >= plan.measured_peak_bytes  # the step adds optimizer state
    with pytest.raises(ValueError, match="raise the budget"):
        plan_checkpoints(model, x, 1, nested=True)


def test_the_strategy_menu_lists_nested_plans_only_where_they_nest():
    """On a deep chain the menu's nested plans recompute some module twice or more, and the
    least of them measures below the one-level plan of least peak."""
    model = build_on_meta(lambda: _deep_chain(16, 64))
    x = torch.empty(256, 64, device="meta")
    menu = strategy_menu(model, x, uniform_counts=[4], nested_fractions=(0.0, 0.5))
    nested = [s.schedule for s in menu if family(s, len(model)) == "nested"]
    assert nested and all(max(plan.runs) > 2 for plan in nested)
    peaks = {
        row["checkpointing"]: row["tracked_peak_mib"]
        for row in measure_strategies(
            model, x, torch.zeros(256, dtype=torch.long, device="meta"), menu
        )
    }
    least_nested = min(peak for name, peak in peaks.items() if name.startswith("nested"))
    assert least_nested < peaks["planned, least peak"]


@pytest.mark.slow
def test_nested_meets_the_goal_on_the_deep_tanh_chain():
    """257 modules at batch 4096, dry run: at most one extra forward of FLOPs over the one-level
    least-peak plan buys at most 0.6x its activation memory."""
    model = build_on_meta(lambda: _deep_chain(128, 256))
    x = torch.empty(4096, 256, device="meta")
    profile = profile_sequential(model, x)
    one_level = plan_from_profile(profile)
    forward = sum(layer.forward_flops for layer in profile.layers)
    one_level_peak, _ = simulate(profile, one_level_schedule(one_level.boundaries))
    plan = nested_from_profile(
        profile, max_recompute=one_level.recompute_flops + forward, max_bytes=one_level_peak
    )
    assert plan.recompute_flops <= one_level.recompute_flops + forward
    one = dry_run_step(model, (4096, 256), scheduled(one_level)).activation_peak_bytes
    nested = dry_run_step(model, (4096, 256), scheduled(plan)).activation_peak_bytes
    assert nested <= 0.6 * one


def test_nested_plan_reads_as_an_outline_and_refuses_reentrant():
    model = _with_batchnorm_and_dropout()
    profile = profile_sequential(meta_copy(model), torch.empty(8, 16, device="meta"))
    plan = nested_plan(profile, one_level_schedule([(0, 5, True), (5, 10, False)]))
    assert "checkpointed" in plan.describe() and "runs per module" in plan.describe()
    assert plan.recompute_seconds is None and plan.recompute_flops > 0
    with pytest.raises(ValueError, match="use_reentrant=False"):
        plan.forward(model, torch.randn(8, 16), use_reentrant=True)
