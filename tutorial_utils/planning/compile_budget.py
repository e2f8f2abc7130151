"""PyTorch's own answer, measured: ``torch.compile`` with an activation memory budget.

``torch._functorch.config.activation_memory_budget`` (0 to 1) tells the min-cut partitioner of a
compiled training graph how much of the default saved-activation memory it may keep: at 1 it saves
what the default partitioner saves, lower budgets make it recompute more ops in backward, chosen by
a knapsack over recomputable ops (the PyTorch blog "Current and New Activation Checkpointing
Techniques in PyTorch"). This module compiles a model at several budgets and **measures** what each
compiled step keeps for backward: every tensor the compiled forward saves passes through
``saved_tensors_hooks``, counted once per storage by ``tools.SavedTensors``; and its step time,
timed in turns.
``backend="aot_eager_decomp_partition"`` runs the same partitioner without generating C++ code,
so it works on any machine; ``"inductor"`` also fuses kernels.

``CompileBudget(budget)`` is the same partition as a ``SequentialSchedule``
(``compile_budget_strategy(budget)`` is its ``Strategy``, which ``measure_step`` and the strategy
tables take): the model's forward and backward are traced
once by AOTAutograd (``aot_module``, the layer ``torch.compile`` hands its graph to), partitioned
by the same min-cut partitioner at that budget, and run op by op as ``aot_eager_decomp_partition``
runs them. Every op then passes through the memory tracker, so the step's whole peak is measured
like any other strategy's, on a device or as a dry run on meta. Inductor would fuse elementwise ops
and plan buffers, so its peak can be lower; the saved set, which the budget governs, is the same.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from tutorial_utils.checkpointing.strategy import Strategy, scheduled
from tutorial_utils.measurement.timing import Timing, time_interleaved
from tutorial_utils.tools import SavedTensors
from tutorial_utils.units import MiB

__all__ = [
    "budget_sweep",
    "BudgetPoint",
    "compile_budget_strategy",
    "CompileBudget",
    "saved_bytes_of",
]


@dataclass(frozen=True)
class BudgetPoint:
    """One compiled step at one budget: what it saved for backward and how long it took, and
    what the partitioner estimated it would save."""

    budget: float
    saved_bytes: int  # storages saved for backward by the compiled forward, each counted once
    timing: Timing
    # The partitioner's own figure for the values it chose to save (its ``_size_of``: each
    # value's full size from its shape, parameters included, views and shared storages counted
    # again); None where the partitioner was not reached. ``saved_with_parameters_bytes`` is the
    # measurement to compare it with: the same storages as ``saved_bytes`` plus the parameters.
    estimated_bytes: int | None = None
    saved_with_parameters_bytes: int | None = None

    def describe(self) -> str:
        line = (
            f"budget {self.budget:.2f}: saved {self.saved_bytes / MiB:,.2f} MiB, "
            f"step {self.timing.describe()}"
        )
        if self.estimated_bytes is not None and self.saved_with_parameters_bytes:
            line += (
                f"; with parameters {self.saved_with_parameters_bytes / MiB:,.2f} MiB measured, "
                f"{self.estimated_bytes / MiB:,.2f} MiB estimated by the partitioner "
                f"({self.estimated_bytes - self.saved_with_parameters_bytes:+,} bytes)"
            )
        return line


def saved_bytes_of(
    model: nn.Module,
    inputs: torch.Tensor,
    *,
    with_parameters: bool = False,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """Bytes of distinct storages autograd keeps for backward after ``model(inputs)``, or
    ``forward(inputs)`` (the parameters it keeps too, with ``with_parameters``: they cost nothing
    extra, but the partitioner's estimate counts them)."""
    with SavedTensors(leave_out=() if with_parameters else model.parameters()) as saved:
        (forward or model)(inputs)
    return saved.total_bytes


def budget_sweep(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    budgets: Sequence[float],
    *,
    backend: str = "aot_eager_decomp_partition",
    repeats: int = 3,
) -> list[BudgetPoint]:
    """Compile a copy of ``model`` at each budget, measure its saved bytes and time its training
    steps (forward, cross-entropy, backward) in turns across the budgets."""
    import torch._functorch.config as functorch_config

    steps, saved, with_parameters, estimated = {}, {}, {}, {}
    for budget in budgets:
        torch._dynamo.reset()
        copy_ = copy.deepcopy(model).train()
        with (
            functorch_config.patch(activation_memory_budget=budget),
            _partitioner_estimates() as seen,
        ):
            compiled = torch.compile(copy_, backend=backend, dynamic=False)
            F.cross_entropy(compiled(inputs), targets).backward()  # compiles forward and backward
        module = cast(nn.Module, compiled)
        saved[budget] = saved_bytes_of(module, inputs)
        with_parameters[budget] = saved_bytes_of(module, inputs, with_parameters=True)
        estimated[budget] = sum(seen) if seen else None

        def step(compiled=compiled, copy_=copy_):
            copy_.zero_grad(set_to_none=True)
            F.cross_entropy(compiled(inputs), targets).backward()

        steps[budget] = step
    timings = time_interleaved(steps, repeats)
    return [BudgetPoint(b, saved[b], timings[b], estimated[b], with_parameters[b]) for b in budgets]


@dataclass(frozen=True)
class CompileBudget:
    """``torch.compile``'s partition at ``activation_memory_budget=budget``, as a schedule of a
    Sequential (``compile_budget_strategy(0.5)`` is its ``Strategy``). Traced once per model,
    input shape and device (a trace takes about a second); run op by op, so measured."""

    budget: float
    _traced: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.budget <= 1.0:
            raise ValueError(f"a compile memory budget is a fraction in [0, 1], got {self.budget}")

    def forward(
        self,
        model: nn.Module,
        x: torch.Tensor,
        use_reentrant: bool = False,
        preserve_rng_state: bool = True,
    ) -> torch.Tensor:
        """``model(x)`` through the partitioned graph (``use_reentrant`` and
        ``preserve_rng_state`` do not apply: the graph's random ops are functionalized)."""
        key = (id(model), tuple(x.shape), x.dtype, x.device, model.training)
        if key not in self._traced:
            self._traced[key] = _trace_partitioned(model, x, self.budget)
        return self._traced[key](x)

    def __str__(self) -> str:
        return f"torch.compile partition, activation memory budget {self.budget:.2f}"


def _run_graph_as_is(graph: torch.fx.GraphModule, _inputs) -> Callable:
    """AOTAutograd's compiler hook that compiles nothing: the graph runs op by op."""
    from functorch.compile import make_boxed_func

    return make_boxed_func(graph.forward)


def _trace_partitioned(model: nn.Module, sample: torch.Tensor, budget: float) -> Callable:
    """``model`` traced by AOTAutograd with Inductor's decompositions and partitioned by the
    min-cut partitioner at ``budget``, as ``aot_eager_decomp_partition`` does. The trace runs
    outside any tracker or FLOP counter (it runs one forward on fake and real tensors), and the
    buffers that forward updates (BatchNorm's statistics) are put back."""
    import torch._functorch.config as functorch_config
    from functorch.compile import aot_module, min_cut_rematerialization_partition
    from torch._inductor.compile_fx import select_decomp_table

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    with (
        _disable_current_modes(),
        functorch_config.patch(activation_memory_budget=budget),
    ):
        traced = aot_module(
            model,
            fw_compiler=_run_graph_as_is,
            bw_compiler=_run_graph_as_is,
            partition_fn=functools.partial(
                min_cut_rematerialization_partition, compiler="inductor"
            ),
            decompositions=select_decomp_table(),
        )
        traced(sample.detach())  # the trace: forward and backward graphs, partitioned
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    return traced


@contextlib.contextmanager
def _partitioner_estimates() -> Iterator[list[int]]:
    """The bytes the min-cut partitioner estimates for the values it saves, one entry per graph
    it partitions: its ``choose_saved_values_set`` is wrapped (looked up by name when it runs)
    and its chosen values sized with its own ``_size_of``, the "Theoretical Activations Stored"
    it logs under ``AOT_PARTITIONER_DEBUG``."""
    from torch._functorch import partitioners

    estimates: list[int] = []
    if not hasattr(partitioners, "choose_saved_values_set") or not hasattr(
        partitioners, "_size_of"
    ):
        yield estimates  # a torch without them: no estimate, said as None
        return
    original = partitioners.choose_saved_values_set

    def choose(*args, **kwargs):
        chosen = original(*args, **kwargs)
        estimates.append(sum(partitioners._size_of(node) for node in chosen))
        return chosen

    partitioners.choose_saved_values_set = choose
    try:
        yield estimates
    finally:
        partitioners.choose_saved_values_set = original


def compile_budget_strategy(budget: float) -> Strategy:
    """The ``Strategy`` that runs a Sequential through ``CompileBudget(budget)``. Its figures move
    with the torch release (the partitioner and its decompositions change), so a notebook shows
    them apart from the plans' release-independent ones."""
    return scheduled(CompileBudget(budget), f"compile budget {budget:.2f}", kind="compile-budget")
