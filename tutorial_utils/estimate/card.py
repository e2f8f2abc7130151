"""A GPU card's memory and the budget a training step's tensors get on it (no torch needed)."""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class Card:
    """A GPU's memory and what is held back from it: the budget the step's tensors get.

    ``reserve`` (bytes) stands for the CUDA context, kernels' workspaces and the allocator's
    fragmentation, which a dry run does not see: an assumption you set, not a measurement."""

    name: str
    total_bytes: int
    reserve_bytes: int

    @property
    def budget_bytes(self) -> int:
        return self.total_bytes - self.reserve_bytes

    def describe(self) -> str:
        return (
            f"card {self.name} = {self.total_bytes / GiB:,.1f} GiB, less a reserve of "
            f"{self.reserve_bytes / GiB:,.2f} GiB (CUDA context, workspaces, allocator: "
            f"assumed, set with --reserve) = {self.budget_bytes / GiB:,.2f} GiB for tensors"
        )


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|mib|mb|g|m)?\s*$", re.IGNORECASE)


def parse_bytes(text: str, default_unit: str = "gb") -> int:
    """``24GB`` / ``24GiB`` / ``24`` (GiB: a card sold as "24GB" has 24 GiB, e.g. an RTX 4090's
    25,757,220,864 bytes) or ``512MB`` / ``512MiB`` (MiB)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 24GB or 512MB, got {text!r}")
    value, unit = float(match.group(1)), (match.group(2) or default_unit).lower()
    return int(value * (GiB if unit.startswith("g") else 2**20))


def parse_card(card: str, reserve: str = "10%") -> Card:
    """A card from ``--card 24GB`` and ``--reserve 10%`` (of the card) or ``--reserve 1.5GB``."""
    total = parse_bytes(card)
    if total <= 0:
        raise ValueError(f"--card must be positive, got {card!r}")
    text = reserve.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            raise ValueError(f"--reserve: expected e.g. 10% or 1.5GB, got {reserve!r}") from None
        if not 0 <= share < 100:
            raise ValueError(f"--reserve must be between 0% and 100%, got {reserve!r}")
        held = int(total * share / 100)
    else:
        held = parse_bytes(text)
    if held >= total:
        raise ValueError(f"--reserve {reserve} leaves nothing of the {card} card")
    return Card(card.strip(), total, held)
