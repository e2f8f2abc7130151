"""Live tensor memory followed op by op, on any device: the CPU's answer to ``max_memory_allocated``.

A ``TorchDispatchMode`` sees every aten op that runs while it is active: forward, backward
(autograd propagates the mode to its worker threads), checkpoint recomputation and the optimizer
step. Each op's new output storages are registered with their byte size, and a weakref callback on
each storage observes the moment it is freed. The running sum of live bytes and its peak are
therefore measured, not computed from a formula.

What it cannot see: scratch memory a kernel allocates internally and frees before returning
(im2col buffers, cuDNN/cuBLAS workspaces). On CUDA those are in ``max_memory_allocated`` but not
here; ``scripts/gpu_crosscheck.py`` states the difference.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed support has no sharded tensors
    DTensor = ()

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")

# The CUDA caching allocator hands out blocks in multiples of 512 bytes, and
# ``max_memory_allocated`` counts those block sizes.
CUDA_BLOCK_BYTES = 512


class TimelineEvent(NamedTuple):
    """Live tracked bytes right after one op."""

    seconds: float  # since the tracker was entered
    current_bytes: int
    op: str


@dataclass
class _Storage:
    serial: int  # unique for the tracker's lifetime, unlike addresses, which get reused
    nbytes: int
    ref: weakref.ref


def storage_bytes(storage: torch.UntypedStorage) -> int:
    """Bytes a storage occupies, rounded to allocator blocks on CUDA like the CUDA statistics."""
    nbytes = storage.nbytes()
    if storage.device.type == "cuda" and nbytes:
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


def _storage_of(value: object) -> torch.UntypedStorage | None:
    """The storage behind a plain dense tensor; None for non-tensors and storage-less tensors."""
    if not isinstance(value, torch.Tensor) or value.is_sparse or value.device.type == "meta":
        return None
    if isinstance(value, DTensor):  # sharded (FSDP2): this rank holds only its local shard
        value = value._local_tensor
    try:
        return value.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a real storage
        return None


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Every tensor held in ``optimizer.state`` (momentum buffers, Adam moments, step counters)."""
    if optimizer is None:
        return []
    return [
        value
        for state in optimizer.state.values()
        for value in tree_leaves(state)
        if isinstance(value, torch.Tensor)
    ]


class TensorMemoryTracker(TorchDispatchMode):
    """Peak live tensor bytes of whatever runs inside ``with tracker:``.

    On entry the storages that already exist and belong to the step are counted as the baseline:
    the model's parameters and buffers, existing gradients, the optimizer's state and any
    ``inputs`` given. So ``peak_bytes`` means what ``torch.cuda.max_memory_allocated`` means after
    ``reset_peak_memory_stats()`` just before the step, with model and optimizer in place.

    ``breakdown_at_peak`` splits the peak into ``CATEGORIES``: "parameters" (buffers such as
    BatchNorm running statistics included: they are model state too), "gradients" (storages that
    are some parameter's ``.grad`` at the peak or at exit), "optimizer_state" (storages in
    ``optimizer.state``, including state created lazily inside the step) and "activations"
    (activations/other: everything else, such as saved tensors, inputs, the loss, temporaries).

    A storage is counted once however many views share it; in-place ops create no new storage.
    ``device`` restricts the count to one device (as the CUDA statistics are per device).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        inputs: Iterable[torch.Tensor] = (),
        device: torch.device | str | None = None,
        record_timeline: bool = False,
    ):
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self.inputs = tuple(inputs)
        self.device = torch.device(device) if device is not None else None
        self.record_timeline = record_timeline
        self.timeline: list[TimelineEvent] = []
        self.baseline_bytes = 0
        self.current_bytes = 0
        self.peak_bytes = 0
        self.breakdown_at_peak: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self._live: dict[
            int, _Storage
        ] = {}  # keyed by the StorageImpl address (unique while alive)
        self._serials = itertools.count()
        self._parameter_serials: set[int] = set()
        self._optimizer_serials: set[int] = set()
        self._grad_serials_at_peak: set[int] = set()
        self._live_at_peak: dict[int, int] = {}  # serial -> bytes
        self._lock = threading.RLock()
        self._started = 0.0
        self._active = False

    # -- registration -----------------------------------------------------------------------

    def _on_device(self, storage: torch.UntypedStorage) -> bool:
        if self.device is None:
            return True
        if storage.device.type != self.device.type:
            return False
        return self.device.index is None or storage.device.index == self.device.index

    def _register(self, storage: torch.UntypedStorage) -> int | None:
        """Start following a storage; its serial, or None when it is not followed."""
        if not self._on_device(storage):
            return None
        key = storage._cdata
        with self._lock:
            known = self._live.get(key)
            if known is not None:
                return known.serial
            nbytes = storage_bytes(storage)
            if nbytes == 0:
                return None
            ref = weakref.ref(storage, lambda _ref, key=key: self._on_free(key))
            self._live[key] = _Storage(next(self._serials), nbytes, ref)
            self.current_bytes += nbytes
            return self._live[key].serial

    def _on_free(self, key: int) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None and self._active:
                self.current_bytes -= entry.nbytes

    def _refresh(self, storage: torch.UntypedStorage) -> None:
        """Follow a resize of a known storage (``out=`` arguments, ``resize_``)."""
        with self._lock:
            entry = self._live.get(storage._cdata)
            if entry is None:
                return
            nbytes = storage_bytes(storage)
            self.current_bytes += nbytes - entry.nbytes
            entry.nbytes = nbytes

    def _register_all(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        serials = set()
        for tensor in tensors:
            storage = _storage_of(tensor)
            if storage is not None and (serial := self._register(storage)) is not None:
                serials.add(serial)
        return serials

    def _live_serials(self, tensors: Iterable[torch.Tensor | None]) -> set[int]:
        """Serials of the followed storages behind ``tensors`` (looked up, never registered)."""
        serials = set()
        for tensor in tensors:
            storage = _storage_of(tensor)
            if storage is not None and (entry := self._live.get(storage._cdata)) is not None:
                serials.add(entry.serial)
        return serials

    def _grad_serials(self) -> set[int]:
        if self.model is None:
            return set()
        return self._live_serials(p.grad for p in self.model.parameters())

    def _note_peak(self) -> None:
        if self.current_bytes <= self.peak_bytes:
            return
        self.peak_bytes = self.current_bytes
        self._live_at_peak = {entry.serial: entry.nbytes for entry in self._live.values()}
        self._grad_serials_at_peak = self._grad_serials()

    # -- the dispatch mode --------------------------------------------------------------------

    def __enter__(self) -> TensorMemoryTracker:
        with self._lock:
            self._active = True
            model_tensors = []
            if self.model is not None:
                model_tensors = [*self.model.parameters(), *self.model.buffers()]
            self._parameter_serials = self._register_all(model_tensors)
            grads = [p.grad for p in self.model.parameters()] if self.model is not None else []
            self._register_all(g for g in grads if g is not None)
            self._optimizer_serials = self._register_all(optimizer_state_tensors(self.optimizer))
            self._register_all(self.inputs)
            self.baseline_bytes = self.current_bytes
            self._note_peak()
        self._started = time.perf_counter()
        return super().__enter__()

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        with self._lock:
            self._classify_peak()
            self._active = False
            self._live.clear()  # dropping the weakrefs cancels their callbacks

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        input_keys = {
            storage._cdata
            for value in tree_leaves((args, kwargs))
            if (storage := _storage_of(value)) is not None
        }
        with self._lock:
            for value in tree_leaves(out):
                storage = _storage_of(value)
                if storage is None:
                    continue
                if storage._cdata in input_keys:  # a view or an in-place/out= result
                    self._refresh(storage)
                else:
                    self._register(storage)
            self._note_peak()
            if self.record_timeline:
                elapsed = time.perf_counter() - self._started
                self.timeline.append(TimelineEvent(elapsed, self.current_bytes, str(func)))
        return out

    def _classify_peak(self) -> None:
        grad_serials = self._grad_serials_at_peak | self._grad_serials()
        optimizer_serials = self._optimizer_serials | self._live_serials(
            optimizer_state_tensors(self.optimizer)
        )
        breakdown = dict.fromkeys(CATEGORIES, 0)
        for serial, nbytes in self._live_at_peak.items():
            if serial in self._parameter_serials:
                breakdown["parameters"] += nbytes
            elif serial in grad_serials:
                breakdown["gradients"] += nbytes
            elif serial in optimizer_serials:
                breakdown["optimizer_state"] += nbytes
            else:
                breakdown["activations"] += nbytes
        self.breakdown_at_peak = breakdown

    @property
    def active(self) -> bool:
        """True inside the ``with`` block."""
        return self._active

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20
