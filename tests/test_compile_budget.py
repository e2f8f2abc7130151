"""torch.compile's activation memory budget, measured: a lower budget saves fewer bytes."""

from __future__ import annotations

import torch
import torch.nn as nn

from tutorial_utils.planning.compile_budget import budget_sweep, saved_bytes_of


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
