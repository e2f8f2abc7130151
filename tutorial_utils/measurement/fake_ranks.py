"""One rank of N, in one process: PyTorch's fake process group and a tracker for sharded steps.

``fake_ranks(world_size)`` starts PyTorch's fake process group (backend ``"fake"``, a
``FakeStore``): collectives return at once and move nothing, but every rank-dependent decision
(FSDP2's shard sizes and padding, its all-gather and reduce-scatter buffers, DDP's buckets) is
PyTorch's own for rank 0 of ``world_size``. Under ``FakeTensorMode`` nothing is allocated, so a
rank of an 8 B model costs seconds and no memory.

``ShardedStepTracker`` is the package's tracker with two additions a sharded step needs:

* **Storage resizes.** FSDP2 frees an all-gathered (unsharded) parameter with
  ``untyped_storage().resize_(0)`` and brings it back with ``resize_(n)``. That call reaches no
  dispatch mode (``torch.distributed._tools.mem_tracker`` patches it for the same reason), so a
  tracker that only watches ops, as ``tools.LiveBytes`` does, never sees the unsharded block.
  Here ``UntypedStorage.resize_`` is followed while the tracker is active.
* **Communication buffers.** Storages passed to an all-gather (FSDP's copy-in, the gathered flat
  buffer, the unsharded parameters it is copied out to) count as ``all_gather``; those passed to a
  reduce-scatter (FSDP's flat gradient input) as ``reduce_scatter``; ``mark`` adds any others
  (DDP's gradient buckets). A storage that is a parameter, gradient or optimizer state keeps that
  category.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Literal, get_args

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves

from tutorial_utils.measurement.tracker import TensorMemoryTracker, _storage_of

__all__ = ["BUFFER_CATEGORIES", "BufferCategory", "fake_ranks", "ShardedStepTracker"]

BufferCategory = Literal["all_gather", "reduce_scatter", "buckets"]
BUFFER_CATEGORIES: tuple[BufferCategory, ...] = get_args(BufferCategory)

# aten/c10d/fsdp ops whose tensors are communication buffers, by a word in the op's name
_BUFFER_OPS: dict[str, BufferCategory] = {
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "split_with_sizes_copy": "all_gather",  # FSDP2's copy-out into the unsharded parameters
    "reduce_scatter": "reduce_scatter",
    "chunk_cat": "reduce_scatter",  # FSDP2's copy-in of the unsharded gradients
}


def fake_backend_unavailable() -> str | None:
    """Why this torch cannot run fake ranks (one line), or None when it can."""
    if not dist.is_available():
        return "this torch was built without torch.distributed: install a build that has it"
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except ImportError as error:
        return f"this torch has no fake process group ({error}): use torch >= 2.9"
    return None


@contextlib.contextmanager
def fake_ranks(world_size: int) -> Iterator[None]:
    """Inside, this process is rank 0 of ``world_size`` over PyTorch's fake process group; the
    group is destroyed on the way out. Refused where a process group already exists (a real
    run's): this must not replace it."""
    if world_size < 1:
        raise ValueError(f"the number of GPUs must be at least 1, got {world_size}")
    problem = fake_backend_unavailable()
    if problem is not None:
        raise RuntimeError(problem)
    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialized in this process: run the sharded estimate "
            "in a process of its own (python -m tutorial_utils estimate --gpus N ...)"
        )
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


class ShardedStepTracker(TensorMemoryTracker):
    """``TensorMemoryTracker`` that follows storage resizes and sorts communication buffers into
    ``BUFFER_CATEGORIES``; ``buffers_at_peak`` has their bytes at the peak (taken out of
    ``breakdown_at_peak["activations"]``, where the base tracker counts them).

    ``follow_resizes=False`` sees what a tracker of ops alone sees (``tools.LiveBytes``)."""

    def __init__(self, *args, follow_resizes: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.follow_resizes = follow_resizes
        self._marked: dict[int, BufferCategory] = {}  # serial -> category
        self.buffers_at_peak: dict[str, int] = dict.fromkeys(BUFFER_CATEGORIES, 0)
        self._original_resize = torch.UntypedStorage.resize_

    def mark(self, tensors: Iterable[torch.Tensor], category: BufferCategory) -> None:
        """Count the storages behind ``tensors`` (followed from now on) as ``category``."""
        for tensor in tensors:
            storage = _storage_of(tensor)
            if storage is not None:
                self._mark_storage(storage, category)

    def _mark_storage(
        self, storage: torch.UntypedStorage, category: BufferCategory, follow: bool = True
    ) -> None:
        """Mark a storage; ``follow=False`` marks it only where it is followed already."""
        with self._lock:
            known = self._live.get(storage._cdata)
            serial = known.serial if known else self._register(storage) if follow else None
            if serial is not None:
                self._marked.setdefault(serial, category)

    def _resize(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        self._original_resize(storage, nbytes)
        with self._lock:
            if storage._cdata in self._live:
                self._refresh(storage)
            elif nbytes:  # brought back from zero: FSDP2 unsharding a parameter
                self._mark_storage(storage, "all_gather")

    def __enter__(self) -> ShardedStepTracker:
        super().__enter__()
        if self.follow_resizes:
            tracker = self

            def resize_(storage: torch.UntypedStorage, nbytes: int) -> None:
                tracker._resize(storage, nbytes)

            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc_info) -> None:
        torch.UntypedStorage.resize_ = self._original_resize  # type: ignore[method-assign]
        super().__exit__(*exc_info)
        state = self._parameter_serials | self._grad_serials | self._optimizer_serials
        for serial, nbytes in self._live_at_peak.items():
            category = self._marked.get(serial)
            if category is not None and serial not in state:
                self.buffers_at_peak[category] += nbytes
                self.breakdown_at_peak["activations"] -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = str(func)
        category = next((c for word, c in _BUFFER_OPS.items() if word in name), None)
        if category is not None and ("c10d" in name or "fsdp" in name):
            for value in tree_leaves((args, kwargs or {}, out)):
                if (storage := _storage_of(value)) is not None:
                    self._mark_storage(storage, category, follow=False)
        return out
