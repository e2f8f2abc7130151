"""Gradient checkpointing, measured: the tools behind the tutorial's notebooks.

The names below are the public API, the tools to take into your own training script (the
README's "Use it on your own model" shows them at work), every type they return (``StepReport``
with its device readings ``CudaReadings``, ``NvmlReading`` and ``MpsReadings``, ``SweepRecord``,
``MaxBatchResult`` and its ``BatchTrial``, ``Plan``, ``NestedPlan``, ``PeakFloor``, ``History``
and its rows ``EpochRow``; ``tests/test_public_api.py`` fails on a returned class left out), the
optimizer factory they all take (``OptimizerFactory``, default ``default_optimizer``) and how to
checkpoint: a ``Strategy`` (``equal_segments(k)``, ``every_nth_block(n)``, ``selective(ops)``,
``offloaded()``, ``scheduled(plan)``, ``NO_CHECKPOINTING``), which every step, sweep, search and
loop takes as ``strategy=`` and which ``strategy.applied(model)`` puts on any model
(``checkpointed_blocks`` wraps blocks you choose yourself). They are imported lazily, on first
use, so ``python -m tutorial_utils --help`` answers before torch is loaded. The layers behind them
are described in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what an IDE or a type checker sees; at run time the names load lazily
    from tutorial_utils.checkpointing.batchnorm import (
        freeze_stats_during_recompute as freeze_stats_during_recompute,
    )
    from tutorial_utils.checkpointing.blocks import checkpointed_blocks as checkpointed_blocks
    from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING as NO_CHECKPOINTING
    from tutorial_utils.checkpointing.strategy import SequentialSchedule as SequentialSchedule
    from tutorial_utils.checkpointing.strategy import Strategy as Strategy
    from tutorial_utils.checkpointing.strategy import StrategyKind as StrategyKind
    from tutorial_utils.checkpointing.strategy import equal_segments as equal_segments
    from tutorial_utils.checkpointing.strategy import every_nth_block as every_nth_block
    from tutorial_utils.checkpointing.strategy import offloaded as offloaded
    from tutorial_utils.checkpointing.strategy import scheduled as scheduled
    from tutorial_utils.checkpointing.strategy import selective as selective
    from tutorial_utils.measurement.batch_search import BatchTrial as BatchTrial
    from tutorial_utils.measurement.batch_search import MaxBatchResult as MaxBatchResult
    from tutorial_utils.measurement.batch_search import find_max_batch_size as find_max_batch_size
    from tutorial_utils.measurement.dry_run import build_on_meta as build_on_meta
    from tutorial_utils.measurement.dry_run import dry_run_step as dry_run_step
    from tutorial_utils.measurement.dry_run import meta_copy as meta_copy
    from tutorial_utils.measurement.nvml import CudaReadings as CudaReadings
    from tutorial_utils.measurement.nvml import MpsReadings as MpsReadings
    from tutorial_utils.measurement.nvml import NvmlReading as NvmlReading
    from tutorial_utils.measurement.step import OptimizerFactory as OptimizerFactory
    from tutorial_utils.measurement.step import Recording as Recording
    from tutorial_utils.measurement.step import StepReport as StepReport
    from tutorial_utils.measurement.step import SweepRecord as SweepRecord
    from tutorial_utils.measurement.step import default_optimizer as default_optimizer
    from tutorial_utils.measurement.step import measure_step as measure_step
    from tutorial_utils.measurement.step import sweep_strategies as sweep_strategies
    from tutorial_utils.measurement.tracker import TensorMemoryTracker as TensorMemoryTracker
    from tutorial_utils.planning.budget import plan_checkpoints as plan_checkpoints
    from tutorial_utils.planning.limits import PeakFloor as PeakFloor
    from tutorial_utils.planning.limits import peak_floor as peak_floor
    from tutorial_utils.planning.nested import NestedPlan as NestedPlan
    from tutorial_utils.planning.planner import Plan as Plan
    from tutorial_utils.training.loop import EpochRow as EpochRow
    from tutorial_utils.training.loop import History as History
    from tutorial_utils.training.loop import TrainingOptions as TrainingOptions
    from tutorial_utils.training.loop import train_model as train_model

_PUBLIC = {
    # mechanism
    "Strategy": "tutorial_utils.checkpointing.strategy",
    "StrategyKind": "tutorial_utils.checkpointing.strategy",
    "SequentialSchedule": "tutorial_utils.checkpointing.strategy",
    "NO_CHECKPOINTING": "tutorial_utils.checkpointing.strategy",
    "equal_segments": "tutorial_utils.checkpointing.strategy",
    "every_nth_block": "tutorial_utils.checkpointing.strategy",
    "selective": "tutorial_utils.checkpointing.strategy",
    "offloaded": "tutorial_utils.checkpointing.strategy",
    "scheduled": "tutorial_utils.checkpointing.strategy",
    "checkpointed_blocks": "tutorial_utils.checkpointing.blocks",
    "freeze_stats_during_recompute": "tutorial_utils.checkpointing.batchnorm",
    # measurement
    "TensorMemoryTracker": "tutorial_utils.measurement.tracker",
    "StepReport": "tutorial_utils.measurement.step",
    "CudaReadings": "tutorial_utils.measurement.nvml",
    "NvmlReading": "tutorial_utils.measurement.nvml",
    "MpsReadings": "tutorial_utils.measurement.nvml",
    "OptimizerFactory": "tutorial_utils.measurement.step",
    "Recording": "tutorial_utils.measurement.step",
    "default_optimizer": "tutorial_utils.measurement.step",
    "measure_step": "tutorial_utils.measurement.step",
    "sweep_strategies": "tutorial_utils.measurement.step",
    "SweepRecord": "tutorial_utils.measurement.step",
    "MaxBatchResult": "tutorial_utils.measurement.batch_search",
    "BatchTrial": "tutorial_utils.measurement.batch_search",
    "find_max_batch_size": "tutorial_utils.measurement.batch_search",
    "dry_run_step": "tutorial_utils.measurement.dry_run",
    "build_on_meta": "tutorial_utils.measurement.dry_run",
    "meta_copy": "tutorial_utils.measurement.dry_run",
    # planning
    "Plan": "tutorial_utils.planning.planner",
    "NestedPlan": "tutorial_utils.planning.nested",
    "plan_checkpoints": "tutorial_utils.planning.budget",
    "PeakFloor": "tutorial_utils.planning.limits",
    "peak_floor": "tutorial_utils.planning.limits",
    # training
    "train_model": "tutorial_utils.training.loop",
    "History": "tutorial_utils.training.loop",
    "TrainingOptions": "tutorial_utils.training.loop",
    "EpochRow": "tutorial_utils.training.loop",
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
