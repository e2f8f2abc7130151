"""Checkpointing strategies for any model: the calls people write, as settings to switch.

A ``transformers`` model is checkpointed through its own call (``activation_checkpointing_enable``,
before transformers 5.23 ``gradient_checkpointing_enable``: ``checkpointing.transformers_api``)
with ``use_reentrant=False``; a torchvision model by wrapping its repeated blocks in
``torch.utils.checkpoint.checkpoint`` (``checkpointing.blocks.checkpointed_blocks``). Both take
the same settings: every block, every n-th block, or selective checkpointing that saves the
outputs of the matrix products and convolutions and recomputes the rest (norms, activations,
pooling, attention kernels). One policy for both kinds, so that its label says what it saves: a
transformer block runs no convolution, a ResNet block both. Offloading is a GPU-only strategy:
on a CPU or in a dry run the saved tensors are in host memory already, so it is listed and
labelled, never measured here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch.nn as nn

from tutorial_utils.checkpointing.blocks import checkpointed_blocks
from tutorial_utils.checkpointing.selective import EXPENSIVE_OPS, selective_context_fn
from tutorial_utils.checkpointing.transformers_api import (
    disable_checkpointing,
    enable_checkpointing,
)
from tutorial_utils.estimate.models import repeated_blocks
from tutorial_utils.measurement.autocast import EmulatedAutocast

KINDS = ("none", "every-block", "every-n", "selective", "offload")
OFFLOAD_NOTE = "GPU-only: keeps checkpoints in pinned host memory; not measurable without CUDA"


@dataclass(frozen=True)
class Strategy:
    """One way to checkpoint: ``kind`` in ``KINDS``, ``every`` for every n-th block."""

    kind: str
    every: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown strategy {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.every < 1:
            raise ValueError(f"every must be at least 1, got {self.every}")

    @property
    def name(self) -> str:
        return {
            "none": "none",
            "every-block": "every block",
            "every-n": f"every {self.every}th block" if self.every != 2 else "every 2nd block",
            "selective": "selective: matmuls+convs",  # what the policy saves
            "offload": "every block, offloaded",
        }[self.kind]

    @property
    def gpu_only(self) -> bool:
        return self.kind == "offload"

    def checkpoint_kwargs(self, autocast: EmulatedAutocast | None) -> dict:
        """What goes to ``torch.utils.checkpoint.checkpoint`` for this strategy."""
        kwargs: dict = {"use_reentrant": False}
        inner = None
        if self.kind == "selective":
            inner = selective_context_fn(EXPENSIVE_OPS)
        if autocast is not None:  # recomputation re-enters autocast, as on a real device
            kwargs["context_fn"] = autocast.checkpoint_context_fn(inner)
        elif inner is not None:
            kwargs["context_fn"] = inner
        return kwargs

    @contextlib.contextmanager
    def applied(
        self, model: nn.Module, autocast: EmulatedAutocast | None = None
    ) -> Iterator[nn.Module]:
        """Inside the ``with``, ``model`` is checkpointed this way; as before on exit.

        ``autocast`` is the emulation a dry run under mixed precision uses (None on a real
        device: its own autocast is re-entered by ``checkpoint``)."""
        if self.gpu_only and next(model.parameters()).device.type != "cuda":
            raise ValueError(f"{self.name!r} is {OFFLOAD_NOTE}")
        if self.kind == "none":
            yield model
            return
        base: Any = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model
        kwargs = self.checkpoint_kwargs(autocast)
        if hasattr(base, "supports_gradient_checkpointing"):  # a transformers model
            enable_checkpointing(base, kwargs, every_n_layers=self.every, offload=self.gpu_only)
            try:
                yield model
            finally:
                disable_checkpointing(base)
            return
        blocks = repeated_blocks(model)[:: self.every]
        with checkpointed_blocks(blocks, use_reentrant=False, context_fn=kwargs.get("context_fn")):
            yield model


def parse_strategy(text: str) -> Strategy:
    """``none``, ``every-block``, ``every-N`` (every N-th block), ``selective`` or ``offload``."""
    text = text.strip().lower()
    if text.startswith("every-") and text[6:].isdigit():
        return Strategy("every-n", int(text[6:]))
    if text in KINDS and text != "every-n":
        return Strategy(text)
    raise ValueError(
        f"unknown strategy {text!r}: use none, every-block, every-N (e.g. every-2), "
        "selective or offload"
    )


DEFAULT_STRATEGIES = (
    Strategy("none"),
    Strategy("every-block"),
    Strategy("every-n", 2),
    Strategy("selective"),
    Strategy("offload"),
)
