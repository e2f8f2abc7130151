"""The roofline charges memory-bound ops: ReLU costs time though it has no FLOPs, and a recompute
of cheap ops is no longer predicted free."""

from __future__ import annotations

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.selective import SelectiveCheckpoint
from tutorial_utils.planning.roofline import (
    Machine,
    RooflineCounter,
    measure_machine,
    roofline_ratios,
)

QUOTED = Machine("a round-number device", 1e12, 1e11, "quoted, for the test")


def test_a_relu_is_charged_by_its_bytes_and_a_matmul_by_its_flops():
    x = torch.empty(1024, 1024, device="meta")
    with RooflineCounter(QUOTED) as relu:
        torch.relu(x)
    assert relu.flops == 0 and relu.bytes == 2 * x.numel() * 4
    assert relu.seconds == relu.memory_bound_seconds == relu.bytes / 1e11
    with RooflineCounter(QUOTED) as matmul:
        x @ x
    assert matmul.flops == 2 * 1024**3
    assert matmul.seconds == matmul.flops / 1e12 and matmul.memory_bound_seconds == 0


def test_selective_checkpointing_is_not_predicted_free():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    x, y = torch.empty(8, 3, 32, 32, device="meta"), torch.zeros(8, dtype=torch.long)
    ratios = roofline_ratios(
        model, x, y.to("meta"), {"none": 0, "3 segments": 3, "selective": SelectiveCheckpoint(3)},
        QUOTED,
    )  # fmt: skip
    assert ratios["none"] == 1.0
    assert 1.0 < ratios["selective"] < ratios["3 segments"]


def test_the_machine_is_measured_and_says_so():
    machine = measure_machine(side=128, copy_mib=4, repeats=2)
    assert machine.flops_per_second > 0 and machine.bytes_per_second > 0
    assert "measured" in machine.describe()
