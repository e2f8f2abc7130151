"""Timings keep their repeats, so a difference is read against its noise."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, equal_segments
from tutorial_utils.measurement.step import measure_step, sweep_strategies
from tutorial_utils.measurement.timing import Timing, time_interleaved, time_repeats, time_verdict


def test_a_timing_is_its_repeats_fastest_first() -> None:
    timing = Timing.of([0.30, 0.20, 0.25])
    assert (timing.fastest, timing.slowest, timing.median, timing.repeats) == (0.20, 0.30, 0.25, 3)
    assert timing.spread == pytest.approx(0.5)
    assert timing.describe(unit="ms", scale=1000, digits=0) == "200 ms (200-300 over 3 runs)"
    assert "1 run: no spread" in Timing.of([0.2]).describe()
    with pytest.raises(ValueError, match="positive durations"):
        Timing.of([])
    with pytest.raises(ValueError, match="positive durations"):
        Timing.of([0.1, 0.0])


def test_the_verdict_says_within_noise_only_when_the_ranges_overlap() -> None:
    plain = Timing.of([1.00, 1.10, 1.05])
    close = Timing.of([1.08, 1.20])
    apart = Timing.of([1.30, 1.35])
    assert close.overlaps(plain) and not apart.overlaps(plain)
    assert time_verdict(close, plain) == "x1.08, within noise (ranges overlap)"
    assert (
        time_verdict(apart, plain, 1.33)
        == "x1.30, beyond noise (ranges apart; FLOPs predict x1.33)"
    )
    assert "noise unknown" in time_verdict(Timing.of([1.3]), plain)


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
