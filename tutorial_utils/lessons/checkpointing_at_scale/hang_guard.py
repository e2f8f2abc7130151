"""How long ``launch`` waits before it calls the lesson's ranks hung: as long as their work needs.

A fixed deadline cannot fit every profile. At the article's sizes a rank's step (width 1024,
depth 24, 4096 rows) is about 6 TFLOP, over a minute on one CPU core, and a rank runs a dozen of
them; at the ``ci`` sizes the same deadline would wait minutes for a few seconds of work. So the
guard is the work's predicted time on this machine, times a margin: the FLOPs of a rank's steps,
counted by a dry run of the checkpointed step (the costlier one), over this machine's measured
one-thread matrix-product rate (each rank runs one thread) times the cores each rank gets. The
margin covers what the count leaves out: elementwise ops, the optimizer, gloo's traffic, process
start-up and a machine busy with other work. It is never shorter than ``launch``'s default.
"""

from __future__ import annotations

import os

from tutorial_utils.lessons.checkpointing_at_scale.model import BlockNetConfig, build_model
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.timing import one_thread
from tutorial_utils.planning.roofline import measure_machine
from tutorial_utils.training.distributed import DEFAULT_TIMEOUT_S, DeviceType

SAFETY_MARGIN = 4.0


def rank_step_flops(config: BlockNetConfig, world_size: int) -> int:
    """FLOPs of one rank's checkpointed training step (forward, backward, recompute), dry run."""
    config.check_splits(world_size)
    model = build_on_meta(lambda: build_model(config, checkpoint_blocks=True))
    report = dry_run_step(model, (config.global_batch // world_size, config.width))
    assert report.flops is not None  # a dry run always counts its FLOPs
    return report.flops.total


def one_thread_flops_per_second() -> float:
    """This machine's float32 matrix-product rate on one thread, as a rank runs (measured)."""
    with one_thread():
        return measure_machine().flops_per_second


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one, as in a container)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def hang_guard_s(
    config: BlockNetConfig,
    steps_per_rank: int,
    world_size: int,
    device_type: DeviceType,
    *,
    flops_per_second: float | None = None,
    cores: int | None = None,
) -> float:
    """Seconds to wait for ``steps_per_rank`` steps on every rank before calling the ranks hung.

    ``flops_per_second`` (one thread) and ``cores`` are measured here unless given.
    """
    if steps_per_rank < 1:
        raise ValueError(f"steps_per_rank must be at least 1, got {steps_per_rank}")
    if device_type == "cuda":
        return DEFAULT_TIMEOUT_S
    rate = one_thread_flops_per_second() if flops_per_second is None else flops_per_second
    if rate <= 0:
        raise ValueError(f"flops_per_second must be positive, got {rate}")
    share_of_a_core = min(1.0, (available_cores() if cores is None else cores) / world_size)
    work_s = steps_per_rank * rank_step_flops(config, world_size) / (rate * share_of_a_core)
    return max(DEFAULT_TIMEOUT_S, SAFETY_MARGIN * work_s)
