"""The few tools the tutorial measures with, small enough to copy next to your own script.

Notebook 01 writes each function below in a visible cell marked ``# @save``; this file keeps
identical copies (``tests/test_tools.py`` holds them equal), which later notebooks import under
the same names. It imports torch and the standard library only, so ``tools.py`` alone is all a
script needs. The package's full tracker (``measurement/tracker.py``) stays for what only it can
do: memory split into parameters, gradients, optimizer state and activations, and dry runs on the
meta device.
"""

from __future__ import annotations

import gc
import statistics
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

__all__ = [
    "compare_times",
    "LiveBytes",
    "MiB",
    "peak_bytes",
    "saved_bytes",
    "SavedTensors",
    "step_flops",
    "StepTimes",
    "time_turns",
]

MiB = 2**20


class SavedTensors:
    """Inside ``with``, every storage autograd saves for backward, once, with its bytes.

    Several ops may save the same tensor, or views of one storage: each storage counts once.
    The storages are the keys, held until the counter goes, so none is freed while counted and
    none is confused with another: their addresses may be reused, and on the meta device they
    are all 0. Tensors in ``leave_out`` (a model's parameters: in memory anyway) are not counted.
    Of a region ``torch.utils.checkpoint`` runs, only the inputs come through here: the rest is
    recomputed in backward, and what a selective policy keeps passes by these hooks unless
    ``checkpoint`` is called with ``respect_saved_tensors_hooks=True`` (torch 2.14 and later).
    Pass that argument explicitly with a selective policy: torch 2.15 warns (FutureWarning) when
    it is left unset inside saved-tensor hooks, and a later release changes its default.
    """

    def __init__(self, leave_out: Iterable[torch.Tensor] = ()) -> None:
        self.left_out = {tensor.untyped_storage() for tensor in leave_out}
        self.storages: dict[torch.UntypedStorage, int] = {}  # storage -> bytes, in saving order
        self.total_bytes = 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage not in self.left_out and storage not in self.storages:
            self.storages[storage] = storage.nbytes()
            self.total_bytes += storage.nbytes()
        return tensor

    def __enter__(self) -> Self:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exception: object) -> None:
        self.hooks.__exit__(*exception)


def saved_bytes(model: torch.nn.Module, forward: Callable[[], object]) -> int:
    """Bytes autograd keeps for backward while ``forward()`` runs: what checkpointing trades.

    Each storage counts once (several ops may save the same tensor); the model's parameters
    are left out, since they are in memory anyway. ``SavedTensors`` says what it sees of a
    checkpointed region.
    """
    with SavedTensors(leave_out=model.parameters()) as saved:
        forward()
    return saved.total_bytes


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage created inside it until that storage is freed,
    and keeps the highest count: a step's peak on any device, without CUDA's allocator.

    The count starts at 0 and falls below it when the step frees a storage that was alive
    before (old gradients, say), as ``torch.cuda.memory_allocated()`` falls: so ``peak_bytes``
    reads what ``torch.cuda.max_memory_allocated() - start`` reads on a GPU.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # storage address -> bytes, while it is alive
        self.now_bytes = self.peak_bytes = 0
        self.finalizers: list[weakref.finalize] = []

    def __enter__(self) -> Self:
        gc.collect()  # garbage collected during the step would count as frees the step made
        for tensor in [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]:
            try:  # a wrapper with no data or device of its own (a DTensor, say) raises
                if tensor.layout == torch.strided and tensor.device.type != "meta":
                    self._follow(tensor.untyped_storage())  # alive already: its free will count
            except RuntimeError:
                pass
        return super().__enter__()

    def __exit__(self, *exception: object) -> None:
        for finalizer in self.finalizers:
            finalizer.detach()
        super().__exit__(*exception)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}  # fmt: skip
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in inputs:  # else a view or an in-place result
                self.now_bytes += self._follow(storage)
        self.peak_bytes = max(self.peak_bytes, self.now_bytes)
        return out

    def _follow(self, storage: torch.UntypedStorage) -> int:
        """Note a storage once, to subtract its bytes when it is freed; its bytes if new."""
        address = storage.data_ptr()
        if address in self.live or storage.nbytes() == 0:
            return 0
        self.live[address] = storage.nbytes()
        self.finalizers.append(weakref.finalize(storage, self._free, address))
        return storage.nbytes()

    def _free(self, address: int) -> None:
        self.now_bytes -= self.live.pop(address, 0)


def peak_bytes(step: Callable[[], object], device: str | torch.device = "cpu") -> int:
    """The most tensor memory ``step()`` holds at once, above what was alive when it started:
    ``torch.cuda.max_memory_allocated() - start``, a free of an older tensor included.

    On CUDA this is the caching allocator's own counter; elsewhere ``LiveBytes`` counts.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    with LiveBytes() as counter:
        step()
    return counter.peak_bytes


def step_flops(step: Callable[[], object]) -> int:
    """Floating-point operations ``step()`` runs, recomputation included (matmuls and convs)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


@dataclass
class StepTimes:
    """Seconds of one step, once per turn: CPU time (``time.process_time``) and wall time."""

    cpu_s: list[float]
    wall_s: list[float]


def time_turns(
    steps: dict[str, Callable[[], object]], turns: int = 5, device: str | torch.device = "cpu"
) -> dict[str, StepTimes]:
    """Time each step once per turn, the steps in turns (a, b, a, b, ...), on one CPU thread.

    Turns spread a busy machine's slow moments over every step alike, one thread keeps the
    threads of one step from waiting on each other, and a one-thread step's CPU time hardly
    notices other programs. Every step runs once untimed first (allocation, kernel choice).
    """
    device = torch.device(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in steps.values():
            step()
        times = {name: StepTimes([], []) for name in steps}
        for _ in range(turns):
            for name, step in steps.items():
                sync()
                cpu, wall = time.process_time(), time.perf_counter()
                step()
                sync()
                times[name].cpu_s.append(time.process_time() - cpu)
                times[name].wall_s.append(time.perf_counter() - wall)
    finally:
        torch.set_num_threads(threads)
    return times


def compare_times(times: dict[str, StepTimes], reference: str) -> str:
    """Each step's median and range against ``reference``'s, CPU and wall time: 'beyond noise'
    only when the two ranges do not overlap."""
    lines = []
    base = times[reference]
    for clock in ("cpu_s", "wall_s"):
        for name, step in times.items():
            ours, theirs = getattr(step, clock), getattr(base, clock)
            ratio = statistics.median(ours) / statistics.median(theirs)
            apart = min(ours) > max(theirs) or max(ours) < min(theirs)
            verdict = "" if name == reference else f"  x{ratio:.2f}, beyond noise: {apart}"
            lines.append(
                f"{clock[:-2]:>4} time  {name:<14} median {statistics.median(ours):.3f} s "
                f"({min(ours):.3f}-{max(ours):.3f}){verdict}"
            )
    return "\n".join(lines)


def profiled_peak_bytes(step: Callable[[], object], device: str | torch.device = "cpu") -> int:
    """``step()``'s peak, also counting buffers that no PyTorch operator allocates.

    ``torch.compile``'s generated code allocates its buffers itself, so ``peak_bytes`` misses
    them. On CUDA the allocator's counter sees them (``peak_bytes``); elsewhere the profiler's
    allocation events do. The profiler sees only frees of what it saw allocated: free what the
    step would free first (``model.zero_grad(set_to_none=True)``), then call this.
    """
    from torch.profiler import ProfilerActivity, profile

    if torch.device(device).type == "cuda":
        return peak_bytes(step, device)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    now = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        now += event.nbytes()  # positive: allocated, negative: freed
        peak = max(peak, now)
    return peak
