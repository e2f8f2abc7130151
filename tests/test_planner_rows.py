"""The planner's one-pass high-water marks equal its per-segment definition, segment by segment.

``_segment_high_waters`` gives every segment from one start in one pass, so the planner's costs
are quadratic in the modules, not cubic (tests/test_nested.py's deep tanh chain: 17.3 s -> 10.2 s,
2026-12-04, load average 1-3). The reference below is the per-segment loop it replaced.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils.articles.models import vgg16_classifier
from tutorial_utils.measurement.dry_run import build_on_meta
from tutorial_utils.planning.planner import (
    _boundary_kept,
    _input_kept,
    _layer_sums,
    _output_grad_bytes,
    _segment_high_waters,
)
from tutorial_utils.planning.profile import ModelProfile, profile_sequential


def one_segment_high_water(
    profile: ModelProfile, start: int, end: int, checkpointed: bool, after_plain: bool
) -> int:
    """The planner's per-segment definition before its one-pass rows (commit 025f422)."""
    layers = profile.layers
    held = layers[start].input_bytes * _input_kept(profile, start, checkpointed, after_plain)
    current_input = [layer.input_bytes if m > 0 else 0 for m, layer in enumerate(layers)]
    output_grad = _output_grad_bytes(layers[end - 1])
    grads_after = sum(layer.parameter_bytes for layer in layers[end:])

    high = 0
    saved_before = 0  # plain savings of modules start..m-1, boundaries start+1..m-1
    savings_through = {}  # m -> plain savings of modules start..m, boundaries start+1..m
    for m in range(start, end):
        layer = layers[m]
        producing = current_input[m] + layer.internal_bytes + layer.output_bytes
        live = (held if m > start else 0) + producing
        if checkpointed:  # forward keeps only the segment input; recompute keeps it all
            high = max(high, live, live + saved_before + output_grad + grads_after)
        else:
            high = max(high, live + saved_before)
        saved_before += layer.internal_bytes
        if m > start and _boundary_kept(profile, m):
            saved_before += layer.input_bytes
        savings_through[m] = saved_before

    # Backward at module m: savings of modules start..m (their inputs included), the output if
    # m saved it, the gradients of m's output and input, and every parameter gradient so far.
    grads_from = grads_after
    for m in range(end - 1, start - 1, -1):
        layer = layers[m]
        grads_from += layer.parameter_bytes
        high = max(
            high,
            held
            + savings_through[m]
            + layer.output_bytes * layer.saves_output
            + _output_grad_bytes(layer)
            + current_input[m]
            + grads_from,
        )
    return high


def _chain_with_everything() -> nn.Sequential:
    """Parameters, BatchNorm, dropout, in-place ReLU, a view and a module without parameters."""
    return nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(inplace=True), nn.Dropout(0.5),
        nn.Linear(32, 32), nn.Tanh(), nn.Unflatten(1, (4, 8)), nn.Flatten(), nn.Linear(32, 8),
    )  # fmt: skip


PROFILES = {
    "chain": lambda: profile_sequential(
        build_on_meta(_chain_with_everything), torch.empty(64, 16, device="meta")
    ),
    "conv, batchnorm, pooling": lambda: profile_sequential(
        build_on_meta(
            lambda: nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(8, 8, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(8, 10),
            )  # fmt: skip
        ),
        torch.empty(4, 3, 32, 32, device="meta"),
    ),
    "flat vgg16": lambda: profile_sequential(
        build_on_meta(lambda: vgg16_classifier(layout="flat")),
        torch.empty(2, 3, 64, 64, device="meta"),
    ),
}


@pytest.mark.parametrize("name", PROFILES)
def test_one_pass_high_water_marks_equal_the_per_segment_definition(name: str) -> None:
    profile = PROFILES[name]()
    sums = _layer_sums(profile)
    count = len(profile.layers)
    for start in range(count):
        for checkpointed in (False, True):
            for after_plain in (False, True):
                highs = _segment_high_waters(profile, start, checkpointed, after_plain, sums)
                expected = [
                    one_segment_high_water(profile, start, end, checkpointed, after_plain)
                    for end in range(start + 1, count + 1)
                ]
                assert highs == expected, (start, checkpointed, after_plain)
