"""Memory over time: a background sampler and the tracker's op-by-op timeline, for plots.

``MemoryMonitor`` samples the tracker's live bytes (any device) and, on CUDA, the allocator and
NVML while a block runs; ``timeline_samples`` turns a tracker's timeline into the same samples.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

import torch

from tutorial_utils.measurement.nvml import cuda_unavailable_reason, nvml_index, nvml_used_mb
from tutorial_utils.measurement.tracker import TensorMemoryTracker


class MemorySample(NamedTuple):
    """One reading of a ``MemoryMonitor``; None where a source is absent."""

    seconds: float  # since the monitor started
    tracked_bytes: int | None
    cuda_allocated_bytes: int | None
    nvml_used_mb: float | None


def timeline_samples(tracker: TensorMemoryTracker) -> list[MemorySample]:
    """A tracker's op-by-op timeline (``record_timeline=True``) as samples for plotting."""
    return [MemorySample(e.seconds, e.current_bytes, None, None) for e in tracker.timeline]


class MemoryMonitor:
    """Samples memory every ``interval_s`` in a background thread while a block runs.

    Sources: the tracker's live bytes while it is active (any device), and on CUDA the allocator's
    allocated bytes and NVML's used MB. A first and a last sample are always taken, and the thread
    is stopped and joined on leaving the block, exceptions included.
    """

    def __init__(
        self,
        interval_s: float = 0.05,
        tracker: TensorMemoryTracker | None = None,
        device: torch.device | str | None = None,
    ):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.tracker = tracker
        if device is not None:
            self.device = torch.device(device)
        else:
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def sample(self) -> MemorySample:
        """Read every available source now (and keep the reading)."""
        tracked = None
        if self.tracker is not None and self.tracker.active:
            tracked = self.tracker.current_bytes
        cuda_allocated = nvml = None
        if self.device.type == "cuda" and cuda_unavailable_reason() is None:
            cuda_allocated = torch.cuda.memory_allocated(self.device)
            nvml = nvml_used_mb(nvml_index(self.device)).used_mb
        reading = MemorySample(time.perf_counter() - self._started, tracked, cuda_allocated, nvml)
        self.samples.append(reading)
        return reading

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> MemoryMonitor:
        if self._thread is not None:
            raise RuntimeError("this MemoryMonitor is already running")
        self._stop.clear()
        self._started = time.perf_counter()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="MemoryMonitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    def __enter__(self) -> MemoryMonitor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
