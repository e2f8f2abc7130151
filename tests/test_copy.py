"""The copy test: each notebook's core experiment runs as a plain script beside tools.py alone,
and prints what the notebook's committed run printed (tests/copy_script.py says how)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from tests.copy_script import (
    BESIDE_THE_SCRIPT,
    CHANGED_LINE,
    IMPORT_LINE,
    ROOT,
    copy_cells,
    copy_script,
    differences,
    run_copy_script,
)

TAUGHT = sorted(path.stem for path in (ROOT / "notebooks").glob("0*.ipynb"))
MAGIC = re.compile(r"^\s*[%!]", re.MULTILINE)


def notebook_path(name: str) -> Path:
    return ROOT / "notebooks" / f"{name}.ipynb"


@pytest.mark.parametrize("name", TAUGHT)
def test_copy_cells_are_plain_python_with_tools_only(name: str) -> None:
    notebook = nbformat.read(notebook_path(name), as_version=4)
    cells = copy_cells(notebook)
    assert len(cells) >= 2, f"{name}: tag the core experiment's cells 'copy'"
    for index, cell in cells:
        assert not MAGIC.search(cell.source), f"{name} cell {index}: IPython syntax in a copy cell"
        imports = re.findall(r"^\s*(?:from|import)\s+(tutorial_utils[\w.]*)", cell.source, re.M)
        assert set(imports) <= {"tutorial_utils.tools"}, f"{name} cell {index} imports {imports}"
    compile(copy_script(notebook), f"{name}-copy.py", "exec")
    if name[:2] in BESIDE_THE_SCRIPT:
        lines = [i for i, cell in cells for _ in IMPORT_LINE.finditer(cell.source)]
        assert len(lines) <= 1, f"{name}: tools imported in cells {lines}; import them once"
        prose = "".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
        if lines:
            assert CHANGED_LINE in prose, f"{name}: name the one line to change, '{CHANGED_LINE}'"
        assert "next to your script" not in prose or CHANGED_LINE in prose


def test_the_script_imports_tools_from_beside_it(tmp_path: Path) -> None:
    """The one import line is changed, and tools.py beside the script is what it imports."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("from tutorial_utils.tools import MiB\nprint(MiB)")]
    notebook.cells[0].metadata["tags"] = ["copy"]
    path = tmp_path / "01_beside.ipynb"
    nbformat.write(notebook, path)
    assert run_copy_script(path, tmp_path / "run") == {0: f"{2**20}\n"}


@pytest.mark.slow
@pytest.mark.parametrize("name", TAUGHT)
def test_copy_script_prints_what_the_notebook_printed(name: str, tmp_path: Path) -> None:
    outputs = run_copy_script(notebook_path(name), tmp_path)
    problems = differences(notebook_path(name), outputs)
    assert not problems, "\n\n".join(problems)


def test_the_script_cannot_reach_the_rest_of_the_package(tmp_path: Path) -> None:
    """The isolation is real: a copy cell importing a lesson fails in the script."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import torch"),
                      nbformat.v4.new_code_cell("from tutorial_utils.lessons import setup")]  # fmt: skip
    for cell in notebook.cells:
        cell.metadata["tags"] = ["copy"]
    for name, missing in (("leak", "tutorial_utils.lessons"), ("01_leak", "tutorial_utils")):
        path = tmp_path / f"{name}.ipynb"
        nbformat.write(notebook, path)
        with pytest.raises(AssertionError, match=f"No module named '{missing}'"):
            run_copy_script(path, tmp_path / f"run-{name}")


@pytest.mark.parametrize("name", TAUGHT)
def test_no_pitfall_is_tagged_copy(name: str) -> None:
    """A cell that shows a mistake on purpose is tagged 'pitfall': never code to paste."""
    notebook = nbformat.read(notebook_path(name), as_version=4)
    both = [index for index, cell in enumerate(notebook.cells)
            if {"pitfall", "copy"} <= set(cell.metadata.get("tags", []))]  # fmt: skip
    assert not both, f"{name}: cells {both} are tagged both 'pitfall' and 'copy'"
