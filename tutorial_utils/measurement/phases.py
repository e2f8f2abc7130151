"""Which part of a training step is running: forward, backward, recompute or optimizer.

The memory tracker and the FLOP counter both sort each op by phase, so a timeline can mark where
the backward pass starts and a checkpointed step can say how much work its recomputation costs.
Whoever runs the step declares the coarse phase (``with step_phase("optimizer"):``); inside a
backward pass an op that runs with gradients enabled is a checkpoint's recomputation (both
checkpoint modes re-run the forward under ``torch.enable_grad()``, while autograd runs backward
functions with gradients disabled). Inside autograd's graph task the phase is read from autograd
itself, which also covers its worker threads on CUDA, where nothing is declared.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, get_args

import torch

__all__ = ["current_phase", "declared_phase", "DeclaredPhase", "Phase", "PHASES", "step_phase"]

Phase = Literal["forward", "backward", "recompute", "optimizer"]
DeclaredPhase = Literal["forward", "backward", "optimizer"]  # recompute is detected, not declared
PHASES: tuple[Phase, ...] = get_args(Phase)

_declared = threading.local()  # .phase: the DeclaredPhase of this thread, None outside any


@contextmanager
def step_phase(name: DeclaredPhase) -> Iterator[None]:
    """Declare the phase of the code inside the block (forward, backward or optimizer)."""
    if name not in get_args(DeclaredPhase):
        raise ValueError(f"a declared phase is forward, backward or optimizer, got {name!r}")
    previous = getattr(_declared, "phase", None)
    _declared.phase = name
    try:
        yield
    finally:
        _declared.phase = previous


def declared_phase() -> DeclaredPhase | None:
    """The phase ``step_phase`` declared on this thread; None outside any (work before a step,
    such as the optimizer state a dry run primes)."""
    return getattr(_declared, "phase", None)


def _in_backward() -> bool:
    # The id of the running autograd graph task; -1 outside backward. Private, as in
    # torch.utils.checkpoint itself, which uses it to detect recomputation.
    return torch._C._current_graph_task_id() != -1


def current_phase() -> Phase:
    """The phase of the op running now (one of ``PHASES``)."""
    if _in_backward():  # also true in autograd's worker threads, where nothing is declared
        return "recompute" if torch.is_grad_enabled() else "backward"
    return getattr(_declared, "phase", None) or "forward"
