"""Profiling a Sequential: what each top-level module keeps for its backward and costs to run.

``profile_sequential`` runs the model once, module by module, and records with
``tools.SavedTensors`` (the one saved-bytes counter) the storages autograd keeps for each module's
backward, the bytes of its output and its forward cost: seconds on a real device, FLOPs on the meta device (where a model of
any size can be profiled on a laptop). The planner (``planning.planner``) and the floor
(``planning.limits``) read these profiles.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from tutorial_utils.measurement.flops import StepFlopCounter
from tutorial_utils.planning.roofline import Machine, RooflineCounter
from tutorial_utils.tools import SavedTensors

__all__ = ["LayerCost", "ModelProfile", "profile_sequential"]


@dataclass(frozen=True)
class LayerCost:
    """What one top-level module costs in the forward and keeps for the backward."""

    name: str
    input_bytes: int  # storage of the module's input (the previous module's output)
    output_bytes: int  # new storage of its output (0 when the output is a view of the input)
    saves_input: bool  # autograd keeps the input alive for this module's backward
    saves_output: bool  # ... or its output (ReLU does)
    internal_bytes: int  # other saved storages (pooling indices, dropout masks, BN statistics)
    parameter_bytes: int  # its gradients' size, created during its backward
    forward_seconds: float | None  # None on the meta device, where nothing takes time
    forward_flops: int = 0  # what its forward costs when time cannot be measured

    @property
    def recompute_cost(self) -> float:
        """What recomputing the module costs: seconds where measured, else FLOPs."""
        return self.forward_flops if self.forward_seconds is None else self.forward_seconds


@dataclass(frozen=True)
class ModelProfile:
    """Per-module costs of one ``nn.Sequential`` at one input size, plus the constant part."""

    layers: tuple[LayerCost, ...]
    baseline_bytes: int  # parameters, buffers and the input batch: there whatever the plan
    # where ``forward_seconds`` come from: "measured" on a real device, or a roofline's
    # prediction on the meta device (``profile_sequential(..., machine=...)``)
    time_source: str = "measured"

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def timed(self) -> bool:
        """True when profiled on a real device (recompute cost in seconds, not FLOPs)."""
        return all(layer.forward_seconds is not None for layer in self.layers)

    def kept_bytes_per_layer(self) -> list[int]:
        """Bytes each module keeps for backward without checkpointing, each storage counted once.

        A tensor saved by two modules (a ReLU's output is the next convolution's input) is
        charged to the first; the batch is left out (it is in the baseline). They sum to
        ``activation_bytes`` (plus the model's output, should the last module save it).
        """
        kept = []
        for m, layer in enumerate(self.layers):
            own_input = m > 0 and layer.saves_input and not self.layers[m - 1].saves_output
            kept.append(
                layer.internal_bytes
                + layer.input_bytes * own_input
                + layer.output_bytes * layer.saves_output
            )
        return kept

    @property
    def activation_bytes(self) -> int:
        """Bytes kept for backward without any checkpointing (each storage counted once)."""
        last = self.layers[-1]
        return sum(self.kept_bytes_per_layer()) - last.output_bytes * last.saves_output


@torch.no_grad()
def _snapshot_buffers(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(buffer, buffer.clone()) for buffer in model.buffers()]


def profile_sequential(
    model: nn.Sequential, sample_input: torch.Tensor, *, machine: Machine | None = None
) -> ModelProfile:
    """Run ``model`` once, module by module, recording what autograd saves for each one.

    Saved storages are counted by ``tools.SavedTensors``; parameters and buffers are left out
    (they are there anyway). The forward runs twice (the first warms up kernels) and each module's
    time is the faster of the two; on the meta device it runs once and has FLOPs, no time, unless
    ``machine`` is given: then each module's time is predicted by that machine's roofline
    (``planning.roofline``), so a plan made on meta charges memory-bound ops (ReLU, BatchNorm,
    pooling) that FLOPs call free. RNG state and BatchNorm running statistics are restored, so
    profiling changes nothing. Profile in the mode you train in (``model.train()``).
    """
    if not isinstance(model, nn.Sequential) or len(model) == 0:
        raise ValueError("plan_checkpoints needs a non-empty nn.Sequential")
    dry_run = sample_input.device.type == "meta"
    if machine is not None and not dry_run:
        raise ValueError(
            "a roofline predicts times for a dry run: pass a meta sample, or no machine to "
            f"measure the times on {sample_input.device}"
        )
    snapshot = _snapshot_buffers(model)
    with torch.random.fork_rng(devices=_cuda_devices(sample_input)):
        first = _profile_pass(model, sample_input, machine)
        second = first if dry_run else _profile_pass(model, sample_input, None)
    with torch.no_grad():
        for buffer, saved in snapshot:
            buffer.copy_(saved)
    layers = tuple(  # each module's faster time of the two passes (one pass in a dry run)
        a
        if a.forward_seconds is None or b.forward_seconds is None
        else replace(a, forward_seconds=min(a.forward_seconds, b.forward_seconds))
        for a, b in zip(first, second, strict=True)
    )
    constant = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()])
    source = "measured" if machine is None else f"predicted by the roofline of {machine.name}"
    return ModelProfile(layers, constant + sample_input.untyped_storage().nbytes(), source)


def _cuda_devices(tensor: torch.Tensor) -> list[int]:
    return [tensor.device.index or 0] if tensor.device.type == "cuda" else []


def _profile_pass(
    model: nn.Sequential, x: torch.Tensor, machine: Machine | None
) -> list[LayerCost]:
    """One forward, module by module: what each saves, its FLOPs, and its time (measured; on
    meta, the roofline's prediction with a ``machine``, else None)."""
    dry_run = x.device.type == "meta"
    model_tensors = [*model.parameters(), *model.buffers()]
    records = []
    for index, module in enumerate(model):
        saved = SavedTensors(leave_out=model_tensors)  # one counter per module, made untimed
        _synchronize(x)
        started = time.perf_counter()
        roofline = RooflineCounter(machine) if machine is not None else contextlib.nullcontext()
        with saved, StepFlopCounter() as flops, roofline:
            y = module(x)
        _synchronize(x)
        seconds: float | None = time.perf_counter() - started
        if dry_run:
            seconds = roofline.seconds if isinstance(roofline, RooflineCounter) else None
        # storages are compared as SavedTensors keys them: the storage object itself
        x_storage, y_storage = x.untyped_storage(), y.untyped_storage()
        view = y_storage is x_storage
        records.append(
            LayerCost(
                name=f"{index}: {type(module).__name__}",
                input_bytes=x_storage.nbytes(),
                output_bytes=0 if view else y_storage.nbytes(),
                saves_input=saved.storages.get(x_storage, 0) > 0,
                saves_output=not view and saved.storages.get(y_storage, 0) > 0,
                internal_bytes=sum(
                    nbytes
                    for storage, nbytes in saved.storages.items()
                    if storage not in (x_storage, y_storage)
                ),
                parameter_bytes=sum(p.untyped_storage().nbytes() for p in module.parameters()),
                forward_seconds=seconds,
                forward_flops=flops.result().total,
            )
        )
        x = y
    return records


def _synchronize(tensor: torch.Tensor) -> None:
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)
