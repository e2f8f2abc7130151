"""Cross-check the tensor tracker and the dry run against the CUDA allocator on a GPU (minutes).

For each step in ``STEPS`` (the first article's VGG16 at 224 px, batch 32, SGD momentum, with 0
and 2 segments, and the flat layout with 6; NetA at 224 px, batch 31, Adam, plain and
checkpointed), runs ``measure_step`` on the GPU and the same step as a dry run on the meta device
with storages rounded to CUDA's 512-byte blocks, and prints both peaks beside
``torch.cuda.max_memory_allocated`` with their relative errors, plus CUDA peak reserved and NVML
used. Writes the result as markdown to the path given (default docs/gpu_crosscheck.md) and as
JSON beside it. Exits 2 without CUDA: no error figure exists until this has run on a GPU.

    python scripts/gpu_crosscheck.py [--output docs/gpu_crosscheck.md]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from tutorial_utils.articles.models import NetA, vgg16_classifier
from tutorial_utils.bench import hardware_line
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.step import (
    OptimizerFactory,
    StepReport,
    adam_optimizer,
    default_optimizer,
    measure_step,
)
from tutorial_utils.units import MB


@dataclass(frozen=True)
class CrossCheckStep:
    """One training step, run the same way on the GPU and as a dry run."""

    name: str
    make_model: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    classes: int
    segments: int  # 0 for a model that checkpoints itself (NetA)
    optimizer: str
    optimizer_factory: OptimizerFactory


def _vgg16(layout: str) -> Callable[[], nn.Module]:
    return lambda: vgg16_classifier(2, layout=layout)


def _neta(use_checkpoint: bool) -> Callable[[], nn.Module]:
    return lambda: NetA(use_checkpoint=use_checkpoint, use_reentrant=False)


VGG_SHAPE, NETA_SHAPE, SGD, ADAM = (32, 3, 224, 224), (31, 3, 224, 224), "SGD momentum", "Adam"
STEPS = (
    CrossCheckStep("VGG16 (article)", _vgg16("article"), VGG_SHAPE, 2, 0, SGD, default_optimizer),
    CrossCheckStep("VGG16 (article)", _vgg16("article"), VGG_SHAPE, 2, 2, SGD, default_optimizer),
    CrossCheckStep("VGG16 (flat)", _vgg16("flat"), VGG_SHAPE, 2, 6, SGD, default_optimizer),
    CrossCheckStep("NetA, plain", _neta(False), NETA_SHAPE, 10, 0, ADAM, adam_optimizer),
    CrossCheckStep("NetA, 5 checkpointed", _neta(True), NETA_SHAPE, 10, 0, ADAM, adam_optimizer),
)


def relative_error(value: float | None, reference: float | None) -> float | None:
    """(value - reference) / reference; None without a reference (no GPU)."""
    return None if value is None or not reference else (value - reference) / reference


def dry_run_row(step: CrossCheckStep) -> dict:
    """The step's dry run on the meta device, storages in 512-byte blocks (no GPU needed)."""
    report = dry_run_step(
        build_on_meta(step.make_model),
        step.input_shape,
        step.segments,
        optimizer_factory=step.optimizer_factory,
        round_to_blocks=True,
    )
    return {
        "step": step.name,
        "segments": step.segments,
        "batch": step.input_shape[0],
        "image_size": step.input_shape[-1],
        "optimizer": step.optimizer,
        "dry_run_peak_mb": report.peak_mb,
        "dry_run_breakdown_mb": report.breakdown_mb,
    }


def measure(step: CrossCheckStep, device: torch.device) -> StepReport:
    """The step for real on ``device`` (random data, fixed seed), fastest of 3 timed steps."""
    torch.manual_seed(0)
    model = step.make_model().to(device)
    inputs = torch.randn(step.input_shape)
    targets = torch.randint(0, step.classes, (step.input_shape[0],))
    optimizer = step.optimizer_factory(model.parameters())
    return measure_step(model, inputs, targets, step.segments, optimizer, device=device, repeats=3)


def measured_row(dry_row: dict, report: StepReport) -> dict:
    """A dry-run row completed with the real step's figures and both relative errors."""
    cuda_before = report.cuda_allocated_before
    return {
        **dry_row,
        "tracked_peak_mb": report.peak_mb,
        "cuda_peak_allocated_mb": report.cuda_peak_allocated_mb,
        "cuda_peak_reserved_mb": report.cuda_peak_reserved_mb,
        "nvml_used_mb": report.nvml_used_mb,
        "tracker_error": report.tracker_error,
        "dry_run_error": relative_error(dry_row["dry_run_peak_mb"], report.cuda_peak_allocated_mb),
        "tracked_baseline_mb": report.baseline_bytes / MB,
        "cuda_allocated_before_mb": None if cuda_before is None else cuda_before / MB,
        "step_seconds": report.seconds,
        "breakdown_mb": report.breakdown_mb,
        "activation_peak_mb": report.activation_peak_mb,
        "device": report.device,
    }


def crosscheck(device: torch.device, steps: tuple[CrossCheckStep, ...] = STEPS) -> list[dict]:
    """One row per step, every figure in MB; the GPU's memory is emptied between steps."""
    rows = []
    for step in steps:
        rows.append(measured_row(dry_run_row(step), measure(step, device)))
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _cell(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def markdown(rows: list[dict], hardware: str) -> str:
    """The cross-check as a markdown page: a table and what each column is."""
    lines = [
        "# GPU cross-check: tracked peak and dry run against the CUDA allocator",
        "",
        "One training step per row (forward, cross-entropy, backward, optimizer step, optimizer "
        f"state present before the step). Hardware: {hardware}. Produced by "
        "`python scripts/gpu_crosscheck.py`.",
        "",
        "| step | segments | batch | optimizer | tracked peak MB | dry-run peak MB (512 B blocks) "
        "| CUDA peak allocated MB | tracker error | dry-run error | CUDA peak reserved MB "
        "| NVML used MB | step s |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        cells = (
            row["step"],
            str(row["segments"]),
            str(row["batch"]),
            row["optimizer"],
            _cell(row["tracked_peak_mb"], "{:.1f}"),
            _cell(row["dry_run_peak_mb"], "{:.1f}"),
            _cell(row["cuda_peak_allocated_mb"], "{:.1f}"),
            _cell(row["tracker_error"], "{:+.2%}"),
            _cell(row["dry_run_error"], "{:+.2%}"),
            _cell(row["cuda_peak_reserved_mb"], "{:.1f}"),
            _cell(row["nvml_used_mb"], "{:.0f}"),
            _cell(row["step_seconds"], "{:.3f}"),
        )
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Tracked peak: live tensor bytes of the real step, followed op by op. Dry-run peak: the "
        "same step on the meta device (shapes, no data), each storage rounded up to the CUDA "
        "caching allocator's 512-byte blocks. Errors: (peak - CUDA peak allocated) / CUDA peak "
        "allocated (torch.cuda.max_memory_allocated).",
        "Before each step the tracker counted "
        + ", ".join(_cell(r["tracked_baseline_mb"], "{:.1f} MB") for r in rows)
        + " while CUDA had "
        + ", ".join(_cell(r["cuda_allocated_before_mb"], "{:.1f} MB") for r in rows)
        + " allocated: the difference is memory no tensor owns (e.g. the cuBLAS workspace).",
        "Kernel workspaces allocated and freed inside one op (cuDNN) count in CUDA peak allocated "
        "but are invisible to the tracker and the dry run; NVML adds the CUDA context and the "
        "allocator's cache.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("docs/gpu_crosscheck.md"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "gpu_crosscheck: no CUDA device here; run it on a machine with a GPU", file=sys.stderr
        )
        return 2
    device = torch.device("cuda")
    hardware = hardware_line(device)
    rows = crosscheck(device)
    text = markdown(rows, hardware)
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    args.output.with_suffix(".json").write_text(
        json.dumps({"hardware": hardware, "rows": rows}, indent=2) + "\n"
    )
    print(f"written: {args.output} and {args.output.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
