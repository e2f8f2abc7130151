"""A ``transformers`` model's own checkpointing, switched on and off under either of its names.

transformers 5.23 renamed ``gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)``
to ``activation_checkpointing_enable(activation_checkpointing_kwargs=...)`` (the old name still
works and warns); ``every_n_layers`` came in 5.16 and ``offload`` in 5.17. Colab ships 5.15, so
on a release without the new name the old call switches checkpointing on and the per-layer flags
and the offloading are set here as 5.23 sets them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

__all__ = ["disable_checkpointing", "enable_checkpointing"]


def enable_checkpointing(
    model: nn.Module,
    checkpoint_kwargs: dict[str, Any] | None = None,
    *,
    every_n_layers: int = 1,
    offload: bool = False,
) -> None:
    """``model.activation_checkpointing_enable(...)``, or on transformers before 5.23 the same
    through ``gradient_checkpointing_enable``; ``checkpoint_kwargs`` go to ``checkpoint``."""
    if every_n_layers < 1:
        raise ValueError(f"every_n_layers must be at least 1, got {every_n_layers}")
    hf: Any = model  # a transformers PreTrainedModel
    if hasattr(hf, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(
            activation_checkpointing_kwargs=checkpoint_kwargs,
            every_n_layers=every_n_layers,
            offload=offload,
        )
        return
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    device_type = next(model.parameters()).device.type
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index % every_n_layers == 0
        if offload:
            layer._gradient_checkpointing_func = _offloaded(
                layer._gradient_checkpointing_func, device_type
            )


def disable_checkpointing(model: nn.Module) -> None:
    """Switch checkpointing off and remove the input hook that switching it on added."""
    hf: Any = model  # a transformers PreTrainedModel
    if hasattr(hf, "activation_checkpointing_disable"):
        hf.activation_checkpointing_disable()
    else:
        hf.gradient_checkpointing_disable()
    hf.disable_input_require_grads()


def _offloaded(checkpoint_fn: Callable, device_type: str) -> Callable:
    """``checkpoint_fn`` with what it saves held in pinned host memory, as ``offload=True`` does."""

    def offloaded_checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
        with torch.autograd.graph.save_on_cpu(pin_memory=True, device_type=device_type):
            return checkpoint_fn(function, *args, **kwargs)

    return offloaded_checkpoint
