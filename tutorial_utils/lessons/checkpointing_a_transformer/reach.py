"""How far checkpointing goes: the longest sequence a card trains, by the command line's engine.

The notebook asks what ``python -m tutorial_utils estimate`` answers, through the same calls:
``Workload``, ``parse_card`` (the card's memory less its CUDA context), ``parse_strategy`` and
``estimate`` with its search (dry runs replayed through the emulated CUDA caching allocator). So
the notebook, the README and the command line give one answer, and
``tests/test_checkpointing_a_transformer.py`` holds the notebook's table equal to the command's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tutorial_utils.display.tables import text_table
from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, build_model, estimate
from tutorial_utils.estimate.strategies import parse_strategy

__all__ = ["Fit", "fit_table", "longest_sequences"]


@dataclass(frozen=True)
class Fit:
    """One strategy's longest sequence on one card, as ``estimate`` finds it."""

    strategy: str
    card: str
    sequence: int  # tokens; 0 if not even 256 fit
    trials: int  # dry runs that found it


def longest_sequences(
    workload: Workload, strategies: Sequence[str], cards: Sequence[str]
) -> list[Fit]:
    """For each card (the command's ``--card``, e.g. ``"16GB"``), each strategy's longest
    sequence: what ``python -m tutorial_utils estimate ... --strategies S --card C`` prints in its
    "longest sequence" column. The model is built once, on meta, and dry-run for every card."""
    if not strategies or not cards:
        raise ValueError("give at least one strategy (e.g. 'none') and one card (e.g. '16GB')")
    parsed = [parse_strategy(name) for name in strategies]
    model = build_model(workload)
    fits = []
    for card_name in cards:
        result = estimate(workload, parsed, parse_card(card_name), model=model, search=True)
        fits += [
            Fit(row.strategy.name, card_name, row.largest or 0, row.trials)
            for row in result.rows
            if row.report is not None
        ]
    return fits


def fit_table(fits: Sequence[Fit]) -> str:
    """The longest sequence of each strategy (rows) on each card (columns), with its dry runs."""
    cards = list(dict.fromkeys(f.card for f in fits))
    names = list(dict.fromkeys(f.strategy for f in fits))
    by = {(f.strategy, f.card): f for f in fits}
    rows = [
        (name, *(f"{by[name, c].sequence:,} tokens ({by[name, c].trials} runs)" for c in cards))
        for name in names
    ]
    return text_table(("strategy", *cards), rows)
