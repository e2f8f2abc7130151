"""PyTorch's CUDA caching allocator, emulated: what ``max_memory_allocated`` and
``max_memory_reserved`` will read for a dry run's allocations and frees, before a GPU runs them.

A dry run knows every storage's bytes and the order in which storages are allocated and freed.
A GPU's counters read more than those bytes, by amounts that depend on that order: the caching
allocator hands out whole blocks, carves them from segments it asked CUDA for, and keeps freed
blocks cached. Replaying the dry run's events through the same rules gives both counters, and
whether the step runs in a card at all (``CachingAllocator``, ``replay``).

The rules, derived from ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch at commit
001074d25084fdb87a799823e395a50f5ec044d3, read 2026-12-03; this project runs torch 2.14.1, whose
file was not compared line by line) and written here without its code:

* a request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
* up to 1 MiB (``kSmallSize``) it is served from the small pool, whose segments are 2 MiB
  (``kSmallBuffer``); larger ones from the large pool: below 10 MiB (``kMinLargeAlloc``) in a new
  20 MiB segment (``kLargeBuffer``), from 10 MiB in a segment of the request rounded up to 2 MiB
  (``kRoundLarge``);
* the free block chosen is the smallest cached one of the pool that is large enough, the lowest
  address among equals (best fit);
* a block is split when the rest would be at least 512 bytes (small pool) or more than 1 MiB
  (large pool); otherwise the whole block is handed out and counted as allocated;
* a freed block merges with free neighbours of its segment and stays cached;
* when a new segment cannot be had (``cudaMalloc`` fails: the card's capacity is reached), every
  cached segment that is wholly free is released and the request retried once; a second failure
  is the out-of-memory error;
* with ``expandable_segments:True`` each pool has one segment that grows by mapping pages of
  2 MiB (small pool) or 20 MiB (large pool), only as many as the request needs; blocks split
  whenever 512 bytes would be left; best fit prefers blocks that cannot grow; a retry unmaps the
  whole free pages of cached blocks.

Left out: ``max_split_size_mb``, ``roundup_power2_divisions``, ``garbage_collection_threshold``,
``set_per_process_memory_fraction``, more than one stream, CUDA graphs' private pools, and the
free-memory callbacks; segment addresses (which only break ties between equal free blocks) are
handed out in increasing order, where ``cudaMalloc`` may choose otherwise.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from tutorial_utils.gpus import (
    cublas_workspace_bytes,
    cublas_workspace_per_call,
    cublaslt_workspace_bytes,
)
from tutorial_utils.measurement.allocation_log import (
    AllocationEvent,
    AllocationLog,
    EventKind,
    TraceAction,
    TraceEntry,
)
from tutorial_utils.units import MiB

__all__ = [
    "AllocationEvent",
    "AllocationLog",
    "AllocatorPrediction",
    "Block",
    "CachingAllocator",
    "EmulatedOutOfMemory",
    "EventKind",
    "replay",
    "rounded_bytes",
    "segment_bytes",
]

MIN_BLOCK_BYTES = 512
SMALL_REQUEST_BYTES = MiB  # the largest request served from the small pool
SMALL_SEGMENT_BYTES = 2 * MiB
LARGE_SEGMENT_BYTES = 20 * MiB  # requests between 1 and 10 MiB share segments of this size
MIN_LARGE_ALLOC_BYTES = 10 * MiB
ROUND_LARGE_BYTES = 2 * MiB
_ADDRESS_SPACE_BYTES = 2**44  # an expandable segment's virtual range (16 TiB): never the limit


class EmulatedOutOfMemory(RuntimeError):
    """The emulated ``cudaMalloc`` failed twice for one request, as ``torch.OutOfMemoryError``."""


def rounded_bytes(nbytes: int) -> int:
    """The block size a request of ``nbytes`` gets."""
    return max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def segment_bytes(size: int) -> int:
    """The segment a new ``cudaMalloc`` asks for, for a rounded request of ``size`` bytes."""
    if size <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if size < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


@dataclass(eq=False)
class Block:
    """A piece of a segment: handed out (``allocated``), cached, or (expandable) not mapped."""

    address: int
    size: int
    small: bool
    allocated: bool = False
    requested_bytes: int = 0  # what the request asked for, before rounding
    mapped: bool = True
    prev: Block | None = None
    next: Block | None = None

    def link(self, before: Block | None, after: Block | None) -> None:
        """Put this block between two neighbours of its segment (None: an end)."""
        self.prev, self.next = before, after
        if before is not None:
            before.next = self
        if after is not None:
            after.prev = self


class _SortedBlocks:
    """Blocks ordered by a key, found by the smallest key not below a bound."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, Block] = {}  # by address

    def add(self, key: tuple[int, int], block: Block) -> None:
        insort(self._keys, key)
        self._blocks[block.address] = block

    def remove(self, key: tuple[int, int], block: Block) -> None:
        del self._keys[bisect_left(self._keys, key)]
        del self._blocks[block.address]

    def from_index(self, bound: tuple[int, int]) -> int:
        return bisect_left(self._keys, bound)

    def at(self, index: int) -> Block | None:
        if index >= len(self._keys):
            return None
        return self._blocks[self._keys[index][1]]

    def blocks(self) -> list[Block]:
        return [self._blocks[address] for _, address in self._keys]


class CachingAllocator:
    """One device's caching allocator, one stream: ``malloc`` and ``free`` as PyTorch serves
    them, with the counters ``torch.cuda.memory_stats`` keeps.

    ``capacity_bytes`` is what ``cudaMalloc`` can hand out in all (the card less the CUDA
    context and anything else held outside PyTorch); None: unlimited."""

    def __init__(
        self,
        capacity_bytes: int | None = None,
        expandable_segments: bool = False,
        *,
        record_trace: bool = False,
    ):
        self.capacity_bytes = capacity_bytes
        self.expandable_segments = expandable_segments
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.max_allocated_bytes = 0
        self.max_reserved_bytes = 0
        self.retries = 0  # requests that succeeded only after the cache was released
        self.segments = 0  # segments obtained from CUDA (expandable: page mappings)
        self._free = {small: _SortedBlocks() for small in (True, False)}  # by (size, address)
        self._unmapped = {small: _SortedBlocks() for small in (True, False)}  # by address
        self._next_address = 0
        # with ``record_trace``: every action in order, and the blocks handed out (for a snapshot)
        self.trace: list[TraceEntry] | None = [] if record_trace else None
        self.handed: set[Block] = set()
        self.label = ""  # names the requests in the trace
        if expandable_segments:
            for small in (True, False):
                base = (1 + int(small)) * _ADDRESS_SPACE_BYTES
                self._add_unmapped(Block(base, _ADDRESS_SPACE_BYTES, small, mapped=False))

    # -- the two calls ----------------------------------------------------------------------

    def malloc(self, nbytes: int) -> Block:
        """A block for ``nbytes``; ``EmulatedOutOfMemory`` when the card cannot hold it."""
        size = rounded_bytes(nbytes)
        small = size <= SMALL_REQUEST_BYTES
        block = self._best_fit(small, size)
        if block is None:
            block = self._new_memory(small, size)
        if block is None:
            self._release_cache()
            block = self._new_memory(small, size)
            if block is None:
                free_bytes = (self.capacity_bytes or 0) - self.reserved_bytes
                self._note("oom", 0, size, free_bytes)
                raise EmulatedOutOfMemory(
                    f"tried to allocate {segment_bytes(size) / MiB:,.1f} MiB with "
                    f"{self.reserved_bytes / MiB:,.1f} MiB reserved of "
                    f"{(self.capacity_bytes or 0) / MiB:,.1f} MiB"
                )
            self.retries += 1
        if self._should_split(block, size):
            handed = Block(block.address, size, small)
            handed.link(block.prev, block)
            block.address += size
            block.size -= size
            self._add_free(block)
            block = handed
        block.allocated = True
        block.requested_bytes = nbytes
        self.allocated_bytes += block.size
        self.max_allocated_bytes = max(self.max_allocated_bytes, self.allocated_bytes)
        if self.trace is not None:
            self._note("alloc", block.address, block.size)
            self.handed.add(block)
        return block

    def free(self, block: Block) -> None:
        """Give ``block`` back: it merges with free neighbours and stays cached."""
        block.allocated = False
        self.allocated_bytes -= block.size
        if self.trace is not None:
            self._note("free_requested", block.address, block.size)
            self._note("free_completed", block.address, block.size)
            self.handed.discard(block)
        self._merge_neighbours(block)
        self._add_free(block)

    # -- finding and splitting --------------------------------------------------------------

    def _best_fit(self, small: bool, size: int) -> Block | None:
        pool = self._free[small]
        index = pool.from_index((size, -1))
        block = pool.at(index)
        if block is None:
            return None
        if self.expandable_segments:  # keep the block that can grow for requests that need it
            while (following := pool.at(index + 1)) is not None and _growable_bytes(
                following
            ) < _growable_bytes(block):
                index, block = index + 1, following
        self._remove_free(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        rest = block.size - size
        if block.small or self.expandable_segments:
            return rest >= MIN_BLOCK_BYTES
        return rest > SMALL_REQUEST_BYTES

    # -- new memory from CUDA ---------------------------------------------------------------

    def _fits_card(self, nbytes: int) -> bool:
        return self.capacity_bytes is None or self.reserved_bytes + nbytes <= self.capacity_bytes

    def _note(self, action: TraceAction, address: int, nbytes: int, free_bytes: int = 0) -> None:
        if self.trace is not None:
            self.trace.append(TraceEntry(action, address, nbytes, self.label, free_bytes))

    def _reserve(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self.max_reserved_bytes = max(self.max_reserved_bytes, self.reserved_bytes)
        self.segments += 1

    def _new_memory(self, small: bool, size: int) -> Block | None:
        """A free block of at least ``size`` made of new memory, or None when CUDA has none."""
        if self.expandable_segments:
            return self._grow(small, size)
        nbytes = segment_bytes(size)
        if not self._fits_card(nbytes):
            return None
        self._reserve(nbytes)
        block = Block(self._next_address, nbytes, small)
        self._next_address += nbytes
        self._note("segment_alloc", block.address, nbytes)
        return block

    def _grow(self, small: bool, size: int) -> Block | None:
        """Map pages at the lowest address where free and unmapped space together hold ``size``
        (after a free block if one comes first), merged into one free block."""
        start = self._lowest_room(small, size)
        if not start.mapped and not self._map(start, min(start.size, size)):
            return None
        while start.size < size:
            following = start.next
            assert following is not None and not following.mapped
            if not self._map(following, min(size - start.size, following.size)):
                return None
            start = following  # it has absorbed ``start``
        self._remove_free(start)
        return start

    def _lowest_room(self, small: bool, size: int) -> Block:
        for block in self._unmapped[small].blocks():
            if block.prev is not None and not block.prev.allocated:
                block = block.prev
            room = 0
            walk: Block | None = block
            while walk is not None and not walk.allocated and room < size:
                room += walk.size
                walk = walk.next
            if room >= size:
                return block
        raise AssertionError("the last unmapped block spans the rest of the address space")

    def _map(self, block: Block, nbytes: int) -> bool:
        page = _page_bytes(block.small)
        mapped = min(block.size, -(-nbytes // page) * page)
        if not self._fits_card(mapped):
            return False
        self._remove_unmapped(block)
        if mapped < block.size:
            rest = Block(block.address + mapped, block.size - mapped, block.small, mapped=False)
            rest.link(block, block.next)
            self._add_unmapped(rest)
        block.size, block.mapped = mapped, True
        self._note("segment_map", block.address, mapped)
        self._merge_neighbours(block)
        self._add_free(block)
        self._reserve(mapped)
        return True

    # -- giving memory back -----------------------------------------------------------------

    def _release_cache(self) -> None:
        """What a failed ``cudaMalloc`` triggers: every wholly free segment goes back to CUDA
        (expandable: every whole free page is unmapped)."""
        for small in (False, True):
            for block in self._free[small].blocks():
                if self.expandable_segments:
                    self._unmap_pages(block)
                elif block.prev is None and block.next is None:
                    self._remove_free(block)
                    self.reserved_bytes -= block.size
                    self._note("segment_free", block.address, block.size)

    def _unmap_pages(self, block: Block) -> None:
        page = _page_bytes(block.small)
        begin = -(-block.address // page) * page
        end = (block.address + block.size) // page * page
        if begin >= end:
            return
        self._remove_free(block)
        if begin > block.address:
            before = Block(block.address, begin - block.address, block.small)
            before.link(block.prev, block)
            self._add_free(before)
        if end < block.address + block.size:
            after = Block(end, block.address + block.size - end, block.small)
            after.link(block, block.next)
            self._add_free(after)
        block.address, block.size, block.mapped = begin, end - begin, False
        self.reserved_bytes -= block.size
        self._note("segment_unmap", block.address, block.size)
        self._merge_neighbours(block)
        self._add_unmapped(block)

    # -- bookkeeping ------------------------------------------------------------------------

    def _merge_neighbours(self, block: Block) -> None:
        """Absorb the free neighbours of ``block`` that are mapped as it is."""
        for other in (block.prev, block.next):
            if other is None or other.allocated or other.mapped != block.mapped:
                continue
            if other.mapped:
                self._remove_free(other)
            else:
                self._remove_unmapped(other)
            if other is block.prev:
                block.address = other.address
                block.prev = other.prev
                if block.prev is not None:
                    block.prev.next = block
            else:
                block.next = other.next
                if block.next is not None:
                    block.next.prev = block
            block.size += other.size

    def free_blocks(self) -> list[Block]:
        """The cached blocks, mapped and free."""
        return [*self._free[True].blocks(), *self._free[False].blocks()]

    def _add_free(self, block: Block) -> None:
        self._free[block.small].add((block.size, block.address), block)

    def _remove_free(self, block: Block) -> None:
        self._free[block.small].remove((block.size, block.address), block)

    def _add_unmapped(self, block: Block) -> None:
        self._unmapped[block.small].add((block.address, block.address), block)

    def _remove_unmapped(self, block: Block) -> None:
        self._unmapped[block.small].remove((block.address, block.address), block)


def _page_bytes(small: bool) -> int:
    return SMALL_SEGMENT_BYTES if small else LARGE_SEGMENT_BYTES


def _growable_bytes(block: Block) -> int:
    """A free block's size counting the unmapped space right after it."""
    after = block.next
    return block.size + (after.size if after is not None and not after.mapped else 0)


# -- replaying a step ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocatorPrediction:
    """What the allocator's counters would read over the replayed steps, and whether they ran."""

    max_allocated_bytes: int  # predicted torch.cuda.max_memory_allocated
    max_reserved_bytes: int  # predicted torch.cuda.max_memory_reserved
    out_of_memory: bool  # a request failed even after the cache was released
    retries: int  # requests that needed the cache released first
    capacity_bytes: int | None
    expandable_segments: bool
    # with ``replay(..., record_trace=True)``: the allocator at the end, its trace kept
    allocator: CachingAllocator | None = field(default=None, repr=False, compare=False)

    @property
    def fits(self) -> bool:
        return not self.out_of_memory

    @property
    def margin_bytes(self) -> int | None:
        """Capacity left at the reserved peak (None without a capacity)."""
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.max_reserved_bytes


def replay(
    log: AllocationLog,
    *,
    capacity_bytes: int | None = None,
    expandable_segments: bool = False,
    workspace_bytes: int | None = None,
    steps: int = 2,
    record_trace: bool = False,
    workspace_per_call: bool | None = None,
) -> AllocatorPrediction:
    """The log's baseline once, then its step ``steps`` times, through one ``CachingAllocator``.

    The second step starts on the cache the first left, as every later step of a training loop
    does; what the first step allocated and still held at its end (gradients, the loss) is freed
    between steps, as ``zero_grad(set_to_none=True)`` and a new loss do. cuBLAS workspaces
    (``workspace_bytes``; None: the installed torch's with no GPU named, ``tutorial_utils.gpus``)
    are taken by each cuBLAS call and given back after it, a cuBLASLt call's once per thread and
    kept (``workspace_per_call``; None: as the installed torch does), or either library's once
    per thread and kept. With ``record_trace`` each request is
    labelled "before the step", "step 1", ... (or "cuBLAS workspace") and the allocator is kept
    for a snapshot."""
    allocator = CachingAllocator(capacity_bytes, expandable_segments, record_trace=record_trace)
    size = cublas_workspace_bytes(None) if workspace_bytes is None else workspace_bytes
    per_call = cublas_workspace_per_call() if workspace_per_call is None else workspace_per_call
    workspace = _Workspace(size, per_call, cublaslt_workspace_bytes() if per_call else size)
    live: dict[int, Block] = {}
    workspaces: dict[int, Block] = {}
    out_of_memory = False
    try:
        allocator.label = "before the step"
        _run(allocator, log.events[: log.baseline_events], live, workspaces, workspace)
        baseline = set(live)
        for step in range(1, steps + 1):
            allocator.label = f"step {step}"
            for key in [key for key in live if key not in baseline]:
                allocator.free(live.pop(key))
            _run(allocator, log.events[log.baseline_events :], live, workspaces, workspace)
    except EmulatedOutOfMemory:
        out_of_memory = True
    return AllocatorPrediction(
        allocator.max_allocated_bytes,
        allocator.max_reserved_bytes,
        out_of_memory,
        allocator.retries,
        capacity_bytes,
        expandable_segments,
        allocator if record_trace else None,
    )


class _Workspace(NamedTuple):
    """cuBLAS's workspace: its size, whether each call takes it (else each thread, kept), and
    what a thread's cuBLASLt calls keep where cuBLAS's are per call."""

    nbytes: int
    per_call: bool
    lt_bytes: int


def _run(
    allocator: CachingAllocator,
    events: Iterable[AllocationEvent],
    live: dict[int, Block],
    workspaces: dict[int, Block],
    workspace: _Workspace,
) -> None:
    for kind, key, nbytes in events:
        if kind == "malloc":
            if nbytes:  # a storage resized to nothing (FSDP2's resharding) holds no block
                live[key] = allocator.malloc(nbytes)
        elif kind == "free":
            block = live.pop(key, None)
            if block is not None:  # None: a baseline storage the first step already freed
                allocator.free(block)
        else:
            _take_workspace(allocator, key, workspaces, workspace)


def _take_workspace(
    allocator: CachingAllocator, key: int, workspaces: dict[int, Block], workspace: _Workspace
) -> None:
    """A cuBLAS call's workspace (``key``: its thread, plus 2 on cuBLASLt): its own, freed as it
    returns, or its thread's, taken once and kept."""
    thread, cublaslt = key % 2, key >= 2
    label, allocator.label = allocator.label, "cuBLAS workspace"
    if workspace.per_call and not cublaslt:
        allocator.free(allocator.malloc(workspace.nbytes))
    elif not workspace.per_call and thread not in workspaces:  # either library's, shared
        workspaces[thread] = allocator.malloc(workspace.nbytes)
    elif workspace.per_call and key not in workspaces:
        workspaces[key] = allocator.malloc(workspace.lt_bytes)
    allocator.label = label
