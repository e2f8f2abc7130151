"""One train/test loop for both articles, with the per-epoch figures the tutorial compares.

The first article has two near-identical loops (plain and ``checkpoint_sequential``); here one
loop takes a ``strategy`` instead (``equal_segments(2)``). The second article's NetA checkpoints
inside its own forward, so it trains here with no strategy.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TypedDict, cast

import torch
import torch.nn as nn
from tqdm.std import tqdm

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, Strategy
from tutorial_utils.measurement.devices import resolve_device
from tutorial_utils.measurement.nvml import nvml_used_mib
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.units import MiB

__all__ = [
    "TrainingOptions",
    "atomic_save",
    "EpochRecord",
    "EpochRow",
    "History",
    "resume",
    "test_model",
    "train_model",
]


@dataclass
class EpochRecord:
    """What one epoch cost and achieved; memory fields are None where not measurable."""

    epoch: int
    train_accuracy: float | None
    train_loss: float | None
    val_accuracy: float
    val_loss: float
    seconds: float  # the training pass alone, evaluation excluded
    samples_per_second: float
    cuda_peak_allocated_mib: float | None = None
    nvml_used_mib: float | None = None
    tracked_peak_mib: float | None = None

    def log_line(self) -> str:
        """The first article's per-epoch line, with our extra figures after it."""
        # the article's fields, names and unit; the reason for a missing NVML figure after the unit
        memory = (
            "n/a MB (no NVIDIA driver)"
            if self.nvml_used_mib is None
            else f"{self.nvml_used_mib} MB"
        )
        line = (
            f"Epoch={self.epoch} Train Accuracy={self.train_accuracy} "
            f"Train loss={self.train_loss} Validation accuracy={self.val_accuracy} "
            f"Validation loss={self.val_loss} Memory used={memory}"
        )
        extras = [f"epoch seconds={self.seconds:.1f}"]
        if self.tracked_peak_mib is not None:
            extras.append(f"tracked peak={self.tracked_peak_mib:.1f} MiB")
        if self.cuda_peak_allocated_mib is not None:
            extras.append(f"CUDA peak allocated={self.cuda_peak_allocated_mib:.1f} MiB")
        return line + " | " + ", ".join(extras)


class EpochRow(TypedDict):
    """An ``EpochRecord`` as a plain dict, for tables and JSON (the same fields)."""

    epoch: int
    train_accuracy: float | None
    train_loss: float | None
    val_accuracy: float
    val_loss: float
    seconds: float
    samples_per_second: float
    cuda_peak_allocated_mib: float | None
    nvml_used_mib: float | None
    tracked_peak_mib: float | None


@dataclass
class History:
    """All epochs of one run, in order."""

    label: str
    records: list[EpochRecord] = field(default_factory=list)

    def as_rows(self) -> list[EpochRow]:
        """Plain dicts, for tables and JSON."""
        return [cast(EpochRow, asdict(record)) for record in self.records]


def model_forward(model: nn.Module, x: torch.Tensor, strategy: Strategy | None) -> torch.Tensor:
    """``model(x)`` checkpointed as ``strategy`` says; None for a model that checkpoints itself."""
    with (strategy or NO_CHECKPOINTING).applied(model):
        return model(x)


def test_model(
    model: nn.Module,
    loader: Iterable,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device | str | None = None,
) -> tuple[float, float]:
    """Accuracy in percent and mean loss per sample, in eval mode without gradients.

    The first article divides the sum of per-batch MEAN losses by the number of samples, which
    shrinks the loss by the batch size, and truncates accuracy to an int. Here each batch's mean
    is weighted by its size, so the figure is the true per-sample mean.
    """
    device = resolve_device(device)
    collect_finished_iterators()
    model.eval()
    correct = 0
    loss_sum = 0.0
    seen = 0
    with torch.no_grad():
        for images, target in loader:
            images, target = images.to(device), target.to(device)
            output = model(images)
            loss_sum += loss_fn(output, target).item() * len(target)
            correct += (output.argmax(dim=1) == target).sum().item()
            seen += len(target)
    if seen == 0:
        raise ValueError("the evaluation loader yielded no samples: check the dataset folder")
    return 100.0 * correct / seen, loss_sum / seen


def atomic_save(obj, path: Path) -> None:
    """``torch.save`` to a temp file, then ``os.replace``: a crash never leaves a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


EPOCH_FILE = re.compile(r"^epoch_(\d+)\.pt$")


def saved_epochs(checkpoint_dir: Path) -> list[int]:
    """Epoch numbers of the ``epoch_N.pt`` state_dicts in ``checkpoint_dir``, ascending."""
    if not checkpoint_dir.is_dir():
        return []
    found = (EPOCH_FILE.match(p.name) for p in checkpoint_dir.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def save_epoch(
    checkpoint_dir: Path,
    epoch: int,
    model: nn.Module,
    optimizer,
    history: History,
    keep_every_epoch: bool = False,
) -> list[Path]:
    """``epoch_N.pt`` holds the bare model state_dict, as the article saves it; a sidecar
    ``training_state_N.pt`` holds what an exact resume also needs (optimizer state, the RNG
    state that drives Dropout and shuffling, every epoch's record so far).

    Unless ``keep_every_epoch`` (the article's one file per epoch), the previous epochs' files
    are removed once the new ones are on disk: a resume needs only the latest. Returns the files
    this epoch wrote.
    """
    weights = checkpoint_dir / f"epoch_{epoch}.pt"
    sidecar = checkpoint_dir / f"training_state_{epoch}.pt"
    atomic_save(model.state_dict(), weights)
    state = {
        "optimizer": optimizer.state_dict(),
        "rng_state": torch.get_rng_state(),
        "records": [asdict(record) for record in history.records],
    }
    atomic_save(state, sidecar)
    if not keep_every_epoch:
        for earlier in saved_epochs(checkpoint_dir):
            if earlier < epoch:
                (checkpoint_dir / f"epoch_{earlier}.pt").unlink()
                (checkpoint_dir / f"training_state_{earlier}.pt").unlink(missing_ok=True)
    return [weights, sidecar]


def resume(checkpoint_dir: Path, model: nn.Module, optimizer, history: History) -> int:
    """Load the last saved epoch; return the epoch to start from (0 when nothing was saved)."""
    epochs = saved_epochs(checkpoint_dir)
    if not epochs:
        return 0
    last = epochs[-1]
    state = torch.load(checkpoint_dir / f"epoch_{last}.pt", weights_only=True, map_location="cpu")
    model.load_state_dict(state)
    sidecar_path = checkpoint_dir / f"training_state_{last}.pt"
    if not sidecar_path.exists():
        warnings.warn(
            f"resuming from {checkpoint_dir / f'epoch_{last}.pt'} without its optimizer state: "
            "momentum starts from zero",
            stacklevel=2,
        )
        return last + 1
    sidecar = torch.load(sidecar_path, weights_only=True, map_location="cpu")
    history.records.extend(EpochRecord(**record) for record in sidecar["records"])
    optimizer.load_state_dict(sidecar["optimizer"])
    torch.set_rng_state(sidecar["rng_state"])
    return last + 1


def describe_saved(paths: Iterable[Path]) -> str:
    """'wrote data/runs/plain/epoch_1.pt, training_state_1.pt (1056.3 MiB)': what an epoch put on disk."""
    paths = list(paths)
    size = sum(path.stat().st_size for path in paths) / MiB
    folder = os.path.relpath(paths[0].parent) if paths else "."  # as the reader would cd there
    return f"wrote {folder}/{', '.join(p.name for p in paths)} ({size:.1f} MiB)"


def collect_finished_iterators() -> None:
    """Collect unreachable DataLoader iterators BEFORE a new pass forks its workers.

    A finished multi-worker iterator caught in a reference cycle otherwise survives into the
    forked workers, whose garbage collector then tries to shut down workers that are not its
    children and prints "AssertionError: can only test a child process" into the notebook.
    """
    gc.collect()


def _progress_stream():
    """Where a progress bar goes: a text bar in a notebook's stdout, whose final line stays
    readable in a saved notebook viewed without widgets; the terminal's stderr elsewhere."""
    return sys.stdout if "ipykernel" in sys.modules else sys.stderr


def train_one_epoch(model, loss_fn, optimizer, loader, strategy, device, progress, desc):
    """One pass over ``loader``: the article's loop body, ``strategy`` choosing the forward."""
    collect_finished_iterators()
    model.train()
    samples = 0
    bar = tqdm(loader, desc=desc, disable=not progress, file=_progress_stream(), mininterval=1.0)
    for images, target in bar:
        images, target = images.to(device), target.to(device)
        optimizer.zero_grad()
        output = model_forward(model, images, strategy)
        loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        samples += len(target)
    return samples


@dataclass(frozen=True)
class TrainingOptions:
    """How ``train_model`` keeps and reports a run.

    ``checkpoint_dir``: each epoch's state is written there atomically (only the latest epoch's
    is kept unless ``keep_every_epoch``) and a later call resumes after the last saved epoch.
    ``evaluate_train`` re-runs the training set in eval mode for the train accuracy/loss as the
    article does (doubling evaluation time). ``track_memory`` follows tensor allocations during
    the training pass (any device) for ``tracked_peak_mib``. ``label`` names the run (default: the
    strategy's name); ``log`` gets the article's line per epoch (None: silent)."""

    checkpoint_dir: str | Path | None = None
    keep_every_epoch: bool = False
    evaluate_train: bool = True
    track_memory: bool = False
    progress: bool = True
    label: str | None = None
    log: Callable[[str], None] | None = print


def train_model(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    train_loader: Iterable,
    val_loader: Iterable,
    epochs: int = 10,
    strategy: Strategy | None = None,
    device: torch.device | str | None = None,
    options: TrainingOptions = TrainingOptions(),
) -> History:
    """Train for ``epochs``, one ``EpochRecord`` each, logging the first article's line; how the
    run is kept and reported is ``options`` (``TrainingOptions``)."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    device = resolve_device(device)
    model.to(device)
    strategy = strategy or NO_CHECKPOINTING
    strategy.check(model)
    history = History(label=options.label or strategy.name)
    checkpoint_path = Path(options.checkpoint_dir) if options.checkpoint_dir is not None else None
    start = resume(checkpoint_path, model, optimizer, history) if checkpoint_path else 0
    for epoch in range(start, epochs):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        tracker = TensorMemoryTracker(model=model, optimizer=optimizer)
        started = time.perf_counter()
        desc = f"epoch {epoch} ({history.label})"
        with tracker if options.track_memory else contextlib.nullcontext():
            samples = train_one_epoch(
                model, loss_fn, optimizer, train_loader, strategy, device, options.progress, desc
            )
        seconds = time.perf_counter() - started
        peak = tracker.peak_bytes if options.track_memory else None
        record = _epoch_record(epoch, model, loss_fn, (train_loader, val_loader), device, options)
        record = _timed(record, seconds, samples, peak)
        history.records.append(record)
        if options.log is not None:
            options.log(record.log_line())
        if checkpoint_path is not None:
            written = save_epoch(
                checkpoint_path, epoch, model, optimizer, history, options.keep_every_epoch
            )
            if options.log is not None:
                options.log(describe_saved(written))
    return history


def _epoch_record(
    epoch: int,
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    loaders: tuple[Iterable, Iterable],
    device: torch.device,
    options: TrainingOptions,
) -> EpochRecord:
    """The epoch's accuracies and losses, with the device's memory readings (time set after)."""
    train_loader, val_loader = loaders
    cuda_peak = torch.cuda.max_memory_allocated(device) / MiB if device.type == "cuda" else None
    train_acc, train_loss = (
        test_model(model, train_loader, loss_fn, device) if options.evaluate_train else (None, None)
    )
    val_acc, val_loss = test_model(model, val_loader, loss_fn, device)
    return EpochRecord(
        epoch=epoch,
        train_accuracy=train_acc,
        train_loss=train_loss,
        val_accuracy=val_acc,
        val_loss=val_loss,
        seconds=0.0,
        samples_per_second=float("nan"),
        cuda_peak_allocated_mib=cuda_peak,
        nvml_used_mib=nvml_used_mib().used_mib,
    )


def _timed(
    record: EpochRecord, seconds: float, samples: int, tracked_peak_bytes: int | None
) -> EpochRecord:
    """``record`` with the training pass's time, throughput and tracked peak."""
    return replace(
        record,
        seconds=seconds,
        samples_per_second=samples / seconds if seconds > 0 else float("nan"),
        tracked_peak_mib=None if tracked_peak_bytes is None else tracked_peak_bytes / MiB,
    )
