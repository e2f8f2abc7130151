"""The one implementation of gradient comparison: it must tell equal from unequal gradients."""

from __future__ import annotations

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.measurement.gradients import (
    compare_gradients,
    gradients_identical,
    gradients_match,
    named_gradients,
    parameter_gradients,
)


def test_checkpointed_gradients_equal_the_plain_ones() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)))
    inputs = torch.randn(5, 8)
    plain = parameter_gradients(model, inputs)
    checkpointed = parameter_gradients(model, inputs, equal_segments(2))
    row = compare_gradients(plain, checkpointed)
    assert row["parameters"] == 8 and row["close"] and row["max_difference"] < 1e-6


def test_a_changed_gradient_is_seen() -> None:
    reference = [torch.ones(3), torch.arange(4.0)]
    changed = [reference[0] + 1e-7, reference[1] + 1.0]
    assert compare_gradients(reference, reference) == {
        "parameters": 2,
        "bitwise": True,
        "close": True,
        "max_difference": 0.0,
    }
    row = compare_gradients(reference, changed)
    assert not row["bitwise"] and not row["close"] and row["max_difference"] == 1.0
    by_name = dict(zip("ab", reference, strict=True))
    assert gradients_match(by_name, by_name)
    assert not gradients_match(dict(zip("ab", changed, strict=True)), by_name)
    assert not gradients_match({"a": reference[0]}, by_name)  # a missing parameter


def test_named_gradients_marks_a_parameter_without_gradient() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].weight.requires_grad_(False)
    model[1](torch.ones(1, 2)).sum().backward()
    gradients = named_gradients(model)
    assert "0.weight" not in gradients  # frozen: not asked for
    assert gradients["0.bias"] is None and gradients["1.weight"] is not None


def test_identical_means_bit_for_bit_and_the_same_missing_gradients():
    a = torch.tensor([1.0, 2.0])
    nudged = torch.nextafter(a, a + 1)  # one float32 step up: within any tolerance
    assert gradients_identical({"w": a, "b": None}, {"w": a.clone(), "b": None})
    assert not gradients_identical({"w": a}, {"w": nudged})  # within tolerance, not identical
    assert not gradients_identical({"w": a, "b": None}, {"w": a, "b": a})
    assert not gradients_identical({"w": a}, {"v": a})
