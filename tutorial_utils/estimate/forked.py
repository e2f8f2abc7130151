"""Tasks in forked processes: the strategies' dry runs and searches, one per core.

A dry run is pure Python dispatch on one core; a 2-core machine runs two at once. The model
and the workload reach the workers by the fork (a meta model does not pickle), so only the
tasks and their answers are pickled.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["mapped"]

_FORKED: tuple[Callable[[tuple, Any], Any], tuple] | None = None  # the workers' work, parts


def mapped(work: Callable[[tuple, Any], Any], parts: tuple, tasks: list, jobs: int) -> list:
    """``work(parts, task)`` for each task, in ``jobs`` forked processes where there are
    several (Linux; ``parts`` reach them by the fork, not pickled); serially where a fork
    cannot run them (autograd ran in this process before)."""
    if jobs < 2 or len(tasks) < 2 or sys.platform != "linux":
        return [work(parts, task) for task in tasks]
    global _FORKED
    _FORKED = (work, parts)
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
            done = pool.map(_forked, tasks, chunksize=1)
    finally:
        _FORKED = None
    if any(isinstance(o, str) and "fork" in o for o in done):  # autograd ran before: serial
        return [work(parts, task) for task in tasks]
    return done


def _forked(task: Any) -> Any:
    assert _FORKED is not None, "set by the parent before it forks"
    work, parts = _FORKED
    try:
        return work(parts, task)
    except RuntimeError as failure:
        if "fork" in str(failure):
            return str(failure)
        raise
