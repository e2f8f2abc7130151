"""What a step's allocations are recorded as, for the emulated caching allocator
(``measurement.allocator``): the requests a dry run makes, in order (``AllocationLog``, which the
tracker fills), and the actions the emulation takes serving them (``TraceEntry``, what
``torch.cuda.memory._record_memory_history`` records and a snapshot shows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

__all__ = ["AllocationEvent", "AllocationLog", "EventKind", "TraceAction", "TraceEntry"]

EventKind = Literal["malloc", "free", "workspace"]
TraceAction = Literal[
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
]


class TraceEntry(NamedTuple):
    """One action of the emulated allocator, as ``torch.cuda.memory._record_memory_history``
    records them (``label``: what asked, e.g. "step 2")."""

    action: TraceAction
    address: int
    nbytes: int
    label: str
    device_free_bytes: int = 0  # an "oom": what the card had left beyond the reserved bytes


class AllocationEvent(NamedTuple):
    """One request of a step, in order: a storage of ``nbytes`` allocated or freed (``key`` names
    it), or a cuBLAS call (``key``: its thread, 0 the calling one, 1 autograd's backward thread),
    which takes a cuBLAS workspace (the call's, or its thread's: ``allocator.replay``)."""

    kind: EventKind
    key: int
    nbytes: int = 0


@dataclass
class AllocationLog:
    """A step's events; the first ``baseline_events`` allocated what existed before the step
    (parameters, optimizer state, inputs)."""

    events: list[AllocationEvent] = field(default_factory=list)
    baseline_events: int = 0
