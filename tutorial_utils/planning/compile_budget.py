"""PyTorch's own answer, measured: ``torch.compile`` with an activation memory budget.

``torch._functorch.config.activation_memory_budget`` (0 to 1) tells the min-cut partitioner of a
compiled training graph how much of the default saved-activation memory it may keep: at 1 it saves
what the default partitioner saves, lower budgets make it recompute more ops in backward, chosen by
a knapsack over recomputable ops (the PyTorch blog "Current and New Activation Checkpointing
Techniques in PyTorch"). This module compiles a model at several budgets and **measures** what each
compiled step keeps for backward: every tensor the compiled forward saves passes through
``saved_tensors_hooks``, counted once per storage; and its step time, timed in turns.
``backend="aot_eager_decomp_partition"`` runs the same partitioner without generating C++ code,
so it works on any machine; ``"inductor"`` also fuses kernels.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_utils.measurement.timing import Timing, time_interleaved
from tutorial_utils.units import MB


@dataclass(frozen=True)
class BudgetPoint:
    """One compiled step at one budget: what it saved for backward and how long it took."""

    budget: float
    saved_bytes: int  # storages saved for backward by the compiled forward, each counted once
    timing: Timing

    def describe(self) -> str:
        return (
            f"budget {self.budget:.2f}: saved {self.saved_bytes / MB:,.2f} MiB, "
            f"step {self.timing.describe()}"
        )


def saved_bytes_of(model: nn.Module, inputs: torch.Tensor) -> int:
    """Bytes of distinct storages autograd keeps for backward after ``model(inputs)``."""
    seen: dict[int, int] = {}
    parameters = {p.untyped_storage()._cdata for p in model.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in parameters:
            seen[storage._cdata] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(inputs)
    del output
    return sum(seen.values())


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

    steps, saved = {}, {}
    for budget in budgets:
        torch._dynamo.reset()
        copy_ = copy.deepcopy(model).train()
        with functorch_config.patch(activation_memory_budget=budget):
            compiled = torch.compile(copy_, backend=backend, dynamic=False)
            F.cross_entropy(compiled(inputs), targets).backward()  # compiles forward and backward
            saved[budget] = saved_bytes_of(cast(nn.Module, compiled), inputs)

        def step(compiled=compiled, copy_=copy_):
            copy_.zero_grad(set_to_none=True)
            F.cross_entropy(compiled(inputs), targets).backward()

        steps[budget] = step
    timings = time_interleaved(steps, repeats)
    return [BudgetPoint(b, saved[b], timings[b]) for b in budgets]
