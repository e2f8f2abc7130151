"""The GPU learner's path, rehearsed on a CPU: every notebook in the ``gpu`` and ``article`` profiles.

Both profiles keep their own sizes (224 px, batch 64 and 31, the 2.5 GB card) but, with
``TUTORIAL_STEPS=2``, train 2 steps per epoch for 2 epochs and evaluate 2 batches, so a notebook
that would crash on a GPU (a size table without a ``gpu`` key, a loop that assumes CUDA) crashes
here first. Every notebook must run to its end and name the cells it skipped for want of CUDA.

Long (a VGG16 step at 224 px, batch 64 is about 25 s on 2 cores), so opt-in:
``TUTORIAL_REHEARSAL=1 .venv/bin/pytest -m rehearsal -s tests/test_rehearsal.py``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REHEARSAL_STEPS = "2"
SKIPPED_REPORT = "cells skipped for want of CUDA"
# A cell that runs this long has hung (the longest, a VGG16 training at 224 px, takes minutes).
CELL_TIMEOUT_S = 1800
SLOWEST_SHOWN = 4
# Every cell that runs only on CUDA guards itself with ``lessons.cuda_only.needs_cuda``, which
# prints one line where CUDA is absent and counts it; this cell, appended to the copy that runs,
# prints the count.
TALLY = "from tutorial_utils.lessons.cuda_only import skipped_cells_report\nprint(skipped_cells_report())"

pytestmark = [
    pytest.mark.rehearsal,
    pytest.mark.skipif(
        os.environ.get("TUTORIAL_REHEARSAL") != "1",
        reason="tens of minutes: set TUTORIAL_REHEARSAL=1 to rehearse the gpu and article profiles",
    ),
]


def cell_seconds(cell: nbformat.NotebookNode) -> float:
    """How long the kernel took on ``cell``, from nbclient's execution timestamps."""
    timing = cell.get("metadata", {}).get("execution", {})
    started, ended = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (started and ended):
        return 0.0
    return (datetime.fromisoformat(ended) - datetime.fromisoformat(started)).total_seconds()


def slowest_cells(notebook: nbformat.NotebookNode) -> str:
    """Where a rehearsal spends its time: the slowest code cells, by index and duration."""
    timed = [(cell_seconds(c), i) for i, c in enumerate(notebook.cells) if c.cell_type == "code"]
    return ", ".join(f"cell {i} {s:.0f} s" for s, i in sorted(timed, reverse=True)[:SLOWEST_SHOWN])


def cell_text(notebook: nbformat.NotebookNode) -> str:
    """Everything the run printed, in cell order."""
    return "\n".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )


@pytest.mark.parametrize("profile", ["gpu", "article"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_the_profile_with_two_steps(
    path: Path, profile: str, tmp_path: Path
) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    from execute_notebooks import run_notebook

    copy = tmp_path / path.name
    shutil.copy(path, copy)
    notebook = nbformat.read(copy, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(TALLY))  # the kernel's own count, at the end
    env = {
        **os.environ,
        "TUTORIAL_PROFILE": profile,
        "TUTORIAL_STEPS": REHEARSAL_STEPS,
        "TUTORIAL_CHECK_FIGURES": "1",
        "MPLBACKEND": "Agg",
        "CUDA_VISIBLE_DEVICES": "",  # the CPU path, even on a machine with a GPU
    }
    started = time.monotonic()
    run_notebook(notebook, path.parent, env, cell_timeout=CELL_TIMEOUT_S)
    printed = cell_text(notebook)
    report = [line for line in printed.splitlines() if line.startswith(SKIPPED_REPORT)]
    assert f"profile: {profile}" in printed, "the setup cell did not report the profile"
    assert report, f"{path.name} did not report the cells it skipped for want of CUDA"
    print(f"{path.name} [{profile}, TUTORIAL_STEPS={REHEARSAL_STEPS}]: "
          f"{time.monotonic() - started:.0f} s; {report[-1]}; slowest: {slowest_cells(notebook)}")  # fmt: skip
