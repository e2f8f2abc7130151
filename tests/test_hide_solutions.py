"""scripts/hide_solutions.py: a solution's answer stays behind a click, and a second run changes
nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from hide_solutions import answer_shown, hide_solutions  # noqa: E402


def test_hiding_removes_the_answer_and_is_idempotent() -> None:
    notebook = nbformat.v4.new_notebook()
    solution = nbformat.v4.new_code_cell('print("Answer: 42")', execution_count=7)
    solution.metadata["tags"] = ["solution"]
    solution.outputs = [nbformat.v4.new_output("stream", name="stdout", text="Answer: 42\n")]
    core = nbformat.v4.new_code_cell("print(1)", execution_count=6)
    core.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    notebook.cells = [core, solution]
    assert answer_shown(solution) is not None
    assert hide_solutions(notebook) == 1
    assert answer_shown(solution) is None and solution.outputs == []
    assert solution.metadata["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
    assert core.outputs and core.execution_count == 6  # only solutions are touched
    assert hide_solutions(notebook) == 0
