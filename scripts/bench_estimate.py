"""How fast ``python -m tutorial_utils estimate`` answers issue 43's speed case: an 8 B Llama with
LoRA rank 16, four strategies, ``--no-search``. It prints two figures, each a measurement of this
machine at this moment:

* the four dry runs (the command's own "dry runs of the strategies" line: building the model on
  meta and the four strategies' dry runs, after the imports);
* the whole command, imports included (wall time of the process).

The targets are at most 3 s and 9 s on this project's 2-core machine when it is quiet (and 20 s
with the largest-fit search: ``--search``); the load average printed beside each run says whether
it was. Medians over ``--repeats`` runs. Run it as
``OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_estimate.py [--repeats 3] [--search]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

COMMAND = [
    "-m", "tutorial_utils", "estimate", "--hf-preset", "llama-3.1-8b", "--seq", "4096",
    "--lora", "16", "--card", "24GB", "--strategies", "none,every-block,every-2,selective",
    "--no-search",
]  # fmt: skip
# Python's default: compiled bytecode is cached. Some shells set PYTHONDONTWRITEBYTECODE, and then
# every import compiles torch's, transformers' and peft's sources again (tens of seconds).
CHILD_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
DRY_RUNS = re.compile(r"dry runs of the strategies: ([0-9.]+) s")


def one_run(search: bool = False) -> tuple[float, float]:
    """(seconds of the dry runs, as the command prints them; wall seconds of the command)."""
    command = [word for word in COMMAND if not (search and word == "--no-search")]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, check=True, env=CHILD_ENV
    )
    wall = time.perf_counter() - started
    match = DRY_RUNS.search(done.stdout)
    if match is None:
        raise RuntimeError("the command printed no 'dry runs of the strategies' line")
    return float(match.group(1)), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs; medians are reported")
    parser.add_argument("--search", action="store_true", help="also time the command with search")
    options = parser.parse_args()
    one_run()  # warm-up, not counted: caches the compiled bytecode as any first run does
    runs, loads = [], []
    for index in range(options.repeats):
        loads.append(os.getloadavg()[0])
        dry, wall = one_run()
        runs.append((dry, wall))
        print(f"run {index + 1}: dry runs {dry:.1f} s, command {wall:.1f} s (load {loads[-1]:.1f})")
    dry = statistics.median(run[0] for run in runs)
    wall = statistics.median(run[1] for run in runs)
    print(
        f"median of {options.repeats}: the four dry runs {dry:.1f} s (target 3 s), the whole "
        f"command {wall:.1f} s (target 9 s); load average {statistics.median(loads):.1f} on "
        f"{os.cpu_count()} cores (the targets are for a quiet machine)"
    )
    if options.search:
        load = os.getloadavg()[0]
        _, wall = one_run(search=True)
        print(
            f"with the largest-fit search: the whole command {wall:.1f} s (target 20 s; load {load:.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
