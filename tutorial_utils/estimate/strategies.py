"""The estimator's menu of strategies for any model, and the command line's spellings of them.

A ``transformers`` model is checkpointed through its own call (``activation_checkpointing_enable``,
before transformers 5.23 ``gradient_checkpointing_enable``: ``checkpointing.transformers_api``)
with ``use_reentrant=False``; a torchvision model by wrapping its repeated blocks in
``torch.utils.checkpoint.checkpoint`` (``checkpointing.blocks.checkpointed_blocks``): both are
``checkpointing.strategy.Strategy.applied``. The default menu, from the table of kinds
(``checkpointing.strategy.STRATEGY_KINDS``): no checkpointing, every block, every 2nd block,
selective checkpointing that saves the outputs of the matrix products and convolutions and
recomputes the rest (norms, activations, pooling, attention kernels: one policy for both kinds, so
that its label says what it saves), and offloading, a GPU-only strategy: on a CPU or in a dry run
the saved tensors are in host memory already, so it is listed and labelled, never measured here.
"""

from __future__ import annotations

from tutorial_utils.checkpointing import strategy as _strategy
from tutorial_utils.checkpointing.kinds import (
    STRATEGY_KINDS,
    default_spellings,
    strategy_spellings,
)
from tutorial_utils.checkpointing.strategy import Strategy

__all__ = ["DEFAULT_STRATEGIES", "default_strategies", "parse_strategy"]


def parse_strategy(text: str) -> Strategy:
    """A ``--strategies`` word as its ``Strategy``; kinds that split only a Sequential are refused,
    since the estimate's models are checkpointed by their repeated blocks."""
    strategy = _strategy.parse_strategy(text)
    if STRATEGY_KINDS[strategy.kind].sequential_only:
        raise ValueError(
            f"{text.strip()!r} splits an nn.Sequential; estimate checkpoints a model by its "
            f"blocks: use {strategy_spellings(any_model=True)}"
        )
    return strategy


def default_strategies() -> tuple[Strategy, ...]:
    """The menu ``estimate`` runs by default: each kind's default spellings, in menu order."""
    return tuple(parse_strategy(spelling) for spelling in default_spellings())


DEFAULT_STRATEGIES = default_strategies()
