"""Nested (multi-level) checkpointing of a Sequential: recompute some modules more than once.

One level of checkpointing keeps each segment's input and recomputes the segment once: on a chain
of n similar modules the best it does is about sqrt(2n) tensors. Checkpointing *inside* the
recomputation of a segment keeps fewer still, at the price of running some modules three or more
times (Chen et al. 2016, section 4; Griewank and Walther's binomial "revolve"; Beaumont et al. 2019
for chains of unequal stages). PyTorch runs such a schedule as nested non-reentrant ``checkpoint``
calls: while an outer segment is recomputed, an inner ``checkpoint`` keeps only its own input.

The schedule and the program, derived here for this package's cost model
------------------------------------------------------------------------
A schedule of modules ``s..e-1`` is a list of items run in order: a module run plainly (it keeps
what it saves for backward), or a *child* ``[s, k)`` run under ``checkpoint`` (it keeps only its
input ``x_s``), whose recomputation in backward follows its own inner schedule. Let ``C(s, e, p)[m]``
be the least forward cost (recomputation included) of running and back-propagating ``s..e-1`` with
``m`` bytes free, where ``p`` says whether ``x_s`` is already held by someone else (the batch, a
checkpoint, or the module before, which saved its output). The first item is either

* module ``s`` plainly: ``f_s + C(s+1, e, s saves its output)[m - keep_s]``, feasible when its
  forward and its backward (``keep_s`` + output and input gradients) fit in ``m``; or
* a child ``[s, k)``: it holds ``x_s`` (``h`` = its size unless ``p``), runs ``s..k-1`` once
  without keeping anything, then the rest: ``F(s, k) + C(k, e, False)[m - h] + C(s, k, True)[m - h]``,
  the last term being the child's recomputation, which runs while the gradient of ``x_k`` exists
  (every forward inside ``C(s, k, ...)`` is charged that gradient's bytes).

Each subproblem depends only on shorter ones, so the table is filled by increasing length,
vectorised over ``m`` (memory in slots of equal size). A one-level plan is the special case where
every child's inner schedule is all plain, so the nested optimum is never worse in the model. The
same model is written a second time as a direct simulation of a schedule (``simulate``); the tests
check the program against exhaustive enumeration of every schedule of small chains, and the
schedule's real peak is measured by a dry run (``planning.budget``).

What the model leaves out: parameter gradients are charged as if all existed from the start (a
constant, which over-counts early in backward), and the loss's own tensors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from tutorial_utils.checkpointing.batchnorm import run_keeping_batchnorm
from tutorial_utils.checkpointing.strategy import scheduled
from tutorial_utils.measurement.dry_run import dry_run_step
from tutorial_utils.measurement.step import StepReport
from tutorial_utils.planning.planner import Plan, plan_from_profile, recompute_label
from tutorial_utils.planning.profile import ModelProfile
from tutorial_utils.units import MiB

__all__ = [
    "Item",
    "nested_from_profile",
    "nested_plan",
    "NestedComparison",
    "NestedPlan",
    "NestedProgram",
    "one_level_against_nested",
    "one_level_schedule",
    "parameter_bytes",
    "runs_per_module",
    "simulate",
]

# An item of a schedule: ("plain", i) or ("child", start, end, inner schedule).
Item = tuple
MAX_SLOTS = 256  # memory resolution of the program: the budget cut into at most this many slots


@dataclass(frozen=True)
class _Chain:
    """Per-module bytes and costs the program and the simulation read (bytes exact)."""

    x: list[int]  # input bytes (0 for module 0: the batch is in the baseline)
    out: list[int]  # new output storage
    internal: list[int]
    saves_input: list[bool]
    saves_output: list[bool]
    grad_out: list[int]  # gradient of the output
    grad_in: list[int]  # gradient of the input (0 for module 0)
    cost: list[float]  # forward cost: seconds, or FLOPs on meta

    @classmethod
    def of(cls, profile: ModelProfile) -> _Chain:
        layers = profile.layers
        return cls(
            x=[layer.input_bytes if i else 0 for i, layer in enumerate(layers)],
            out=[layer.output_bytes for layer in layers],
            internal=[layer.internal_bytes for layer in layers],
            saves_input=[layer.saves_input for layer in layers],
            saves_output=[layer.saves_output for layer in layers],
            grad_out=[layer.output_bytes or layer.input_bytes for layer in layers],
            grad_in=[layer.input_bytes if i else 0 for i, layer in enumerate(layers)],
            cost=[float(layer.recompute_cost) for layer in layers],
        )

    def keep(self, i: int, held: bool) -> int:
        """What a plain module keeps for backward (its input only if nobody holds it yet)."""
        return (
            self.internal[i]
            + self.x[i] * (self.saves_input[i] and not held)
            + self.out[i] * self.saves_output[i]
        )

    def forward_charge(self, i: int, input_counted: bool) -> int:
        return (0 if input_counted else self.x[i]) + self.out[i] + self.internal[i]

    def gradient_during(self, e: int) -> int:
        """Bytes of the gradient alive while modules before ``e`` are recomputed (0 at the end)."""
        return 0 if e == len(self.x) else self.grad_out[e - 1]


def simulate(profile: ModelProfile, schedule: tuple[Item, ...]) -> tuple[int, float]:
    """(peak bytes above baseline and parameter gradients, total forward cost) of a schedule,
    walked op by op in the program's model."""
    chain = _Chain.of(profile)
    peak, cost = _walk(chain, schedule, held=True, gradient=0, live=0)
    return peak, cost


def _walk(chain: _Chain, items, held: bool, gradient: int, live: int) -> tuple[int, float]:
    peak, cost, stack = live, 0.0, []
    for item in items:
        if item[0] == "plain":
            i = item[1]
            peak = max(peak, live + chain.forward_charge(i, held) + gradient)
            keep = chain.keep(i, held)
            live += keep
            stack.append((item, keep))
            held = chain.saves_output[i]
            cost += chain.cost[i]
        else:
            _, s, k, _inner = item
            hold = 0 if held else chain.x[s]
            live += hold
            for i in range(s, k):
                peak = max(peak, live + chain.forward_charge(i, i == s) + gradient)
                cost += chain.cost[i]
            stack.append((item, hold))
            held = False
    for item, kept in reversed(stack):
        if item[0] == "plain":
            i = item[1]
            peak = max(peak, live + chain.grad_out[i] + chain.grad_in[i])
        else:
            _, s, k, inner = item
            inner_peak, inner_cost = _walk(chain, inner, True, chain.grad_out[k - 1], live)
            peak, cost = max(peak, inner_peak), cost + inner_cost
        live -= kept
    return peak, cost


class NestedProgram:
    """The dynamic program above, solved once for every budget up to ``max_bytes``."""

    def __init__(self, profile: ModelProfile, max_bytes: int):
        self.profile = profile
        self.chain = chain = _Chain.of(profile)
        n = len(profile)
        # Memory in slots: the common divisor of the sizes that matter at this resolution (exact
        # for them, tiny tensors rounded up to a slot), else the range cut in MAX_SLOTS.
        sizes = [*chain.x, *chain.out, *chain.internal, *chain.grad_out]
        coarse = max(1, max_bytes // MAX_SLOTS)
        exact = functools.reduce(math.gcd, [b for b in sizes if b >= coarse], 0) or 1
        self.slot = exact if max_bytes // exact <= MAX_SLOTS else -(-max_bytes // MAX_SLOTS)
        self.slots = max_bytes // self.slot
        scale = sum(chain.cost) or 1.0  # costs in units of one forward pass (float32 is enough)
        self.forward_cost = sum(chain.cost)
        self._fill(n, [c / scale for c in chain.cost], scale)

    def _units(self, nbytes: int) -> int:
        return -(-nbytes // self.slot)

    def _fill(self, n: int, cost: list[float], scale: float) -> None:
        chain, width = self.chain, self.slots + 1
        units = self._units
        self.table = np.full((2, n + 1, n + 1, width), np.inf, dtype=np.float32)
        self.choice = np.full((2, n + 1, n + 1, width), -2, dtype=np.int16)
        self.table[:, np.arange(n + 1), np.arange(n + 1), :] = 0.0
        prefix = np.concatenate([[0.0], np.cumsum(cost)])
        m = np.arange(width)
        first = [units(chain.forward_charge(i, True)) for i in range(n)]  # input held
        later = [units(chain.forward_charge(i, False)) for i in range(n)]
        keep = [[units(chain.keep(i, held)) for held in (False, True)] for i in range(n)]
        backward = [units(chain.grad_out[i] + chain.grad_in[i]) for i in range(n)]
        hold_of = [units(b) for b in chain.x]
        gradient = [units(chain.gradient_during(e)) for e in range(n + 1)]
        # running[s][j]: the largest forward charge of s..s+j run without keeping (x_s held)
        running = [np.maximum.accumulate(np.array([first[s], *later[s + 1 :]])) for s in range(n)]
        infinite = np.full(width, np.inf, dtype=np.float32)
        for length in range(1, n + 1):
            for s in range(0, n - length + 1):
                e = s + length
                g = gradient[e]
                ks = np.arange(s + 1, e)
                for held in (0, 1):
                    best = infinite.copy()
                    pick = np.full(width, -1, dtype=np.int16)
                    kept = keep[s][held]
                    need = max((first if held else later)[s] + g, kept + backward[s])
                    rest = self.table[int(chain.saves_output[s]), s + 1, e]
                    if need < width:
                        start = max(need, kept)
                        best[start:] = cost[s] + rest[start - kept : width - kept]
                    if length > 1:
                        hold = 0 if held else hold_of[s]
                        both = np.full((len(ks), width), np.inf, dtype=np.float32)
                        np.add(
                            self.table[0, s + 1 : e, e, : width - hold],
                            self.table[1, s, s + 1 : e, : width - hold],
                            out=both[:, hold:],
                        )
                        both += (prefix[ks] - prefix[s])[:, None].astype(np.float32)
                        both[m[None, :] < (hold + running[s][: len(ks)] + g)[:, None]] = np.inf
                        k_best = both.argmin(axis=0)
                        child = both[k_best, m]
                        better = child < best
                        best[better], pick[better] = child[better], ks[k_best][better]
                    pick[~np.isfinite(best)] = -2
                    self.table[held, s, e], self.choice[held, s, e] = best, pick
        self.scale = scale

    def cost_at(self, budget_bytes: int) -> float:
        """Least total forward cost (one forward + recompute) within ``budget_bytes``; inf if none."""
        m = min(self.slots, budget_bytes // self.slot)
        return float(self.table[1, 0, len(self.profile), m]) * self.scale if m >= 0 else math.inf

    def least_slots(self, max_cost: float | None = None) -> int | None:
        """The fewest slots whose least cost is finite (and at most ``max_cost``, if given)."""
        curve = self.table[1, 0, len(self.profile)].astype(np.float64) * self.scale
        ok = np.isfinite(curve)
        if max_cost is not None:
            ok &= curve <= max_cost * (1 + 1e-6)
        where = np.flatnonzero(ok)
        return int(where[0]) if len(where) else None

    def schedule(self, slots: int) -> tuple[Item, ...]:
        """The schedule the program chose for ``slots`` of memory."""
        return self._rebuild(0, len(self.profile), 1, min(slots, self.slots))

    def _rebuild(self, s: int, e: int, held: int, m: int) -> tuple[Item, ...]:
        items: list[Item] = []
        chain = self.chain
        while s < e:
            pick = int(self.choice[held, s, e, m])
            if pick == -2:
                raise ValueError("no schedule fits this budget")
            if pick == -1:
                items.append(("plain", s))
                m -= self._units(chain.keep(s, bool(held)))
                held, s = int(chain.saves_output[s]), s + 1
            else:
                m -= 0 if held else self._units(chain.x[s])
                items.append(("child", s, pick, self._rebuild(s, pick, 1, m)))
                held, s = 0, pick
        return tuple(items)


def runs_per_module(schedule: tuple[Item, ...], n_modules: int) -> list[int]:
    """How many times each module's forward runs in one step under ``schedule``."""
    counts = [0] * n_modules
    _count(schedule, counts, extra=0)
    return counts


def _count(items, counts: list[int], extra: int) -> None:
    for item in items:
        if item[0] == "plain":
            counts[item[1]] += 1 + extra
        else:
            _, s, k, inner = item
            for i in range(s, k):
                counts[i] += 1 + extra  # the first, discarded run
            _count(inner, counts, extra)  # plus every recomputation inside it


@dataclass(frozen=True)
class NestedPlan:
    """A nested checkpoint schedule for a Sequential and what it is predicted to cost.

    A ``SequentialSchedule``: ``scheduled(plan)`` is the strategy every step, sweep and loop
    takes (``dry_run_step(model, shape, scheduled(plan))``). ``boundaries`` are the top-level runs
    (a child is one checkpointed run); ``runs`` how many times each module runs per step.
    """

    schedule: tuple[Item, ...]
    predicted_peak_bytes: int
    baseline_bytes: int
    recompute_seconds: float | None
    recompute_flops: int
    runs: tuple[int, ...]
    layer_names: tuple[str, ...] = field(default=(), repr=False)
    measured_peak_bytes: int | None = None
    time_source: str = "measured"  # of recompute_seconds: ModelProfile.time_source

    @property
    def boundaries(self) -> list[tuple[int, int, bool]]:
        return [
            (item[1], item[1] + 1, False) if item[0] == "plain" else (item[1], item[2], True)
            for item in self.schedule
        ]

    @property
    def checkpointed_segments(self) -> int:
        return sum(item[0] == "child" for item in self.schedule)

    @property
    def depth(self) -> int:
        """Nesting depth: 1 for a one-level plan."""
        return max(self.runs) - 1

    def recompute_label(self) -> str:
        return recompute_label(self.recompute_seconds, self.recompute_flops, self.time_source)

    def forward(
        self,
        model: nn.Sequential,
        x: torch.Tensor,
        use_reentrant: bool = False,
        preserve_rng_state: bool = True,
    ) -> torch.Tensor:
        """``model(x)`` as nested non-reentrant ``checkpoint`` calls; BatchNorm kept right."""
        if use_reentrant:
            raise ValueError("nested checkpointing needs use_reentrant=False")
        if len(model) != len(self.runs):
            raise ValueError(
                f"this plan covers {len(self.runs)} modules but the model has {len(model)}: "
                "plan again with plan_checkpoints(model, sample_input, nested=True)"
            )
        return _run_items(list(model), self.schedule, preserve_rng_state, x)

    def __str__(self) -> str:
        return (
            f"NestedPlan[depth {self.depth}, {self.checkpointed_segments} top-level checkpoints] "
            f"predicted peak {self.predicted_peak_bytes / MiB:.1f} MiB, {self.recompute_label()}"
        )

    def describe(self) -> str:
        """The schedule as an indented outline, and how often each module runs."""
        lines = [str(self)]
        _outline(self.schedule, self.layer_names, lines, indent="  ")
        lines.append("runs per module: " + " ".join(str(r) for r in self.runs))
        return "\n".join(lines)


def _outline(items, names, lines: list[str], indent: str) -> None:
    for item in items:
        if item[0] == "plain":
            lines.append(f"{indent}kept          {names[item[1]] if names else item[1]}")
        else:
            _, s, k, inner = item
            span = f"{names[s]} .. {names[k - 1]}" if names else f"{s}..{k - 1}"
            lines.append(f"{indent}checkpointed  {span}")
            if any(sub[0] == "child" for sub in inner):
                _outline(inner, names, lines, indent + "    ")


def _run_items(modules: list[nn.Module], items, preserve_rng_state: bool, x: torch.Tensor):
    for item in items:
        if item[0] == "plain":
            x = run_keeping_batchnorm([modules[item[1]]], x)
        else:
            run = functools.partial(_run_items, modules, item[3], preserve_rng_state)
            x = checkpoint(run, x, use_reentrant=False, preserve_rng_state=preserve_rng_state)
    return x


def parameter_bytes(profile: ModelProfile) -> int:
    return sum(layer.parameter_bytes for layer in profile.layers)


def nested_plan(profile: ModelProfile, schedule: tuple[Item, ...]) -> NestedPlan:
    """A schedule with its predicted peak (baseline + every parameter gradient + simulated peak)."""
    peak, _ = simulate(profile, schedule)
    runs = runs_per_module(schedule, len(profile))
    extra = [r - 1 for r in runs]
    layers = profile.layers
    return NestedPlan(
        schedule=schedule,
        predicted_peak_bytes=profile.baseline_bytes + parameter_bytes(profile) + peak,
        baseline_bytes=profile.baseline_bytes,
        recompute_seconds=(
            sum(x * (layer.forward_seconds or 0.0) for x, layer in zip(extra, layers, strict=True))
            if profile.timed  # every layer has its forward_seconds
            else None
        ),
        recompute_flops=sum(
            x * layer.forward_flops for x, layer in zip(extra, layers, strict=True)
        ),
        runs=tuple(runs),
        layer_names=tuple(layer.name for layer in layers),
        time_source=profile.time_source,
    )


def one_level_schedule(boundaries: list[tuple[int, int, bool]]) -> tuple[Item, ...]:
    """A one-level plan's boundaries as a schedule (each checkpointed run a child, plain inside)."""
    items: list[Item] = []
    for start, end, checkpointed in boundaries:
        if checkpointed:
            items.append(("child", start, end, tuple(("plain", i) for i in range(start, end))))
        else:
            items.extend(("plain", i) for i in range(start, end))
    return tuple(items)


def nested_from_profile(
    profile: ModelProfile,
    budget_bytes: int | None = None,
    *,
    max_recompute: float | None = None,
    max_bytes: int | None = None,
) -> NestedPlan:
    """The nested schedule of least recompute within ``budget_bytes`` (whole predicted peak);
    without a budget, the least peak whose recompute is at most ``max_recompute`` (seconds, or
    FLOPs on meta), or the least peak at all. ``max_bytes`` bounds the program's memory range
    (default: the budget, or the peak of running every module plainly)."""
    fixed = profile.baseline_bytes + parameter_bytes(profile)
    plain_peak, _ = simulate(profile, tuple(("plain", i) for i in range(len(profile))))
    if budget_bytes is not None:
        room = budget_bytes - fixed
        if room <= 0:
            raise ValueError(
                f"budget {budget_bytes / MiB:.1f} MiB is below parameters, gradients, buffers and "
                f"batch ({fixed / MiB:.1f} MiB): raise the budget or shrink the batch"
            )
        program = NestedProgram(profile, min(room, max_bytes or room, plain_peak))
        slots = program.least_slots()
        if slots is None or not math.isfinite(program.cost_at(room)):
            raise ValueError(
                f"no nested schedule fits {budget_bytes / MiB:.1f} MiB in the cost model: "
                "raise the budget or shrink the batch"
            )
        best = program.cost_at(room)
        slots = program.least_slots(best)
    else:
        program = NestedProgram(profile, max_bytes or plain_peak)
        limit = None if max_recompute is None else program.forward_cost + max_recompute
        slots = program.least_slots(limit)
        if slots is None:
            raise ValueError("no nested schedule meets that recompute limit: raise it")
    assert slots is not None, "a finite cost has a least slot count"
    return nested_plan(profile, program.schedule(slots))


@dataclass(frozen=True)
class NestedComparison:
    """A one-level plan and a nested plan of the same model, each measured by a dry run."""

    forward_flops: int  # one forward pass of the whole model: the unit of recompute
    plans: dict[str, Plan | NestedPlan]  # "one level", "nested"
    reports: dict[str, StepReport]  # the same keys: each plan's dry-run step


def one_level_against_nested(
    model: nn.Sequential, input_shape: tuple[int, ...], profile: ModelProfile
) -> NestedComparison:
    """The one-level least-peak plan and the nested plan of least activation memory within one
    extra forward pass of recompute over it, both measured by dry run."""
    one_level = plan_from_profile(profile)
    forward = sum(layer.forward_flops for layer in profile.layers)
    ceiling, _ = simulate(profile, one_level_schedule(one_level.boundaries))
    nested = nested_from_profile(
        profile, max_recompute=one_level.recompute_flops + forward, max_bytes=ceiling
    )
    plans: dict[str, Plan | NestedPlan] = {"one level": one_level, "nested": nested}
    reports = {
        name: dry_run_step(model, input_shape, scheduled(plan)) for name, plan in plans.items()
    }
    return NestedComparison(forward, plans, reports)
