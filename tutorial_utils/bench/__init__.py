"""``python -m tutorial_utils bench``: memory and time with and without checkpointing, side by side.

Two tables, because no one machine shows both halves of the trade-off at the articles' sizes,
and a BatchNorm check:

* **Dry runs at the articles' sizes** (``dry_runs``): the first article's VGG16 at 224 px,
  batch 64, SGD momentum (article layout, flat layout's segment counts, the best uniform split,
  the planner one level and nested, selective checkpointing, torch.compile's partition at three
  memory budgets, and the floor no plan can beat) and the second article's NetA at 224 px with
  Adam (batches 23 and 31, and its largest batch under the 2.5 GB card). The meta device gives
  exact tensor bytes and FLOPs, no time, in seconds on any machine.
* **Real steps at the active profile's sizes** on this machine (``timed``): memory and measured
  step time, each row with the time ratio its FLOPs predict (a dry run of the same step) beside
  the measured one, so the reader sees how far FLOPs explain time.
* **BatchNorm after one real step** of NetA at 32 px under each strategy: which update the
  running statistics twice, and how far the statistics land from the plain step's.

Every figure is also given as a ratio to the same model without checkpointing (``rows``).
"""

from tutorial_utils.bench.dry_runs import (
    DryRunBench,
    batchnorm_bench,
    deep_chain_name,
    dry_run_bench,
    print_dry_run_bench,
)
from tutorial_utils.bench.timed import COLUMNS, bench_main, run_bench

__all__ = [
    "COLUMNS",
    "DryRunBench",
    "batchnorm_bench",
    "bench_main",
    "deep_chain_name",
    "dry_run_bench",
    "print_dry_run_bench",
    "run_bench",
]
