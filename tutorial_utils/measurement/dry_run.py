"""Dry runs: a training step of any size measured on the meta device, on any machine.

A model on the ``meta`` device has parameters with shapes and dtypes but no data, so a step of
VGG16 at 224 px and batch 64 (5.5 GB on a GPU) costs a fraction of a second and no memory, and
the tensor bytes it reports are those of the real step (``tests/test_dry_run.py``). These helpers
put a model there without touching the original and run ``measure_step`` on it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import Strategy
from tutorial_utils.measurement.autocast import EmulatedAutocast
from tutorial_utils.measurement.step import (
    OptimizerFactory,
    Recording,
    StepReport,
    measure_step,
    next_token_loss,
)
from tutorial_utils.measurement.torch_support import require_tested_torch

__all__ = ["build_on_meta", "dry_run_step", "meta_copy", "model_for_sample", "ModuleT", "on_meta"]

require_tested_torch()  # before any internal API below is reached

ModuleT = TypeVar("ModuleT", bound=nn.Module)  # a copy is of the original's type


def meta_copy(module: ModuleT) -> ModuleT:
    """An independent copy of ``module`` whose parameters and buffers are on the meta device.

    Nothing is copied but shapes: ``deepcopy`` is handed a meta twin of each tensor in advance.
    """
    twins: dict[int, Any] = {}
    for parameter in module.parameters():
        twins[id(parameter)] = nn.Parameter(
            torch.empty_like(parameter, device="meta"), parameter.requires_grad
        )
    for buffer in module.buffers():
        twins[id(buffer)] = torch.empty_like(buffer, device="meta")
    return copy.deepcopy(module, twins)


def on_meta(model: ModuleT) -> ModuleT:
    """``model`` itself when every parameter and buffer is on the meta device, else a meta copy."""
    tensors = [*model.parameters(), *model.buffers()]
    return model if all(t.device.type == "meta" for t in tensors) else meta_copy(model)


def model_for_sample(model: ModuleT, sample: torch.Tensor) -> ModuleT:
    """``model`` ready to run on ``sample``: a meta copy for a meta sample (a dry run; the model is
    left alone), the model itself where both are on one device, else a one-line ``ValueError``
    saying what to do."""
    if sample.device.type == "meta":
        return on_meta(model)
    devices = {tensor.device for tensor in [*model.parameters(), *model.buffers()]}
    if not devices or devices == {sample.device}:
        return model
    where = ", ".join(sorted(str(device) for device in devices))
    if any(device.type == "meta" for device in devices):
        hint = (
            f"for a dry run pass a meta sample (torch.empty({tuple(sample.shape)}, "
            f"device='meta')); for a real step build the model on {sample.device}"
        )
    else:
        hint = f"move one to the other, e.g. model.to({str(sample.device)!r})"
    raise ValueError(f"the model is on {where} and the sample on {sample.device}: {hint}")


def build_on_meta(make_model: Callable[[], ModuleT]) -> ModuleT:
    """``make_model()`` with every tensor created on the meta device (nothing is initialised)."""
    with torch.device("meta"):
        return make_model()


def dry_run_step(
    model: nn.Module,
    input_shape: Sequence[int],
    strategy: Strategy | None = None,
    *,
    optimizer_factory: OptimizerFactory | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    token_ids: bool = False,
    autocast: EmulatedAutocast | None = None,
    recording: Recording = Recording(),
) -> StepReport:
    """One training step of ``model`` on a batch of ``input_shape``, as a dry run.

    ``model`` may be anywhere: a model already on the meta device is used as it is, any other is
    copied there first (``meta_copy``), so the caller's weights are untouched. Targets are class
    indices, one per sample (cross-entropy, the default loss). The optimizer (default SGD with
    momentum, as in the first article) has its state before the step, as in a training loop.

    ``token_ids=True`` is for a language model (a ``transformers`` causal LM, say): the inputs are
    token ids of ``input_shape = (batch, sequence)``, the targets the same ids and the default
    loss ``next_token_loss``.

    ``autocast`` runs the forward and the loss under emulated mixed precision. Left out, an active
    ``torch.autocast("cuda" | "cpu")`` around the call is followed (meta tensors would otherwise
    ignore it and the dry run would silently read the float32 step: ``measure_step`` on meta
    reads it, ``autocast.ambient_autocast``).
    """
    if len(input_shape) < 2 or any(int(side) <= 0 for side in input_shape):
        raise ValueError(f"input_shape must be (batch, ...) with positive sides, got {input_shape}")
    run = on_meta(model)
    batch = int(input_shape[0])
    shape = tuple(int(side) for side in input_shape)
    if token_ids:
        if len(shape) != 2:
            raise ValueError(f"token_ids needs input_shape (batch, sequence), got {input_shape}")
        inputs = targets = torch.empty(shape, dtype=torch.long, device="meta")
        loss_fn = loss_fn if loss_fn is not None else next_token_loss
    else:
        inputs = torch.empty(shape, device="meta")
        targets = torch.empty(batch, dtype=torch.long, device="meta")
    return measure_step(
        run,
        inputs,
        targets,
        strategy,
        optimizer_factory=optimizer_factory,
        loss_fn=loss_fn,
        device="meta",
        autocast=autocast,
        recording=recording,
    )
