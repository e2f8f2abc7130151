"""Gradient checkpointing, measured: the tools behind the tutorial's notebooks.

The names below are the public API, the tools to take into your own training script (the
README's "Use it on your own model" shows them at work). They are imported lazily, on first use,
so ``python -m tutorial_utils --help`` answers before torch is loaded. The layers behind them
are described in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    # mechanism
    "forward_segments": "tutorial_utils.checkpointing.segments",
    "SelectiveCheckpoint": "tutorial_utils.checkpointing.selective",
    "OffloadedActivations": "tutorial_utils.checkpointing.selective",
    "freeze_stats_during_recompute": "tutorial_utils.checkpointing.batchnorm",
    # measurement
    "TensorMemoryTracker": "tutorial_utils.measurement.tracker",
    "StepReport": "tutorial_utils.measurement.step",
    "measure_step": "tutorial_utils.measurement.step",
    "sweep_segments": "tutorial_utils.measurement.step",
    "find_max_batch_size": "tutorial_utils.measurement.batch_search",
    "dry_run_step": "tutorial_utils.measurement.dry_run",
    "build_on_meta": "tutorial_utils.measurement.dry_run",
    "meta_copy": "tutorial_utils.measurement.dry_run",
    # planning
    "plan_checkpoints": "tutorial_utils.planning.budget",
    "peak_floor": "tutorial_utils.planning.limits",
    # training
    "train_model": "tutorial_utils.training.loop",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tutorial_utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
