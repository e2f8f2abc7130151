"""Two other answers to "what to keep for backward": selective checkpointing and offloading.

Selective activation checkpointing (``create_selective_checkpoint_contexts``) decides per
operation, not per module: inside each checkpointed region, the outputs of expensive ops
(convolutions, matrix products) are saved and everything cheap (ReLU, BatchNorm, pooling,
dropout) is recomputed. Memory lands between no checkpointing and full checkpointing; the
recompute time is only that of the cheap ops. It pays where a cheap op would save a tensor of its
own (BatchNorm's input next to the convolution's), less where it would not (VGG's ReLU output is
the next convolution's input anyway).

Offloading (``save_on_cpu``) keeps every saved tensor but moves it to host memory during the
forward and back during backward: no recompute, PCIe traffic instead. It only means something
when the model runs on a GPU; on a CPU the tensors are in host memory already.

``strategy.selective(ops)`` and ``strategy.offloaded()`` run them on any model.
``selective_context_fn(ops)`` is the policy for any set of ops, in
the form ``checkpoint(..., context_fn=...)`` takes (and ``transformers`` passes on from
``activation_checkpointing_kwargs``): the PyTorch blog's "save the matrix products" policy for a
transformer block, or one that also saves the attention kernel's output.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = [
    "aten",
    "ATTENTION_OPS",
    "EXPENSIVE_OPS",
    "MATRIX_PRODUCT_OPS",
    "saving_policy",
    "selective_context_fn",
    "sac_hooks_option",
]

aten = torch.ops.aten

# Ops whose outputs are worth keeping: recomputing them costs as much as the forward itself.
EXPENSIVE_OPS = frozenset(
    {
        aten.convolution.default,
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
    }
)


# A transformer block's matrix products (linear layers and the math path's attention products).
MATRIX_PRODUCT_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})

# Fused attention kernels, one per backend: saving their output skips attention's recompute.
ATTENTION_OPS = frozenset(
    {
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    }
)


def saving_policy(ops: frozenset) -> Callable[..., CheckpointPolicy]:
    """A policy that keeps the outputs of ``ops`` and recomputes everything else."""
    if not ops:
        raise ValueError("ops is empty: pass e.g. MATRIX_PRODUCT_OPS (an empty set is full AC)")

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_context_fn(ops: frozenset) -> Callable[[], tuple]:
    """``checkpoint(..., use_reentrant=False, context_fn=selective_context_fn(ops))``."""
    return functools.partial(create_selective_checkpoint_contexts, saving_policy(ops))


def sac_hooks_option() -> dict[str, bool]:
    """``respect_saved_tensors_hooks=False`` where ``checkpoint`` has it (torch 2.14 and later).

    A ``context_fn`` region run inside saved-tensor hooks (the tools' ``SavedTensors``, the
    tracker, ``save_on_cpu``) warns in torch 2.15 that a future release will route what the policy
    saves through the hooks. Saying ``False`` keeps today's behaviour, which every figure here was
    measured with; older releases lack the argument, so it is left out there.
    """
    parameters = inspect.signature(torch.utils.checkpoint.checkpoint).parameters
    return (
        {"respect_saved_tensors_hooks": False}
        if "respect_saved_tensors_hooks" in parameters
        else {}
    )
