"""How long ``python -m tutorial_utils estimate`` takes at its acceptance size (an 8 B model,
4096 tokens, LoRA rank 16, a 24 GB card): the model built on meta, the strategies' dry runs and
the largest-fit search, each timed; ``python -m tutorial_utils bench`` prints it."""

from __future__ import annotations

import dataclasses
import time

from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, build_model, estimate, search_largest
from tutorial_utils.estimate.report import estimate_table
from tutorial_utils.estimate.strategies import DEFAULT_STRATEGIES
from tutorial_utils.measurement.timing import load_average_line

__all__ = [
    "ESTIMATE_COMMAND",
    "EstimateBench",
    "estimate_bench",
    "print_estimate_bench",
]


ESTIMATE_COMMAND = "--hf-preset llama-3.1-8b --seq 4096 --lora 16 --card 24GB"


@dataclasses.dataclass
class EstimateBench:
    """How long ``python -m tutorial_utils estimate`` takes: the table and the search."""

    table: str
    build_seconds: float  # the model on meta, LoRA included
    table_seconds: float  # the strategies' dry runs
    table_cpu_seconds: float
    search_seconds: float
    search_cpu_seconds: float
    strategies: int


def estimate_bench(model: str = "hf:llama-3.1-8b", size: int = 4096) -> EstimateBench:
    """The estimate command's work at its acceptance size (an 8 B model, 4096 tokens, LoRA 16,
    a 24 GB card): four strategies' dry runs, then the largest-fit search, each timed."""
    workload = Workload(model, batch=1, size=size, precision="bf16", lora_rank=16)
    started = time.perf_counter()
    built = build_model(workload)
    build_seconds = time.perf_counter() - started
    cpu = time.process_time()
    result = estimate(workload, DEFAULT_STRATEGIES, parse_card("24GB"), model=built, search=False)
    table_cpu = time.process_time() - cpu
    cpu = time.process_time()
    search_largest(result)
    search_cpu = time.process_time() - cpu
    measured = sum(1 for row in result.rows if row.report is not None)
    assert result.seconds is not None and result.search_seconds is not None  # both just timed
    return EstimateBench(
        estimate_table(result),
        build_seconds,
        result.seconds,
        table_cpu,
        result.search_seconds,
        search_cpu,
        measured,
    )


def print_estimate_bench(bench: EstimateBench) -> None:
    print(f"python -m tutorial_utils estimate {ESTIMATE_COMMAND}, in process (dry runs):")
    print()
    print(bench.table)
    print()
    print(
        f"Estimate timings: model built on meta in {bench.build_seconds:.1f} s; the table of "
        f"{bench.strategies} strategies in {bench.table_seconds:.1f} s "
        f"({bench.table_cpu_seconds:.1f} s of CPU time); the largest-fit search in "
        f"{bench.search_seconds:.1f} s ({bench.search_cpu_seconds:.1f} s of CPU time); "
        f"{load_average_line()}."
    )
