"""Repeated wall times, and whether a difference between two of them is more than noise.

On a shared machine one timing can invert a lesson (a checkpointed step "faster" than the plain
one). A `Timing` keeps every repeat: the fastest is the estimate (other work only ever adds time,
as ``timeit`` argues), the range is the noise, and two timings whose ranges overlap are not told
apart. Things compared with each other are timed in turns (`time_interleaved`), so a slow spell
of the machine lands on all of them instead of on whichever ran during it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import TypeVar

import torch

__all__ = [
    "Key",
    "load_average_line",
    "one_thread",
    "time_interleaved",
    "time_repeats",
    "time_verdict",
    "Timing",
]

Key = TypeVar("Key", bound=Hashable)  # what names the works timed in turns: a label, a count


@dataclass(frozen=True)
class Timing:
    """Wall times of repeats of the same work, in seconds."""

    durations: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.durations or min(self.durations) <= 0:
            raise ValueError(f"a Timing needs positive durations, got {self.durations!r}")

    @classmethod
    def of(cls, durations: Sequence[float]) -> Timing:
        return cls(tuple(float(d) for d in durations))

    @property
    def fastest(self) -> float:
        return min(self.durations)

    @property
    def slowest(self) -> float:
        return max(self.durations)

    @property
    def median(self) -> float:
        return median(self.durations)

    @property
    def repeats(self) -> int:
        return len(self.durations)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / fastest: 0.25 means repeats varied by 25%."""
        return (self.slowest - self.fastest) / self.fastest

    def overlaps(self, other: Timing) -> bool:
        """True when the two ranges of repeats overlap: the difference is within noise."""
        return self.fastest <= other.slowest and other.fastest <= self.slowest

    def describe(self, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
        """'0.957 s (0.951-1.033 over 3 runs)'; one run says it has no spread."""
        low, high = self.fastest * scale, self.slowest * scale
        if self.repeats == 1:
            return f"{low:.{digits}f} {unit} (1 run: no spread measured)"
        return (
            f"{low:.{digits}f} {unit} ({low:.{digits}f}-{high:.{digits}f} over {self.repeats} runs)"
        )


def time_repeats(
    work: Callable[[], object], repeats: int, synchronize: Callable[[], None] = lambda: None
) -> Timing:
    """Run ``work`` ``repeats`` times, each timed alone (``synchronize`` waits for a GPU)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    durations = []
    for _ in range(repeats):
        synchronize()
        started = time.perf_counter()
        work()
        synchronize()
        durations.append(time.perf_counter() - started)
    return Timing.of(durations)


def time_interleaved(
    works: Mapping[Key, Callable[[], object]],
    repeats: int,
    synchronize: Callable[[], None] = lambda: None,
    setups: Mapping[Key, Callable[[], object]] | None = None,
) -> dict[Key, Timing]:
    """Time each of ``works`` ``repeats`` times, in turns (a, b, c, a, b, c, ...); ``setups``
    of the same name run untimed before each of its turns (switching a shared model to it)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    setups = setups or {}
    durations: dict[Key, list[float]] = {name: [] for name in works}
    for _ in range(repeats):
        for name, work in works.items():
            if name in setups:
                setups[name]()
            durations[name].extend(time_repeats(work, 1, synchronize).durations)
    return {name: Timing.of(values) for name, values in durations.items()}


def time_verdict(timing: Timing, reference: Timing, flops_ratio: float | None = None) -> str:
    """A measured time ratio read against its noise and, when given, the FLOP-based expectation.

    'x1.08, within noise (ranges overlap; FLOPs predict x1.20)' or 'x1.35, beyond noise (...)'.
    """
    ratio = timing.fastest / reference.fastest
    expected = "" if flops_ratio is None else f"; FLOPs predict x{flops_ratio:.2f}"
    if timing.repeats == 1 or reference.repeats == 1:
        return f"x{ratio:.2f}, noise unknown (1 run{expected})"
    if timing.overlaps(reference):
        return f"x{ratio:.2f}, within noise (ranges overlap{expected})"
    return f"x{ratio:.2f}, beyond noise (ranges apart{expected})"


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch's CPU ops on one thread inside, then restore the count. On a machine shared with
    other work, several intra-op threads wait on each other whenever one is descheduled, which can
    make a step several times slower and its repeats scatter; one thread times steadier."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def load_average_line() -> str:
    """Other work on the machine, which measured times include (dry runs have none)."""
    return f"load average {os.getloadavg()[0]:.1f} (1 min)"
