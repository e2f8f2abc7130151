"""A time model that sees memory-bound ops: the roofline, op by op, on the meta device.

FLOPs alone call ReLU, BatchNorm, pooling and the optimizer free, so a plan that recomputes them
looks free too. Each op here is charged the larger of its arithmetic time (FLOPs / peak FLOP/s)
and its memory time (bytes read and written / bandwidth): the roofline. FLOPs come from PyTorch's
formulas (``measurement.flops.FORMULAS``); bytes are the sizes of the op's tensor inputs and
outputs, which a dry run knows exactly. Peak FLOP/s and bandwidth come from ``measure_machine``: a
short matrix product and a large copy on this machine (labelled measured), or figures quoted for a
named device (labelled quoted). Ops are charged one by one, so overlap between them and caches
that keep a tensor between ops are not modelled. A fused attention kernel told the mask is causal
(FlashAttention, cuDNN, memory-efficient) skips the blocks above the diagonal, so it is charged
half the FLOPs of PyTorch's formula, which counts the whole S x S product.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tutorial_utils.checkpointing.strategy import Strategy
from tutorial_utils.measurement.dry_run import on_meta
from tutorial_utils.measurement.flops import FORMULAS, _formula_arguments
from tutorial_utils.measurement.op_tensors import op_tensors
from tutorial_utils.measurement.step import default_optimizer, prime_optimizer_state
from tutorial_utils.units import MiB

__all__ = ["Machine", "measure_machine", "roofline_ratios", "RooflineCounter"]


@dataclass(frozen=True)
class Machine:
    """What a roofline needs to know about a device, and where the figures come from."""

    name: str
    flops_per_second: float
    bytes_per_second: float
    source: str  # "measured ..." or "quoted ..."

    def describe(self) -> str:
        return (
            f"{self.name}: {self.flops_per_second / 1e9:,.0f} GFLOP/s, "
            f"{self.bytes_per_second / 1e9:,.1f} GB/s ({self.source})"
        )


def _best_of(work: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def measure_machine(side: int = 1024, copy_mib: int = 64, repeats: int = 5) -> Machine:
    """Peak FLOP/s from a float32 ``side`` x ``side`` matrix product and bandwidth from copying
    ``copy_mib`` MiB, best of ``repeats`` each, on this machine's CPU (well under a second)."""
    a, b = torch.randn(side, side), torch.randn(side, side)
    matmul = _best_of(lambda: a @ b, repeats)
    source = torch.empty(copy_mib * MiB // 4)
    target = torch.empty_like(source)
    copy = _best_of(lambda: target.copy_(source), repeats)
    return Machine(
        name=f"this machine's CPU ({torch.get_num_threads()} threads)",
        flops_per_second=2 * side**3 / matmul,
        bytes_per_second=2 * source.nbytes / copy,  # read and written
        source=f"measured: {side}x{side} matmul and a {copy_mib} MiB copy, best of {repeats}",
    )


def _tensor_bytes(values) -> int:
    return sum(value.numel() * value.element_size() for value in op_tensors(values))


_ALLOCATIONS = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided}
# ops that move no bytes though their schema does not say they are views: ``_unsafe_view``
# reinterprets its input's storage (a reshape after a matmul), like ``view``; ``prim`` ops
# (``prim.device``, ``prim.layout``) read a tensor's metadata, not its data
_NO_BYTES = {*_ALLOCATIONS, torch.ops.aten._unsafe_view}


def causal_share(func, args: tuple, kwargs: dict) -> float:
    """The share of its formula's FLOPs a fused attention op computes: 0.5 when told its mask is
    causal (the kernel skips the blocks above the diagonal), else 1."""
    names = [argument.name for argument in func._schema.arguments]
    if "is_causal" not in names:
        return 1.0
    index = names.index("is_causal")
    causal = kwargs.get("is_causal", args[index] if index < len(args) else False)
    return 0.5 if causal else 1.0


class RooflineCounter(TorchDispatchMode):
    """Predicted seconds, FLOPs and bytes moved of every op run inside ``with counter:``."""

    def __init__(self, machine: Machine) -> None:
        super().__init__()
        self.machine = machine
        self.seconds = 0.0
        self.flops = 0
        self.bytes = 0
        self.memory_bound_seconds = 0.0  # the part of ``seconds`` set by bandwidth

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        counted = _formula_arguments(packet, args)  # grouped-query heads, as older torch needs
        flops = 0
        if packet in FORMULAS:
            formula = FORMULAS[packet](*counted, **kwargs, out_val=out)
            flops = int(formula * causal_share(func, args, kwargs))
        # A view (detach, t, view) and an uninitialised allocation (empty) move no bytes;
        # charging them would also make the prediction depend on how many of them a torch
        # release's kernels emit (torch 2.9 emits twice as many detaches as 2.14).
        moves_nothing = func.is_view or packet in _NO_BYTES or func.namespace == "prim"
        moved = 0 if moves_nothing else _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        arithmetic = flops / self.machine.flops_per_second
        memory = moved / self.machine.bytes_per_second
        self.seconds += max(arithmetic, memory)
        self.memory_bound_seconds += memory if memory > arithmetic else 0.0
        self.flops += flops
        self.bytes += moved
        return out


def roofline_step(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    strategy: Strategy,
    machine: Machine,
) -> RooflineCounter:
    """One training step (forward, cross-entropy, backward, SGD with momentum) as a dry run,
    charged op by op on ``machine``'s roofline."""
    run = on_meta(model).train()
    x = torch.empty(inputs.shape, dtype=inputs.dtype, device="meta")
    y = torch.empty(targets.shape, dtype=targets.dtype, device="meta")
    optimizer = default_optimizer(run.parameters())
    prime_optimizer_state(optimizer)
    with RooflineCounter(machine) as counter:
        with strategy.applied(run):
            output = run(x)
        F.cross_entropy(output, y).backward()
        optimizer.step()
    run.zero_grad(set_to_none=True)
    return counter


def roofline_ratios(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    strategies: dict[str, Strategy],
    machine: Machine,
) -> dict[str, float]:
    """Each strategy's predicted step time over the first strategy's (the roofline's ratio)."""
    seconds = {
        name: roofline_step(model, inputs, targets, strategy, machine).seconds
        for name, strategy in strategies.items()
    }
    reference = next(iter(seconds.values()))
    return {name: value / reference for name, value in seconds.items()}
