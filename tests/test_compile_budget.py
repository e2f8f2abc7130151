"""torch.compile's activation memory budget, measured: a lower budget saves fewer bytes."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_utils.articles.models import NetA, neta_as_sequential
from tutorial_utils.checkpointing.batchnorm import running_stats, stats_match
from tutorial_utils.measurement.dry_run import meta_copy
from tutorial_utils.measurement.step import measure_step
from tutorial_utils.planning.compile_budget import (
    CompileBudget,
    budget_sweep,
    compile_budget_strategy,
    saved_bytes_of,
)
from tutorial_utils.planning.strategies import measure_strategies, strategy_menu


def mlp(blocks: int = 4, width: int = 256) -> nn.Sequential:
    layers = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def test_saved_bytes_of_an_eager_model_counts_each_storage_once():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())  # ReLU's output: saved once
    x = torch.randn(4, 8)
    assert saved_bytes_of(model, x) == x.nbytes + 4 * 8 * 4  # Linear's input, ReLU's output


def test_a_lower_budget_saves_less_as_measured():
    torch.manual_seed(0)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    points = budget_sweep(mlp(), x, y, [0.0, 1.0], repeats=1)
    low, high = points
    assert 0 < low.saved_bytes < high.saved_bytes
    assert all(p.timing.repeats == 1 for p in points)


def test_the_partitioners_estimate_is_read_beside_the_measurement():
    """Its own size of the values it saves: on this MLP within 0.01% of the storages the
    compiled forward saves once its parameters are counted too (the partitioner counts every
    input it saves, so its budget 0 keeps all the weights), and never below them: it sizes
    whatever it hands to backward, autograd packs what backward reads."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    points = budget_sweep(mlp(), x, y, [0.0, 1.0], repeats=1)
    for point in points:
        assert point.estimated_bytes is not None and point.saved_with_parameters_bytes
        gap = point.estimated_bytes - point.saved_with_parameters_bytes
        assert 0 <= gap < 1e-4 * point.saved_with_parameters_bytes
        assert point.saved_with_parameters_bytes > point.saved_bytes  # the weights it keeps
    gap = points[0].estimated_bytes - points[0].saved_with_parameters_bytes
    assert f"estimated by the partitioner ({gap:+,} bytes)" in points[0].describe()


def test_the_strategy_saves_what_torch_compile_saves_at_each_budget():
    """``CompileBudget`` traces with AOTAutograd itself; torch.compile's own path (Dynamo, then
    the same partitioner) must keep exactly the same storages for backward."""
    torch.manual_seed(0)
    model, x, y = mlp(), torch.randn(64, 256), torch.randint(0, 10, (64,))
    budgets = [0.0, 0.5, 1.0]
    compiled = {p.budget: p.saved_bytes for p in budget_sweep(model, x, y, budgets, repeats=1)}
    ours = {}
    for b in budgets:
        forward = functools.partial(CompileBudget(b).forward, model)
        forward(x)  # the first call traces, and its forward saves tensors of its own
        ours[b] = saved_bytes_of(model, x, forward=forward)
    assert ours == compiled
    assert ours[0.0] < ours[1.0]


def test_a_compile_budget_step_dry_run_equals_the_real_step_and_keeps_batchnorm():
    """Run op by op, the partitioned step is measured like any strategy: on meta to the byte
    of the CPU step, with the plain step's gradients and BatchNorm updated once."""
    torch.manual_seed(0)
    model = neta_as_sequential(NetA())
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for budget in (0.0, 1.0):
        strategy = compile_budget_strategy(budget)
        real = measure_step(copy.deepcopy(model), x, y, strategy, time_step=False)
        dry = measure_step(meta_copy(model), x.to("meta"), y.to("meta"), strategy)
        assert (real.peak_bytes, real.activation_peak_bytes) == (
            dry.peak_bytes,
            dry.activation_peak_bytes,
        )
    runs = {}
    for name, forward in (("plain", None), ("compiled", CompileBudget(0.0).forward)):
        probe = copy.deepcopy(model).train()
        out = probe(x) if forward is None else forward(probe, x)
        F.cross_entropy(out, y).backward()
        runs[name] = (running_stats(probe), [p.grad for p in probe.parameters()])
    (plain_stats, plain_grads), (stats, grads) = runs["plain"], runs["compiled"]
    assert all(int(layer["num_batches_tracked"]) == 1 for layer in stats.values())
    assert stats_match(stats, plain_stats, rtol=1e-5, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(plain_grads, grads, strict=True))


def test_a_budget_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match=r"fraction in \[0, 1\]"):
        CompileBudget(1.5)


def test_compile_budgets_join_the_strategy_table_as_dry_runs():
    """On meta, each budget is one more measured row: budget 0 recomputes, so it counts more
    FLOPs than budget 1, which recomputes nothing."""
    torch.manual_seed(0)
    model = meta_copy(mlp())
    x, y = torch.empty(64, 256, device="meta"), torch.zeros(64, dtype=torch.long, device="meta")
    menu = strategy_menu(
        model, x, uniform_counts=[4], budget_fractions=(), compile_budgets=(0.0, 1.0)
    )
    rows = {row["checkpointing"]: row for row in measure_strategies(model, x, y, menu)}
    low, high = rows["compile budget 0.00"], rows["compile budget 1.00"]
    assert low["kind"] == high["kind"] == "compile-budget"
    assert low["family"] == high["family"] == "compile budget"
    assert low["step_gflop"] > high["step_gflop"] == rows["none"]["step_gflop"]


def test_profiled_peak_bytes_agrees_with_peak_bytes_on_an_eager_step_and_reads_a_compiled_one():
    """Notebook 04's compile cell: the profiler's allocation events read the eager step's peak
    as peak_bytes does, and read the compiled step's below it (fused kernels keep less)."""
    from tutorial_utils.tools import peak_bytes, profiled_peak_bytes

    torch.manual_seed(0)
    model = mlp(blocks=2, width=64)
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))

    def step(forward):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(forward(x), y).backward()

    eager = functools.partial(step, model)
    eager()
    model.zero_grad(set_to_none=True)  # the profiler sees only frees of what it saw allocated
    eager_peak = profiled_peak_bytes(eager)
    assert eager_peak == peak_bytes(eager)
    torch._dynamo.reset()
    compiled = functools.partial(step, torch.compile(model))
    compiled()
    model.zero_grad(set_to_none=True)
    assert 0 < profiled_peak_bytes(compiled) < eager_peak
