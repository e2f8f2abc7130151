"""Bytes autograd saves for backward, charged to the module whose forward saved them.

The tracker measures what is alive; this answers *who* keeps it. The counting is
``tools.SavedTensors``, the one counter notebook 01 teaches (each storage once, parameters left
out); this module only charges what it counts to modules: every byte it adds while a module's
forward runs goes to the innermost of the given modules running at the time. For a transformer,
one decoder block's bytes are what checkpointing that block trades for its recompute; on the meta
device the bytes are exact at any size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from tutorial_utils.measurement.dry_run import on_meta
from tutorial_utils.tools import SavedTensors

__all__ = [
    "ActivationAccount",
    "ModuleActivations",
    "OUTSIDE",
    "saved_activations",
    "saved_bytes_per_module",
]

OUTSIDE = "outside the given modules"


def saved_bytes_per_module(
    model: nn.Module, modules: Mapping[str, nn.Module], run: Callable[[], Any]
) -> dict[str, int]:
    """Saved-for-backward bytes of each module in ``modules`` while ``run()`` runs a forward.

    A storage saved twice is charged once, to the module that saved it first. Bytes saved outside
    all of them (embeddings, the head, the loss) are under ``OUTSIDE``.
    """
    if not modules:
        raise ValueError("modules is empty: pass e.g. {'block 0': model.model.layers[0]}")
    saved = SavedTensors(leave_out=model.parameters())
    totals = dict.fromkeys([*modules, OUTSIDE], 0)
    running: list[str] = []
    charged = [0]  # the counter's total when a module last started or finished

    def charge() -> None:
        """What was saved since a module last started or finished is the running one's."""
        totals[running[-1] if running else OUTSIDE] += saved.total_bytes - charged[0]
        charged[0] = saved.total_bytes

    def enter(name: str) -> Callable[..., None]:
        def hook(*_) -> None:  # returns None: the module's input stays as it is
            charge()
            running.append(name)

        return hook

    def leave(*_) -> None:
        charge()
        running.pop()

    handles = []
    for name, module in modules.items():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))
    try:
        with saved:
            run()
        charge()
    finally:
        for handle in handles:
            handle.remove()
    return totals


@dataclass(frozen=True)
class ModuleActivations:
    """What one top-level module leaves for the backward pass, from autograd's own record."""

    index: int
    kind: str
    output_shape: tuple[int, ...]
    output_bytes: int
    saved_bytes: int  # storages this module saved first (a tensor saved twice counts once)


@dataclass
class ActivationAccount:
    """Autograd's saved tensors of one forward pass, per top-level module of a Sequential."""

    layers: list[ModuleActivations]
    input_shape: tuple[int, ...]
    device: str

    @property
    def total_saved_bytes(self) -> int:
        return sum(layer.saved_bytes for layer in self.layers)


def saved_activations(
    model: nn.Sequential, input_shape: Sequence[int], device: str | None = "meta"
) -> ActivationAccount:
    """Per top-level module of an image model, the bytes autograd saves for the backward pass.

    ``device="meta"`` runs a weightless copy on the meta device: nothing is computed or
    allocated, so the article's 224 px, batch-64 figures cost milliseconds, with autograd's real
    shapes and dtypes. ``device=None`` runs ``model`` itself where it is (a real forward).
    Parameters, and views of them such as a Linear's transposed weight, are not activations and
    are left out; a tensor saved by two modules (a ReLU's output, saved by the ReLU and by the next
    convolution) is counted once, for the first (``saved_bytes_per_module``).
    """
    if len(input_shape) != 4 or any(int(side) <= 0 for side in input_shape):
        raise ValueError(f"input_shape must be (batch, channels, height, width), got {input_shape}")
    if device not in ("meta", None):
        raise ValueError(f"device must be 'meta' or None (the model's own), got {device!r}")
    run = on_meta(model) if device == "meta" else model
    run_device = next(run.parameters()).device
    outputs: list[tuple[tuple[int, ...], int]] = [((), 0)] * len(run)

    def record(index: int, output: torch.Tensor) -> None:
        outputs[index] = (tuple(output.shape), output.numel() * output.element_size())

    handles = [
        module.register_forward_hook(lambda _m, _a, output, i=index: record(i, output))
        for index, module in enumerate(run)
    ]
    was_training = run.training
    try:
        run.train()
        inputs = torch.zeros(tuple(int(s) for s in input_shape), device=run_device)
        per_module = saved_bytes_per_module(
            run, {str(index): module for index, module in enumerate(run)}, lambda: run(inputs)
        )
    finally:
        run.train(was_training)
        for handle in handles:
            handle.remove()
    layers = [
        ModuleActivations(index, type(module).__name__, *outputs[index], per_module[str(index)])
        for index, module in enumerate(run)
    ]
    return ActivationAccount(layers, tuple(int(s) for s in input_shape), str(run_device))
