"""Section 6, notebooks: 02 and 03 executed as copies in a temporary folder in the ``gpu`` profile
with the figure check on, each within its share of the time budget (never the committed files).

Only this section needs Jupyter: on the project's device machine (python3 with torch but no
Jupyter packages) the kernel comes from wheels carried in .whl/ (scripts/gpu_check_wheels.txt;
docs/TESTING.md, "The GPU check in full", says how).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, NotRequired, TypedDict

from tutorial_utils.articles.profiles import PROFILE_ENV
from tutorial_utils.display.figure_check import CHECK_FIGURES_ENV
from tutorial_utils.gpu_check.report import (
    FAILED,
    MEASURED,
    PASSED,
    Outcome,
    Shown,
    Table,
    columns_of,
    one_line,
)
from tutorial_utils.gpu_check.runner import Budget, Section

__all__ = [
    "execute_copy",
    "MIN_NOTEBOOK_S",
    "notebook_env",
    "notebook_timeout",
    "NotebookExecutor",
    "NotebookRow",
    "NOTEBOOKS",
    "NOTEBOOKS_DIR",
    "notebooks_section",
    "RESERVE_S",
    "ROOT",
    "SECTION",
    "stopping_cell",
]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = ROOT / "notebooks"
NOTEBOOKS = ("02_vgg16_dogcat.ipynb", "03_cifar10_neta.ipynb")
NOTEBOOK_PROFILE = "gpu"
RESERVE_S = 15.0  # after the last notebook: its kernel's shutdown and the report
MIN_NOTEBOOK_S = 30.0  # less than this is not worth a kernel's start
NotebookExecutor = Callable[[Path, Mapping[str, str], float], None]


class NotebookRow(TypedDict):
    notebook: Annotated[str, Shown("notebook")]
    profile: Annotated[str, Shown("profile")]
    status: NotRequired[Annotated[str, Shown("status")]]  # passed, FAILED, or why it did not run
    timeout_s: Annotated[float | None, Shown("time allowed s", "{:.0f}")]
    seconds: NotRequired[Annotated[float, Shown("wall s", "{:.1f}", MEASURED)]]
    cell: NotRequired[Annotated[str | None, Shown("where it stopped")]]
    error: NotRequired[Annotated[str, Shown("error")]]


NOTEBOOK_COLUMNS = columns_of(NotebookRow)


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
    # execute_notebooks is scripts/execute_notebooks.py, importable when scripts/gpu_check.py runs.
    import nbformat
    from execute_notebooks import run_notebook  # type: ignore[import-not-found]

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
    rows: list[NotebookRow] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-notebooks-") as folder:
        for position, name in enumerate(names):
            timeout = notebook_timeout(budget.left(), len(names) - position)
            row: NotebookRow = {"notebook": name, "profile": NOTEBOOK_PROFILE, "timeout_s": timeout}
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
                row.update(
                    {"status": FAILED, "error": one_line(error), "cell": stopping_cell(copy)}
                )
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


SECTION = Section("notebooks", "Notebooks 02 and 03 in the gpu profile", notebooks_section)
