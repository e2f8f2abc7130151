"""Bytes autograd saves for backward, charged to the module whose forward saved them.

The tracker measures what is alive; this answers *who* keeps it: run a forward under
``torch.autograd.graph.saved_tensors_hooks`` and charge each saved storage (once, however many
ops save it; parameters left out, they are there anyway) to the innermost of the given modules
running at the time. For a transformer, one decoder block's bytes are what checkpointing that
block trades for its recompute; on the meta device the bytes are exact at any size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

OUTSIDE = "outside the given modules"


def saved_bytes_per_module(
    model: nn.Module, modules: Mapping[str, nn.Module], run: Callable[[], Any]
) -> dict[str, int]:
    """Saved-for-backward bytes of each module in ``modules`` while ``run()`` runs a forward.

    Bytes saved outside all of them (embeddings, the head, the loss) are under ``OUTSIDE``.
    """
    if not modules:
        raise ValueError("modules is empty: pass e.g. {'block 0': model.model.layers[0]}")
    parameters = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, torch.UntypedStorage] = {}  # held, so no address is reused while we count
    totals = dict.fromkeys([*modules, OUTSIDE], 0)
    running: list[str] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in parameters and key not in seen:
            seen[key] = storage
            totals[running[-1] if running else OUTSIDE] += storage.nbytes()
        return tensor

    def enter(name: str) -> Callable[..., None]:
        return lambda *_: running.append(name)  # append returns None: the input stays

    def leave(*_) -> None:
        running.pop()

    handles = []
    for name, module in modules.items():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            run()
    finally:
        for handle in handles:
            handle.remove()
    return totals
