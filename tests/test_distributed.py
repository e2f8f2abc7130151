"""Checkpointing under DDP and FSDP, run for real: 2 gloo processes on 127.0.0.1."""

import multiprocessing

import pytest

from tutorial_utils.articles.models import count_parameters
from tutorial_utils.articles.profiles import PROFILES
from tutorial_utils.display.figure_check import figure_problems
from tutorial_utils.lessons.checkpointing_at_scale import (
    DISTRIBUTED_SETUPS,
    REENTRANT_DDP_ERROR,
    SINGLE_PROCESS,
    build_model,
    compare_memory,
    describe_plan,
    memory_table,
    plot_memory_by_setup,
    raise_on_rank,
    run_ddp_cases,
    savings,
    single_process_gradients,
    sizes_for,
    stall_on_rank,
)
from tutorial_utils.measurement.gradients import gradients_match
from tutorial_utils.training.distributed import DistributedRunError, check_spawnable, launch

WORLD_SIZE = 2
CI = PROFILES["ci"]
CONFIG = sizes_for(CI, width=32, depth=4, global_batch=16)


@pytest.fixture(scope="module")
def ddp_results():
    """Every DDP case, run once for the whole file: each launch costs seconds of process start."""
    per_rank = launch(run_ddp_cases, CONFIG, world_size=WORLD_SIZE, device_type="cpu")
    return {
        result.case.name: [ranks[i] for ranks in per_rank] for i, result in enumerate(per_rank[0])
    }


def test_ddp_gradients_equal_single_process_gradients_of_the_global_batch(ddp_results):
    rank_results = ddp_results["no checkpointing"]
    reference = single_process_gradients(CONFIG, tied_blocks=True)
    assert [r.rank for r in rank_results] == [0, 1]
    for result in rank_results:
        assert gradients_match(result.gradients, reference)


@pytest.mark.parametrize(
    "case", ["reentrant, block used twice", "reentrant + find_unused_parameters"]
)
def test_reentrant_checkpointing_breaks_ddp(ddp_results, case):
    for result in ddp_results[case]:
        assert not result.ok
        assert REENTRANT_DDP_ERROR in result.error


@pytest.mark.parametrize("case", ["fix: use_reentrant=False", "fix: static_graph=True"])
def test_fixes_give_the_single_process_gradients(ddp_results, case):
    reference = single_process_gradients(CONFIG, tied_blocks=True)
    for result in ddp_results[case]:
        assert result.ok, result.error
        assert gradients_match(result.gradients, reference)


def test_gradients_match_notices_a_difference():
    reference = single_process_gradients(CONFIG)
    changed = {name: g.clone() for name, g in reference.items()}
    changed["head.bias"][0] += 1e-2
    assert gradients_match(reference, reference)
    assert not gradients_match(changed, reference)


def test_a_failing_rank_gives_one_clear_error_and_leaves_no_process():
    with pytest.raises(
        DistributedRunError, match=r"^rank 1 failed: ValueError: rank 1 was told to fail$"
    ) as info:
        launch(raise_on_rank, 1, world_size=WORLD_SIZE, device_type="cpu", timeout_s=60)
    assert info.value.rank == 1
    assert "raise_on_rank" in info.value.rank_traceback
    assert multiprocessing.active_children() == []


def test_a_rank_over_its_time_is_stopped():
    with pytest.raises(DistributedRunError, match=r"TimeoutError: still running after"):
        launch(stall_on_rank, 1, 120, world_size=WORLD_SIZE, device_type="cpu", timeout_s=3)
    assert multiprocessing.active_children() == []


def test_functions_a_spawned_process_cannot_import_are_refused_before_launch():
    def local_function(ctx):
        return ctx.rank

    with pytest.raises(ValueError, match="top level of an importable module"):
        check_spawnable(local_function)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        launch(raise_on_rank, 0, world_size=0, device_type="cpu")


def test_uneven_global_batch_is_refused_before_launch():
    with pytest.raises(ValueError, match="multiple of 2"):
        compare_memory(sizes_for(CI, global_batch=15), world_size=2, device_type="cpu")


@pytest.fixture(scope="module")
def memory_records():
    config = sizes_for(CI, width=32, depth=4, global_batch=256)
    return compare_memory(config, world_size=WORLD_SIZE, device_type="cpu")


def rank0(records, setup):
    return next(r for r in records if r.setup == setup and r.rank == 0)


def test_every_setup_is_measured_on_every_rank(memory_records):
    assert [(r.setup, r.rank) for r in memory_records] == [(SINGLE_PROCESS, 0)] + [
        (setup, rank) for setup in DISTRIBUTED_SETUPS for rank in range(WORLD_SIZE)
    ]
    for record in memory_records:
        assert record.peak_bytes == sum(record.breakdown.values())


def test_every_setup_computes_the_same_step(memory_records):
    single = rank0(memory_records, SINGLE_PROCESS)
    for setup in DISTRIBUTED_SETUPS:
        ranks = [r for r in memory_records if r.setup == setup]
        assert sum(r.loss for r in ranks) / len(ranks) == pytest.approx(single.loss, rel=1e-5)
        for record in ranks:
            assert record.gradient_norm == pytest.approx(single.gradient_norm, rel=1e-4)


def test_fsdp_shards_parameter_state_per_rank(memory_records):
    ddp, fsdp = rank0(memory_records, "DDP"), rank0(memory_records, "FSDP")
    for category in ("parameters", "optimizer_state"):
        half = ddp.breakdown[category] / WORLD_SIZE
        assert fsdp.breakdown[category] == pytest.approx(half, rel=0.02)
    assert ddp.ddp_bucket_bytes == pytest.approx(ddp.breakdown["parameters"], rel=0.02)
    assert fsdp.ddp_bucket_bytes == 0


def test_checkpointing_lowers_activations_at_the_peak_under_ddp_and_fsdp(memory_records):
    gained = savings(memory_records)
    assert gained.checkpointing_activations_ddp > 0
    assert gained.checkpointing_activations_fsdp > 0
    assert gained.sharding_parameter_state > 0
    both = rank0(memory_records, "FSDP + checkpointing")
    assert both.peak_bytes < rank0(memory_records, "DDP").peak_bytes


def test_table_and_figure_show_every_record(memory_records):
    table = memory_table(memory_records)
    assert len(table.splitlines()) == 1 + len(memory_records)  # header, then one per record
    figure = plot_memory_by_setup(memory_records, "test")
    assert len(figure.axes[0].get_xticklabels()) == len(memory_records)
    assert figure_problems(figure) == []


def test_describe_plan_counts_the_parameters_the_model_has():
    config = sizes_for(CI, width=16, depth=3, global_batch=8)
    assert f"{count_parameters(build_model(config)):,} parameters" in describe_plan(config, 2)


def test_one_process_group_runs_ddp_here_and_tears_down():
    """The notebook's visible DDP cell: one rank in this process; reentrant checkpointing of a
    block used twice fails as on many ranks, non-reentrant gives the plain gradients."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from tutorial_utils.lessons.checkpointing_at_scale import (
        global_batch,
        one_process_group,
    )
    from tutorial_utils.measurement.gradients import named_gradients

    reference = single_process_gradients(CONFIG, tied_blocks=True)
    inputs, labels = global_batch(CONFIG)
    outcomes = {}
    with one_process_group():
        for use_reentrant in (True, False):
            model = build_model(
                CONFIG, tied_blocks=True, checkpoint_blocks=True, use_reentrant=use_reentrant
            )
            ddp_model = DistributedDataParallel(model)  # kept alive: its reducer checks backward
            try:
                F.cross_entropy(ddp_model(inputs), labels).backward()
            except RuntimeError as error:
                outcomes[use_reentrant] = str(error)
            else:
                outcomes[use_reentrant] = gradients_match(named_gradients(model), reference)
    assert not dist.is_initialized()
    assert REENTRANT_DDP_ERROR in outcomes[True]
    assert outcomes[False] is True
