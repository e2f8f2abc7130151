"""The one prepared GPU check: every CUDA path of the package in one command, under 10 minutes.

The CPU tests cannot reach the code that only runs on CUDA, so this runs it on a GPU, section by
section (each a module of ``tutorial_utils/gpu_check/``), and writes what it found:

1. hardware: GPU names, count and memory, driver, CUDA, cuDNN, torch and Python versions, NVML used
   MiB through the package's reader beside the driver's free/total.
2. cross-check: the tracker and the dry run against ``torch.cuda.max_memory_allocated`` (the
   articles' VGG16 and NetA steps), with relative errors.
3. batch search: ``find_max_batch_size(mode="cuda")`` for NetA at 224 px under the second
   article's 2.5 GB card, where the doubling phase meets a real ``torch.cuda.OutOfMemoryError``;
   afterwards the process must still compute and ``memory_allocated`` be back at its baseline;
   the tracked search beside it.
4. offloading: one step with ``offloaded()`` (saved tensors in pinned host memory) and one
   without: peaks, times, gradients.
5. NCCL: an all-reduce over two ranks (``training.distributed.launch``) where two GPUs are
   visible; skipped, not failed, on one.
6. estimate, allocator, kernels: ``python -m tutorial_utils estimate``, the emulated caching
   allocator and the SDPA kernel rules, each against what torch.cuda reports on this GPU.
7. notebooks: 02 and 03 executed as copies in a temporary folder in the ``gpu`` profile with the
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
import sys
from pathlib import Path

import torch

from tutorial_utils.gpu_check import (
    allocator,
    batch_search,
    crosscheck,
    estimate,
    hardware,
    kernels,
    nccl,
    notebooks,
    offloading,
)
from tutorial_utils.gpu_check.report import (
    FAILED,
    SectionResult,
    render_report,
    report_data,
    status_text,
    write_report,
)
from tutorial_utils.gpu_check.runner import Budget, exit_status, run_sections
from tutorial_utils.measurement.devices import hardware_line

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "docs" / "gpu_report.md"
DEFAULT_BUDGET_S = 540.0  # the device machine stops a command at 600 s; wheels and start-up first

SECTIONS = (
    hardware.SECTION,
    crosscheck.SECTION,
    batch_search.SECTION,
    offloading.SECTION,
    nccl.SECTION,
    estimate.SECTION,
    allocator.SECTION,
    kernels.SECTION,
    notebooks.SECTION,  # last: it takes what the budget has left
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
    hardware_text = f"{hardware_line(device)}; {torch.cuda.device_count()} GPU(s) visible"
    planned = [section.title for section in SECTIONS]

    def after_each(results: list[SectionResult]) -> None:
        last = results[-1]
        failed = f" ({last.error})" if last.status == FAILED else ""
        status = status_text(last.status, last.error)
        print(f"{last.title}: {status} in {last.seconds:.1f} s{failed}", flush=True)
        write_report(
            args.output,
            report_data(hardware_text, budget.total_s, budget.elapsed(), planned, results),
        )

    results = run_sections(SECTIONS, budget, after_each)
    print(
        render_report(
            report_data(hardware_text, budget.total_s, budget.elapsed(), planned, results)
        )
    )
    print(f"written: {args.output} and {args.output.with_suffix('.json')}")
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
