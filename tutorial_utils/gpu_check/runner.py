"""Running the GPU check's sections: one after another under one time budget, each isolated.

A section that raises is recorded FAILED with its error and traceback and the rest still run;
CUDA memory is freed between sections, so none starts on another's leftovers.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tutorial_utils.gpu_check.report import (
    FAILED,
    PASSED,
    SKIPPED,
    Outcome,
    SectionResult,
    one_line,
)

__all__ = ["Budget", "exit_status", "free_cuda_memory", "run_section", "run_sections", "Section"]


class Budget:
    """The check's wall-time allowance, counted from its creation: the notebooks, the long part,
    share what the earlier sections left."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic):
        self.total_s = total_s
        self.clock = clock
        self.started = clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        return self.total_s - self.elapsed()


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    run: Callable[[Budget], Outcome]


def free_cuda_memory() -> None:
    """Drop what a section left (its tensors, a caught error's frames) and hand the allocator's
    cached blocks back, so no section starts on another's leftovers."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_section(section: Section, budget: Budget) -> SectionResult:
    """One section, isolated: whatever it raises becomes a FAILED result."""
    started = time.perf_counter()
    try:
        outcome = section.run(budget)
    except Exception as raised:  # noqa: BLE001 - a failing section must not stop the others
        return SectionResult(
            section.key,
            section.title,
            FAILED,
            time.perf_counter() - started,
            error=one_line(raised),
            traceback=traceback.format_exc(),
        )
    if outcome.skipped is not None:
        status, error = SKIPPED, outcome.skipped
    elif outcome.failures:
        status, error = FAILED, "; ".join(outcome.failures)
    else:
        status, error = PASSED, None
    return SectionResult(
        section.key,
        section.title,
        status,
        time.perf_counter() - started,
        outcome.tables,
        outcome.notes,
        error,
    )


def run_sections(
    sections: Sequence[Section], budget: Budget, after_each: Callable[[list[SectionResult]], None]
) -> list[SectionResult]:
    """Every section in order, memory freed after each; ``after_each`` sees the results so far."""
    results: list[SectionResult] = []
    for section in sections:
        results.append(run_section(section, budget))
        free_cuda_memory()
        after_each(results)
    return results


def exit_status(results: list[SectionResult]) -> int:
    """1 when a section failed (skipped is not failed), else 0."""
    return 1 if any(result.status == FAILED for result in results) else 0
