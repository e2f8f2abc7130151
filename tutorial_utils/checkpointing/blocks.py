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
from typing import Any

import torch.nn as nn
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def checkpointed_blocks(
    blocks: Iterable[nn.Module],
    *,
    use_reentrant: bool,
    context_fn: Callable[[], tuple] | None = None,
) -> Iterator[None]:
    """Inside the ``with``, each block's forward runs under ``checkpoint``; restored on exit.

    Keyword arguments (attention masks, position embeddings) are bound into the checkpointed
    function, as reentrant checkpointing passes on positional tensors only.
    """
    blocks = list(blocks)
    if not blocks:
        raise ValueError("no blocks to checkpoint: pass e.g. model.model.layers")
    options: dict[str, Any] = {"use_reentrant": use_reentrant}
    if context_fn is not None:
        options["context_fn"] = context_fn
    for block in blocks:
        forward = block.forward

        def checkpointed_forward(*args, _forward=forward, **kwargs):
            return checkpoint(functools.partial(_forward, **kwargs), *args, **options)

        block.forward = checkpointed_forward
    try:
        yield
    finally:
        for block in blocks:
            del block.forward  # the instance attribute: the class's forward shows through again
