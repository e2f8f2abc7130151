"""Timings keep their repeats, so a difference is read against its noise."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, equal_segments
from tutorial_utils.measurement.step import measure_step, sweep_strategies
from tutorial_utils.measurement.timing import (
    Timing,
    compare,
    time_interleaved,
    time_repeats,
    time_verdict,
)
from tutorial_utils.tools import StepTimes, compare_times


def test_a_timing_is_its_repeats_fastest_first() -> None:
    timing = Timing.of([0.30, 0.20, 0.25])
    assert (timing.fastest, timing.slowest, timing.median, timing.repeats) == (0.20, 0.30, 0.25, 3)
    assert timing.spread == pytest.approx(0.5)
    assert timing.describe(unit="ms", scale=1000, digits=0) == "250 ms median (200-300 over 3 runs)"
    assert "1 run: no spread" in Timing.of([0.2]).describe()
    with pytest.raises(ValueError, match="positive durations"):
        Timing.of([])
    with pytest.raises(ValueError, match="positive durations"):
        Timing.of([0.1, 0.0])


def test_the_verdict_says_within_noise_only_when_the_ranges_overlap() -> None:
    plain = Timing.of([1.00, 1.10, 1.05], [1.00, 1.10, 1.05])
    close = Timing.of([1.08, 1.20], [1.08, 1.20])
    apart = Timing.of([1.30, 1.35], [1.30, 1.35])
    assert time_verdict(close, plain) == "x1.09 CPU time, within noise (medians, ranges overlap)"
    assert (
        time_verdict(apart, plain, 1.33)
        == "x1.26 CPU time, beyond noise (medians, ranges apart; FLOPs predict x1.33)"
    )
    assert "noise unknown" in time_verdict(Timing.of([1.3], [1.3]), plain)


def test_the_verdict_reads_cpu_time_medians_not_the_fastest_wall_times() -> None:
    # wall time: the fastest repeats are x1.50 apart and the ranges too (a busy spell hit the
    # plain step's wall clock); CPU time, which the busy spell hardly touches, overlaps
    plain = Timing.of([1.0, 1.0, 1.1], cpu_durations=[1.00, 1.04, 1.08])
    ckpt = Timing.of([1.5, 1.6, 1.7], cpu_durations=[1.06, 1.10, 1.12])
    result = compare(ckpt, plain)
    assert (result.clock, result.beyond_noise) == ("cpu", False)
    assert result.ratio == pytest.approx(1.10 / 1.04)
    assert compare(ckpt, plain, clock="wall").beyond_noise is True
    # a timing with wall time only (a training history's epochs) is read on the wall clock
    assert time_verdict(Timing.of([1.3, 1.4]), Timing.of([1.0, 1.1])).startswith(
        "x1.29 wall time, beyond noise"
    )


@pytest.mark.parametrize(
    ("plain_cpu", "ckpt_cpu"),
    [([1.0, 1.2, 1.1], [1.3, 1.5, 1.4]), ([1.0, 1.3, 1.1], [1.25, 1.5, 1.4])],
)
def test_the_package_and_tools_give_one_verdict(plain_cpu: list, ckpt_cpu: list) -> None:
    """measurement.timing and tools.compare_times: one statistic behind "beyond noise"."""
    times = {"plain": StepTimes(plain_cpu, plain_cpu), "ckpt": StepTimes(ckpt_cpu, ckpt_cpu)}
    tools_line = next(
        line
        for line in compare_times(times, "plain").splitlines()
        if "cpu" in line and "ckpt" in line
    )
    result = compare(Timing.of(ckpt_cpu, ckpt_cpu), Timing.of(plain_cpu, plain_cpu))
    assert f"x{result.ratio:.2f}, beyond noise: {result.beyond_noise}" in tools_line


def test_steps_compared_in_turns_run_on_one_thread_and_keep_their_cpu_time() -> None:
    threads_before, seen = torch.get_num_threads(), []
    timings = time_interleaved(
        {"a": lambda: seen.append(torch.get_num_threads()), "b": lambda: sum(range(10_000))}, 3
    )
    assert seen == [1, 1, 1] and torch.get_num_threads() == threads_before
    assert all(len(t.cpu_durations) == 3 for t in timings.values())


def test_time_repeats_times_each_run_and_refuses_zero_repeats() -> None:
    calls = []
    timing = time_repeats(lambda: calls.append(sum(range(10_000))), 4)
    assert timing.repeats == 4 and len(calls) == 4 and timing.fastest > 0
    with pytest.raises(ValueError, match="at least 1"):
        time_repeats(lambda: None, 0)


def test_interleaved_timing_takes_turns() -> None:
    order = []
    timings = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3)
    assert order == ["a", "b"] * 3
    assert {name: t.repeats for name, t in timings.items()} == {"a": 3, "b": 3}
    order.clear()
    time_interleaved({"a": lambda: order.append("a")}, 2, setups={"a": lambda: order.append("s")})
    assert order == ["s", "a", "s", "a"]
    with pytest.raises(ValueError, match="at least 1"):
        time_interleaved({"a": lambda: None}, 0)


def test_measure_step_keeps_every_timed_repeat() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    inputs, targets = torch.randn(16, 32), torch.randint(0, 4, (16,))
    report = measure_step(model, inputs, targets, repeats=3)
    assert report.timing is not None and report.timing.repeats == 3
    assert report.seconds == report.timing.fastest
    dry = measure_step(model, inputs, targets, device="meta")
    assert dry.seconds is None and dry.timing is None


def test_a_sweep_times_every_count_with_its_repeats() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(4)])
    inputs, targets = torch.randn(8, 16), torch.randint(0, 16, (8,))
    splits = [NO_CHECKPOINTING, equal_segments(2)]
    records = sweep_strategies(model, inputs, targets, splits, repeats=3)
    assert [r.timing.repeats for r in records] == [3, 3]
    assert all(r.seconds == r.timing.fastest for r in records)
    assert records[1].time_ratio == records[1].seconds / records[0].seconds
    dry = sweep_strategies(model, inputs, targets, [NO_CHECKPOINTING], device="meta")
    assert all(r.timing is None for r in dry)
