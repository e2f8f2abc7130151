"""Backprop through a chain of layers: the simulation's bookkeeping, and a real chain measured.

Keep every activation, or keep every k-th and recompute the rest; a real chain of equal blocks,
measured by ``tutorial_utils.measurement``, is set beside the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.segments import segment_boundaries
from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.measurement.dry_run import dry_run_step
from tutorial_utils.measurement.gradients import named_gradients
from tutorial_utils.measurement.step import SweepRecord
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.tools import peak_bytes

__all__ = [
    "ChainCost",
    "ChainSizes",
    "ModelComparison",
    "backward_peak_and_gradients",
    "chain_cost",
    "compare_with_model",
    "equal_blocks_chain",
    "every_kth_layer_cost",
    "forward_peak_bytes",
    "optimal_k",
    "predicted_time_ratios",
    "sequential_cost",
    "sizes_for",
]


@dataclass(frozen=True)
class ChainSizes:
    """How notebook 01 sweeps its chain (the chain itself is written in the notebook's cells)."""

    repeats: int  # timed steps per segment count: their range is the noise


def sizes_for(profile: Profile) -> ChainSizes:
    """One timed step per count in ``ci`` (seconds under nbval), enough to show the noise above."""
    repeats = 1 if profile.name == "ci" else 7 if profile.name == "cpu" else 3
    return ChainSizes(profile.capped(repeats) or repeats)


# --- backprop through a chain of layers -------------------------------------------------------


@dataclass(frozen=True)
class ChainCost:
    """Activation memory and recomputation of one way to cut a chain of layers into segments.

    Counting convention: layer i's backward needs its input a_(i-1), one unit each; parameters,
    gradients, the output and the loss are not counted. A checkpointed segment keeps only its
    input during the forward pass and re-runs its layers before its backward; segments are
    processed from last to first and freed when done.
    """

    n_layers: int
    segments: tuple[tuple[int, int], ...]
    checkpointed: tuple[bool, ...]
    peak_activations: int
    recomputed_layers: int


def chain_cost(
    n_layers: int, segments: list[tuple[int, int]], checkpointed: list[bool]
) -> ChainCost:
    """Peak stored activations and recomputed layer forwards for the given ``[start, end)`` cuts.

    While segment j runs its backward, memory holds what segments 0..j-1 stored (their input if
    checkpointed, all their layer inputs if not) plus all of segment j's layer inputs.
    """
    if not segments or segments[0][0] != 0 or segments[-1][1] != n_layers:
        raise ValueError(f"segments must cover layers 0..{n_layers} from start to end")
    if any(a[1] != b[0] for a, b in zip(segments, segments[1:], strict=False)) or any(
        end <= start for start, end in segments
    ):
        raise ValueError("segments must be contiguous, non-empty [start, end) ranges")
    if len(checkpointed) != len(segments):
        raise ValueError("give one checkpointed flag per segment")
    lengths = [end - start for start, end in segments]
    stored = [1 if flag else length for flag, length in zip(checkpointed, lengths, strict=True)]
    peak = max(sum(stored[:index]) + lengths[index] for index in range(len(segments)))
    recomputed = sum(length for flag, length in zip(checkpointed, lengths, strict=True) if flag)
    return ChainCost(n_layers, tuple(segments), tuple(checkpointed), peak, recomputed)


def _check_layer_count(n_layers: int) -> None:
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")


def every_kth_layer_cost(n_layers: int, k: int) -> ChainCost:
    """Keep the input of every k-th layer (segments of k layers); recompute all but the last."""
    _check_layer_count(n_layers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_layers:
        raise ValueError(f"k must be an integer in 1..{n_layers}, got {k!r}")
    segments = [(start, min(start + k, n_layers)) for start in range(0, n_layers, k)]
    checkpointed = [True] * (len(segments) - 1) + [False]
    return chain_cost(n_layers, segments, checkpointed)


def optimal_k(n_layers: int) -> ChainCost:
    """The every-k-th plan with the lowest peak (then the least recomputation, then the largest k)."""
    _check_layer_count(n_layers)
    plans = [every_kth_layer_cost(n_layers, k) for k in range(1, n_layers + 1)]
    return min(plans, key=lambda p: (p.peak_activations, p.recomputed_layers, -len(p.segments)))


def sequential_cost(n_layers: int, segments: int) -> ChainCost:
    """What ``checkpoint_sequential(model, segments, ...)`` does to a chain of ``n_layers`` blocks.

    It cuts ``n_layers // segments``-sized runs (the remainder goes to the last one) and
    checkpoints every segment except the last, so 0 or 1 segments checkpoint nothing.
    """
    _check_layer_count(n_layers)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 0 <= segments <= n_layers:
        raise ValueError(f"segments must be an integer in 0..{n_layers}, got {segments!r}")
    bounds = segment_boundaries(n_layers, segments)
    return chain_cost(n_layers, bounds, [True] * (len(bounds) - 1) + [False])


# --- the real thing: a chain of equal blocks, measured ------------------------------------------


def equal_blocks_chain(n_blocks: int, width: int) -> nn.Sequential:
    """``n_blocks`` blocks of Linear(width, width) + ReLU, each one module of the Sequential.

    The ReLU is out of place, so each block leaves exactly one saved tensor of batch x width
    behind (its output, which is also the next Linear's saved input): one "activation" of the
    chain model per block.
    """
    _check_layer_count(n_blocks)
    if width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(n_blocks))
    )


@dataclass(frozen=True)
class ModelComparison:
    """One measured segment count next to the chain model's prediction, in activation units."""

    segments: int
    model_units: int  # sequential_cost(...).peak_activations
    measured_units: float  # tracked "activations" at the step's peak / bytes of one activation
    peak_bytes: int
    breakdown: dict[str, int]

    @property
    def extra_units(self) -> float:
        """What the measurement holds beyond the model's stored layer inputs."""
        return self.measured_units - self.model_units


def compare_with_model(
    records: list[SweepRecord], n_blocks: int, unit_bytes: int
) -> list[ModelComparison]:
    """Pair each measured sweep record with ``sequential_cost`` of the same segment count."""
    if unit_bytes <= 0:
        raise ValueError(f"unit_bytes must be positive, got {unit_bytes}")
    comparisons = []
    for record in records:
        segments = record.strategy.segments  # the count, 0 or 1 on no checkpointing
        comparisons.append(
            ModelComparison(
                segments=segments,
                model_units=sequential_cost(n_blocks, segments).peak_activations,
                measured_units=record.breakdown["activations"] / unit_bytes,
                peak_bytes=record.peak_bytes,
                breakdown=dict(record.breakdown),
            )
        )
    return comparisons


def forward_peak_bytes(
    model: nn.Sequential, inputs: torch.Tensor, segments: int, *, grad_enabled: bool
) -> int:
    """Tracked peak of one forward pass above what existed before it (parameters, inputs)."""
    with torch.set_grad_enabled(grad_enabled):
        with TensorMemoryTracker(model, inputs=(inputs,)) as tracker:
            with equal_segments(segments).applied(model):
                output = model(inputs)
        del output
    return tracker.peak_bytes - tracker.baseline_bytes


def backward_peak_and_gradients(
    model: nn.Module,
    forward: Callable[[torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
) -> tuple[int, dict[str, torch.Tensor | None]]:
    """``peak_bytes`` of ``cross_entropy(forward(inputs), targets).backward()`` (above the model
    and the batch), and the gradients it leaves: one way of running the model, measured."""
    model.zero_grad(set_to_none=True)
    peak = peak_bytes(lambda: F.cross_entropy(forward(inputs), targets).backward(), inputs.device)
    gradients = named_gradients(model)
    model.zero_grad(set_to_none=True)
    return peak, gradients


def predicted_time_ratios(
    model: nn.Sequential, input_shape: Sequence[int], segment_counts: Iterable[int]
) -> dict[int, float]:
    """Each count's training-step FLOPs over the plain step's, by dry run: the time ratio that
    recomputation alone predicts."""
    flops = {
        count: dry_run_step(model, input_shape, equal_segments(count)).flops
        for count in segment_counts
    }
    plain = dry_run_step(model, input_shape).flops
    ratios = {}
    for count, step in flops.items():
        assert step is not None and plain is not None  # a dry run counts FLOPs
        ratios[count] = step.overhead_vs(plain)
    return ratios
