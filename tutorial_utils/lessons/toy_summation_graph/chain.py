"""Backprop through a chain of n layers, modelled: keep every activation, or keep every k-th
and recompute the rest. Notebook 01 measures a real chain beside it in its own cells."""

from __future__ import annotations

from dataclasses import dataclass

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.segments import segment_boundaries

__all__ = [
    "ChainCost",
    "ChainSizes",
    "chain_cost",
    "every_kth_layer_cost",
    "optimal_k",
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
