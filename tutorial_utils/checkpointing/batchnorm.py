"""BatchNorm under checkpointing: the recomputation updates the running statistics a second time.

A checkpointed segment runs its forward twice per step, once in the forward pass and once when
backward needs its activations. A BatchNorm in training mode updates ``running_mean``,
``running_var`` and ``num_batches_tracked`` every time it runs, so with torch 2.x every
checkpointed BatchNorm is updated twice per step, in reentrant and in non-reentrant mode alike
(early stop does not help: BatchNorm saves tensors for backward, so the recomputation reaches it).
Here: snapshots to compare, a per-step update count, and the fixes: compensated momentum, hooks
on the whole model (``freeze_stats_during_recompute``) and, for code that runs the checkpointed
modules itself, ``run_keeping_batchnorm`` (what the planner's plans, nested plans and every
``strategy.Strategy`` with ``keep_batchnorm=True``, the default, use).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.hooks import RemovableHandle

__all__ = [
    "batchnorm_layers",
    "compensate_momentum",
    "compensated_momentum",
    "counter_ratio",
    "freeze_stats_during_recompute",
    "is_recomputing",
    "largest_difference",
    "relative_distance",
    "run_keeping_batchnorm",
    "running_stats",
    "RunningStats",
    "stats_match",
    "updates_per_step",
]

STAT_NAMES = ("running_mean", "running_var", "num_batches_tracked")
RunningStats = dict[str, dict[str, torch.Tensor]]


def batchnorm_layers(model: nn.Module) -> dict[str, _BatchNorm]:
    """Every BatchNorm that tracks running statistics, by qualified name."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, _BatchNorm) and module.track_running_stats
    }


def running_stats(model: nn.Module) -> RunningStats:
    """Copies of each BatchNorm's running_mean, running_var and num_batches_tracked."""
    return {
        name: {stat: getattr(module, stat).detach().clone() for stat in STAT_NAMES}
        for name, module in batchnorm_layers(model).items()
    }


def stats_match(
    stats: RunningStats,
    reference: RunningStats,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    counters: bool = True,
) -> bool:
    """True when every running mean and variance (and counter, with ``counters``) equals the
    reference's within tolerance."""
    if stats.keys() != reference.keys():
        return False
    compared = STAT_NAMES if counters else STAT_NAMES[:2]
    return all(
        torch.allclose(stats[name][stat].double(), reference[name][stat].double(), rtol, atol)
        for name in reference
        for stat in compared
    )


def counter_ratio(stats: RunningStats, reference: RunningStats) -> float:
    """Total num_batches_tracked relative to the reference's: 2.0 for a doubled update."""
    total = sum(int(layer["num_batches_tracked"]) for layer in stats.values())
    reference_total = sum(int(layer["num_batches_tracked"]) for layer in reference.values())
    if reference_total == 0:
        raise ValueError("the reference has no BatchNorm updates: run a training step first")
    return total / reference_total


def relative_distance(stats: RunningStats, reference: RunningStats) -> float:
    """||stats - reference|| / ||reference|| over all running means and variances."""
    difference = reference_norm = 0.0
    for name, layer in reference.items():
        for stat in ("running_mean", "running_var"):
            difference += float((stats[name][stat] - layer[stat]).double().pow(2).sum())
            reference_norm += float(layer[stat].double().pow(2).sum())
    return math.sqrt(difference / reference_norm)


def largest_difference(stats: RunningStats, reference: RunningStats) -> float:
    """The largest absolute difference of any running mean or variance from the reference's: 0
    where they are identical, rounding-sized where only the arithmetic differed."""
    return max(
        (
            float((stats[name][stat].double() - layer[stat].double()).abs().max())
            for name, layer in reference.items()
            for stat in STAT_NAMES[:2]
        ),
        default=0.0,
    )


def updates_per_step(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, int]:
    """How often one forward + backward updates each BatchNorm (run on a deep copy of ``model``)."""
    probe = copy.deepcopy(model).train()
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    before = running_stats(probe)
    loss_fn(probe(inputs), targets).backward()
    after = running_stats(probe)
    return {
        name: int(after[name]["num_batches_tracked"] - before[name]["num_batches_tracked"])
        for name in before
    }


def compensated_momentum(momentum: float, updates: int = 2) -> float:
    """The momentum m' with (1 - m')**updates == 1 - m: ``updates`` updates act as one.

    Exact only when every update sees the same batch statistics, which is what a recomputation
    does (same weights, same inputs, RNG state restored).
    """
    if not 0 < momentum <= 1 or updates < 1:
        raise ValueError(f"need 0 < momentum <= 1 and updates >= 1, got {momentum}, {updates}")
    return 1 - (1 - momentum) ** (1 / updates)


def compensate_momentum(model: nn.Module, updates: Mapping[str, int]) -> dict[str, float]:
    """Set each BatchNorm updated ``n > 1`` times per step to ``compensated_momentum(m, n)``.

    ``updates`` comes from ``updates_per_step``. Fixes running_mean/var, not the counter (which
    only matters for ``momentum=None``, the cumulative average, where this fix cannot apply).
    Returns the new momenta by layer name.
    """
    layers = batchnorm_layers(model)
    changed = {}
    for name, count in updates.items():
        if count <= 1:
            continue
        momentum = layers[name].momentum
        if momentum is None:
            raise ValueError(
                f"{name} uses momentum=None (cumulative average): use "
                "freeze_stats_during_recompute instead"
            )
        changed[name] = layers[name].momentum = compensated_momentum(momentum, count)
    return changed


def is_recomputing() -> bool:
    """True while the autograd engine runs a backward pass on this thread.

    A training-mode forward that runs inside backward is a checkpoint recomputation (reentrant and
    non-reentrant alike; double backward through a forward is the rare exception).
    ``torch.utils.checkpoint`` keys its own recomputations by the same graph-task id; the call is
    private, so the public route, where you write the ``checkpoint`` call yourself, is
    ``checkpoint(..., use_reentrant=False, context_fn=...)`` whose second context wraps the
    recomputation.
    """
    return torch._C._current_graph_task_id() != -1


class _FreezeDuringRecompute:
    """A forward pre-hook and an always-called forward hook that turn a recomputation's statistics
    update into a no-op.

    Momentum 0 leaves running_mean and running_var exactly as they were (a cumulative average,
    ``momentum=None``, is covered too) and the counter is hidden (``BatchNorm`` skips it when it is
    None), as in ``statistics_unchanged``. The op itself is unchanged, so the recomputation saves
    the same tensors as the original forward, which both checkpoint modes check. The restoring
    hook is registered with ``always_call=True`` because the recomputation can end inside the
    BatchNorm: non-reentrant checkpoint's early stop raises from the op once it has saved the
    last tensor backward needs, and a forward hook without it would then never run.
    """

    def __init__(self) -> None:
        self.hidden: dict[int, tuple[float | None, torch.Tensor | None]] = {}

    def before(self, module: _BatchNorm, _inputs) -> None:
        # already hidden only when a BaseException skipped ``after``: keep the values it holds
        if module.training and is_recomputing() and id(module) not in self.hidden:
            self.hidden[id(module)] = (module.momentum, module.num_batches_tracked)
            module.momentum = 0.0
            module.num_batches_tracked = None

    def after(self, module: _BatchNorm, _inputs, _output) -> None:
        if id(module) in self.hidden:
            module.momentum, module.num_batches_tracked = self.hidden.pop(id(module))


def freeze_stats_during_recompute(model: nn.Module) -> list[RemovableHandle]:
    """Make every BatchNorm in ``model`` skip its statistics update when it is recomputed.

    Works for either checkpoint mode, with or without early stop, and any choice of segments;
    the counter and momentum stay right even when the recomputation ends inside a BatchNorm.
    Call ``handle.remove()`` on the returned handles to undo.
    """
    hooks = _FreezeDuringRecompute()
    handles = []
    for module in batchnorm_layers(model).values():
        handles.append(module.register_forward_pre_hook(hooks.before))
        # prepended: restores run in the reverse order of the hides when a model is frozen twice
        handles.append(module.register_forward_hook(hooks.after, prepend=True, always_call=True))
    return handles


@contextmanager
def statistics_unchanged(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Inside the block, every training BatchNorm in ``modules`` normalises as usual but leaves its
    running statistics and counter as they were.

    Momentum 0 makes the kernel's own update a no-op and the counter is hidden for the duration
    (``BatchNorm`` skips it when it is None), so no extra tensor op runs: selective checkpointing
    checks that a recomputation runs the forward's ops.
    """
    layers = [
        layer
        for module in modules
        for layer in module.modules()
        if isinstance(layer, _BatchNorm) and layer.track_running_stats and layer.training
    ]
    saved = [(layer, layer.momentum, layer.num_batches_tracked) for layer in layers]
    for layer in layers:
        layer.momentum = 0.0
        layer.num_batches_tracked = None
    try:
        yield
    finally:
        for layer, momentum, counter in saved:
            layer.momentum = momentum
            layer.num_batches_tracked = counter


def run_keeping_batchnorm(modules: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """``modules`` applied in turn; when this run is a checkpoint's recomputation, BatchNorm's
    statistics are left alone, so the step updates them once, as an un-checkpointed step does."""
    with statistics_unchanged(modules) if is_recomputing() else nullcontext():
        for module in modules:
            x = module(x)
    return x
