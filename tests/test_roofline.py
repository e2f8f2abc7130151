"""The roofline charges memory-bound ops: ReLU costs time though it has no FLOPs, and a recompute
of cheap ops is no longer predicted free."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, equal_segments, selective
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
    with RooflineCounter(QUOTED) as views:
        x.t().detach()
        torch.empty_like(x)
    assert views.bytes == 0 and views.seconds == 0  # nothing read or written


def test_selective_checkpointing_is_not_predicted_free():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    x, y = torch.empty(8, 3, 32, 32, device="meta"), torch.zeros(8, dtype=torch.long)
    ratios = roofline_ratios(
        model, x, y.to("meta"),
        {"none": NO_CHECKPOINTING, "3 segments": equal_segments(3),
         "selective": selective(regions=3)},
        QUOTED,
    )  # fmt: skip
    assert ratios["none"] == 1.0
    assert 1.0 < ratios["selective"] < ratios["3 segments"]


def test_the_machine_is_measured_and_says_so():
    machine = measure_machine(side=128, copy_mib=4, repeats=2)
    assert machine.flops_per_second > 0 and machine.bytes_per_second > 0
    assert "measured" in machine.describe()


def test_a_plan_made_on_meta_with_a_roofline_charges_memory_bound_recompute():
    from tutorial_utils.measurement.dry_run import build_on_meta
    from tutorial_utils.planning.budget import plan_checkpoints
    from tutorial_utils.planning.profile import profile_sequential

    def build() -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
        ).train()  # fmt: skip

    model = build_on_meta(build)
    x = torch.empty(8, 3, 32, 32, device="meta")
    by_flops = profile_sequential(model, x)
    by_roofline = profile_sequential(model, x, machine=QUOTED)
    relu = by_flops.layers[2]
    assert relu.forward_seconds is None and relu.recompute_cost == 0  # FLOPs: ReLU is free
    assert by_roofline.layers[2].recompute_cost == 2 * 8 * 16 * 32 * 32 * 4 / 1e11  # its bytes
    assert by_roofline.timed and "roofline" in by_roofline.time_source
    plan = plan_checkpoints(model, x, machine=QUOTED)
    assert plan.recompute_seconds is not None and "predicted by the roofline" in str(plan)
    with pytest.raises(ValueError, match="a roofline predicts times for a dry run"):
        profile_sequential(build(), torch.randn(8, 3, 32, 32), machine=QUOTED)


def test_causal_fused_attention_is_charged_half_its_formula():
    """FlashAttention told the mask is causal skips the blocks above the diagonal: half of
    PyTorch's formula, which counts the whole S x S product (4 b h s^2 d)."""
    q = torch.empty(1, 4, 256, 64, device="meta", dtype=torch.bfloat16)
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    with RooflineCounter(QUOTED) as full:
        flash(q, q, q, 0.0, False)
    with RooflineCounter(QUOTED) as causal:
        flash(q, q, q, 0.0, is_causal=True)
    assert full.flops == 4 * 4 * 256**2 * 64
    assert causal.flops * 2 == full.flops


def test_an_unsafe_view_moves_no_bytes():
    """``_unsafe_view`` (a reshape after a matmul) reinterprets its input, like ``view``."""
    x = torch.empty(1024, 1024, device="meta")
    with RooflineCounter(QUOTED) as counter:
        torch.ops.aten._unsafe_view(x, [1024 * 1024])
    assert counter.bytes == 0 and counter.seconds == 0


def test_reading_a_tensors_device_moves_no_bytes():
    """``prim.device`` (FSDP2 asks it of every parameter) reads metadata, not the tensor."""
    x = torch.empty(1024, 1024, device="meta")
    with RooflineCounter(QUOTED) as counter:
        torch.ops.prim.device(x)
    assert counter.bytes == 0 and counter.seconds == 0
