"""Live tensor memory followed op by op, on any device: the CPU's answer to ``max_memory_allocated``.

A ``TorchDispatchMode`` sees every aten op that runs while it is active: forward, backward
(autograd propagates the mode to its worker threads), checkpoint recomputation and the optimizer
step. Each op's new output storages are registered with their byte size, and a weakref callback on
each storage observes the moment it is freed. The running sum of live bytes and its peak are
therefore measured, not computed from a formula.

On the ``meta`` device (tensors with shapes and dtypes but no data) the same ops run, autograd
builds the same graph, checkpoints recompute the same segments and the same storages are freed, so
a step there is a **dry run**: the exact tensor bytes of a step of any size, in well under a second
and without the memory, but no time.

What it cannot see: scratch memory a kernel allocates internally and frees before returning
(im2col buffers, cuDNN workspaces). On CUDA those are in ``max_memory_allocated`` but not
here; ``scripts/gpu_check.py`` measures the difference. Each cuBLAS call (and its thread) is
marked in the allocation events (``record_allocations``), which ``measurement.allocator``
replays through the CUDA caching allocator's rules, cuBLAS's workspace as the installed torch
takes it (per call, or once per thread and kept: ``tutorial_utils.gpus.CUBLAS_RULES``).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tutorial_utils.measurement.allocator import AllocationEvent, AllocationLog
from tutorial_utils.measurement.op_tensors import op_tensors
from tutorial_utils.measurement.phases import Phase, current_phase
from tutorial_utils.units import MiB

__all__ = [
    "CATEGORIES",
    "Category",
    "MemoryLimitExceeded",
    "StorageKind",
    "TensorMemoryTracker",
    "TimelineEvent",
]

try:
    from torch.distributed.tensor import DTensor

    SHARDED: tuple[type, ...] = (DTensor,)
except ImportError:  # a torch built without distributed support has no sharded tensors
    SHARDED = ()

Category = Literal["parameters", "gradients", "optimizer_state", "activations"]
CATEGORIES: tuple[Category, ...] = get_args(Category)
# how a followed storage counts: model or optimizer state at entry, a gradient, or neither
StorageKind = Literal["state", "grad", ""]

# The CUDA caching allocator hands out blocks in multiples of 512 bytes, and
# ``max_memory_allocated`` counts those block sizes.
CUDA_BLOCK_BYTES = 512

# Ops that run through cuBLAS on CUDA: each takes a workspace (per call, or its thread's).
_aten = torch.ops.aten
CUBLAS_OPS = frozenset(
    {
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten.baddbmm.default,
        _aten.addbmm.default,
        _aten._addmm_activation.default,
    }
)


def runs_on_cublaslt(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether CUDA's ``addmm`` runs this call through cuBLASLt with the bias in its epilogue
    (``aten/src/ATen/native/cuda/Blas.cpp``, ``isInputCompliesAddmmCudaLt`` on CUDA 12.1 and
    later): beta 1, a contiguous bias of one dimension (squeezed) as wide as the output, or a 2-D
    one with a fused activation, a floating dtype, every matrix side above 1."""
    if func not in (_aten.addmm.default, _aten._addmm_activation.default):
        return False
    bias, mat1, mat2 = args[:3]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    fused = func is _aten._addmm_activation.default
    one_dim = bias.is_contiguous() and (bias.dim() == 1 or bias.squeeze().dim() == 1)
    fusable = (one_dim and bias.shape[-1] == mat2.shape[1]) or (fused and bias.dim() == 2)
    return (
        beta == 1
        and fusable
        and mat1.dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)
        and min(*mat1.shape, *mat2.shape) > 1
    )


class TimelineEvent(NamedTuple):
    """Live tracked bytes right after one op."""

    seconds: float  # since the tracker was entered (no meaning in a dry run)
    current_bytes: int
    op: str
    phase: Phase = "forward"


@dataclass
class _Storage:
    serial: int  # unique for the tracker's lifetime, unlike addresses, which get reused
    nbytes: int
    ref: weakref.ref
    born: int  # index into the tracker's per-op log at registration
    kind: StorageKind = ""


def storage_bytes(storage: torch.UntypedStorage, round_to_blocks: bool = False) -> int:
    """Bytes a storage occupies, rounded up to 512-byte allocator blocks on CUDA (as the CUDA
    statistics count them) or wherever ``round_to_blocks`` asks for it (a dry run to be read
    beside ``max_memory_allocated``)."""
    nbytes = storage.nbytes()
    if (round_to_blocks or storage.device.type == "cuda") and nbytes:
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


def _storage_of(value: object) -> torch.UntypedStorage | None:
    """The storage behind a dense tensor, meta tensors included (their storage has a size and
    no data); None for non-tensors and storage-less tensors."""
    if not isinstance(value, torch.Tensor) or value.is_sparse:
        return None
    tensor: torch.Tensor = value
    if isinstance(value, SHARDED):  # sharded (FSDP2): this rank holds only its local shard
        tensor = value._local_tensor  # type: ignore[attr-defined]  # DTensor's, untyped
    try:
        return tensor.untyped_storage()
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


class MemoryLimitExceeded(RuntimeError):
    """Raised by a tracker with ``limit_bytes`` as soon as live tensors exceed it."""

    def __init__(self, live_bytes: int, limit_bytes: int):
        super().__init__(
            f"live tensors reached {live_bytes / MiB:.1f} MiB, over the limit of "
            f"{limit_bytes / MiB:.1f} MiB"
        )
        self.live_bytes = live_bytes
        self.limit_bytes = limit_bytes


class TensorMemoryTracker(TorchDispatchMode):
    """Peak live tensor bytes of whatever runs inside ``with tracker:``.

    On entry the storages that already exist and belong to the step are counted as the baseline:
    the model's parameters and buffers, existing gradients, the optimizer's state and any
    ``inputs`` given. So ``peak_bytes`` means what ``torch.cuda.max_memory_allocated`` means after
    ``reset_peak_memory_stats()`` just before the step, with model and optimizer in place.

    ``breakdown_at_peak`` splits the peak into ``CATEGORIES``: "parameters" (buffers such as
    BatchNorm running statistics included: they are model state too), "gradients" (storages that
    were accumulated into some parameter's ``.grad``, seen by a post-accumulate-grad hook),
    "optimizer_state" (storages in ``optimizer.state``, including state created lazily inside the
    step) and "activations" (activations/other: everything else, such as saved tensors, inputs,
    the loss, temporaries).

    ``activation_peak_bytes`` is the largest amount of "activations/other" alive at any moment of
    the step, which checkpointing cuts even where the overall peak is set by the weights (then
    ``breakdown_at_peak["activations"]`` hardly moves). It is computed at exit, because a
    gradient is only recognised once it is accumulated, a few ops after it was allocated.

    A storage is counted once however many views share it; in-place ops create no new storage.
    ``device`` restricts the count to one device (as the CUDA statistics are per device).
    ``limit_bytes`` stops the step with ``MemoryLimitExceeded`` as soon as the live bytes exceed
    it, so a search over batch sizes never holds much more than its budget in real memory.
    ``round_to_blocks`` counts every storage in 512-byte blocks, as CUDA's allocator does.
    ``record_allocations`` keeps ``allocations``: every storage's allocation and free in order,
    and each thread's first cuBLAS op (forward and optimizer on the calling thread, backward and
    recomputation on autograd's, as on CUDA), for ``measurement.allocator.replay``.

    Each op is sorted into a phase (``phases.current_phase``); ``phase_peak_bytes`` is the peak
    within each phase. With ``record_timeline`` every op is logged, and after exit
    ``category_timeline`` gives, for each logged op, the live bytes of each category.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        inputs: Iterable[torch.Tensor] = (),
        device: torch.device | str | None = None,
        record_timeline: bool = False,
        limit_bytes: int | None = None,
        round_to_blocks: bool = False,
        record_allocations: bool = False,
    ):
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self.inputs = tuple(inputs)
        self.device = torch.device(device) if device is not None else None
        self.record_timeline = record_timeline
        self.limit_bytes = limit_bytes
        self.round_to_blocks = round_to_blocks
        self.allocations: AllocationLog | None = AllocationLog() if record_allocations else None
        self.timeline: list[TimelineEvent] = []
        self.category_timeline: list[dict[str, int]] = []
        self.phase_peak_bytes: dict[str, int] = {}
        self.baseline_bytes = 0
        self.current_bytes = 0
        self.peak_bytes = 0
        self.activation_peak_bytes = 0
        self.breakdown_at_peak: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self._live: dict[
            int, _Storage
        ] = {}  # keyed by the StorageImpl address (unique while alive)
        self._serials = itertools.count()
        self._parameter_serials: set[int] = set()
        self._optimizer_serials: set[int] = set()
        self._grad_serials: set[int] = set()  # every storage ever accumulated as a gradient
        self._grad_lives: list[tuple[int, int, int]] = []  # (born, freed, bytes) of freed grads
        self._state_bytes = 0  # live bytes of parameters, buffers and optimizer state at entry
        self._others_log: list[int] = []  # current bytes minus state bytes, after every op
        self._live_at_peak: dict[int, int] = {}  # serial -> bytes
        self._lives: list[tuple[int, int, int, int]] = []  # (serial, born, freed, bytes), timeline
        self._hooks: list = []
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
            nbytes = storage_bytes(storage, self.round_to_blocks)
            if nbytes == 0:
                return None
            ref = weakref.ref(storage, functools.partial(self._on_free, key))
            entry = _Storage(next(self._serials), nbytes, ref, born=len(self._others_log))
            self._live[key] = entry
            self.current_bytes += nbytes
            if self.allocations is not None:
                self.allocations.events.append(AllocationEvent("malloc", entry.serial, nbytes))
            return entry.serial

    def _on_free(self, key: int, _ref: object = None) -> None:
        """A followed storage was freed (the callback of its weakref)."""
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is None or not self._active:
                return
            self.current_bytes -= entry.nbytes
            if self.allocations is not None:
                self.allocations.events.append(AllocationEvent("free", entry.serial))
            if self.record_timeline:
                self._lives.append((entry.serial, entry.born, len(self._others_log), entry.nbytes))
            if entry.kind == "state":
                self._state_bytes -= entry.nbytes
            elif entry.kind == "grad":
                self._grad_lives.append((entry.born, len(self._others_log), entry.nbytes))

    def _refresh(self, storage: torch.UntypedStorage) -> None:
        """Follow a resize of a known storage (``out=`` arguments, ``resize_``)."""
        with self._lock:
            entry = self._live.get(storage._cdata)
            if entry is None:
                return
            nbytes = storage_bytes(storage, self.round_to_blocks)
            if nbytes == entry.nbytes:
                return
            if self.record_timeline:  # the old size lived until now, the new one starts now
                now = len(self._others_log)
                self._lives.append((entry.serial, entry.born, now, entry.nbytes))
                entry.born = now
            self.current_bytes += nbytes - entry.nbytes
            if self.allocations is not None:  # a resize is a new block for the allocator
                self.allocations.events += [
                    AllocationEvent("free", entry.serial),
                    AllocationEvent("malloc", entry.serial, nbytes),
                ]
            if entry.kind == "state":
                self._state_bytes += nbytes - entry.nbytes
            entry.nbytes = nbytes

    def _register_all(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        serials = set()
        for tensor in tensors:
            storage = _storage_of(tensor)
            if storage is not None and (serial := self._register(storage)) is not None:
                serials.add(serial)
        return serials

    def _live_entries(self, tensors: Iterable[torch.Tensor | None]) -> list[_Storage]:
        """The followed storages behind ``tensors`` (looked up, never registered)."""
        entries = []
        for tensor in tensors:
            storage = _storage_of(tensor)
            if storage is not None and (entry := self._live.get(storage._cdata)) is not None:
                entries.append(entry)
        return entries

    def _tag_grads(self, grads: Iterable[torch.Tensor | None]) -> None:
        for entry in self._live_entries(grads):
            if entry.kind == "":
                entry.kind = "grad"
                self._grad_serials.add(entry.serial)

    def _on_grad_accumulated(self, parameter: torch.Tensor) -> None:
        with self._lock:
            self._tag_grads([parameter.grad])

    def _after_op(self, phase: Phase = "forward") -> None:
        self._others_log.append(self.current_bytes - self._state_bytes)
        if self.current_bytes > self.phase_peak_bytes.get(phase, -1):
            self.phase_peak_bytes[phase] = self.current_bytes
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self._live_at_peak = {entry.serial: entry.nbytes for entry in self._live.values()}

    def _note_cublas(self, phase: Phase, cublaslt: bool) -> None:
        """A cuBLAS op takes a workspace (after the op's output): its own for the call, or its
        thread's, taken by the thread's first and kept, as the replay's rule says
        (``AllocationEvent``'s key: the thread, plus 2 where cuBLASLt runs it)."""
        thread = 1 if phase in ("backward", "recompute") else 0
        assert self.allocations is not None
        self.allocations.events.append(AllocationEvent("workspace", thread + 2 * cublaslt))

    def _check_limit(self) -> None:
        if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
            raise MemoryLimitExceeded(self.current_bytes, self.limit_bytes)

    # -- the dispatch mode --------------------------------------------------------------------

    def __enter__(self) -> TensorMemoryTracker:
        with self._lock:
            self._active = True
            model_tensors, grads = [], []
            if self.model is not None:
                model_tensors = [*self.model.parameters(), *self.model.buffers()]
                grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            self._parameter_serials = self._register_all(model_tensors)
            self._optimizer_serials = self._register_all(optimizer_state_tensors(self.optimizer))
            self._register_all(grads)
            self._register_all(self.inputs)
            for entry in self._live_entries(
                [*model_tensors, *optimizer_state_tensors(self.optimizer)]
            ):
                entry.kind = "state"
                self._state_bytes += entry.nbytes
            self._tag_grads(grads)
            self._hooks = [
                p.register_post_accumulate_grad_hook(self._on_grad_accumulated)
                for p in model_tensors
                if isinstance(p, nn.Parameter) and p.requires_grad
            ]
            self.baseline_bytes = self.current_bytes
            if self.allocations is not None:
                self.allocations.baseline_events = len(self.allocations.events)
            self._others_log.append(self.current_bytes - self._state_bytes)
            self.peak_bytes = self.current_bytes
            self._live_at_peak = {entry.serial: entry.nbytes for entry in self._live.values()}
        self._started = time.perf_counter()
        return super().__enter__()

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        with self._lock:
            if self.model is not None:
                self._tag_grads(p.grad for p in self.model.parameters())
            self._classify_peak()
            self._measure_activation_peak()
            if self.record_timeline:
                self._build_category_timeline()
            self._active = False
            self._live.clear()  # dropping the weakrefs cancels their callbacks

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        phase = current_phase()
        input_keys = {
            storage._cdata
            for value in op_tensors(args, kwargs)
            if (storage := _storage_of(value)) is not None
        }
        with self._lock:
            for value in op_tensors(out):
                storage = _storage_of(value)
                if storage is None:
                    continue
                if storage._cdata in input_keys:  # a view or an in-place/out= result
                    self._refresh(storage)
                else:
                    self._register(storage)
            if self.allocations is not None and func in CUBLAS_OPS:
                self._note_cublas(phase, runs_on_cublaslt(func, args, kwargs))
            self._after_op(phase)
            if self.record_timeline:
                elapsed = time.perf_counter() - self._started
                self.timeline.append(TimelineEvent(elapsed, self.current_bytes, str(func), phase))
        self._check_limit()
        return out

    def _category_of(self) -> dict[Category, set[int]]:
        """Serials by category, known only at exit (gradients and lazy optimizer state)."""
        optimizer_serials = self._optimizer_serials | {
            entry.serial for entry in self._live_entries(optimizer_state_tensors(self.optimizer))
        }
        return {
            "parameters": self._parameter_serials,
            "gradients": self._grad_serials - self._parameter_serials,
            "optimizer_state": optimizer_serials - self._parameter_serials - self._grad_serials,
        }

    def _classify(self, serial: int, known: dict[Category, set[int]]) -> Category:
        for category, serials in known.items():
            if serial in serials:
                return category
        return "activations"

    def _classify_peak(self) -> None:
        known = self._category_of()
        breakdown: dict[str, int] = {category: 0 for category in CATEGORIES}
        for serial, nbytes in self._live_at_peak.items():
            breakdown[self._classify(serial, known)] += nbytes
        self.breakdown_at_peak = breakdown

    def _build_category_timeline(self) -> None:
        """Live bytes per category after each logged op, from every storage's life span."""
        steps = len(self._others_log)
        known = self._category_of()
        lives = self._lives + [
            (entry.serial, entry.born, steps, entry.nbytes) for entry in self._live.values()
        ]
        change = {category: [0] * (steps + 1) for category in CATEGORIES}
        for serial, born, freed, nbytes in lives:
            column = change[self._classify(serial, known)]
            column[born] += nbytes
            column[freed] -= nbytes
        running: dict[str, int] = {category: 0 for category in CATEGORIES}
        per_step = []
        for step in range(steps):
            for category in CATEGORIES:
                running[category] += change[category][step]
            per_step.append(dict(running))
        self.category_timeline = per_step[1:]  # entry 0 is the state on entering, before any op

    def _measure_activation_peak(self) -> None:
        """max over ops of (live bytes - state - gradients alive then), gradients found late."""
        steps = len(self._others_log)
        lives = self._grad_lives + [
            (entry.born, steps, entry.nbytes)
            for entry in self._live.values()
            if entry.kind == "grad"
        ]
        grad_change = [0] * (steps + 1)
        for born, freed, nbytes in lives:
            grad_change[born] += nbytes
            grad_change[freed] -= nbytes
        grads_alive = 0
        peak = 0
        for step, others in enumerate(self._others_log):
            grads_alive += grad_change[step]
            peak = max(peak, others - grads_alive)
        self.activation_peak_bytes = peak

    @property
    def active(self) -> bool:
        """True inside the ``with`` block."""
        return self._active

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MiB
