"""The committed notebooks, read without running them: Colab-ready, from one complete clean run.

nbval re-runs the notebooks, but it cannot tell whether the outputs a reader sees on GitHub came
from a top-to-bottom run (scripts/execute_notebooks.py) or from cells run by hand out of order,
nor whether an error was committed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from hide_solutions import answer_shown  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BADGE_PREFIX = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]("
COLAB_GUARD = '"google.colab" in sys.modules'
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# notebooks whose solutions are committed without outputs (scripts/hide_solutions.py), so no
# answer shows before the learner runs it, in JupyterLab, Colab or on GitHub; the lead extends it
ANSWERS_BEHIND_A_CLICK = {"01", "02", "03", "04", "05", "06", "07"}
WRITTEN_ANSWER = re.compile(r"print\(\s*\(?\s*f?[\"']Answer: ")

by_name = pytest.mark.parametrize("notebook_path", NOTEBOOKS, ids=lambda path: path.stem)


def executed_code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """Code cells a run executes (nbclient skips empty cells and those tagged skip-execution)."""
    return [
        cell
        for cell in notebook.cells
        if cell.cell_type == "code"
        and cell.source.strip()
        and "skip-execution" not in cell.metadata.get("tags", [])
    ]


def stored_outputs(notebook: nbformat.NotebookNode) -> list[dict]:
    """Cell outputs, plus those captured inside Output widgets (stored in the widget state)."""
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model in state.values():
        outputs.extend(model.get("state", {}).get("outputs", []))
    return outputs


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "no notebooks/*.ipynb found"


def test_colab_urls_are_stamped_from_pyproject() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "stamp_colab.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


@by_name
def test_opens_with_title_and_colab_badge(notebook_path: Path) -> None:
    first = nbformat.read(notebook_path, as_version=4).cells[0]
    assert first.cell_type == "markdown", "the first cell must be the markdown introduction"
    lines = [line for line in first.source.splitlines() if line.strip()]
    before_badge = []
    for line in lines:
        if line.startswith(BADGE_PREFIX):
            break
        before_badge.append(line)
    assert len(before_badge) < len(lines), f"no Colab badge line in the first cell: {lines[:3]}"
    assert all(line.startswith("#") for line in before_badge), (
        f"only the title may come before the Colab badge, found {before_badge}"
    )


@by_name
def test_first_code_cell_is_the_colab_setup(notebook_path: Path) -> None:
    notebook = nbformat.read(notebook_path, as_version=4)
    setup = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert COLAB_GUARD in setup.source, f"the first code cell lacks the guard `{COLAB_GUARD}`"
    assert '"-m", "pip", "install"' in setup.source and "REPO_URL" in setup.source
    assert "raise SystemExit(" in setup.source  # a failed install says what to do, in one line
    assert "report_environment(" in setup.source


@by_name
def test_outputs_come_from_one_complete_run(notebook_path: Path) -> None:
    cells = executed_code_cells(nbformat.read(notebook_path, as_version=4))
    counts = [cell.execution_count for cell in cells]
    expected = [  # a hidden solution ran in that run, but keeps no trace of it (hide_solutions.py)
        None if "solution" in cell.metadata.get("tags", []) and answer_shown(cell) is None else n
        for n, cell in enumerate(cells, 1)
    ]
    assert counts == expected, (
        f"execution counts {counts}: re-run with python scripts/execute_notebooks.py"
    )


@by_name
def test_no_committed_error_outputs(notebook_path: Path) -> None:
    errors = [
        f"{output.get('ename')}: {output.get('evalue')}"
        for output in stored_outputs(nbformat.read(notebook_path, as_version=4))
        if output.get("output_type") == "error"
    ]
    assert not errors, f"committed error outputs: {errors}"


@by_name
def test_first_code_cell_prints_profile_and_device(notebook_path: Path) -> None:
    notebook = nbformat.read(notebook_path, as_version=4)
    setup = next(cell for cell in notebook.cells if cell.cell_type == "code")
    printed = "".join(output.get("text", "") for output in setup.outputs)
    assert "profile:" in printed and "device:" in printed, (
        f"the setup cell's stored output should name the profile and device, got {printed!r}"
    )


@by_name
def test_nbval_markers_are_cell_tags_not_comment_lines(notebook_path: Path) -> None:
    notebook = json.loads(notebook_path.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    commented = [
        index
        for index, cell in enumerate(code)
        if "".join(cell["source"]).lstrip().startswith("# NBVAL_")
    ]
    assert not commented, f"code cells {commented} open with an nbval comment: use a cell tag"
    tags = {tag for cell in code for tag in cell.get("metadata", {}).get("tags", [])}
    assert "nbval-check-output" in tags, "no cell's output is checked by nbval"


ALIGNED_FIELD = re.compile(r"\{[^{}]*:[<>^]\d+")  # an f-string field padded to a column width
MAX_ALIGNED_FIELDS = 3  # a cell with more is printing a table: its formatter belongs in the package


@by_name
def test_cells_show_the_experiment_not_table_formatting(notebook_path: Path) -> None:
    notebook = nbformat.read(notebook_path, as_version=4)
    crowded = {
        index: len(ALIGNED_FIELD.findall(cell.source))
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
        and "copy" not in cell.get("metadata", {}).get("tags", [])  # a learner's script: no package
        and len(ALIGNED_FIELD.findall(cell.source)) > MAX_ALIGNED_FIELDS
    }
    assert not crowded, (
        f"cells {sorted(crowded)} format tables in the notebook ({crowded} aligned fields): "
        "move the formatting into the lesson module (tutorial_utils/display/tables.py helps)"
    )


TAUGHT = NOTEBOOKS
CORE_WORDS = 1300  # "about 1,200": the markdown a learner reads before Exercises
FIRST_RESULT_CELL = 5  # the first checkpointing result comes within this many code cells
HINT = "<details><summary>Hint</summary>"
# the calls that turn checkpointing on: torch's own, transformers' method and Trainer flag,
# FSDP's wrapper, and torch.compile's budget
CHECKPOINT_CALL = re.compile(
    r"\bcheckpoint(_sequential)?\(|\b(activation|gradient)_checkpointing_enable\("
    r"|\b(activation|gradient)_checkpointing=True|\bapply_activation_checkpointing\("
    r"|\bactivation_memory_budget\b"
)


def core_and_exercises(notebook: nbformat.NotebookNode) -> tuple[list, list]:
    """The cells before '## Exercises', and those from it to '## Going deeper'."""
    headings = [cell.source.split("\n", 1)[0] for cell in notebook.cells]
    start = headings.index("## Exercises")
    end = headings.index("## Going deeper")
    assert start < end, "Exercises come before Going deeper"
    return notebook.cells[:start], notebook.cells[start:end]


@pytest.mark.parametrize("notebook_path", TAUGHT, ids=lambda p: p.stem)
def test_the_core_is_short_and_reaches_a_result_early(notebook_path: Path) -> None:
    notebook = nbformat.read(notebook_path, as_version=4)
    core, _ = core_and_exercises(notebook)
    words = sum(len(cell.source.split()) for cell in core if cell.cell_type == "markdown")
    assert words <= CORE_WORDS, f"the core has {words} words of prose: move detail to Going deeper"
    code = [cell for cell in core if cell.cell_type == "code"]
    first = next(
        number
        for number, cell in enumerate(code, 1)
        if CHECKPOINT_CALL.search(cell.source) and "copy" in cell.metadata.get("tags", [])
    )
    assert first <= FIRST_RESULT_CELL, f"the first checkpointing result is in code cell {first}"


@pytest.mark.parametrize("notebook_path", TAUGHT, ids=lambda p: p.stem)
def test_exercises_have_a_hint_and_a_hidden_worked_solution(notebook_path: Path) -> None:
    notebook = nbformat.read(notebook_path, as_version=4)
    _, exercises = core_and_exercises(notebook)
    questions = [cell for cell in exercises[1:] if cell.cell_type == "markdown"]
    solutions = [cell for cell in exercises if cell.cell_type == "code"]
    assert 2 <= len(questions) <= 4, f"{len(questions)} exercises: give 2-4"
    assert len(solutions) == len(questions), "each exercise is followed by its solution cell"
    for question in questions:
        assert HINT in question.source and "</details>" in question.source, question.source[:80]
    for solution in solutions:
        assert "solution" in solution.metadata.get("tags", []), solution.source[:80]
        assert solution.metadata.get("jupyter", {}).get("source_hidden") is True
        if notebook_path.stem[:2] not in ANSWERS_BEHIND_A_CLICK:
            assert solution.get("outputs"), "a solution cell's worked answer comes from its run"
            continue
        why = answer_shown(solution)
        assert why is None, f"{solution.source[:60]!r} shows its answer early: {why}"
        assert WRITTEN_ANSWER.search(solution.source), (
            f'{solution.source[:60]!r}: end the solution with print("Answer: ..."), a sentence '
            "that answers the question asked"
        )
