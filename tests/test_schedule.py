"""The suite's order on pytest-xdist's workers: notebook runs first, longest first, each alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.schedule import notebook_names, recorded_run_s, schedule, work_unit

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class FakeItem:
    """What the schedule reads of a pytest item: its id, file, markers and parameters."""

    nodeid: str
    marks: tuple[str, ...] = ()
    notebook: Path | None = None

    @property
    def path(self) -> Path:
        return Path(self.nodeid.split("::", 1)[0])

    @property
    def callspec(self) -> object:
        if self.notebook is None:
            raise AttributeError("callspec")
        return type("CallSpec", (), {"params": {"notebook": self.notebook}})()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def timed_notebook(path: Path, seconds: list[float]) -> Path:
    cells = [
        {"cell_type": "code", "metadata": {"execution": {
            "iopub.execute_input": "2026-12-03T10:00:00.000000Z",
            "shell.execute_reply": f"2026-12-03T10:00:{s:09.6f}Z"}}}
        for s in seconds
    ]  # fmt: skip
    cells.append({"cell_type": "code", "metadata": {}})  # never timed: counts nothing
    path.write_text(json.dumps({"cells": cells}))
    return path


def test_the_recorded_run_is_the_sum_of_the_cells_timings(tmp_path: Path) -> None:
    assert recorded_run_s(timed_notebook(tmp_path / "a.ipynb", [1.5, 20.0])) == pytest.approx(21.5)
    assert recorded_run_s(tmp_path / "missing.ipynb") == 0.0


def test_every_committed_notebook_records_how_long_its_run_took() -> None:
    """The order on the workers comes from these timings: a notebook saved without them would
    start last, however long it runs."""
    untimed = [
        nb.name for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) if not recorded_run_s(nb)
    ]
    assert not untimed, f"no execution timings in {untimed}: re-run scripts/execute_notebooks.py"


def test_notebook_runs_start_first_longest_first_and_each_stands_alone(tmp_path: Path) -> None:
    short = timed_notebook(tmp_path / "01_short.ipynb", [5.0])
    long = timed_notebook(tmp_path / "02_long.ipynb", [50.0])
    unit = [FakeItem("tests/test_a.py::test_one"), FakeItem("tests/test_a.py::test_two")]
    copy = FakeItem("tests/test_copy.py::test_script[01]", marks=("slow",), notebook=short)
    browser = [
        FakeItem(f"tests/test_browser.py::test_nb[{nb.stem}]", marks=("browser",), notebook=nb)
        for nb in (short, long)
    ]
    items = [*unit, copy, *browser]
    schedule(items)
    assert items == [browser[1], browser[0], copy, *unit]


def test_nbval_cells_stay_in_order_with_their_notebook(tmp_path: Path) -> None:
    short = timed_notebook(tmp_path / "01_short.ipynb", [5.0])
    long = timed_notebook(tmp_path / "02_long.ipynb", [50.0])
    cells = [FakeItem(f"{nb}::Cell {n}") for nb in (short, long) for n in range(3)]
    unit = FakeItem("tests/test_a.py::test_one")
    items = [unit, *cells]
    schedule(items)
    assert items == [*cells[3:], *cells[:3], unit]


def test_a_case_named_after_a_notebook_is_a_unit_of_work_alone() -> None:
    names = notebook_names(ROOT)
    assert "02_vgg16_dogcat" in names
    browser = "tests/test_browser.py::test_runs[02_vgg16_dogcat]"
    assert work_unit(browser, names) == browser
    assert work_unit("tests/test_a.py::test_one[2-7]", names) == "tests/test_a.py"
    assert work_unit("tests/test_a.py::TestB::test_one", names) == "tests/test_a.py::TestB"
    nbval_cell = "notebooks/02_vgg16_dogcat.ipynb::Cell 3"
    assert work_unit(nbval_cell, names) == "notebooks/02_vgg16_dogcat.ipynb"
