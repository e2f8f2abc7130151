"""The work of a training step in FLOPs, split by phase: time's stand-in where no time exists.

A dry run on the meta device has exact memory but no time. What it does have is every op with
its shapes, and PyTorch's FLOP formulas (``torch.utils.flop_counter``, the ones ``FlopCounterMode``
uses) turn those into floating-point operations. Counted per phase (``phases.PHASES``), a
checkpointed step shows its price directly: the recompute FLOPs, and the step's FLOPs over the
plain step's as the predicted slowdown. It is a prediction of time, not a measurement: ops with
no formula (elementwise ops, BatchNorm, the optimizer) count 0, and memory-bound kernels take
longer than their FLOPs say; the bench prints it beside a measured ratio to show how far it goes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from tutorial_utils.measurement.op_tensors import op_tensors
from tutorial_utils.measurement.phases import PHASES, current_phase

__all__ = ["FORMULAS", "StepFlopCounter", "StepFlops"]

# Queries of a tensor's metadata, which FlopCounterMode also leaves to the next handler.
_METADATA_OPS = frozenset(
    {
        torch.ops.aten.is_contiguous.default,
        torch.ops.aten.is_contiguous.memory_format,
        torch.ops.aten.is_strides_like_format.default,
        torch.ops.aten.is_non_overlapping_and_dense.default,
        torch.ops.aten.size.default,
        torch.ops.aten.sym_size.default,
        torch.ops.aten.stride.default,
        torch.ops.aten.sym_stride.default,
        torch.ops.aten.storage_offset.default,
        torch.ops.aten.sym_storage_offset.default,
        torch.ops.aten.numel.default,
        torch.ops.aten.sym_numel.default,
        torch.ops.aten.dim.default,
        torch.ops.prim.layout.default,
    }
)


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step by phase (ops without a FLOP formula count 0)."""

    forward: int
    backward: int
    recompute: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.recompute + self.optimizer

    def overhead_vs(self, plain: StepFlops) -> float:
        """This step's FLOPs over ``plain``'s: the predicted time ratio of a strategy."""
        if plain.total == 0:
            raise ValueError("the plain step counted no FLOPs: nothing to compare with")
        return self.total / plain.total


# PyTorch's formulas, plus the CPU's fused attention kernels (the same FLOPs as the CUDA flash
# kernel's, whose formulas read the same leading arguments: query, key, value; grad first).
_aten = torch.ops.aten
FORMULAS = {
    **flop_registry,
    _aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[
        _aten._scaled_dot_product_flash_attention
    ],
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_registry[
        _aten._scaled_dot_product_flash_attention_backward
    ],
}

# Attention ops and where their query sits (backward ops take the output's gradient first).
_ATTENTION_QUERY_INDEX = {
    packet: (1 if "backward" in packet.__name__ else 0)
    for packet in FORMULAS
    if "scaled_dot_product" in getattr(packet, "__name__", "")
}


def _formula_arguments(packet, args: tuple) -> tuple:
    """``args`` with grouped-query keys and values counted at the query's head count, as the
    kernel broadcasts them: PyTorch 2.14's formulas do so themselves, older ones assert."""
    index = _ATTENTION_QUERY_INDEX.get(packet)
    if index is None or len(args) < index + 3:
        return args
    query, key, value = args[index : index + 3]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        return args
    heads = query.shape[1]
    key_shape = torch.Size((key.shape[0], heads, *key.shape[2:]))
    value_shape = torch.Size((value.shape[0], heads, *value.shape[2:]))
    return (*args[: index + 1], key_shape, value_shape, *args[index + 3 :])


_BACKEND_KEYS = {
    "cpu": torch._C.DispatchKey.CPU,
    "cuda": torch._C.DispatchKey.CUDA,
    "meta": torch._C.DispatchKey.Meta,
}


def _has_own_kernel(func, args, kwargs) -> bool:
    """True when ``func`` has a kernel of its own for its tensors' device (``silu_backward``
    does, besides a decomposition): decomposing it would run, and allocate, other ops than the
    real step runs, and an op with its own kernel has no matrix product inside to count."""
    for value in op_tensors(args, kwargs):
        key = _BACKEND_KEYS.get(value.device.type)
        return key is not None and func.has_kernel_for_dispatch_key(key)
    return False


class StepFlopCounter(TorchDispatchMode):
    """Counts the FLOPs of every op inside ``with counter:``, per phase, on any device.

    Ops without a formula are decomposed where PyTorch can (as ``FlopCounterMode`` does), so a
    composite op is counted through the matrix products it is made of; never an op with a
    kernel of its own for the device, so counting does not change what the step allocates.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = dict.fromkeys(PHASES, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA_OPS:
            return NotImplemented
        packet = func._overloadpacket
        if (
            packet not in FORMULAS
            and func is not torch.ops.prim.device.default
            and not _has_own_kernel(func, args, kwargs)
        ):
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if packet in FORMULAS:
            counted = _formula_arguments(packet, args)
            self.counts[current_phase()] += int(FORMULAS[packet](*counted, **kwargs, out_val=out))
        return out

    def result(self) -> StepFlops:
        return StepFlops(**self.counts)
