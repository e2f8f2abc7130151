"""Launching a function on several processes with ``torch.distributed``, safely.

A notebook cannot host ranks itself, so ``launch`` spawns them: gloo on CPU (2 processes on
127.0.0.1 need no GPU), NCCL on CUDA. Each rank's return value comes back to the caller through a
file in a temporary folder (no shared-memory tensors outliving their process), the process group is
torn down in ``finally``, and when one rank fails the others are terminated, so the caller gets ONE
clear ``DistributedRunError`` instead of a hang in a collective and orphan processes.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = [
    "Backend",
    "check_spawnable",
    "DeviceType",
    "DistributedRunError",
    "launch",
    "RankContext",
]

LOOPBACK = "127.0.0.1"
POLL_INTERVAL_S = 0.05
JOIN_TIMEOUT_S = 5.0

DeviceType = Literal["cpu", "cuda"]  # where ranks run
Backend = Literal["gloo", "nccl"]  # how they talk: gloo on CPUs, NCCL on GPUs


class DistributedRunError(RuntimeError):
    """A rank failed, died or timed out; ``rank`` says which, ``rank_traceback`` shows where."""

    def __init__(self, message: str, rank: int | None = None, rank_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback


@dataclass(frozen=True)
class RankContext:
    """What a rank's function needs to know about itself."""

    rank: int
    world_size: int
    device: torch.device


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


DEFAULT_TIMEOUT_S = 300.0  # launch's hang guard: spawning ranks, importing torch, small steps


def default_world_size(device_type: DeviceType) -> int:
    """All visible GPUs on CUDA; two processes on CPU (enough to shard, cheap on 2 cores)."""
    if device_type == "cuda":
        return torch.cuda.device_count()
    return 2


def default_device_type() -> DeviceType:
    """``cuda`` where a GPU is visible, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_ranks(world_size: int | None, device_type: DeviceType | None) -> tuple[int, DeviceType]:
    """The ranks ``launch`` will start: the given ones, else its defaults for this machine."""
    device_type = device_type or default_device_type()
    return (default_world_size(device_type) if world_size is None else world_size), device_type


def backend_for(device_type: str) -> Backend:
    """NCCL for GPUs, gloo for CPUs."""
    if device_type not in get_args(DeviceType):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    return "nccl" if device_type == "cuda" else "gloo"


def check_spawnable(fn: Callable) -> None:
    """Spawned processes import ``fn`` by name: reject functions they could not find."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    # A script's __main__ is re-imported from its file; a notebook's or a REPL's has no file.
    interactive_main = module == "__main__" and not hasattr(sys.modules["__main__"], "__file__")
    if module is None or interactive_main or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"{qualname or fn!r} cannot run in a spawned process: define it at the top level of an "
            "importable module (e.g. in tutorial_utils), not in a notebook cell or inside a function"
        )


def launch(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int | None = None,
    device_type: DeviceType | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Any]:
    """``[fn(RankContext(rank, ...), *args) for each rank]``, each call in its own process.

    Raises ``DistributedRunError("rank N failed: <ExcType>: <message>")`` when a rank raises or
    dies, and after ``timeout_s``; in every case no rank process is left running.
    """
    check_spawnable(fn)
    world_size, device_type = resolve_ranks(world_size, device_type)
    backend = backend_for(device_type)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if device_type == "cuda" and world_size > torch.cuda.device_count():
        raise ValueError(
            f"world_size={world_size} needs as many GPUs, {torch.cuda.device_count()} are visible"
        )
    context = mp.get_context("spawn")
    port = free_loopback_port()
    with tempfile.TemporaryDirectory(prefix="tutorial-dist-") as folder:
        results_dir = Path(folder)
        processes = [
            context.Process(
                target=_rank_main,
                args=(fn, args, rank, world_size, device_type, backend, port, results_dir),
                name=f"rank{rank}",
                daemon=True,
            )
            for rank in range(world_size)
        ]
        try:
            for process in processes:
                process.start()
            _wait_for_ranks(processes, results_dir, timeout_s)
        finally:
            _stop(processes)
        return [_load(_result_path(results_dir, rank)) for rank in range(world_size)]


def _rank_main(
    fn: Callable[..., Any],
    args: tuple,
    rank: int,
    world_size: int,
    device_type: DeviceType,
    backend: Backend,
    port: int,
    results_dir: Path,
) -> None:
    """One rank: join the group, run ``fn``, write its result or its error, always leave."""
    os.environ.update(
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)  # ranks share the machine's cores; one thread each avoids thrashing
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    exit_code = 0
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
        )
        result = fn(RankContext(rank, world_size, device), *args)
        _write_atomically(_result_path(results_dir, rank), result)
    except BaseException as error:  # noqa: BLE001 - every failure must reach the caller
        summary = f"{type(error).__name__}: {error}"
        _write_atomically(
            _error_path(results_dir, rank),
            {"summary": summary, "traceback": traceback.format_exc(), "time": time.time()},
        )
        exit_code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # The outcome is on disk. Leave without the interpreter's teardown: there, torch 2.14's
    # C++ threads (gloo, autograd) sometimes abort with "terminate called without an active
    # exception" (about 1 run in 6 here), which would turn a finished rank into a crashed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _wait_for_ranks(processes: list, results_dir: Path, timeout_s: float) -> None:
    """Return when every rank succeeded; raise on the first failure or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        errors = [
            (report["time"], rank, report)
            for rank in range(len(processes))
            if (report := _read_error(results_dir, rank)) is not None
        ]
        if errors:
            # A rank's failure makes its peers fail too ("connection closed by peer"): the
            # earliest report is the cause. A rank writes its report before its sockets close,
            # so the cause is already on disk when any consequence is.
            _, rank, report = min(errors, key=lambda error: error[:2])
            raise DistributedRunError(
                f"rank {rank} failed: {report['summary']}", rank, report["traceback"]
            )
        for rank, process in enumerate(processes):
            if process.exitcode not in (None, 0):
                time.sleep(POLL_INTERVAL_S)  # its report may land just after the exit code
                if _read_error(results_dir, rank) is None:
                    raise DistributedRunError(
                        f"rank {rank} failed: process exited with code {process.exitcode} "
                        "without an error report",
                        rank,
                    )
        if all(process.exitcode == 0 for process in processes):
            return
        if time.monotonic() > deadline:
            running = [r for r, p in enumerate(processes) if p.exitcode is None]
            raise DistributedRunError(
                f"rank {running[0]} failed: TimeoutError: still running after {timeout_s:.0f} s "
                f"(ranks {running} were stopped)",
                running[0],
            )
        time.sleep(POLL_INTERVAL_S)


def _stop(processes: list) -> None:
    """Terminate what still runs, then kill what ignores it: nothing outlives ``launch``."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        if process.pid is None:
            continue
        process.join(JOIN_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join(JOIN_TIMEOUT_S)


def _write_atomically(path: Path, payload: Any) -> None:
    """``torch.save`` to a side file then rename, so the caller never reads half a file."""
    partial = path.with_suffix(".partial")
    torch.save(payload, partial)
    partial.replace(path)


def _load(path: Path) -> Any:
    """Our own ranks wrote these files: plain pickles of results, not untrusted checkpoints."""
    return torch.load(path, weights_only=False)


def _read_error(results_dir: Path, rank: int) -> dict | None:
    """The error report a rank wrote, if any."""
    path = _error_path(results_dir, rank)
    return _load(path) if path.exists() else None


def _result_path(results_dir: Path, rank: int) -> Path:
    return results_dir / f"rank{rank}.result"


def _error_path(results_dir: Path, rank: int) -> Path:
    return results_dir / f"rank{rank}.error"
