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

Both objects have the ``forward(model, x, use_reentrant, preserve_rng_state)`` of a
``planner.Plan``, so ``forward_segments``, ``measure_step`` and ``train_model`` accept them in
place of a segment count. ``selective_context_fn(ops)`` is the same policy for any set of ops, in
the form ``checkpoint(..., context_fn=...)`` takes (and ``transformers`` passes on from
``activation_checkpointing_kwargs``): the PyTorch blog's "save the matrix products" policy for a
transformer block, or one that also saves the attention kernel's output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from tutorial_utils.checkpointing.batchnorm import run_keeping_batchnorm
from tutorial_utils.checkpointing.segments import segment_boundaries, validate_segments

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


# The policy of `SelectiveCheckpoint`: keep convolutions and matrix products, recompute the rest.
save_expensive_ops_policy = saving_policy(EXPENSIVE_OPS)
_selective_context = selective_context_fn(EXPENSIVE_OPS)


@dataclass(frozen=True)
class SelectiveCheckpoint:
    """Every one of ``segments`` equal runs of modules checkpointed under the policy above.

    Why several regions and not one: when backward reaches a region, its cheap activations are
    all recomputed at once, so one region spanning the model would bring them all back together.
    BatchNorm is recomputed too; ``keep_batchnorm`` (the default) keeps that second run from
    updating its running statistics (``checkpointing.batchnorm``).
    """

    segments: int
    keep_batchnorm: bool = True

    def forward(
        self,
        model: nn.Sequential,
        x: torch.Tensor,
        use_reentrant: bool = False,
        preserve_rng_state: bool = True,
    ) -> torch.Tensor:
        """``model(x)`` with each region checkpointed selectively."""
        if use_reentrant:
            raise ValueError("selective checkpointing needs use_reentrant=False")
        if validate_segments(model, self.segments) < 1:
            raise ValueError(f"SelectiveCheckpoint needs segments in 1..{len(model)}")
        modules = list(model)
        for start, end in segment_boundaries(len(model), self.segments):
            x = checkpoint(
                functools.partial(
                    run_keeping_batchnorm if self.keep_batchnorm else _run_modules,
                    modules[start:end],
                ),
                x,
                use_reentrant=False,
                preserve_rng_state=preserve_rng_state,
                context_fn=_selective_context,
            )
        return x

    def __str__(self) -> str:
        return f"selective, {self.segments} regions"


@dataclass(frozen=True)
class OffloadedActivations:
    """No recompute: every tensor saved for backward waits in (pinned) host memory instead."""

    pin_memory: bool = True

    def forward(
        self,
        model: nn.Sequential,
        x: torch.Tensor,
        use_reentrant: bool = False,
        preserve_rng_state: bool = True,
    ) -> torch.Tensor:
        """``model(x)`` under ``save_on_cpu``; a ValueError off CUDA, where it would do nothing."""
        if x.device.type != "cuda":
            raise ValueError(
                f"offloading moves saved activations from GPU to host memory; the input is on "
                f"{x.device.type}, where they are in host memory already: run on CUDA"
            )
        with torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory):
            return model(x)

    def __str__(self) -> str:
        return "offload saved activations to CPU"


def _run_modules(modules: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for module in modules:
        x = module(x)
    return x
