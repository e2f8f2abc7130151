"""The order and grouping of the suite's tests on pytest-xdist's two workers.

The suite's longest tests execute the notebooks (the browser test, or nbval where chromium is
missing), one to two minutes each. Run on one worker, they alone set the suite's wall time while
the other worker finishes the unit tests early and waits. So each notebook run is its own unit of
work, the units start longest first, and a worker that finishes one takes the next unit: the
notebooks spread over both workers and the unit tests fill the gaps (longest processing time
first). How long a notebook takes is read from its committed run (each code cell's execution
timestamps, written by nbclient and JupyterLab), so the order follows the notebooks as they
change, with no list to keep up to date.

``./scripts/test`` runs ``--dist loadscope --no-loadscope-reorder``: xdist hands out the units in
collection order (``schedule`` sorts it) and the scheduler below says what a unit is. It reads
only test ids (xdist's controller does not collect), and it replaces ``--dist loadgroup``'s
``xdist_group`` marks, which pytest-xdist 3.8 cannot apply under pytest 9.2 (it renames
``item._nodeid``, and pytest 9.2 reads a test's id from elsewhere).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cache
from pathlib import Path

import pytest

BROWSER_MARK, SLOW_MARK = "browser", "slow"


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@cache
def recorded_run_s(notebook: Path) -> float:
    """Seconds the notebook's committed run spent in its code cells (0 when not recorded)."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return 0.0
    total_s = 0.0
    for cell in cells:
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if start and end:
            total_s += max(0.0, (_timestamp(end) - _timestamp(start)).total_seconds())
    return total_s


def executed_notebook(item: pytest.Item) -> Path | None:
    """The notebook an item executes: the browser test's parameter, or nbval's cell's file."""
    if item.get_closest_marker(BROWSER_MARK) is not None:
        callspec = getattr(item, "callspec", None)
        notebook = callspec.params.get("notebook") if callspec else None
        return Path(notebook) if notebook is not None else None
    if item.path.suffix == ".ipynb":
        return item.path
    return None


def work_unit(nodeid: str, notebook_names: frozenset[str]) -> str:
    """The unit of work a test id belongs to (tests of one unit run on one worker, in order).

    A case parametrized by a notebook's name (the browser's run of that notebook, the copy
    script's) is a unit by itself; every other test stays with its module or class, as
    ``--dist loadscope`` keeps them (their fixtures are built once; nbval's cells of one
    notebook run in one kernel, in order).
    """
    case = re.search(r"\[([^\[\]]*)\]$", nodeid)
    if case is not None and case.group(1) in notebook_names:
        return nodeid
    return nodeid.rsplit("::", 1)[0]


def notebook_names(root: Path) -> frozenset[str]:
    return frozenset(path.stem for path in (root / "notebooks").glob("*.ipynb"))


def notebook_first_scheduler(config: pytest.Config, log: object, root: Path) -> object:
    """xdist's loadscope scheduler with ``work_unit``'s units (imported here: xdist is optional)."""
    from xdist.scheduler import LoadScopeScheduling

    names = notebook_names(root)

    class NotebookFirstScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, names)

    return NotebookFirstScheduling(config, log)


def schedule(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: notebook runs first, longest recorded run first, then the slow
    tests, then the rest in collection order."""
    position = {id(item): index for index, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[int, float, int]:
        notebook = executed_notebook(item)
        if notebook is not None:
            return (0, -recorded_run_s(notebook), position[id(item)])
        return (1 if item.get_closest_marker(SLOW_MARK) else 2, 0.0, position[id(item)])

    items.sort(key=key)
