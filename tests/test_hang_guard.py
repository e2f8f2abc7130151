"""Notebook 05's hang guard: launch waits as long as the ranks' work needs on this machine."""

import pytest

from tutorial_utils.articles.profiles import PROFILES
from tutorial_utils.lessons.checkpointing_at_scale import (
    DDP_CASES,
    DISTRIBUTED_SETUPS,
    WARMUP_STEPS,
    BlockNetConfig,
    compare_ddp_cases,
    compare_memory,
    ddp_cases,
    hang_guard,
    memory,
    sizes_for,
)
from tutorial_utils.lessons.checkpointing_at_scale.hang_guard import (
    SAFETY_MARGIN,
    hang_guard_s,
    one_thread_flops_per_second,
    rank_step_flops,
)
from tutorial_utils.training.distributed import DEFAULT_TIMEOUT_S

ARTICLE = sizes_for(PROFILES["article"])
CI = sizes_for(PROFILES["ci"])
SLOW_RATE = 1e7  # FLOP/s: a machine slow enough that every guard here exceeds the minimum


def test_a_ranks_step_flops_are_its_matrix_products_counted_by_hand():
    config = BlockNetConfig(width=64, depth=3, global_batch=32)
    batch, width, depth, classes = 16, 64, 3, 10
    block = 2 * batch * 8 * width * width  # fc1 and fc2: width -> 4 width -> width
    forward = 2 * batch * width * width + depth * block + 2 * batch * width * classes
    backward = 2 * forward - 2 * batch * width * width  # the input needs no gradient
    # Each block's forward again up to fc1 and its ReLU: fc2 saves its input, not its output, and
    # the non-reentrant checkpoint stops recomputing once every saved tensor is back.
    recompute = depth * block // 2
    assert rank_step_flops(config, world_size=2) == forward + backward + recompute


def test_the_guard_is_the_predicted_work_times_the_margin():
    flops = rank_step_flops(ARTICLE, world_size=2)
    guard = hang_guard_s(ARTICLE, 12, 2, "cpu", flops_per_second=SLOW_RATE, cores=2)
    assert guard == pytest.approx(SAFETY_MARGIN * 12 * flops / SLOW_RATE)


def test_more_work_waits_longer():
    def guard(config: BlockNetConfig, steps: int) -> float:
        return hang_guard_s(config, steps, 2, "cpu", flops_per_second=SLOW_RATE, cores=2)

    assert guard(ARTICLE, 12) > guard(CI, 12) > DEFAULT_TIMEOUT_S
    assert guard(ARTICLE, 12) == pytest.approx(2 * guard(ARTICLE, 6))


def test_ranks_sharing_a_core_wait_for_each_other():
    alone = hang_guard_s(ARTICLE, 1, 2, "cpu", flops_per_second=SLOW_RATE, cores=2)
    shared = hang_guard_s(ARTICLE, 1, 2, "cpu", flops_per_second=SLOW_RATE, cores=1)
    assert shared == pytest.approx(2 * alone)


def test_small_work_and_gpus_keep_launchs_default():
    assert hang_guard_s(CI, 1, 2, "cpu", flops_per_second=1e12, cores=2) == DEFAULT_TIMEOUT_S
    assert hang_guard_s(ARTICLE, 12, 2, "cuda") == DEFAULT_TIMEOUT_S


@pytest.mark.parametrize(
    ("steps", "rate", "message"),
    [(0, SLOW_RATE, "steps_per_rank must be at least 1"), (1, 0.0, "must be positive")],
)
def test_bad_input_is_refused(steps, rate, message):
    with pytest.raises(ValueError, match=message):
        hang_guard_s(CI, steps, 2, "cpu", flops_per_second=rate, cores=2)


def test_this_machines_one_thread_rate_is_measured():
    assert one_thread_flops_per_second() > 1e8  # any CPU since 2005 beats 0.1 GFLOP/s


class LaunchCalled(Exception):
    """Stops the lesson's call at launch, with what it was given."""


@pytest.fixture
def launch_calls(monkeypatch):
    """The lesson's launch calls, stopped before they spawn anything, on a slow machine."""
    calls = []

    def fake_launch(fn, *args, **kwargs):
        calls.append(kwargs)
        raise LaunchCalled

    monkeypatch.setattr(hang_guard, "one_thread_flops_per_second", lambda: SLOW_RATE)
    monkeypatch.setattr(hang_guard, "available_cores", lambda: 2)
    monkeypatch.setattr(memory, "launch", fake_launch)
    monkeypatch.setattr(ddp_cases, "launch", fake_launch)
    return calls


def test_the_lessons_calls_wait_for_the_steps_they_run(launch_calls):
    config = BlockNetConfig(width=256, depth=4, global_batch=64)
    step_s = rank_step_flops(config, 2) / SLOW_RATE
    with pytest.raises(LaunchCalled):
        compare_memory(config, 2, "cpu")
    with pytest.raises(LaunchCalled):
        compare_ddp_cases(config, 2, "cpu")
    memory_steps = len(DISTRIBUTED_SETUPS) * (WARMUP_STEPS + 1)
    assert [call["timeout_s"] for call in launch_calls] == pytest.approx(
        [SAFETY_MARGIN * memory_steps * step_s, SAFETY_MARGIN * len(DDP_CASES) * step_s]
    )
