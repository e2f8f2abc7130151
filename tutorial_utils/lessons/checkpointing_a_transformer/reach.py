"""How far checkpointing goes: the longest sequence a card's tensor budget trains, by dry runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.nn as nn

from tutorial_utils.checkpointing.strategy import Strategy
from tutorial_utils.display.tables import text_table
from tutorial_utils.lessons.checkpointing_a_transformer.strategies import lm_step
from tutorial_utils.measurement.batch_search import largest_fitting, start_on_line
from tutorial_utils.measurement.tracker import MemoryLimitExceeded

# -- how far it goes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """The longest sequence whose step fits a card, found by dry runs."""

    strategy: str
    card: str
    budget_bytes: int
    sequence: int  # tokens; 0 if not even one unit fits
    peak_bytes: int | None  # the dry run's peak at ``sequence``
    trials: int  # dry runs that searched for it (besides the two shared predicting ones)


def longest_sequences(
    model: nn.Module,
    strategy: Strategy,
    budgets: dict[str, int],
    *,
    batch: int = 1,
    unit: int = 256,
    max_sequence: int = 131072,
) -> list[Fit]:
    """For each card in ``budgets``, the longest multiple of ``unit`` tokens whose step's tracked
    peak fits its budget.

    Two dry runs predict a start (the peak grows about linearly in the sequence once attention
    keeps no s x s matrix), then ``largest_fitting`` confirms each answer by dry runs that stop as
    soon as they exceed the budget: the answers are measured, the line only saves trials.
    """
    if not budgets or min(budgets.values()) <= 0 or unit < 2:
        raise ValueError(f"need positive budgets_bytes and unit >= 2, got {budgets}, {unit}")
    low, high = (lm_step(model, strategy, batch, n * unit).peak_bytes for n in (1, 2))
    fits = []
    for card, budget in budgets.items():
        peaks: dict[int, int] = {}  # units -> peak bytes of the trials that fit
        tried: list[int] = []

        def fits_in(units: int, budget: int = budget, peaks: dict = peaks, tried=tried) -> bool:
            tried.append(units)
            try:
                report = lm_step(model, strategy, batch, units * unit, limit_bytes=budget)
            except MemoryLimitExceeded:
                return False
            peaks[units] = report.peak_bytes
            return True

        start = start_on_line(low, high, budget)
        best = largest_fitting(fits_in, max_sequence // unit, start=start)
        fits.append(Fit(strategy.name, card, budget, best * unit, peaks.get(best), len(tried)))
    return fits


def card_budget(gib: int) -> int:
    """A card's tensor budget: its memory less 10% for the CUDA context, kernel workspaces and
    the allocator's fragmentation, which the tracker does not see (an assumption, not measured)."""
    return int(0.9 * gib * 2**30)


def fit_table(fits: Sequence[Fit]) -> str:
    """The longest sequence of each strategy (rows) on each card (columns), with its dry runs."""
    cards = list(dict.fromkeys(f.card for f in fits))
    names = list(dict.fromkeys(f.strategy for f in fits))
    by = {(f.strategy, f.card): f for f in fits}
    rows = [
        (
            name,
            *(
                f"{by[(name, card)].sequence:,} tokens ({by[(name, card)].trials} runs)"
                for card in cards
            ),
        )
        for name in names
    ]
    return text_table(("strategy", *cards), rows)
