"""Choosing WHERE to checkpoint an ``nn.Sequential``: profile once, then dynamic programming.

``checkpoint_sequential`` cuts a model into runs of equal module counts, blind to where the memory
sits; in VGG16 most activation bytes live in the first, high-resolution layers. Here each
top-level module is profiled once (the bytes autograd saves for its backward, the bytes of its
output, its forward time), a cost model predicts the step's peak for any choice of contiguous
segments (each checkpointed or not), and a dynamic program picks the boundaries: with a budget,
the plan of least recompute time whose predicted peak fits; without one, the plan of least peak.
The idea is Chen et al. (2016)'s budgeted sqrt(n) scheme made exact for a chain, as rotor does.
``planning.budget.plan_checkpoints`` is the entry point: it also measures the plan it returns.

Profiling works on the meta device too (a model and a sample there: the article's 224 px on any
laptop). There no time exists, so each module's forward FLOPs stand in for its forward time, and
the recompute cost the program minimises is in FLOPs; on a real device it is in seconds.

What the prediction covers (``Plan.predicted_peak_bytes``): parameters and buffers, the input
batch, gradients as backward creates them (``.grad`` starts at None, as after
``zero_grad(set_to_none=True)``), saved activations, the activation being produced and the
activation gradients of the layer being differentiated. It leaves out optimizer state (add it: it
is a constant, e.g. 2x the parameters for Adam), scratch memory inside kernels, and temporaries
smaller than a layer's output. It is the same quantity ``TensorMemoryTracker`` measures.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from tutorial_utils.checkpointing.batchnorm import run_keeping_batchnorm
from tutorial_utils.checkpointing.segments import segment_boundaries
from tutorial_utils.planning.profile import LayerCost, ModelProfile
from tutorial_utils.units import MiB

__all__ = [
    "evaluate_plan",
    "iter_uniform_plans",
    "Plan",
    "plan_from_profile",
    "recompute_label",
    "Segment",
    "uniform_boundaries",
]

# (start, end, checkpointed): modules ``start..end-1`` run as one segment.
Segment = tuple[int, int, bool]


# -- the cost model ------------------------------------------------------------------------------
#
# Boundary tensor x_j is the input of module j (x_0 the batch, in the baseline). Going forward,
# a segment [s, e) leaves behind what its backward needs: a checkpointed one only its input x_s,
# a plain one every saved storage of its modules. Each plan's peak is the largest over segments k
# of (bytes left behind by segments before k) + (segment k's own high-water mark, forward or
# backward). Backward adds the gradients of all parameters from the current module to the end.


def _input_kept(profile: ModelProfile, start: int, checkpointed: bool, after_plain: bool) -> bool:
    """Whether the segment's input x_start stays alive until the segment's backward."""
    if start == 0:
        return False  # the batch is in the baseline
    layers = profile.layers
    return (
        checkpointed
        or layers[start].saves_input
        or (after_plain and layers[start - 1].saves_output)
    )


def _boundary_kept(profile: ModelProfile, j: int) -> bool:
    """Inside a plain segment: whether x_j is saved by the module before or after it."""
    return profile.layers[j - 1].saves_output or profile.layers[j].saves_input


def _segment_stored(
    profile: ModelProfile, start: int, end: int, checkpointed: bool, after_plain: bool
) -> int:
    """Bytes a segment leaves behind after its forward, its input included, its output not."""
    layers = profile.layers
    kept = (
        layers[start].input_bytes if _input_kept(profile, start, checkpointed, after_plain) else 0
    )
    if checkpointed:
        return kept
    for m in range(start, end):
        kept += layers[m].internal_bytes
        if m > start and _boundary_kept(profile, m):
            kept += layers[m].input_bytes
    return kept


def _layer_sums(profile: ModelProfile) -> tuple[list[int], list[int]]:
    """Each module's input bytes as the step holds it (the batch is in the baseline), and the
    parameter bytes of modules j.. for each j: the same for every segment, so computed once."""
    current_input = [layer.input_bytes if m > 0 else 0 for m, layer in enumerate(profile.layers)]
    parameters_from = [0] * (len(profile.layers) + 1)
    for m in range(len(profile.layers) - 1, -1, -1):
        parameters_from[m] = parameters_from[m + 1] + profile.layers[m].parameter_bytes
    return current_input, parameters_from


def _segment_high_waters(
    profile: ModelProfile,
    start: int,
    checkpointed: bool,
    after_plain: bool,
    sums: tuple[list[int], list[int]],
) -> list[int]:
    """The own peak, on top of what earlier segments left behind, of the segment start..end-1
    for each end after ``start`` (``sums``: ``_layer_sums(profile)``), in one pass.

    Forward at module m holds its input, its internals and its output beside the plain savings
    of modules start..m-1 (a checkpointed segment keeps them only while it recomputes, with the
    gradient of its output and the parameter gradients after it). Backward at module m holds the
    savings of modules start..m, m's saved output, the gradients of its output and input and
    every parameter gradient from m on: neither depends on where the segment ends, so the peak
    of a longer segment is a running maximum.
    """
    layers = profile.layers
    current_input, parameters_from = sums
    held = layers[start].input_bytes * _input_kept(profile, start, checkpointed, after_plain)
    live_high = forward_high = backward_high = 0
    saved_before = 0  # plain savings of modules start..m-1, boundaries start+1..m-1
    highs = []
    for m in range(start, len(layers)):
        layer = layers[m]
        live = (held if m > start else 0) + current_input[m] + layer.internal_bytes
        live += layer.output_bytes
        live_high = max(live_high, live)
        forward_high = max(forward_high, live + saved_before)
        saved_before += layer.internal_bytes
        if m > start and _boundary_kept(profile, m):
            saved_before += layer.input_bytes
        output_grad = _output_grad_bytes(layer)
        backward = held + saved_before + layer.output_bytes * layer.saves_output + output_grad
        backward_high = max(backward_high, backward + current_input[m] + parameters_from[m])
        if checkpointed:  # forward keeps only the segment input; recompute keeps it all
            after = output_grad + parameters_from[m + 1]
            highs.append(max(live_high, forward_high + after, backward_high))
        else:
            highs.append(max(forward_high, backward_high))
    return highs


def recomputed_end(profile: ModelProfile, start: int, end: int) -> int:
    """Where the recomputation of a checkpointed run ``start..end-1`` stops (exclusive).

    Non-reentrant ``checkpoint`` stops recomputing as soon as every tensor the segment saved is
    back, and autograd saves an op's inputs before its kernel runs. So trailing modules that save
    only their inputs (a convolution, a linear layer: input and weight) are never re-run. On flat
    VGG16 at 224 px, batch 64, counting them anyway gave 721 GFLOP of recompute for the least-peak
    plan where the dry run counts 248.
    """
    layers = profile.layers
    stop = end
    while stop > start and not (layers[stop - 1].saves_output or layers[stop - 1].internal_bytes):
        stop -= 1
    return stop


def _output_grad_bytes(layer: LayerCost) -> int:
    """The gradient of a module's output; a view's output is as big as its input."""
    return layer.output_bytes or layer.input_bytes


@dataclass(frozen=True)
class _Partial:
    """A plan for modules ``0..j-1``: bytes left behind, peak so far, recompute cost."""

    stored: int
    peak: int
    cost: float
    last: Segment | None = None  # the segment ending at j
    parent: _Partial | None = field(default=None, repr=False, compare=False)  # the plan before it

    @property
    def segments(self) -> tuple[Segment, ...]:
        """Every segment, first to last (kept as a chain: extending copies nothing)."""
        found = []
        node: _Partial | None = self
        while node is not None and node.last is not None:
            found.append(node.last)
            node = node.parent
        return tuple(reversed(found))


def _pareto(candidates: list[_Partial], key) -> list[_Partial]:
    """Sorted by ``key``, the candidates that improve on ``key[1]``: none is beaten on both
    ``key[0]`` and ``key[1]`` (``key[2:]`` only breaks ties)."""
    front: list[_Partial] = []
    best_second = math.inf
    for candidate in sorted(candidates, key=key):
        if key(candidate)[1] < best_second:
            front.append(candidate)
            best_second = key(candidate)[1]
    return front


class _CostTable:
    """Stored bytes and high-water marks of every possible segment, computed once."""

    def __init__(self, profile: ModelProfile):
        self.profile = profile
        self.prefix_cost = [0.0]  # recompute cost of modules 0..j-1: seconds, or FLOPs on meta
        for layer in profile.layers:
            self.prefix_cost.append(self.prefix_cost[-1] + layer.recompute_cost)
        self._costs: dict[tuple[int, int, bool, bool], tuple[int, int]] = {}
        self._sums = _layer_sums(profile)
        self._recompute: dict[tuple[int, int], float] = {}

    def cost(self, start: int, end: int, checkpointed: bool, after_plain: bool) -> tuple[int, int]:
        """(stored, high-water) of one segment, memoized: the search asks for each many times,
        and the high-water marks of every segment from ``start`` come in one pass."""
        key = (start, end, checkpointed, after_plain)
        if key not in self._costs:
            highs = _segment_high_waters(self.profile, start, checkpointed, after_plain, self._sums)
            for later, high in enumerate(highs, start=start + 1):
                stored = _segment_stored(self.profile, start, later, checkpointed, after_plain)
                self._costs[(start, later, checkpointed, after_plain)] = (stored, high)
        return self._costs[key]

    def extend(self, partial: _Partial, end: int, checkpointed: bool) -> _Partial:
        start = partial.last[1] if partial.last else 0
        after_plain = partial.last is not None and not partial.last[2]
        stored, high = self.cost(start, end, checkpointed, after_plain)
        cost = self.recompute_cost(start, end) if checkpointed else 0.0
        return _Partial(
            partial.stored + stored,
            max(partial.peak, partial.stored + high),
            partial.cost + cost,
            (start, end, checkpointed),
            partial,
        )

    def recompute_cost(self, start: int, end: int) -> float:
        """What recomputing ``start..end-1`` costs (memoized, see ``recomputed_end``)."""
        key = (start, end)
        if key not in self._recompute:
            stop = recomputed_end(self.profile, start, end)
            self._recompute[key] = self.prefix_cost[stop] - self.prefix_cost[start]
        return self._recompute[key]

    def finished_plans(self, fits, front_key) -> list[_Partial]:
        """Partial plans grown boundary by boundary, pruned to a Pareto front at each boundary.

        States at boundary j are split by whether the last segment is plain (that decides
        whether x_j is already kept); within a state the future depends only on the bytes left
        behind, so a partial plan beaten on (stored, ``front_key``'s second coordinate) by another
        can never finish better. ``fits`` drops partial plans over the budget.
        """
        n = len(self.profile)
        fronts: dict[tuple[int, bool], list[_Partial]] = {(0, False): [_Partial(0, 0, 0.0)]}
        for start in range(n):
            for after_plain in (False, True):
                for partial in fronts.get((start, after_plain), []):
                    for end in range(start + 1, n + 1):
                        for checkpointed in (False, True):
                            longer = self.extend(partial, end, checkpointed)
                            if fits(longer):
                                fronts.setdefault((end, not checkpointed), []).append(longer)
            for state in ((start + 1, False), (start + 1, True)):
                if state in fronts:
                    fronts[state] = _pareto(fronts[state], front_key)
        return fronts.get((n, False), []) + fronts.get((n, True), [])

    def fastest_within(self, activation_budget: float) -> _Partial | None:
        """The plan of least recompute whose peak above the baseline fits (least peak on ties)."""
        finished = self.finished_plans(
            lambda p: p.peak <= activation_budget, lambda p: (p.stored, p.cost, p.peak)
        )
        return min(finished, key=lambda p: (p.cost, p.peak), default=None)

    def least_peak(self) -> int:
        """The smallest peak above the baseline that any plan reaches."""
        return min(
            p.peak for p in self.finished_plans(lambda p: True, lambda p: (p.stored, p.peak))
        )


@dataclass(frozen=True)
class Plan:
    """Where to checkpoint a Sequential, and what that is predicted to cost.

    ``boundaries``: ``(start, end, checkpointed)`` for each run of modules, covering the model
    in order. ``predicted_peak_bytes``: the step's predicted peak (see the module docstring for
    what it covers), ``baseline_bytes`` of which are parameters, buffers and the batch.
    ``recompute_seconds``: forward time of the checkpointed modules, paid again in backward
    (None when profiled on the meta device); ``recompute_flops``: their forward FLOPs.
    ``measured_peak_bytes``: the same quantity measured by a dry run of the plan, where
    ``plan_checkpoints`` verified it (None for a prediction alone).
    """

    boundaries: list[Segment]
    predicted_peak_bytes: int
    baseline_bytes: int
    recompute_seconds: float | None
    recompute_flops: int = 0
    layer_names: tuple[str, ...] = field(default=(), repr=False)
    measured_peak_bytes: int | None = None  # set by planning.budget.plan_checkpoints
    time_source: str = "measured"  # of recompute_seconds: ModelProfile.time_source

    def recompute_label(self) -> str:
        """'recompute 12 ms', or in GFLOP where the plan was made on the meta device."""
        return recompute_label(self.recompute_seconds, self.recompute_flops, self.time_source)

    @property
    def checkpointed_segments(self) -> int:
        return sum(checkpointed for _, _, checkpointed in self.boundaries)

    @property
    def runs(self) -> tuple[int, ...]:
        """How many times each module runs per step: twice where checkpointed (as
        ``NestedPlan.runs``, where it may be more)."""
        return tuple(
            2 if checkpointed else 1
            for start, end, checkpointed in self.boundaries
            for _ in range(start, end)
        )

    def forward(
        self,
        model: nn.Sequential,
        x: torch.Tensor,
        use_reentrant: bool = False,
        preserve_rng_state: bool = True,
    ) -> torch.Tensor:
        """``model(x)`` with the checkpointed segments run under ``checkpoint``; their
        recomputation leaves BatchNorm's running statistics alone (one update per step, as plain).

        A plain segment's modules run here, one by one, so that no frame keeps the segment's input
        alive while its modules run: a tensor no module saved is freed as soon as the next module
        has its output, as the cost model assumes. (Run through a helper, the caller's reference
        kept each plain segment's input until the segment returned: 16 MiB over the prediction on
        NetA at 64 px, batch 32, the miss issue 16 reported.)
        """
        if len(model) != self.boundaries[-1][1]:
            raise ValueError(
                f"this plan covers {self.boundaries[-1][1]} modules but the model has "
                f"{len(model)}: plan again with plan_checkpoints(model, sample_input)"
            )
        for start, end, checkpointed in self.boundaries:
            if checkpointed:
                x = checkpoint(
                    functools.partial(run_keeping_batchnorm, list(model)[start:end]),
                    x,
                    use_reentrant=use_reentrant,
                    preserve_rng_state=preserve_rng_state,
                )
            else:
                for module in list(model)[start:end]:
                    x = module(x)
        return x

    def __str__(self) -> str:
        """One line, short enough for a legend: checkpointed runs marked ``ckpt``."""
        runs = ", ".join(
            f"{'ckpt ' if checkpointed else ''}{start}-{end - 1}"
            for start, end, checkpointed in self.boundaries
        )
        return (
            f"Plan[{runs}] predicted peak {self.predicted_peak_bytes / MiB:.1f} MiB, "
            f"{self.recompute_label()}"
        )

    def describe(self) -> str:
        """A table of the segments, with the module names, and what the plan is predicted to cost."""
        lines = [f"{len(self.boundaries)} segments, {self.checkpointed_segments} checkpointed:"]
        for start, end, checkpointed in self.boundaries:
            names = self.layer_names[start:end] or ("",)
            span = names[0] if end - start == 1 else f"{names[0]} .. {names[-1]}"
            lines.append(f"  {'checkpointed' if checkpointed else 'kept        '}  {span}")
        lines.append(
            f"predicted peak {self.predicted_peak_bytes / MiB:.1f} MiB = "
            f"{self.baseline_bytes / MiB:.1f} MiB parameters, buffers and batch + "
            f"{(self.predicted_peak_bytes - self.baseline_bytes) / MiB:.1f} MiB activations and "
            "gradients (optimizer state not included)"
        )
        lines.append(f"{self.recompute_label()} per step (profiled)")
        return "\n".join(lines)


def evaluate_plan(profile: ModelProfile, boundaries: list[Segment]) -> Plan:
    """The predicted peak and recompute time of given boundaries (e.g. a uniform split)."""
    _check_boundaries(boundaries, len(profile))
    table = _CostTable(profile)
    partial = _Partial(0, 0, 0.0)
    for _, end, checkpointed in boundaries:
        partial = table.extend(partial, end, checkpointed)
    return _plan_from(profile, partial)


def _check_boundaries(boundaries: list[Segment], n_modules: int) -> None:
    position = 0
    for start, end, _ in boundaries:
        if start != position or end <= start:
            raise ValueError(f"boundaries must cover 0..{n_modules} in order, got {boundaries}")
        position = end
    if position != n_modules:
        raise ValueError(f"boundaries must end at {n_modules} (the module count), got {position}")


def _plan_from(profile: ModelProfile, partial: _Partial) -> Plan:
    flops = sum(
        layer.forward_flops
        for start, end, checkpointed in partial.segments
        if checkpointed
        for layer in profile.layers[start : recomputed_end(profile, start, end)]
    )
    return Plan(
        boundaries=list(partial.segments),
        predicted_peak_bytes=profile.baseline_bytes + partial.peak,
        baseline_bytes=profile.baseline_bytes,
        recompute_seconds=partial.cost if profile.timed else None,
        recompute_flops=flops,
        layer_names=tuple(layer.name for layer in profile.layers),
        time_source=profile.time_source,
    )


def recompute_label(seconds: float | None, flops: int, time_source: str) -> str:
    """'recompute 12 ms' (measured), '... ms (predicted by the roofline of ...)', or GFLOP where
    a plan made on the meta device has no time."""
    if seconds is None:
        return f"recompute {flops / 1e9:,.1f} GFLOP"
    source = "" if time_source == "measured" else f" ({time_source})"
    return f"recompute {seconds * 1000:.0f} ms{source}"


def uniform_boundaries(n_modules: int, segments: int) -> list[Segment]:
    """What ``checkpoint_sequential(segments)`` does: equal runs, all but the last checkpointed."""
    runs = segment_boundaries(n_modules, segments)
    return [(start, end, k < len(runs) - 1) for k, (start, end) in enumerate(runs)]


def plan_from_profile(profile: ModelProfile, budget_bytes: int | None = None) -> Plan:
    """The dynamic program on an existing profile (re-planning for a new budget is cheap)."""
    table = _CostTable(profile)
    least = table.least_peak()
    if budget_bytes is None:
        best = table.fastest_within(least)
    else:
        if budget_bytes < profile.baseline_bytes + least:
            raise ValueError(
                f"budget {budget_bytes / MiB:.1f} MiB is below the smallest peak any plan reaches, "
                f"{(profile.baseline_bytes + least) / MiB:.1f} MiB "
                f"({profile.baseline_bytes / MiB:.1f} MiB of it parameters, buffers and batch): "
                "raise the budget or shrink the batch"
            )
        best = table.fastest_within(budget_bytes - profile.baseline_bytes)
    assert best is not None  # the least-peak plan is always feasible at or above ``least``
    return _plan_from(profile, best)


def iter_uniform_plans(profile: ModelProfile) -> Iterator[tuple[int, Plan]]:
    """``(segments, predicted plan)`` for every ``checkpoint_sequential`` split 1..n."""
    for segments in range(1, len(profile) + 1):
        yield segments, evaluate_plan(profile, uniform_boundaries(len(profile), segments))
