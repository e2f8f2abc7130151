"""``estimate --snapshot``: a dry run's replayed step, written as ``torch.cuda.memory._dump_snapshot``
writes one, must be read by ``torch.cuda._memory_viz``'s own renderers (offline: the flame-graph
renderers are given a formatter that does not download flamegraph.pl)."""

from __future__ import annotations

import json
import pickle

import pytest
import torch.cuda._memory_viz as memory_viz

from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, build_model, predict_allocator, train_step
from tutorial_utils.estimate.gpu_step import as_gpu_runs
from tutorial_utils.estimate.snapshot import snapshot, write_step_snapshot
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.measurement.allocator import AllocationEvent, AllocationLog, replay
from tutorial_utils.units import MiB

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("expandable", [False, True])
def test_memory_viz_renders_the_snapshot_and_it_matches_the_replay(
    tiny_config, tmp_path, expandable
):
    workload = Workload(f"hf:{tiny_config('llama')}", batch=2, size=64, precision="amp-bf16")
    card = parse_card("8GB", gpu="h100", expandable_segments=expandable)
    strategy = parse_strategy("every-block")
    path = write_step_snapshot(workload, strategy, card, tmp_path / "step.pickle")
    data = pickle.loads(path.read_bytes())

    summary = memory_viz.segsum(data)  # raises on any segment whose blocks do not add up
    assert f"segments: {len(data['segments'])}" in summary
    trace = memory_viz.trace(data)
    assert f"{len(data['device_traces'][0])} entries" in trace
    assert "step 2" in memory_viz.memory(data, format_flamegraph=str)
    memory_viz.segments(data, format_flamegraph=str)
    assert "snapshot.pickle" in memory_viz.trace_plot(data)
    assert memory_viz.segment_plot(data)

    # the timeline's high-water marks are the replay's predictions
    model = build_model(workload)
    with as_gpu_runs(card):
        report = train_step(model, workload, strategy, record_allocations=True)
    assert report.allocations is not None
    predicted = predict_allocator(report.allocations, card)
    assert _high_water_marks(data) == (predicted.max_allocated_bytes, predicted.max_reserved_bytes)
    # the segments at the end are what the trace leaves allocated and reserved
    allocated, reserved = _held_at_end(data)
    assert reserved == sum(segment["total_size"] for segment in data["segments"])
    assert allocated == sum(segment["allocated_size"] for segment in data["segments"])


def test_an_out_of_memory_replay_ends_with_an_oom_entry():
    # a 2 MiB segment, then a 30 MiB request that a 20 MiB capacity cannot hold
    log = AllocationLog([AllocationEvent("malloc", 0, MiB), AllocationEvent("malloc", 1, 30 * MiB)])
    data = snapshot(replay(log, capacity_bytes=20 * MiB, steps=1, record_trace=True))
    last = data["device_traces"][0][-1]
    assert last["action"] == "oom" and last["size"] == 30 * MiB
    assert last["device_free"] == 18 * MiB
    assert "raise OutOfMemoryError" in memory_viz.trace(data)


def test_command_writes_one_snapshot_per_strategy(tiny_config, tmp_path):
    from tutorial_utils.__main__ import main

    target = tmp_path / "step.pickle"
    argv = ["estimate", "--hf-config", tiny_config("llama"), "--seq", "64", "--no-search"]
    argv += ["--strategies", "none,every-block,offload", "--snapshot", str(target), "--jobs", "1"]
    assert main(argv) == 0
    written = sorted(path.name for path in tmp_path.glob("step-*.pickle"))
    assert written == ["step-every-block.pickle", "step-none.pickle"]  # offload: not measured
    for name in written:
        memory_viz.segsum(pickle.loads((tmp_path / name).read_bytes()))


def test_a_sharded_snapshot_is_rank_0s_replayed_step(tiny_config, tmp_path, capsys):
    """``--gpus 2 --shard ...  --snapshot``: rank 0's step, which torch's renderers read, its
    high-water marks the row's predicted max_memory_allocated and _reserved."""
    from tutorial_utils.__main__ import main

    target = tmp_path / "rank0.pickle"
    argv = ["estimate", "--hf-config", tiny_config("llama"), "--seq", "64", "--no-search"]
    argv += ["--strategies", "every-block", "--gpus", "2", "--shard", "fsdp2", "--jobs", "1"]
    assert main([*argv, "--json", "--snapshot", str(target)]) == 0
    (row,) = json.loads(capsys.readouterr().out)["strategies"]
    data = pickle.loads(target.read_bytes())
    memory_viz.segsum(data)
    assert f"{len(data['device_traces'][0])} entries" in memory_viz.trace(data)
    assert _high_water_marks(data) == (
        row["predicted_max_allocated_bytes"],
        row["predicted_max_reserved_bytes"],
    )


_SIGNS = {"alloc": 1, "free_completed": -1, "segment_alloc": 1, "segment_map": 1}
_SIGNS |= {"segment_free": -1, "segment_unmap": -1}


def _walk(data: dict) -> list[tuple[int, int]]:
    """(allocated, reserved) after each entry of a snapshot's trace."""
    allocated = reserved = 0
    held = []
    for entry in data["device_traces"][0]:
        step = _SIGNS.get(entry["action"], 0) * entry["size"]
        if entry["action"] in ("alloc", "free_completed"):
            allocated += step
        else:
            reserved += step
        held.append((allocated, reserved))
    return held


def _high_water_marks(data: dict) -> tuple[int, int]:
    """(most allocated, most reserved) along a snapshot's trace."""
    held = _walk(data)
    return max(a for a, _ in held), max(r for _, r in held)


def _held_at_end(data: dict) -> tuple[int, int]:
    return _walk(data)[-1]
