"""Issue 46: no committed notebook output shows a learner a library's deprecation warning.

A warning in a saved output is the first thing a reader sees under a cell, and it is about code
the notebook does not run (peft's call into transformers) or about the project's own code. Either
is fixed at its source or filtered narrowly in the setup cell, never left on the page.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
WARNINGS = ("FutureWarning", "DeprecationWarning", "PendingDeprecationWarning")


def output_text(output: nbformat.NotebookNode) -> str:
    """What a reader sees of one output, as text: a stream, a traceback or a text/plain result."""
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    return str(output.get("data", {}).get("text/plain", ""))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_no_committed_output_holds_a_deprecation_warning(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    found = [
        (index, name)
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        for name in WARNINGS
        if name in output_text(output)
    ]
    assert not found, f"{path.name}: cells with a warning in their output (cell, warning): {found}"


def test_the_check_sees_a_warning_in_a_stream() -> None:
    stream = nbformat.v4.new_output("stream", name="stderr", text="x.py:1: FutureWarning: old\n")
    assert "FutureWarning" in output_text(stream)
