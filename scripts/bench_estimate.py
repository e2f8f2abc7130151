"""How fast ``python -m tutorial_utils estimate`` answers issue 43's speed case: an 8 B Llama with
LoRA rank 16, four strategies. It prints three figures, each a measurement of this machine at
this moment:

* the four dry runs, ``--no-search`` (the command's own "dry runs of the strategies" line: the
  model built on meta and the four strategies' dry runs, after the imports);
* the whole command, imports included (wall time of the process), ``--no-search``;
* the whole command with the largest-fit search.

The targets are at most 3 s, 9 s and 20 s on this project's 2-core machine when it is quiet; the
load average printed beside each run says whether it was. Medians over ``--repeats`` runs (the
search: one run unless ``--repeats-search``). ``--write`` also saves the output to
docs/bench_estimate.txt, which docs/ESTIMATE.md points to. Run it as
``OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_estimate.py [--repeats 3] [--write]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

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
    parser.add_argument("--repeats-search", type=int, default=1, help="runs with the search")
    parser.add_argument("--write", action="store_true", help="save to docs/bench_estimate.txt")
    options = parser.parse_args()
    one_run()  # warm-up, not counted: caches the compiled bytecode as any first run does
    lines = [f"python -m tutorial_utils {' '.join(COMMAND[2:])}  ({time.strftime('%Y-%m-%d')})"]

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    runs, loads = [], []
    for index in range(options.repeats):
        loads.append(os.getloadavg()[0])
        dry, wall = one_run()
        runs.append((dry, wall))
        say(f"run {index + 1}: dry runs {dry:.1f} s, command {wall:.1f} s (load {loads[-1]:.1f})")
    dry = statistics.median(run[0] for run in runs)
    wall = statistics.median(run[1] for run in runs)
    say(
        f"median of {options.repeats}: the four dry runs {dry:.1f} s (target 3 s), the whole "
        f"command {wall:.1f} s (target 9 s); load average {statistics.median(loads):.1f} on "
        f"{os.cpu_count()} cores (the targets are for a quiet machine)"
    )
    searched, search_loads = [], []
    for _ in range(options.repeats_search):
        search_loads.append(os.getloadavg()[0])
        searched.append(one_run(search=True)[1])
    say(
        f"with the largest-fit search: the whole command {statistics.median(searched):.1f} s "
        f"(median of {len(searched)}; target 20 s; load {statistics.median(search_loads):.1f})"
    )
    if options.write:
        target = Path(__file__).resolve().parent.parent / "docs" / "bench_estimate.txt"
        target.write_text("\n".join(lines) + "\n")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
