"""Section 3, the CUDA-capped batch search: ``find_max_batch_size(mode="cuda")`` for NetA at 224 px
under the second article's 2.5 GB card, where the doubling phase meets a real
``torch.cuda.OutOfMemoryError``; afterwards the process must still compute and
``memory_allocated`` be back at its baseline; the tracked search beside it."""

from __future__ import annotations

from typing import Annotated, TypedDict

import torch
import torch.nn as nn

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import NetA
from tutorial_utils.articles.quoted import NETA_ARTICLE
from tutorial_utils.gpu_check.report import MEASURED, Outcome, Shown, Table, columns_of
from tutorial_utils.gpu_check.runner import Budget, Section, free_cuda_memory
from tutorial_utils.measurement.batch_search import MaxBatchResult, find_max_batch_size
from tutorial_utils.measurement.step import measure_step
from tutorial_utils.units import MiB

__all__ = [
    "batch_search_outcome",
    "first_out_of_memory",
    "FirstOverflow",
    "ReleaseRow",
    "SEARCH_BUDGET_BYTES",
    "SEARCH_SAMPLE",
    "SearchRow",
    "SECTION",
]

# NetA at the second article's 224 px under its 2.5 GB card: the dry run puts the plain step at
# batch 64 over the card, so the doubling phase (1, 2, ..., 64) meets a real out-of-memory error.
SEARCH_SAMPLE, SEARCH_BUDGET_BYTES = (3, 224, 224), NETA_ARTICLE.card_bytes


class FirstOverflow(TypedDict):
    batch: int
    doubling: bool
    error: str | None


class SearchRow(TypedDict):
    mode: Annotated[str, Shown("mode")]
    budget_mib: Annotated[float, Shown("budget MiB", "{:.0f}")]
    batch_size: Annotated[int, Shown("largest batch", "{:d}", MEASURED)]
    trials: Annotated[int, Shown("trials", "{:d}")]
    tried: Annotated[str, Shown("batches tried")]
    first_over: Annotated[int | None, Shown("first over budget", "{:d}", MEASURED)]
    doubling: Annotated[bool | None, Shown("in the doubling phase", "{}", MEASURED)]
    error: str | None


SEARCH_COLUMNS = columns_of(SearchRow)


class ReleaseRow(TypedDict):
    before: Annotated[int, Shown("allocated before the search, bytes", "{:d}", MEASURED)]
    after: Annotated[int, Shown("allocated after it, bytes", "{:d}", MEASURED)]
    difference: Annotated[int, Shown("difference, bytes", "{:d}", MEASURED)]
    alive: Annotated[bool, Shown("CUDA still computes", "{}", MEASURED)]


RELEASE_COLUMNS = columns_of(ReleaseRow)


def _neta_plain() -> nn.Module:
    return NetA(use_checkpoint=False)


def _warm_up(device: torch.device) -> None:
    """One small NetA step, so cuBLAS's and cuDNN's handles and workspaces (kept for the
    process's life) exist before the baseline is read and are not mistaken for a leak."""
    inputs, targets = torch.randn(2, *SEARCH_SAMPLE), torch.randint(0, 10, (2,))
    model = _neta_plain()
    measure_step(
        model, inputs, targets, optimizer_factory=adam_optimizer, device=device, time_step=False
    )


def first_out_of_memory(result: MaxBatchResult) -> FirstOverflow | None:
    """The first trial that ran out of memory, and whether it came in the doubling phase (the
    batches so far 1, 2, 4, ..., it included)."""
    for position, trial in enumerate(result.trials):
        if not trial.fits:
            tried = [t.batch_size for t in result.trials[: position + 1]]
            doubling = tried == [2**i for i in range(position + 1)]
            return {"batch": trial.batch_size, "doubling": doubling, "error": trial.error}
    return None


def _search_row(label: str, result: MaxBatchResult) -> SearchRow:
    over = first_out_of_memory(result)
    return {
        "mode": label,
        "budget_mib": result.budget_bytes / MiB,
        "batch_size": result.batch_size,
        "trials": len(result.trials),
        "tried": ", ".join(f"{t.batch_size}{'' if t.fits else ' (over)'}" for t in result.trials),
        "first_over": None if over is None else over["batch"],
        "doubling": None if over is None else over["doubling"],
        "error": None if over is None else over["error"],
    }


def batch_search_outcome(
    capped: MaxBatchResult, tracked: MaxBatchResult, before: int, after: int, alive: bool
) -> Outcome:
    """The two searches side by side and whether the out-of-memory error was survived."""
    rows = [_search_row("cuda: allocator capped", capped), _search_row("tracked peak", tracked)]
    release: ReleaseRow = {
        "before": before,
        "after": after,
        "difference": after - before,
        "alive": alive,
    }
    failures = []
    if rows[0]["first_over"] is None:
        failures.append("no trial ran out of memory under the cap: the OOM path was not exercised")
    if after != before:
        failures.append(f"memory_allocated {after} B after the search, {before} B before")
    if not alive:
        failures.append("CUDA no longer computes after the out-of-memory error")
    notes = [
        "NetA at 224 px, Adam, under the second article's 2560 MB card. mode cuda: each trial "
        "runs for real with torch.cuda.set_per_process_memory_fraction(budget / total); an "
        "out-of-memory error means it does not fit. tracked: each trial stops as soon as its "
        "live tensors exceed the budget (no kernel workspaces counted).",
        f"The first out-of-memory error: {rows[0]['error'] or 'none'}.",
    ]
    return Outcome(
        [
            Table("Largest batch under the card", SEARCH_COLUMNS, rows),
            Table("After the out-of-memory error", RELEASE_COLUMNS, [release]),
        ],
        notes,
        failures,
    )


def batch_search_section(budget: Budget) -> Outcome:
    """Section 3: the capped search, its out-of-memory error survived and its memory released."""
    device = torch.device("cuda")
    _warm_up(device)
    free_cuda_memory()
    before = torch.cuda.memory_allocated(device)
    capped = find_max_batch_size(
        _neta_plain,
        SEARCH_SAMPLE,
        SEARCH_BUDGET_BYTES,
        device=device,
        mode="cuda",
        optimizer_factory=adam_optimizer,
    )
    free_cuda_memory()
    after = torch.cuda.memory_allocated(device)
    alive = torch.ones(4, device=device).add(1).sum().item() == 8.0
    tracked = find_max_batch_size(
        _neta_plain,
        SEARCH_SAMPLE,
        SEARCH_BUDGET_BYTES,
        device=device,
        mode="tracked",
        optimizer_factory=adam_optimizer,
    )
    return batch_search_outcome(capped, tracked, before, after, alive)


SECTION = Section(
    "batch_search", "CUDA-capped batch search with an out-of-memory error", batch_search_section
)
