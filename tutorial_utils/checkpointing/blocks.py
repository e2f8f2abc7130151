"""Checkpoint chosen blocks of any model by hand: the loop people write around ``checkpoint``.

``transformers`` checkpoints its decoder layers itself (``activation_checkpointing_enable``) and,
for models that take token ids, also makes the embedding output require grad. A hand-written
wrapper around the same blocks does not, and that is the old pitfall: with reentrant
checkpointing, a block whose *input* does not require grad returns an output that does not
either, so the trainable parameters inside it (LoRA adapters on a frozen base) get no gradient.
``checkpointed_blocks`` is that hand-written wrapper, to show the pitfall and its fixes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from tutorial_utils.checkpointing.selective import sac_hooks_option

__all__ = ["checkpointed_blocks", "decoder_layers", "repeated_blocks"]


@contextlib.contextmanager
def checkpointed_blocks(
    blocks: Iterable[nn.Module],
    *,
    use_reentrant: bool,
    context_fn: Callable[[], tuple] | None = None,
    offload: bool = False,
) -> Iterator[None]:
    """Inside the ``with``, each block's forward runs under ``checkpoint``; restored on exit.

    Keyword arguments (attention masks, position embeddings) are bound into the checkpointed
    function, as reentrant checkpointing passes on positional tensors only. ``offload`` keeps
    what each checkpoint saves in pinned host memory, as ``transformers``' ``offload=True`` does.
    """
    blocks = list(blocks)
    if not blocks:
        raise ValueError("no blocks to checkpoint: pass e.g. model.model.layers")
    options: dict[str, Any] = {"use_reentrant": use_reentrant}
    if context_fn is not None:
        options["context_fn"] = context_fn
        options.update(sac_hooks_option())
    for block in blocks:
        forward = block.forward

        def checkpointed_forward(*args, _forward=forward, **kwargs):
            with torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else nullcontext():
                return checkpoint(functools.partial(_forward, **kwargs), *args, **options)

        block.forward = checkpointed_forward
    try:
        yield
    finally:
        for block in blocks:
            del block.forward  # the instance attribute: the class's forward shows through again


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The layers ``transformers`` checkpoints itself (``GradientCheckpointingLayer``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks a model is checkpointed by: ``transformers``' decoder layers
    (``GradientCheckpointingLayer``), or a torchvision model's residual/encoder blocks (the
    outermost modules with parameters and children of their own that sit in an
    ``nn.Sequential``: ResNet's BasicBlocks, ViT's EncoderBlocks, DenseNet's dense blocks)."""
    layers = decoder_layers(model)
    if layers:
        return layers
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for parent in model.modules():
        if id(parent) in inside or not isinstance(parent, nn.Sequential):
            continue
        for child in parent.children():
            has_parts = any(True for _ in child.children())
            if (
                has_parts
                and not isinstance(child, nn.Sequential)
                and any(True for _ in child.parameters())
            ):
                blocks.append(child)
                inside.update(id(m) for m in child.modules())
    return blocks
