"""Where a language model's activations come from: the repeated blocks, the logits and the loss,
and the rest (embeddings, the final norm, masks, rotary tables).

Measured in the dry run itself: while the forward and the loss run, ``RegionRecorder`` (a
dispatch mode entered inside the step's tracker) notes every new storage and the region whose op
made it; when the loss is computed (after the Trainer's loop has dropped the outputs), the bytes
still alive are summed by region. That is what the step keeps for backward: once the blocks are
checkpointed, often mostly the logits and the loss. On N GPUs (``estimate.sharded``) the same
recorder runs in rank 0's step on fake tensors, its sizes read when the loss is computed (FSDP2
resizes some storages).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from tutorial_utils.measurement.op_tensors import op_tensors

__all__ = ["REGIONS", "KeptForBackward", "RegionRecorder", "recording_regions"]

REGIONS = ("blocks", "logits_and_loss", "rest")


@dataclass
class KeptForBackward:
    """Bytes alive when the loss is computed, by the region that made them."""

    bytes_by_region: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REGIONS, 0))

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_region.values())

    def logits_dominate(self) -> bool:
        return self.bytes_by_region["logits_and_loss"] > self.total_bytes / 2


class RegionRecorder(TorchDispatchMode):
    """Notes each op's new storages with the current region; ``kept()`` sums those alive."""

    def __init__(self) -> None:
        super().__init__()
        self.region = "rest"
        self._storages: dict[int, tuple[str, weakref.ref]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {value.untyped_storage()._cdata for value in op_tensors(args, kwargs or {})}
        for value in op_tensors(out):
            storage = value.untyped_storage()
            known = self._storages.get(storage._cdata)
            if storage._cdata in inputs or (known is not None and known[1]() is not None):
                continue  # a view, an in-place result, or a storage already noted
            self._storages[storage._cdata] = (self.region, weakref.ref(storage))
        return out

    def kept(self) -> KeptForBackward:
        """Bytes alive now by region, each storage at its size now (FSDP2 resizes some)."""
        result = KeptForBackward()
        for region, ref in self._storages.values():
            storage = ref()
            if storage is not None:
                result.bytes_by_region[region] += storage.nbytes()
        return result

    def watch(self, model: nn.Module, blocks: list[nn.Module]) -> Callable[[], None]:
        """Enter at the model's forward, mark its blocks and output layer; returns a remover
        (``finish`` exits, once the loss is computed)."""
        handles = [model.register_forward_pre_hook(self._enter)]
        output = getattr(model, "get_output_embeddings", lambda: None)()
        for module, region in [*((b, "blocks") for b in blocks), (output, "logits_and_loss")]:
            if module is None:
                continue
            handles.append(module.register_forward_pre_hook(self._set(region)))
            handles.append(module.register_forward_hook(self._set("rest", after=True)))

        def remove() -> None:
            for handle in handles:
                handle.remove()

        return remove

    def _enter(self, *_: Any) -> None:  # a pre-hook that returned the mode would replace inputs
        self._storages.clear()  # each forward's own: an earlier step's storages are not its
        self.region = "rest"
        self.__enter__()

    def finish(self, into: KeptForBackward) -> None:
        """At the loss: what is kept, by region, into ``into``; the mode exits."""
        into.bytes_by_region.update(self.kept().bytes_by_region)
        self.__exit__(None, None, None)

    def _set(self, region: str, after: bool = False) -> Callable[..., Any]:
        """A hook that sets the region (the blocks' post-hooks set it back to "rest")."""

        def hook(*_: Any) -> None:
            self.region = region

        return hook


def recording_regions(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    loss_fn: Callable[..., torch.Tensor],
    kept: KeptForBackward,
) -> tuple[Callable[..., torch.Tensor], Callable[[], None]]:
    """``loss_fn`` that fills ``kept`` once the loss is computed (every step: the last step's
    stays), and the hooks' remover. ``blocks``: the model's repeated blocks."""
    recorder = RegionRecorder()
    remove = recorder.watch(model, list(blocks))

    def loss_and_breakdown(outputs: Any, targets: torch.Tensor) -> torch.Tensor:
        recorder.region = "logits_and_loss"
        loss = loss_fn(outputs, targets)
        recorder.finish(kept)
        return loss

    return loss_and_breakdown, remove
