"""The caching allocator's emulation on sequences whose outcome the allocator's rules fix exactly.

Each case works out the segments and blocks by hand in its comment (MiB = 2**20 bytes)."""

import pytest
import torch

from tutorial_utils.gpus import cublas_workspace_bytes, cublaslt_workspace_bytes
from tutorial_utils.measurement.allocator import (
    AllocationEvent,
    AllocationLog,
    CachingAllocator,
    EmulatedOutOfMemory,
    replay,
    rounded_bytes,
    segment_bytes,
)
from tutorial_utils.measurement.tracker import TensorMemoryTracker, runs_on_cublaslt
from tutorial_utils.units import MiB


def test_rounding_and_segment_sizes():
    assert rounded_bytes(1) == 512 and rounded_bytes(513) == 1024 and rounded_bytes(0) == 512
    assert segment_bytes(512) == 2 * MiB and segment_bytes(MiB) == 2 * MiB  # small pool
    assert segment_bytes(MiB + 512) == 20 * MiB and segment_bytes(10 * MiB - 512) == 20 * MiB
    assert segment_bytes(10 * MiB) == 10 * MiB and segment_bytes(11 * MiB + 1) == 12 * MiB


def test_a_small_request_splits_a_2_mib_segment():
    # 1000 B -> a 1024 B block carved from a new 2 MiB segment (the rest, 2 MiB - 1 KiB, is at
    # least 512 B: split); 600 B -> 1024 B from the rest of the same segment.
    allocator = CachingAllocator()
    allocator.malloc(1000)
    allocator.malloc(600)
    assert allocator.allocated_bytes == 2048
    assert allocator.reserved_bytes == 2 * MiB and allocator.segments == 1


def test_a_large_split_and_a_whole_block_counted_as_allocated():
    # 3 MiB -> a new 20 MiB segment, split: [3 MiB allocated | 17 MiB free] (17 MiB > 1 MiB).
    # 16.5 MiB -> best fit is the free 17 MiB block; the rest, 0.5 MiB, is not more than 1 MiB,
    # so the whole 17 MiB block is handed out and counted: allocated 3 + 17 = 20 MiB, while the
    # tensors hold 19.5 MiB.
    allocator = CachingAllocator()
    allocator.malloc(3 * MiB)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (3 * MiB, 20 * MiB)
    block = allocator.malloc(16 * MiB + MiB // 2)
    assert block.size == 17 * MiB
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (20 * MiB, 20 * MiB)
    assert allocator.segments == 1


def test_a_freed_block_is_reused_best_fit():
    # 12 MiB and 14 MiB -> two segments of exactly those sizes (from 10 MiB: rounded to 2 MiB).
    # Both freed: 26 MiB reserved, nothing allocated. 11 MiB -> the smallest cached block that
    # fits is the 12 MiB one; its rest, 1 MiB, is not more than 1 MiB: no split, 12 MiB counted.
    # No new segment.
    allocator = CachingAllocator()
    twelve = allocator.malloc(12 * MiB)
    fourteen = allocator.malloc(14 * MiB)
    allocator.free(twelve)
    allocator.free(fourteen)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (0, 26 * MiB)
    reused = allocator.malloc(11 * MiB)
    assert reused is twelve and reused.size == 12 * MiB
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (12 * MiB, 26 * MiB)
    assert allocator.segments == 2 and allocator.max_allocated_bytes == 26 * MiB


def test_a_request_larger_than_the_cache_forces_a_new_segment():
    # 12 MiB allocated and freed: one cached 12 MiB segment. 13 MiB does not fit it -> a new
    # segment of 14 MiB (13 rounded up to 2 MiB); reserved 12 + 14 = 26 MiB.
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(12 * MiB))
    allocator.malloc(13 * MiB)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (14 * MiB, 26 * MiB)
    assert allocator.segments == 2


def test_a_failed_cudamalloc_frees_the_cache_and_retries():
    # Capacity 30 MiB. Two 12 MiB segments allocated and freed: 24 MiB reserved, all cached.
    # 14 MiB fits no cached block; a new 14 MiB segment would make 38 MiB > 30: cudaMalloc
    # fails, both wholly free segments go back (reserved 0), the retry gets 14 MiB.
    allocator = CachingAllocator(capacity_bytes=30 * MiB)
    first, second = allocator.malloc(12 * MiB), allocator.malloc(12 * MiB)
    allocator.free(first)
    allocator.free(second)
    allocator.malloc(14 * MiB)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (14 * MiB, 14 * MiB)
    assert allocator.retries == 1 and allocator.max_reserved_bytes == 24 * MiB


def test_a_split_segment_is_not_released_and_the_request_runs_out_of_memory():
    # Capacity 30 MiB. 3 MiB and 3 MiB share one 20 MiB segment: [3 | 3 | 14 free]. The first is
    # freed: [3 free | 3 | 14 free]; the segment is split, so it cannot go back. 18 MiB needs a
    # new 18 MiB segment: 20 + 18 > 30, nothing releasable, the retry fails too.
    allocator = CachingAllocator(capacity_bytes=30 * MiB)
    first = allocator.malloc(3 * MiB)
    allocator.malloc(3 * MiB)
    allocator.free(first)
    with pytest.raises(EmulatedOutOfMemory):
        allocator.malloc(18 * MiB)
    assert allocator.reserved_bytes == 20 * MiB


def test_expandable_segments_map_pages_as_needed():
    # Large pool, 20 MiB pages. 3 MiB maps one page: [3 allocated | 17 free], reserved 20 MiB.
    # 18 MiB fits no free block; the lowest room is the free 17 MiB followed by unmapped space:
    # one more page is mapped and merged, [3 | 37 free], and 18 MiB split off it (a rest of at
    # least 512 B always splits): [3 | 18 | 19 free], reserved 40 MiB (38 MiB without
    # expandable segments: a 20 MiB and an 18 MiB segment).
    allocator = CachingAllocator(expandable_segments=True)
    allocator.malloc(3 * MiB)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (3 * MiB, 20 * MiB)
    allocator.malloc(18 * MiB)
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (21 * MiB, 40 * MiB)


def test_expandable_segments_unmap_free_pages_on_a_retry():
    # As above, capacity 40 MiB, then the 18 MiB block freed: [3 | 37 free] over pages
    # [0, 20) and [20, 40) MiB. 1 MiB (small pool) needs a 2 MiB page: 42 > 40, so the retry
    # unmaps the whole free page [20, 40): reserved 20 MiB, then 2 MiB is mapped: 22 MiB.
    allocator = CachingAllocator(capacity_bytes=40 * MiB, expandable_segments=True)
    allocator.malloc(3 * MiB)
    allocator.free(allocator.malloc(18 * MiB))
    allocator.malloc(MiB)
    assert allocator.reserved_bytes == 22 * MiB and allocator.retries == 1
    assert allocator.allocated_bytes == 3 * MiB + MiB
    assert allocator.max_reserved_bytes == 40 * MiB


def test_replay_runs_the_step_twice_on_the_cache_and_keeps_workspaces():
    # Baseline: a 12 MiB parameter (a 12 MiB segment). Step: a cuBLAS workspace (8,519,680 B =
    # 8.125 MiB: a new 20 MiB segment, split, 11.875 MiB free); an activation of 16 MiB (a new
    # 16 MiB segment), freed; a gradient of 12 MiB kept to the step's end (best fit: the free
    # 16 MiB block, not the 11.875 MiB one; its rest, 4 MiB, splits off). Peaks: allocated
    # 12 + 8.125 + 16 MiB, reserved 12 + 20 + 16 = 48 MiB. Second step: the gradient is freed
    # first (the 16 MiB block is whole again and serves the activation), the workspace is kept,
    # not taken again: the same peaks. With 40 MiB the activation's segment cannot be had
    # (32 + 16 > 40) and nothing is wholly free to release: out of memory.
    log = AllocationLog(
        [
            AllocationEvent("malloc", 0, 12 * MiB),
            AllocationEvent("workspace", 0),
            AllocationEvent("malloc", 1, 16 * MiB),
            AllocationEvent("free", 1),
            AllocationEvent("malloc", 2, 12 * MiB),
        ],
        baseline_events=1,
    )
    workspace = cublas_workspace_bytes(None, "2.14")  # 8 MiB + 128 KiB: a new 20 MiB segment
    kept = {"workspace_bytes": workspace, "workspace_per_call": False}  # torch 2.14's rule
    once = replay(log, steps=1, **kept)
    twice = replay(log, **kept)
    allocated = 12 * MiB + rounded_bytes(workspace) + 16 * MiB
    assert once.max_allocated_bytes == twice.max_allocated_bytes == allocated
    assert once.max_reserved_bytes == twice.max_reserved_bytes == (12 + 20 + 16) * MiB
    assert twice.fits and twice.margin_bytes is None
    tight = replay(log, capacity_bytes=40 * MiB, **kept)
    assert tight.out_of_memory and not tight.fits


def test_a_workspace_per_call_is_given_back_when_the_call_returns():
    # torch 2.15: each cuBLAS call takes 8 MiB + 128 KiB for itself (a new 20 MiB segment) and
    # frees it as it returns; the 16 MiB activation then takes the freed segment (best fit),
    # its rest (4 MiB) split off. Peaks: allocated 12 + 16 MiB, reserved 12 + 20 MiB, both
    # steps alike; the call's workspace is in the allocated peak while the call runs.
    log = AllocationLog(
        [
            AllocationEvent("malloc", 0, 12 * MiB),
            AllocationEvent("workspace", 0),
            AllocationEvent("malloc", 1, 16 * MiB),
            AllocationEvent("free", 1),
        ],
        baseline_events=1,
    )
    workspace = cublas_workspace_bytes(None, "2.15")
    assert workspace == 8 * MiB + 128 * 1024
    per_call = replay(log, workspace_bytes=workspace, workspace_per_call=True)
    assert per_call.max_allocated_bytes == 28 * MiB
    assert per_call.max_reserved_bytes == 32 * MiB
    wide = replay(log, workspace_bytes=24 * MiB, workspace_per_call=True)
    assert wide.max_allocated_bytes == 36 * MiB  # the call's 24 MiB above the 12 MiB parameter


def test_a_cublaslt_call_keeps_its_threads_workspace_where_cublas_calls_take_theirs():
    # Keys: 0 a cuBLAS call of the calling thread, 2 a cuBLASLt call of it. torch 2.15: the
    # cuBLASLt calls keep one 1 MiB workspace (a 2 MiB small-pool segment), taken once; the cuBLAS
    # call takes 8 MiB + 128 KiB for itself (a 20 MiB segment). torch 2.14: one workspace for the
    # thread, either library's, kept.
    log = AllocationLog([AllocationEvent("workspace", key) for key in (2, 2, 0)])
    workspace = 8 * MiB + 128 * 1024
    lt_bytes = cublaslt_workspace_bytes("2.15")
    assert lt_bytes == MiB
    per_call = replay(log, workspace_bytes=workspace, workspace_per_call=True)
    assert per_call.max_allocated_bytes == lt_bytes + rounded_bytes(workspace)
    assert per_call.max_reserved_bytes == 2 * MiB + 20 * MiB
    shared = replay(log, workspace_bytes=workspace, workspace_per_call=False)
    assert shared.max_allocated_bytes == rounded_bytes(workspace)
    assert shared.max_reserved_bytes == 20 * MiB


def test_addmm_with_a_bias_of_one_dimension_runs_on_cublaslt():
    """Blas.cpp's isInputCompliesAddmmCudaLt, as the tracker reads it: a Linear's bias
    qualifies; beta other than 1, a 2-D bias without a fused activation, or a plain mm do not."""
    aten = torch.ops.aten
    x, w = torch.empty(4, 8, device="meta"), torch.empty(8, 16, device="meta")
    bias = torch.empty(16, device="meta")
    assert runs_on_cublaslt(aten.addmm.default, (bias, x, w), {})
    assert not runs_on_cublaslt(aten.addmm.default, (bias, x, w), {"beta": 0.5})
    assert not runs_on_cublaslt(aten.addmm.default, (torch.empty(4, 16, device="meta"), x, w), {})
    assert not runs_on_cublaslt(aten.mm.default, (x, w), {})
    tracker = TensorMemoryTracker(record_allocations=True)
    with tracker:
        torch.nn.functional.linear(torch.empty(3, 4, 8, device="meta"), w.T, bias)
        torch.nn.functional.linear(torch.empty(3, 4, 8, device="meta"), w.T)
    assert tracker.allocations is not None
    keys = [key for kind, key, _ in tracker.allocations.events if kind == "workspace"]
    assert keys == [2, 0]  # the biased Linear on cuBLASLt, the other on cuBLAS
