"""The estimator's menu of strategies for any model, and the command line's spellings of them.

A ``transformers`` model is checkpointed through its own call (``activation_checkpointing_enable``,
before transformers 5.23 ``gradient_checkpointing_enable``: ``checkpointing.transformers_api``)
with ``use_reentrant=False``; a torchvision model by wrapping its repeated blocks in
``torch.utils.checkpoint.checkpoint`` (``checkpointing.blocks.checkpointed_blocks``): both are
``checkpointing.strategy.Strategy.applied``. The menu: no checkpointing, every block, every 2nd
block, selective checkpointing that saves the outputs of the matrix products and convolutions and
recomputes the rest (norms, activations, pooling, attention kernels: one policy for both kinds, so
that its label says what it saves), and offloading, a GPU-only strategy: on a CPU or in a dry run
the saved tensors are in host memory already, so it is listed and labelled, never measured here.
"""

from __future__ import annotations

from tutorial_utils.checkpointing.strategy import (
    NO_CHECKPOINTING,
    Strategy,
    every_nth_block,
    offloaded,
    selective,
)

SPELLINGS = "none, every-block, every-N (e.g. every-2), selective or offload"


def parse_strategy(text: str) -> Strategy:
    """``none``, ``every-block``, ``every-N`` (every N-th block), ``selective`` or ``offload``."""
    text = text.strip().lower()
    if text.startswith("every-") and text[6:].isdigit() and int(text[6:]) >= 1:
        return every_nth_block(int(text[6:]))
    named = {
        "none": NO_CHECKPOINTING,
        "every-block": every_nth_block(1),
        "selective": selective(),
        "offload": offloaded(),
    }
    if text in named:
        return named[text]
    raise ValueError(f"unknown strategy {text!r}: use {SPELLINGS}")


DEFAULT_STRATEGIES = (
    NO_CHECKPOINTING,
    every_nth_block(1),
    every_nth_block(2),
    selective(),
    offloaded(),
)
