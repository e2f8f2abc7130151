"""Repeated times of the same work, and whether a difference between two of them is more than noise.

On a shared machine one timing can invert a lesson (a checkpointed step "faster" than the plain
one). A `Timing` keeps every repeat, in wall time and in CPU time. The tutorial has one statistic
behind "beyond noise", the one ``tools.time_turns`` and ``tools.compare_times`` teach: the ratio
of the **medians of one-thread CPU time**, beyond noise only when the two **ranges** of repeats do
not overlap. A one-thread step's CPU time hardly notices other programs, and the median is not
swayed by one slow repeat. Things compared with each other are timed in turns
(`time_interleaved`, on one thread), so a slow spell of the machine lands on all of them alike.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Literal, TypeVar

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
Clock = Literal["cpu", "wall"]
CLOCK_NAMES: dict[Clock, str] = {"cpu": "CPU time", "wall": "wall time"}


@dataclass(frozen=True)
class Timing:
    """Repeats of the same work: wall seconds, and the CPU seconds of the same repeats (empty
    when only wall time was recorded, as for a training history's epochs)."""

    durations: tuple[float, ...]
    cpu_durations: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.durations or min(self.durations) <= 0:
            raise ValueError(f"a Timing needs positive durations, got {self.durations!r}")
        if self.cpu_durations and (
            len(self.cpu_durations) != len(self.durations) or min(self.cpu_durations) < 0
        ):
            raise ValueError(
                f"cpu_durations are one non-negative CPU time per repeat: {self.cpu_durations!r} "
                f"for {len(self.durations)} repeats"
            )

    @classmethod
    def of(cls, durations: Sequence[float], cpu_durations: Sequence[float] = ()) -> Timing:
        return cls(tuple(float(d) for d in durations), tuple(float(d) for d in cpu_durations))

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
    def cpu_median(self) -> float | None:
        return median(self.cpu_durations) if self.cpu_durations else None

    @property
    def repeats(self) -> int:
        return len(self.durations)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / fastest: 0.25 means repeats varied by 25%."""
        return (self.slowest - self.fastest) / self.fastest

    def seconds(self, clock: Clock) -> tuple[float, ...]:
        """The repeats on one clock (``cpu`` falls back to nothing when it was not recorded)."""
        return self.cpu_durations if clock == "cpu" else self.durations

    def overlaps(self, other: Timing) -> bool:
        """True when the two ranges of wall times overlap (`compare` reads CPU time first)."""
        return self.fastest <= other.slowest and other.fastest <= self.slowest

    def describe(self, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
        """'0.957 s median (0.951-1.033 over 3 runs)', wall time; one run says it has no spread."""
        low, high, middle = self.fastest * scale, self.slowest * scale, self.median * scale
        if self.repeats == 1:
            return f"{low:.{digits}f} {unit} (1 run: no spread measured)"
        return (
            f"{middle:.{digits}f} {unit} median ({low:.{digits}f}-{high:.{digits}f} over "
            f"{self.repeats} runs)"
        )


@dataclass(frozen=True)
class TimeComparison:
    """One timing against a reference: the ratio of medians on one clock, and whether the two
    ranges of repeats are apart (None: a single run, so no noise was measured)."""

    ratio: float
    beyond_noise: bool | None
    clock: Clock


def compare(timing: Timing, reference: Timing, clock: Clock = "cpu") -> TimeComparison:
    """The tutorial's one statistic: medians on ``clock`` (CPU time unless a timing has none, or
    its median is 0; on a GPU, whose work a CPU clock does not see, pass ``clock="wall"``), beyond
    noise only when the ranges do not overlap."""
    if clock == "cpu" and not (timing.cpu_median and reference.cpu_median):
        clock = "wall"
    ours, theirs = timing.seconds(clock), reference.seconds(clock)
    ratio = median(ours) / median(theirs)
    if len(ours) == 1 or len(theirs) == 1:
        return TimeComparison(ratio, None, clock)
    apart = min(ours) > max(theirs) or max(ours) < min(theirs)
    return TimeComparison(ratio, apart, clock)


def time_repeats(
    work: Callable[[], object], repeats: int, synchronize: Callable[[], None] = lambda: None
) -> Timing:
    """Run ``work`` ``repeats`` times, each timed alone in wall and CPU time (``synchronize``
    waits for a GPU)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    durations, cpu_durations = [], []
    for _ in range(repeats):
        synchronize()
        started, cpu_started = time.perf_counter(), time.process_time()
        work()
        synchronize()
        durations.append(time.perf_counter() - started)
        cpu_durations.append(time.process_time() - cpu_started)
    return Timing.of(durations, cpu_durations)


def time_interleaved(
    works: Mapping[Key, Callable[[], object]],
    repeats: int,
    synchronize: Callable[[], None] = lambda: None,
    setups: Mapping[Key, Callable[[], object]] | None = None,
) -> dict[Key, Timing]:
    """Time each of ``works`` ``repeats`` times, in turns (a, b, c, a, b, c, ...), on one CPU
    thread as ``tools.time_turns`` does; ``setups`` of the same name run untimed before each of
    its turns (switching a shared model to it)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    setups = setups or {}
    walls: dict[Key, list[float]] = {name: [] for name in works}
    cpus: dict[Key, list[float]] = {name: [] for name in works}
    with one_thread():
        for _ in range(repeats):
            for name, work in works.items():
                if name in setups:
                    setups[name]()
                timing = time_repeats(work, 1, synchronize)
                walls[name].extend(timing.durations)
                cpus[name].extend(timing.cpu_durations)
    return {name: Timing.of(walls[name], cpus[name]) for name in works}


def time_verdict(
    timing: Timing, reference: Timing, flops_ratio: float | None = None, clock: Clock = "cpu"
) -> str:
    """A measured time ratio read against its noise and, when given, the FLOP-based expectation.

    'x1.35 CPU time, beyond noise (medians, ranges apart; FLOPs predict x1.20)', or 'within noise
    (medians, ranges overlap)': the statistic of ``tools.compare_times`` (see `compare`).
    """
    result = compare(timing, reference, clock)
    expected = "" if flops_ratio is None else f"; FLOPs predict x{flops_ratio:.2f}"
    head = f"x{result.ratio:.2f} {CLOCK_NAMES[result.clock]}"
    if result.beyond_noise is None:
        return f"{head}, noise unknown (1 run{expected})"
    if result.beyond_noise:
        return f"{head}, beyond noise (medians, ranges apart{expected})"
    return f"{head}, within noise (medians, ranges overlap{expected})"


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
