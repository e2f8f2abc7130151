"""A dry run's step as a CUDA memory snapshot: the timeline of a full-size GPU step, before you
rent the GPU (``estimate --snapshot FILE``).

The replay through the emulated caching allocator (``measurement.allocator.replay`` with
``record_trace``) knows every request, segment and free of the step. ``write_snapshot`` pickles
them in the format of ``torch.cuda.memory._dump_snapshot`` (a dict of ``segments`` and
``device_traces``, documented in ``torch.cuda.memory._snapshot``), which pytorch.org/memory_viz
opens and ``torch.cuda._memory_viz`` renders (``segsum``, ``trace``, ``segments``, ``memory``,
``trace_plot``). It is a prediction: the addresses are the emulation's, no stack frames were
recorded (each entry's one frame says what asked: the state before the step, step 1, step 2,
cuBLAS's workspace), and there are no timestamps. On N GPUs (``--gpus``) it is rank 0's step.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tutorial_utils.measurement.allocation_log import TraceEntry
from tutorial_utils.measurement.allocator import (
    AllocatorPrediction,
    Block,
    CachingAllocator,
    replay,
)

if TYPE_CHECKING:
    import torch.nn as nn

    from tutorial_utils.checkpointing.strategy import Strategy
    from tutorial_utils.estimate.card import Card
    from tutorial_utils.estimate.estimator import Workload
    from tutorial_utils.estimate.sharded import Sharding

__all__ = ["ADDRESS_BASE", "snapshot", "write_snapshot", "write_step_snapshot"]

# the emulation's addresses start at 0; a real device pointer is never 0 (and the viewer
# reads an address as a JavaScript number: below 2**53)
ADDRESS_BASE = 0x7F00_0000_0000
_FRAME_FILE = "tutorial_utils estimate (dry run, replayed)"


def _frames(label: str) -> list[dict[str, Any]]:
    return [{"filename": _FRAME_FILE, "line": 0, "name": label}]


def _trace_entry(entry: TraceEntry) -> dict[str, Any]:
    record: dict[str, Any] = {
        "action": entry.action,
        "addr": ADDRESS_BASE + entry.address,
        "size": entry.nbytes,
        "stream": 0,
        "frames": _frames(entry.label),
    }
    if entry.action == "oom":
        del record["addr"]
        record["device_free"] = max(0, entry.device_free_bytes)
    return record


def _segment(head: Block, labels: dict[int, str]) -> dict[str, Any]:
    """One segment (a run of mapped blocks) and its blocks, as ``_snapshot`` lists them."""
    blocks: list[dict[str, Any]] = []
    walk: Block | None = head
    while walk is not None and walk.mapped:
        allocated = walk.allocated
        blocks.append(
            {
                "address": ADDRESS_BASE + walk.address,
                "size": walk.size,
                "requested_size": walk.requested_bytes if allocated else 0,
                "state": "active_allocated" if allocated else "inactive",
                "frames": _frames(labels.get(id(walk), "")) if allocated else [],
            }
        )
        walk = walk.next
    allocated_bytes = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": 0,
        "address": blocks[0]["address"],
        "total_size": sum(b["size"] for b in blocks),
        "stream": 0,
        "segment_type": "small" if head.small else "large",
        "segment_pool_id": (0, 0),
        "allocated_size": allocated_bytes,
        "active_size": allocated_bytes,
        "requested_size": sum(b["requested_size"] for b in blocks),
        "is_expandable": False,
        "blocks": blocks,
    }


def _segments(allocator: CachingAllocator, labels: dict[int, str]) -> list[dict[str, Any]]:
    """The segments at the end of the replay, by address: each run of mapped blocks that
    starts a segment (no mapped block before it)."""
    mapped = [*allocator.handed, *allocator.free_blocks()]
    heads = [b for b in mapped if b.prev is None or not b.prev.mapped]
    segments = [_segment(head, labels) for head in sorted(heads, key=lambda b: b.address)]
    for segment in segments:
        segment["is_expandable"] = allocator.expandable_segments
    return segments


def snapshot(prediction: AllocatorPrediction) -> dict[str, Any]:
    """A replay kept with its trace (``replay(log, ..., record_trace=True)``) as the dict
    ``torch.cuda.memory._snapshot()`` returns: the segments at the end, and every action."""
    allocator = prediction.allocator
    if allocator is None or allocator.trace is None:
        raise ValueError("snapshot needs replay(..., record_trace=True)")
    labels: dict[int, str] = {}
    for entry in allocator.trace:  # the last label of each live block's address
        if entry.action == "alloc":
            labels[entry.address] = entry.label
    by_block = {id(b): labels.get(b.address, "") for b in allocator.handed}
    return {
        "segments": _segments(allocator, by_block),
        "device_traces": [[_trace_entry(e) for e in allocator.trace]],
        "allocator_settings": {"expandable_segments": prediction.expandable_segments},
    }


def write_snapshot(prediction: AllocatorPrediction, path: str | Path) -> Path:
    """Pickle ``snapshot(prediction)`` to ``path`` as ``torch.cuda.memory._dump_snapshot`` does;
    open it at pytorch.org/memory_viz. Returns the path written."""
    path = Path(path).expanduser()
    with path.open("wb") as file:
        pickle.dump(snapshot(prediction), file)
    return path


def write_step_snapshot(
    workload: Workload,
    strategy: Strategy,
    card: Card,
    path: str | Path,
    *,
    model: nn.Module | None = None,
    sharding: Sharding | None = None,
) -> Path:
    """Dry-run one step of ``workload`` under ``strategy`` as ``estimate`` does (the card's
    attention kernels; ``model``: one already built on meta; ``sharding``: rank 0's step of N
    GPUs, ``sharded.rank_dry_run``) and write its replay through the card's allocator to
    ``path`` (``write_snapshot``)."""
    from tutorial_utils.estimate.estimator import build_model, train_step
    from tutorial_utils.estimate.gpu_step import as_gpu_runs

    if sharding is not None:
        from tutorial_utils.estimate.sharded import rank_dry_run

        report = rank_dry_run(workload, strategy, sharding, card, record_allocations=True)[0]
    else:
        model = model if model is not None else build_model(workload)
        with as_gpu_runs(card):
            report = train_step(model, workload, strategy, record_allocations=True)
    assert report.allocations is not None
    replayed = replay(
        report.allocations,
        capacity_bytes=card.budget_bytes,
        expandable_segments=card.expandable_segments,
        workspace_bytes=card.workspace_bytes,
        record_trace=True,
    )
    return write_snapshot(replayed, path)
