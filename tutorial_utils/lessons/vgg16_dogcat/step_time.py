"""Notebook 02, section 3: the checkpointed step's time, measured where recomputation dominates.

With the full VGG16 at a laptop's small images, most of a step is parameter-sized work (the
backward pass through the classifier's 120 M weights, the optimizer step over 134 M), which
checkpointing does not repeat, so the extra forward pass drowns in noise. VGG16's convolutional
part with a 2-class head at 128 px is convolution-bound: there the recomputation is a large,
predictable share of the step, and the two steps, timed in turns, come out ranges apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

import torch
import torch.nn as nn

from tutorial_utils.articles.models import vgg16_classifier
from tutorial_utils.measurement.devices import synchronize
from tutorial_utils.measurement.timing import Timing, time_interleaved, time_verdict


def vgg16_convolutional(num_classes: int = 2) -> nn.Sequential:
    """VGG16's 31 feature layers (out-of-place ReLUs, as in the flat layout) with a small head:
    global average pool, Flatten, one Linear(512, ``num_classes``). 34 top-level modules."""
    features = list(vgg16_classifier(num_classes, layout="flat"))[:31]
    return nn.Sequential(
        *features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)
    )


@dataclass(frozen=True)
class StepTimes:
    """A plain and a checkpointed training step, timed in turns, beside the FLOP prediction."""

    plain: Timing
    checkpointed: Timing
    predicted: float  # checkpointed / plain FLOPs of one step, by dry run

    def __post_init__(self) -> None:
        if self.plain.repeats != self.checkpointed.repeats:
            raise ValueError("plain and checkpointed need the same number of turns")

    @property
    def turn_ratios(self) -> tuple[float, ...]:
        """Checkpointed over plain within each turn: a slow spell hits both steps of a turn."""
        pairs = zip(self.checkpointed.durations, self.plain.durations, strict=True)
        return tuple(c / p for c, p in pairs)

    @property
    def median_ratio(self) -> float:
        return median(self.turn_ratios)

    @property
    def off_prediction(self) -> float:
        """measured / predicted - 1: 0.05 means 5% slower than the FLOPs say."""
        return self.median_ratio / self.predicted - 1

    @property
    def beyond_noise(self) -> bool:
        return self.plain.repeats > 1 and not self.checkpointed.overlaps(self.plain)

    def describe(self) -> str:
        ratios = self.turn_ratios
        return "\n".join(
            [
                f"plain step:        {self.plain.describe()}",
                f"checkpointed step: {self.checkpointed.describe()}",
                f"ratio per turn: median x{self.median_ratio:.2f} "
                f"(x{min(ratios):.2f}-x{max(ratios):.2f} over {len(ratios)} turns); "
                f"FLOPs predict x{self.predicted:.2f} (dry run): measured / predicted - 1 = "
                f"{self.off_prediction:+.2f}",
                f"fastest against fastest: {time_verdict(self.checkpointed, self.plain)}",
            ]
        )


def time_plain_and_checkpointed(
    plain_step: Callable[[], object],
    checkpointed_step: Callable[[], object],
    repeats: int,
    predicted: float,
    device: torch.device | str = "cpu",
) -> StepTimes:
    """One untimed warm-up of each step, then ``repeats`` turns of (plain, checkpointed)."""
    plain_step()
    checkpointed_step()
    timings = time_interleaved(
        {"plain": plain_step, "checkpointed": checkpointed_step},
        repeats,
        functools.partial(synchronize, device),
    )
    return StepTimes(timings["plain"], timings["checkpointed"], predicted)
