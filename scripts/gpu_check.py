"""The one prepared GPU check: every CUDA path of the package in one command, under 10 minutes.

The CPU tests cannot reach the code that only runs on CUDA, so this runs it on a GPU, section by
section, and writes what it found:

1. hardware: GPU names, count and memory, driver, CUDA, cuDNN, torch and Python versions, NVML used
   MiB through the package's reader beside the driver's free/total.
2. cross-check: the tracker and the dry run against ``torch.cuda.max_memory_allocated`` (the
   articles' VGG16 and NetA steps), with relative errors.
3. batch search: ``find_max_batch_size(mode="cuda")`` for NetA at 224 px under the second
   article's 2.5 GB card, where the doubling phase meets a real ``torch.cuda.OutOfMemoryError``;
   afterwards the process must still compute and ``memory_allocated`` be back at its baseline;
   the tracked search beside it.
4. offloading: one step with ``OffloadedActivations`` and one without: peaks, times, gradients.
5. NCCL: an all-reduce over two ranks (``training.distributed.launch``) where two GPUs are
   visible; skipped, not failed, on one.
6. notebooks: 02 and 03 executed as copies in a temporary folder in the ``gpu`` profile with the
   figure check on, each within its share of the time budget (never the committed files).

Sections run one after another and are isolated: one that raises is recorded FAILED with its
error (the traceback in the JSON) and the rest still run; CUDA memory is freed between them. The
report (default docs/gpu_report.md: hardware first, one table per section, every figure labelled
measured on the GPU or dry run) and its JSON are rewritten after each section, so a run cut short
keeps what it measured. Exit status 1 if a section failed, 0 if none did; without CUDA, 2 and
nothing written.

    python scripts/gpu_check.py [--output docs/gpu_report.md] [--budget-s 540]

On the project's device machine (python3 with torch but no Jupyter packages) the notebooks' kernel
comes from wheels carried in .whl/ (scripts/gpu_check_wheels.txt; docs/TESTING.md, "The GPU check in full", says how).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn as nn

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import Layout, NetA, vgg16_classifier
from tutorial_utils.articles.profiles import PROFILE_ENV
from tutorial_utils.articles.quoted import NETA_ARTICLE
from tutorial_utils.checkpointing.selective import OffloadedActivations
from tutorial_utils.display.figure_check import CHECK_FIGURES_ENV
from tutorial_utils.display.tables import cell_text, columns_table, markdown_cell
from tutorial_utils.measurement.batch_search import MaxBatchResult, find_max_batch_size
from tutorial_utils.measurement.devices import hardware_line
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.gradients import compare_gradients, parameter_gradients
from tutorial_utils.measurement.nvml import nvml_driver_version, nvml_used_mib
from tutorial_utils.measurement.step import (
    OptimizerFactory,
    StepReport,
    default_optimizer,
    measure_step,
)
from tutorial_utils.training.distributed import RankContext, launch
from tutorial_utils.units import MiB

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "docs" / "gpu_report.md"
DEFAULT_BUDGET_S = 540.0  # the device machine stops a command at 600 s; wheels and start-up first

Status = Literal["passed", "FAILED", "skipped"]
PASSED: Status = "passed"
FAILED: Status = "FAILED"
SKIPPED: Status = "skipped"
MEASURED, DRY_RUN = "measured on the GPU", "dry run"


# -- results and their rendering (pure: the report is a function of the collected results) -----


@dataclass(frozen=True)
class Column:
    """One column of a report table; ``source`` labels a figure, None a name or a setting."""

    header: str
    key: str
    fmt: str = "{}"
    source: str | None = None


@dataclass
class Table:
    """Rows of raw figures; the columns say how each is shown and where it came from."""

    title: str
    columns: list[Column]
    rows: list[dict]


@dataclass
class Outcome:
    """What a section found. Failed checks keep their figures; ``skipped`` says why it did not run."""

    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None


@dataclass
class SectionResult:
    key: str
    title: str
    status: Status
    seconds: float
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # one line: the exception, the failed checks, or why it was skipped
    traceback: str | None = None


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``; a notebook cell's error as its own name and value."""
    name = getattr(error, "ename", None) or type(error).__name__
    message = str(getattr(error, "evalue", None) or error).strip()
    return f"{name}: {message.splitlines()[0]}" if message else name


def _header(column: dict) -> str:
    return (
        column["header"] if column["source"] is None else f"{column['header']} ({column['source']})"
    )


def render_table(table: dict) -> list[str]:
    """A table (as ``dataclasses.asdict`` gives it) as markdown lines under its title."""
    columns = [(column["key"], _header(column), column["fmt"]) for column in table["columns"]]
    body = columns_table(table["rows"], columns, "markdown")
    return [f"### {table['title']}", "", *body.splitlines(), ""]


def status_text(status: Status, error: str | None) -> str:
    """The status as the report shows it: passed, FAILED, or "skipped: " and why."""
    return f"skipped: {error}" if status == SKIPPED else status


def render_report(report: dict) -> str:
    """The report as markdown: hardware and totals first, then one part per section."""
    sections = report["sections"]
    counts = {status: sum(s["status"] == status for s in sections) for status in (PASSED, FAILED)}
    skipped = sum(s["status"] == SKIPPED for s in sections)
    lines = [
        "# GPU check",
        "",
        f"Hardware: {report['hardware']}.",
        "",
        f"{len(sections)} of {len(report['planned'])} sections ran in {report['elapsed_s']:.0f} s "
        f"(budget {report['budget_s']:.0f} s): {counts[PASSED]} passed, {counts[FAILED]} failed, "
        f"{skipped} skipped. Produced by `python scripts/gpu_check.py`; the JSON beside this page "
        "holds every figure and each failure's traceback.",
        f'"{MEASURED}": read or measured on this GPU in this run; "{DRY_RUN}": the same step on '
        "the meta device (exact tensor bytes, no GPU involved).",
        "",
    ]
    not_run = report["planned"][len(sections) :]
    if not_run:
        lines += [f"Not run (the check stopped before them): {', '.join(not_run)}.", ""]
    lines += ["| section | status | seconds | error |", "| --- | --- | ---: | --- |"]
    for section in sections:
        status = status_text(section["status"], section["error"])
        error = "" if section["status"] == SKIPPED else markdown_cell(section["error"] or "")
        lines.append(f"| {section['title']} | {status} | {section['seconds']:.1f} | {error} |")
    lines.append("")
    for number, section in enumerate(sections, 1):
        lines += [f"## {number}. {section['title']}", ""]
        lines += [
            f"{status_text(section['status'], section['error'])} in {section['seconds']:.1f} s.",
            "",
        ]
        if section["status"] == FAILED:
            lines += [f"Error: {markdown_cell(cell_text(section['error']))}", ""]
        for table in section["tables"]:
            lines += render_table(table)
        lines += [*(f"{note}\n" for note in section["notes"])]
    return "\n".join(lines).rstrip() + "\n"


def report_data(
    hardware: str,
    budget_s: float,
    elapsed_s: float,
    planned: Sequence[str],
    results: list[SectionResult],
) -> dict:
    """Everything the report shows, as JSON-ready data."""
    return {
        "hardware": hardware,
        "budget_s": budget_s,
        "elapsed_s": elapsed_s,
        "planned": list(planned),
        "sections": [dataclasses.asdict(result) for result in results],
    }


def write_report(output: Path, report: dict) -> None:
    """The markdown page and the JSON beside it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_report(report))
    output.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")


# -- running the sections ---------------------------------------------------------------------


class Budget:
    """The check's wall-time allowance, counted from its creation: the notebooks, the long part,
    share what the earlier sections left."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic):
        self.total_s = total_s
        self.clock = clock
        self.started = clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        return self.total_s - self.elapsed()


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    run: Callable[[Budget], Outcome]


def free_cuda_memory() -> None:
    """Drop what a section left (its tensors, a caught error's frames) and hand the allocator's
    cached blocks back, so no section starts on another's leftovers."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_section(section: Section, budget: Budget) -> SectionResult:
    """One section, isolated: whatever it raises becomes a FAILED result."""
    started = time.perf_counter()
    try:
        outcome = section.run(budget)
    except Exception as error:  # noqa: BLE001 - a failing section must not stop the others
        return SectionResult(
            section.key,
            section.title,
            FAILED,
            time.perf_counter() - started,
            error=one_line(error),
            traceback=traceback.format_exc(),
        )
    if outcome.skipped is not None:
        status, error = SKIPPED, outcome.skipped
    elif outcome.failures:
        status, error = FAILED, "; ".join(outcome.failures)
    else:
        status, error = PASSED, None
    return SectionResult(
        section.key,
        section.title,
        status,
        time.perf_counter() - started,
        outcome.tables,
        outcome.notes,
        error,
    )


def run_sections(
    sections: Sequence[Section], budget: Budget, after_each: Callable[[list[SectionResult]], None]
) -> list[SectionResult]:
    """Every section in order, memory freed after each; ``after_each`` sees the results so far."""
    results: list[SectionResult] = []
    for section in sections:
        results.append(run_section(section, budget))
        free_cuda_memory()
        after_each(results)
    return results


def exit_status(results: list[SectionResult]) -> int:
    """1 when a section failed (skipped is not failed), else 0."""
    return 1 if any(result.status == FAILED for result in results) else 0


# -- 1. hardware ------------------------------------------------------------------------------


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()  # a tuple in recent torch, an int such as 2708 before
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def hardware_section(budget: Budget) -> Outcome:
    """Each GPU and the software stack, with NVML's used memory beside the driver's free/total."""
    gpus, failures = [], []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        nvml = nvml_used_mib(index)
        if nvml.used_mib is None:
            failures.append(f"NVML could not be read on GPU {index}: {nvml.reason}")
        gpus.append(
            {
                "index": index,
                "name": properties.name,
                "capability": f"{properties.major}.{properties.minor}",
                "multiprocessors": properties.multi_processor_count,
                "total_mib": total / MiB,
                "driver_used_mib": (total - free) / MiB,
                "nvml_used_mib": nvml.used_mib,
            }
        )
    versions = {
        "driver": nvml_driver_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": _nccl_version(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    return Outcome(
        [
            Table(
                f"GPUs ({len(gpus)} visible)",
                [
                    Column("GPU", "index"),
                    Column("name", "name"),
                    Column("compute capability", "capability"),
                    Column("multiprocessors", "multiprocessors", "{:d}", MEASURED),
                    Column("total MiB", "total_mib", "{:.0f}", MEASURED),
                    Column("used MiB (cudaMemGetInfo)", "driver_used_mib", "{:.0f}", MEASURED),
                    Column("used MiB (NVML)", "nvml_used_mib", "{:.0f}", MEASURED),
                ],
                gpus,
            ),
            Table(
                "Versions",
                [Column(name, name) for name in versions],
                [versions],
            ),
        ],
        [
            "Both used figures are the whole device's (the CUDA context, the allocator's cache, "
            "other processes), read before any section allocated tensors."
        ],
        failures,
    )


# -- 2. tracker and dry run against the CUDA allocator ----------------------------------------


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


def _vgg16(layout: Layout) -> Callable[[], nn.Module]:
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
        "dry_run_peak_mib": report.peak_mib,
        "dry_run_breakdown_mib": report.breakdown_mib,
    }


def measure(step: CrossCheckStep, device: torch.device) -> StepReport:
    """The step for real on ``device`` (random data, fixed seed), fastest of 3 timed steps."""
    torch.manual_seed(0)
    model = step.make_model().to(device)
    inputs = torch.randn(step.input_shape)
    targets = torch.randint(0, step.classes, (step.input_shape[0],))
    return measure_step(
        model,
        inputs,
        targets,
        step.segments,
        optimizer_factory=step.optimizer_factory,
        device=device,
        repeats=3,
    )


def measured_row(dry_row: dict, report: StepReport) -> dict:
    """A dry-run row completed with the real step's figures and both relative errors."""
    cuda = report.cuda
    peak_allocated_mib = None if cuda is None else cuda.peak_allocated_bytes / MiB
    return {
        **dry_row,
        "tracked_peak_mib": report.peak_mib,
        "cuda_peak_allocated_mib": peak_allocated_mib,
        "cuda_peak_reserved_mib": None if cuda is None else cuda.peak_reserved_bytes / MiB,
        "nvml_used_mib": report.nvml.used_mib,
        "tracker_error": relative_error(report.peak_mib, peak_allocated_mib),
        "dry_run_error": relative_error(dry_row["dry_run_peak_mib"], peak_allocated_mib),
        "tracked_baseline_mib": report.baseline_bytes / MiB,
        "cuda_allocated_before_mib": None if cuda is None else cuda.allocated_before_bytes / MiB,
        "step_seconds": report.seconds,
        "breakdown_mib": report.breakdown_mib,
        "activation_peak_mib": report.activation_peak_bytes / MiB,
        "device": report.device,
    }


def crosscheck(device: torch.device, steps: tuple[CrossCheckStep, ...] = STEPS) -> list[dict]:
    """One row per step, every figure in MiB; memory is freed between steps."""
    rows = []
    for step in steps:
        rows.append(measured_row(dry_run_row(step), measure(step, device)))
        free_cuda_memory()
    return rows


CROSSCHECK_COLUMNS = [
    Column("step", "step"),
    Column("segments", "segments", "{:d}"),
    Column("batch", "batch", "{:d}"),
    Column("optimizer", "optimizer"),
    Column("tracked peak MiB", "tracked_peak_mib", "{:.1f}", MEASURED),
    Column("peak MiB, 512 B blocks", "dry_run_peak_mib", "{:.1f}", DRY_RUN),
    Column("CUDA peak allocated MiB", "cuda_peak_allocated_mib", "{:.1f}", MEASURED),
    Column("tracker error", "tracker_error", "{:+.2%}", MEASURED),
    Column("dry-run error", "dry_run_error", "{:+.2%}", DRY_RUN),
    Column("CUDA peak reserved MiB", "cuda_peak_reserved_mib", "{:.1f}", MEASURED),
    Column("NVML used MiB", "nvml_used_mib", "{:.0f}", MEASURED),
    Column("step s", "step_seconds", "{:.3f}", MEASURED),
]


def crosscheck_outcome(rows: list[dict]) -> Outcome:
    """The cross-check's table and what its columns mean; a row without CUDA figures fails."""
    return Outcome(
        [Table("One training step per row", CROSSCHECK_COLUMNS, rows)],
        [
            "One training step per row (forward, cross-entropy, backward, optimizer step, "
            "optimizer state present before the step). Tracked peak: live tensor bytes of the "
            "real step, followed op by op. Dry run: the same step on the meta device, each "
            "storage rounded up to the CUDA caching allocator's 512-byte blocks. Errors: (peak - "
            "CUDA peak allocated) / CUDA peak allocated (torch.cuda.max_memory_allocated).",
            "Before each step the tracker counted "
            + ", ".join(cell_text(r["tracked_baseline_mib"], "{:.1f} MiB") for r in rows)
            + " while CUDA had "
            + ", ".join(cell_text(r["cuda_allocated_before_mib"], "{:.1f} MiB") for r in rows)
            + " allocated: the difference is memory no tensor owns (e.g. the cuBLAS workspace).",
            "Kernel workspaces allocated and freed inside one op (cuDNN) count in CUDA peak "
            "allocated but are invisible to the tracker and the dry run; NVML adds the CUDA "
            "context and the allocator's cache.",
        ],
        [
            f"{row['step']}, {row['segments']} segments: no CUDA peak allocated"
            for row in rows
            if row["cuda_peak_allocated_mib"] is None
        ],
    )


def crosscheck_section(budget: Budget) -> Outcome:
    """Section 2: the tracker and the dry run against ``max_memory_allocated``."""
    return crosscheck_outcome(crosscheck(torch.device("cuda")))


# -- 3. the CUDA-capped batch search ----------------------------------------------------------

# NetA at the second article's 224 px under its 2.5 GB card: the dry run puts the plain step at
# batch 64 over the card, so the doubling phase (1, 2, ..., 64) meets a real out-of-memory error.
SEARCH_SAMPLE, SEARCH_BUDGET_BYTES = (3, 224, 224), NETA_ARTICLE.card_bytes


def _neta_plain() -> nn.Module:
    return NetA(use_checkpoint=False)


def _warm_up(device: torch.device) -> None:
    """One small NetA step, so cuBLAS's and cuDNN's handles and workspaces (kept for the
    process's life) exist before the baseline is read and are not mistaken for a leak."""
    inputs, targets = torch.randn(2, *SEARCH_SAMPLE), torch.randint(0, 10, (2,))
    measure_step(
        _neta_plain(),
        inputs,
        targets,
        optimizer_factory=adam_optimizer,
        device=device,
        time_step=False,
    )


def first_out_of_memory(result: MaxBatchResult) -> dict | None:
    """The first trial that ran out of memory, and whether it came in the doubling phase (the
    batches so far 1, 2, 4, ..., it included)."""
    for position, trial in enumerate(result.trials):
        if not trial.fits:
            tried = [t.batch_size for t in result.trials[: position + 1]]
            doubling = tried == [2**i for i in range(position + 1)]
            return {"batch": trial.batch_size, "doubling": doubling, "error": trial.error}
    return None


SEARCH_COLUMNS = [
    Column("mode", "mode"),
    Column("budget MiB", "budget_mib", "{:.0f}"),
    Column("largest batch", "batch_size", "{:d}", MEASURED),
    Column("trials", "trials", "{:d}"),
    Column("batches tried", "tried"),
    Column("first over budget", "first_over", "{:d}", MEASURED),
    Column("in the doubling phase", "doubling", "{}", MEASURED),
]
RELEASE_COLUMNS = [
    Column("allocated before the search, bytes", "before", "{:d}", MEASURED),
    Column("allocated after it, bytes", "after", "{:d}", MEASURED),
    Column("difference, bytes", "difference", "{:d}", MEASURED),
    Column("CUDA still computes", "alive", "{}", MEASURED),
]


def _search_row(label: str, result: MaxBatchResult) -> dict:
    over = first_out_of_memory(result)
    return {
        "mode": label,
        "budget_mib": result.budget_bytes / MiB,
        "batch_size": result.batch_size,
        "trials": len(result.trials),
        "tried": ", ".join(f"{t.batch_size}{'' if t.fits else ' (over)'}" for t in result.trials),
        "first_over": None if over is None else over["batch"],
        "doubling": None if over is None else over["doubling"],
        "error": None if over is None else over["error"],
    }


def batch_search_outcome(
    capped: MaxBatchResult, tracked: MaxBatchResult, before: int, after: int, alive: bool
) -> Outcome:
    """The two searches side by side and whether the out-of-memory error was survived."""
    rows = [_search_row("cuda: allocator capped", capped), _search_row("tracked peak", tracked)]
    release = {"before": before, "after": after, "difference": after - before, "alive": alive}
    failures = []
    if rows[0]["first_over"] is None:
        failures.append("no trial ran out of memory under the cap: the OOM path was not exercised")
    if after != before:
        failures.append(f"memory_allocated {after} B after the search, {before} B before")
    if not alive:
        failures.append("CUDA no longer computes after the out-of-memory error")
    notes = [
        "NetA at 224 px, Adam, under the second article's 2560 MB card. mode cuda: each trial "
        "runs for real with torch.cuda.set_per_process_memory_fraction(budget / total); an "
        "out-of-memory error means it does not fit. tracked: each trial stops as soon as its "
        "live tensors exceed the budget (no kernel workspaces counted).",
        f"The first out-of-memory error: {rows[0]['error'] or 'none'}.",
    ]
    return Outcome(
        [
            Table("Largest batch under the card", SEARCH_COLUMNS, rows),
            Table("After the out-of-memory error", RELEASE_COLUMNS, [release]),
        ],
        notes,
        failures,
    )


def batch_search_section(budget: Budget) -> Outcome:
    """Section 3: the capped search, its out-of-memory error survived and its memory released."""
    device = torch.device("cuda")
    _warm_up(device)
    free_cuda_memory()
    before = torch.cuda.memory_allocated(device)
    capped = find_max_batch_size(
        _neta_plain,
        SEARCH_SAMPLE,
        SEARCH_BUDGET_BYTES,
        device=device,
        mode="cuda",
        optimizer_factory=adam_optimizer,
    )
    free_cuda_memory()
    after = torch.cuda.memory_allocated(device)
    alive = torch.ones(4, device=device).add(1).sum().item() == 8.0
    tracked = find_max_batch_size(
        _neta_plain,
        SEARCH_SAMPLE,
        SEARCH_BUDGET_BYTES,
        device=device,
        mode="tracked",
        optimizer_factory=adam_optimizer,
    )
    return batch_search_outcome(capped, tracked, before, after, alive)


# -- 4. offloading ----------------------------------------------------------------------------

OFFLOAD_SHAPE = (32, 3, 224, 224)
OFFLOAD_COLUMNS = [
    Column("step", "step"),
    Column("tracked peak MiB", "tracked_peak_mib", "{:.1f}", MEASURED),
    Column("CUDA peak allocated MiB", "cuda_peak_allocated_mib", "{:.1f}", MEASURED),
    Column("step s", "step_seconds", "{:.3f}", MEASURED),
]
GRADIENT_COLUMNS = [
    Column("parameters", "parameters", "{:d}"),
    Column("bitwise equal", "bitwise", "{}", MEASURED),
    Column("within rtol 1e-4, atol 1e-5", "close", "{}", MEASURED),
    Column("largest difference", "max_difference", "{:.3g}", MEASURED),
]


def offloading_outcome(rows: list[dict], gradients: dict) -> Outcome:
    """Both steps' peaks and the gradient comparison; offloading must lower the CUDA peak and
    leave the gradients as they were."""
    plain, offloaded = rows
    failures = []
    if not offloaded["cuda_peak_allocated_mib"] < plain["cuda_peak_allocated_mib"]:
        failures.append("offloading did not lower the CUDA peak allocated")
    if not gradients["close"]:
        failures.append(f"gradients differ by up to {gradients['max_difference']:.3g}")
    return Outcome(
        [
            Table(
                "One step of VGG16 (flat), 224 px, batch 32, SGD momentum", OFFLOAD_COLUMNS, rows
            ),
            Table("Gradients, offloaded against plain", GRADIENT_COLUMNS, [gradients]),
        ],
        [
            "Offloading (torch.autograd.graph.save_on_cpu, pinned) keeps every saved tensor in "
            "host memory between forward and backward: no recompute. Gradients compared with "
            "cuDNN deterministic, the same weights and the same dropout seed."
        ],
        failures,
    )


def offloading_section(budget: Budget) -> Outcome:
    """Section 4: the package's offloading against the plain step on the GPU."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = vgg16_classifier(2, layout="flat").to(device)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(OFFLOAD_SHAPE, generator=generator)
    targets = torch.randint(0, 2, (OFFLOAD_SHAPE[0],), generator=generator)
    rows = []
    for label, segments in (("plain", 0), (str(OffloadedActivations()), OffloadedActivations())):
        report = measure_step(model, inputs, targets, segments, device=device, repeats=3)
        cuda = report.cuda
        rows.append(
            {
                "step": label,
                "tracked_peak_mib": report.peak_mib,
                "cuda_peak_allocated_mib": None
                if cuda is None
                else cuda.peak_allocated_bytes / MiB,
                "step_seconds": report.seconds,
            }
        )
        free_cuda_memory()
    inputs = inputs.to(device)
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        plain = parameter_gradients(model, inputs, 0)  # notebook 02's: Dropout drawn after seed 0
        offloaded = parameter_gradients(model, inputs, OffloadedActivations())
    return offloading_outcome(rows, compare_gradients(plain, offloaded))


# -- 5. NCCL ----------------------------------------------------------------------------------

NCCL_RANKS = 2
NCCL_COLUMNS = [
    Column("rank", "rank", "{:d}"),
    Column("device", "device"),
    Column("GPU", "gpu"),
    Column("backend", "backend"),
    Column("all-reduce sum", "sum", "{:g}", MEASURED),
    Column("expected", "expected", "{:g}"),
    Column("all-reduce s", "seconds", "{:.4f}", MEASURED),
]


def nccl_skip_reason(device_count: int) -> str | None:
    """Why the NCCL section cannot run with ``device_count`` GPUs; None when it can."""
    if device_count >= NCCL_RANKS:
        return None
    return f"{'one GPU' if device_count == 1 else f'{device_count} GPUs'} visible"


def nccl_rank(context: RankContext) -> dict:
    """One rank: an all-reduce of rank + 1 over NCCL on its own GPU (a spawned process imports
    this from the script's file)."""
    tensor = torch.full((1 << 20,), float(context.rank + 1), device=context.device)
    torch.cuda.synchronize(context.device)
    started = time.perf_counter()
    dist.all_reduce(tensor)
    torch.cuda.synchronize(context.device)
    seconds = time.perf_counter() - started
    return {
        "rank": context.rank,
        "device": str(context.device),
        "gpu": torch.cuda.get_device_name(context.device),
        "backend": str(dist.get_backend()),
        "sum": tensor[0].item(),
        "all_equal": bool((tensor == tensor[0]).all().item()),
        "expected": float(sum(range(1, context.world_size + 1))),
        "seconds": seconds,
    }


def nccl_section(budget: Budget) -> Outcome:
    """Section 5: two NCCL ranks through ``training.distributed.launch``, or why not."""
    reason = nccl_skip_reason(torch.cuda.device_count())
    if reason is not None:
        return Outcome(skipped=reason)
    rows = launch(nccl_rank, world_size=NCCL_RANKS, device_type="cuda", timeout_s=120)
    failures = [
        f"rank {row['rank']}: all-reduce gave {row['sum']:g}, expected {row['expected']:g}"
        for row in rows
        if row["sum"] != row["expected"] or not row["all_equal"]
    ]
    return Outcome([Table(f"{NCCL_RANKS} ranks", NCCL_COLUMNS, rows)], [], failures)


# -- 6. notebooks 02 and 03 in the gpu profile ------------------------------------------------

NOTEBOOKS_DIR = ROOT / "notebooks"
NOTEBOOKS = ("02_vgg16_dogcat.ipynb", "03_cifar10_neta.ipynb")
NOTEBOOK_PROFILE = "gpu"
RESERVE_S = 15.0  # after the last notebook: its kernel's shutdown and the report
MIN_NOTEBOOK_S = 30.0  # less than this is not worth a kernel's start
NOTEBOOK_COLUMNS = [
    Column("notebook", "notebook"),
    Column("profile", "profile"),
    Column("status", "status"),
    Column("time allowed s", "timeout_s", "{:.0f}"),
    Column("wall s", "seconds", "{:.1f}", MEASURED),
    Column("where it stopped", "cell"),
    Column("error", "error"),
]
NotebookExecutor = Callable[[Path, Mapping[str, str], float], None]


def notebook_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the gpu profile and the figure check, as execute_notebooks.py runs them
    (no MPLBACKEND: the kernel's inline backend keeps figures as outputs)."""
    env = {name: value for name, value in base.items() if name != "MPLBACKEND"}
    env.update({PROFILE_ENV: NOTEBOOK_PROFILE, CHECK_FIGURES_ENV: "1"})
    return env


def notebook_timeout(left_s: float, notebooks_left: int) -> float | None:
    """The next notebook's time: an equal share of what the budget has left after the reserve (a
    notebook that finishes early leaves its rest to the next); all of it when a share would be
    too short, so the earlier notebook runs; None when even that is too short."""
    usable = left_s - RESERVE_S
    share = usable / notebooks_left
    if share >= MIN_NOTEBOOK_S:
        return share
    return usable if usable >= MIN_NOTEBOOK_S else None


def execute_copy(path: Path, env: Mapping[str, str], timeout_s: float) -> None:
    """Run the notebook at ``path`` in its own folder with execute_notebooks.py's kernel code, and
    save what ran (outputs, the error) back to ``path`` whether or not it succeeded."""
    # Imported here: only this section needs Jupyter, so the others run without it.
    import nbformat
    from execute_notebooks import run_notebook

    notebook = nbformat.read(path, as_version=4)
    try:
        run_notebook(notebook, path.parent, env, deadline=time.monotonic() + timeout_s)
    finally:
        nbformat.write(notebook, path)


def stopping_cell(path: Path) -> str | None:
    """The last code cell that started (the failing or timed-out one) in an executed notebook."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    started = [i for i, cell in enumerate(cells) if cell.get("execution_count") is not None]
    if not started:
        return None
    source = "".join(cells[started[-1]]["source"]).strip().splitlines()
    return f"code cell {started[-1] + 1} of {len(cells)}: {source[0][:60] if source else ''}"


def notebooks_section(
    budget: Budget,
    executor: NotebookExecutor | None = None,
    source: Path = NOTEBOOKS_DIR,
    names: Sequence[str] = NOTEBOOKS,
) -> Outcome:
    """Section 6: each notebook copied to a temporary folder and run there, within its time."""
    executor = executor or execute_copy
    env = notebook_env(os.environ)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-notebooks-") as folder:
        for position, name in enumerate(names):
            timeout = notebook_timeout(budget.left(), len(names) - position)
            row = {"notebook": name, "profile": NOTEBOOK_PROFILE, "timeout_s": timeout}
            if timeout is None:
                rows.append({**row, "status": "not run: the time budget is spent"})
                continue
            copy = Path(folder) / name
            shutil.copyfile(source / name, copy)
            started = time.perf_counter()
            try:
                executor(copy, env, timeout)
                row["status"] = PASSED
            except Exception as error:  # noqa: BLE001 - the next notebook still runs
                row.update(status=FAILED, error=one_line(error), cell=stopping_cell(copy))
            rows.append({**row, "seconds": time.perf_counter() - started})
    failures = [
        f"{row['notebook']}: {row.get('error') or row['status']}"
        for row in rows
        if row["status"] != PASSED
    ]
    notes = [
        f"Copies run in a temporary folder with {PROFILE_ENV}={NOTEBOOK_PROFILE} and "
        f"{CHECK_FIGURES_ENV}=1 (an unreadable figure fails its cell); the committed notebooks "
        "are not touched. Each notebook may take an equal share of the time the budget has left."
    ]
    return Outcome([Table("Notebooks", NOTEBOOK_COLUMNS, rows)], notes, failures)


# -- the estimate command against the CUDA allocator ----------------------------------------

# (workload, strategy) pairs ``python -m tutorial_utils estimate`` answers, small enough for any
# GPU: a LoRA Llama under CUDA autocast (the emulated cast policy), a fully trained GPT-2 in bf16,
# a ResNet-50 under autocast with selective checkpointing.
ESTIMATE_CHECKS = (
    ("hf:llama-3.2-1b", 1, 1024, "amp-bf16", 16, "every-block"),
    ("hf:gpt2", 2, 512, "bf16", 0, "none"),
    ("torchvision:resnet50", 16, 224, "amp-bf16", 0, "selective"),
)
ESTIMATE_TOLERANCE = 0.02  # kernels' workspaces (cuBLAS, cuDNN) are in CUDA's peak only
ESTIMATE_COLUMNS = [
    Column("model", "model"),
    Column("batch x size", "shape"),
    Column("precision", "precision"),
    Column("strategy", "strategy"),
    Column("estimate MiB, 512 B blocks", "estimate_mib", "{:.1f}", DRY_RUN),
    Column("tracked peak MiB", "tracked_peak_mib", "{:.1f}", MEASURED),
    Column("CUDA peak allocated MiB", "cuda_peak_allocated_mib", "{:.1f}", MEASURED),
    Column("estimate error", "estimate_error", "{:+.2%}", DRY_RUN),
]


def estimate_rows(device: torch.device, checks: tuple = ESTIMATE_CHECKS) -> list[dict]:
    """Each check's estimate (a dry run) beside the same step run on ``device``."""
    from tutorial_utils.estimate.estimator import Workload, dry_run_and_real_step
    from tutorial_utils.estimate.strategies import parse_strategy

    rows = []
    for model, batch, size, precision, lora, strategy in checks:
        workload = Workload(model, batch=batch, size=size, precision=precision, lora_rank=lora)
        dry, real = dry_run_and_real_step(workload, parse_strategy(strategy), str(device))
        cuda = None if real.cuda is None else real.cuda.peak_allocated_bytes
        rows.append(
            {
                "model": model,
                "shape": f"{batch} x {size}",
                "precision": precision + (f", LoRA {lora}" if lora else ""),
                "strategy": strategy,
                "estimate_mib": dry.peak_bytes / MiB,
                "tracked_peak_mib": real.peak_bytes / MiB,
                "cuda_peak_allocated_mib": None if cuda is None else cuda / MiB,
                "estimate_error": relative_error(dry.peak_bytes, cuda),
            }
        )
        free_cuda_memory()
    return rows


def estimate_outcome(rows: list[dict]) -> Outcome:
    """Fails a row without a CUDA peak, or whose estimate is off by more than the tolerance."""
    failures = []
    for row in rows:
        label = f"{row['model']} {row['strategy']}"
        if row["estimate_error"] is None:
            failures.append(f"{label}: no CUDA peak allocated")
        elif abs(row["estimate_error"]) > ESTIMATE_TOLERANCE:
            failures.append(f"{label}: estimate off by {row['estimate_error']:+.2%}")
    notes = [
        "Estimate: python -m tutorial_utils estimate's dry run of the step (meta device; "
        "autocast emulated with CUDA's cast policy), storages in 512-byte blocks. Measured: the "
        "same step on the GPU, random weights from the config. Error: (estimate - CUDA peak "
        f"allocated) / CUDA peak allocated; a row fails beyond {ESTIMATE_TOLERANCE:.0%}."
    ]
    return Outcome([Table("Estimates against the GPU", ESTIMATE_COLUMNS, rows)], notes, failures)


def estimate_section(budget: Budget) -> Outcome:
    """``python -m tutorial_utils estimate`` against ``max_memory_allocated``."""
    return estimate_outcome(estimate_rows(torch.device("cuda")))


PREDICTED = "predicted: dry run replayed through the emulated allocator"
ALLOCATOR_COLUMNS = [
    Column("model", "model"),
    Column("batch x size", "shape"),
    Column("precision", "precision"),
    Column("strategy", "strategy"),
    Column("allocated MiB", "predicted_allocated_mib", "{:.1f}", PREDICTED),
    Column("max_memory_allocated MiB", "cuda_allocated_mib", "{:.1f}", MEASURED),
    Column("error", "allocated_error", "{:+.2%}", PREDICTED),
    Column("reserved MiB", "predicted_reserved_mib", "{:.1f}", PREDICTED),
    Column("max_memory_reserved MiB", "cuda_reserved_mib", "{:.1f}", MEASURED),
    Column("error", "reserved_error", "{:+.2%}", PREDICTED),
    Column("outside the allocator MiB", "outside_allocator_mib", "{:.0f}", MEASURED),
]


def allocator_section(budget: Budget) -> Outcome:
    """The emulated caching allocator's two counters against ``torch.cuda``'s on this GPU."""
    from tutorial_utils.estimate.allocator_check import allocator_failures, allocator_rows

    rows = allocator_rows(torch.device("cuda"))
    notes = [
        "Predicted: the step's dry run, its allocations and frees replayed through "
        "tutorial_utils.measurement.allocator (baseline, then two steps; cuBLAS workspaces per "
        "thread). Measured: the second of two real steps after the allocator was emptied. "
        "Outside the allocator: total - free - reserved at its end, i.e. the CUDA context and "
        "anything else on the device (compare with the quoted context in estimate/card.py)."
    ]
    table = Table("The emulated allocator against torch.cuda", ALLOCATOR_COLUMNS, rows)
    return Outcome([table], notes, allocator_failures(rows))


RULES = "dry run: measurement.gpu_attention's rules"
KERNEL_COLUMNS = [
    Column("dtype", "dtype"),
    Column("head dim", "head_dim", "{:d}"),
    Column("mask", "mask"),
    Column("rules' kernel", "rules", source=RULES),
    Column("torch's kernel", "torch", source=MEASURED),
    Column("kept, dry run MiB", "dry_run_mib", "{:.2f}", DRY_RUN),
    Column("kept, real MiB", "real_mib", "{:.2f}", MEASURED),
    Column("error", "saved_error", "{:+.2%}", DRY_RUN),
]


def kernels_section(budget: Budget) -> Outcome:
    """The SDPA kernel the estimate's rules pick against torch's own choice on this GPU."""
    from tutorial_utils.estimate.kernel_check import kernel_failures, kernel_rows

    rows = kernel_rows(torch.device("cuda"))
    notes = [
        "Rules: measurement/gpu_attention.py's replay of torch 2.14's sdp_utils.cpp for this "
        "GPU's compute capability and the installed cuDNN. Torch: aten._fused_sdp_choice on CUDA "
        "tensors (batch 2, 8 heads, 1,024 tokens). Kept: distinct storages autograd saves for "
        "backward of one scaled_dot_product_attention call, the dry run's (meta) and the real one."
    ]
    table = Table("SDPA kernels: the rules against torch", KERNEL_COLUMNS, rows)
    return Outcome([table], notes, kernel_failures(rows))


SECTIONS = (
    Section("hardware", "Hardware", hardware_section),
    Section("crosscheck", "Tracker and dry run against the CUDA allocator", crosscheck_section),
    Section(
        "batch_search", "CUDA-capped batch search with an out-of-memory error", batch_search_section
    ),
    Section("offloading", "Offloading saved activations to the CPU", offloading_section),
    Section("nccl", "Two NCCL ranks", nccl_section),
    Section("estimate", "The estimate command against the CUDA allocator", estimate_section),
    Section("allocator", "The emulated allocator against torch.cuda", allocator_section),
    Section("kernels", "SDPA kernels: the rules against torch", kernels_section),
    Section("notebooks", "Notebooks 02 and 03 in the gpu profile", notebooks_section),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall time for the whole check"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    budget = Budget(args.budget_s)
    device = torch.device("cuda")
    hardware = f"{hardware_line(device)}; {torch.cuda.device_count()} GPU(s) visible"
    planned = [section.title for section in SECTIONS]

    def after_each(results: list[SectionResult]) -> None:
        last = results[-1]
        failed = f" ({last.error})" if last.status == FAILED else ""
        status = status_text(last.status, last.error)
        print(f"{last.title}: {status} in {last.seconds:.1f} s{failed}", flush=True)
        write_report(
            args.output, report_data(hardware, budget.total_s, budget.elapsed(), planned, results)
        )

    results = run_sections(SECTIONS, budget, after_each)
    print(render_report(report_data(hardware, budget.total_s, budget.elapsed(), planned, results)))
    print(f"written: {args.output} and {args.output.with_suffix('.json')}")
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
