"""A notebook's ``copy`` cells as the plain script a learner would paste them into.

The cells tagged ``copy`` hold a notebook's core experiment. Concatenated in order they must run
as ``python script.py`` with ``tools.py`` copied beside the script and nothing else of
``tutorial_utils`` importable (torch, torchvision, matplotlib and the standard library beside
it): that is what "a learner can copy the code" means here. The copy cells' one import line,
``from tutorial_utils.tools import ...``, is the line the notebook tells the learner to change,
to ``from tools import ...``; the script changes exactly that. ``run_copy_script`` builds that
process and returns what each cell printed, so a test can hold it against the notebook's
committed outputs. (Notebooks outside ``BESIDE_THE_SCRIPT`` still run with a ``tutorial_utils/``
folder holding only ``tools.py``, until their copy cells are rewritten.)
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import nbformat

from tests.saved_run import CHECK_TAG, sanitize_patterns

ROOT = Path(__file__).resolve().parent.parent
COPY_TAG = "copy"
BESIDE_THE_SCRIPT = {
    "01",
    "02",
    "03",
    "04",
    "05",
    "06",
    "07",
}  # copy cells run beside tools.py alone
IMPORT_LINE = re.compile(r"^from tutorial_utils\.tools import", re.MULTILINE)
CHANGED_LINE = "from tools import"
CELL_MARK = "@@copy cell {}@@"
# the process proves its isolation before the first cell runs
ISOLATION_CHECK = """\
import importlib.util, pathlib, tutorial_utils
assert pathlib.Path(tutorial_utils.__file__).parent == pathlib.Path.cwd() / "tutorial_utils"
assert importlib.util.find_spec("tutorial_utils.lessons") is None, "the package leaked in"
"""
ISOLATION_CHECK_BESIDE = """\
import importlib.util, pathlib, tools
assert pathlib.Path(tools.__file__).parent == pathlib.Path.cwd(), "tools.py is not beside"
assert importlib.util.find_spec("tutorial_utils") is None, "the package leaked in"
"""


def beside_the_script(notebook_path: Path) -> bool:
    return notebook_path.stem[:2] in BESIDE_THE_SCRIPT


def copy_cells(notebook: nbformat.NotebookNode) -> list[tuple[int, nbformat.NotebookNode]]:
    """(index among the notebook's cells, cell) of every code cell tagged ``copy``."""
    return [
        (index, cell)
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code" and COPY_TAG in cell.get("metadata", {}).get("tags", [])
    ]


def copy_script(notebook: nbformat.NotebookNode, beside: bool = False) -> str:
    """The script: each copy cell's source after a line that marks where its output starts;
    ``beside``: tools.py lies next to it, and the one import line says so."""
    parts = [ISOLATION_CHECK_BESIDE if beside else ISOLATION_CHECK]
    for index, cell in copy_cells(notebook):
        source = IMPORT_LINE.sub(CHANGED_LINE, cell.source) if beside else cell.source
        parts.append(f"print({CELL_MARK.format(index)!r}, flush=True)\n{source}\n")
    return "\n".join(parts)


def run_copy_script(notebook_path: Path, workdir: Path, timeout_s: float = 300) -> dict[int, str]:
    """Run the copy script with nothing of the package but tools.py; stdout per cell index."""
    notebook = nbformat.read(notebook_path, as_version=4)
    beside = beside_the_script(notebook_path)
    package = workdir if beside else workdir / "tutorial_utils"
    package.mkdir(parents=True, exist_ok=True)
    if not beside:
        (package / "__init__.py").write_text("")
    shutil.copy(ROOT / "tutorial_utils" / "tools.py", package / "tools.py")
    script = workdir / "script.py"
    script.write_text(copy_script(notebook, beside), encoding="utf-8")
    # -S: no site hooks, so the package's editable install cannot add itself; the installed
    # libraries come in by path alone, after the folder that holds only tools.py
    path = os.pathsep.join([str(workdir), *site.getsitepackages()])
    env = {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-S", str(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise AssertionError(f"{notebook_path.name}'s copy script failed:\n{done.stderr[-3000:]}")
    outputs: dict[int, str] = {}
    current = None
    for line in done.stdout.splitlines(keepends=True):
        if mark := re.fullmatch(r"@@copy cell (\d+)@@\n?", line):
            current = int(mark.group(1))
            outputs[current] = ""
        elif current is not None:
            outputs[current] += line
    return outputs


def committed_stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(
        output.get("text", "")
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream" and output.get("name") == "stdout"
    )


def sanitized(text: str) -> str:
    for regex, replace in sanitize_patterns().items():
        text = re.sub(regex, replace, text)
    return text


def shape_of(text: str) -> str:
    """The text with every number and True/False masked: what a timing cell always prints."""
    return re.sub(r"\b(True|False)\b", "BOOL", re.sub(r"\d+(\.\d+)?", "N", text))


def differences(notebook_path: Path, outputs: dict[int, str]) -> list[str]:
    """Where the script printed other than the notebook's committed run: exactly, after nbval's
    sanitizing, for cells tagged nbval-check-output; line for line with numbers masked otherwise."""
    notebook = nbformat.read(notebook_path, as_version=4)
    problems = []
    for index, cell in copy_cells(notebook):
        committed, printed = committed_stdout(cell), outputs.get(index)
        if printed is None:
            problems.append(f"cell {index} did not run in the script")
        elif CHECK_TAG in cell.metadata.get("tags", []):
            if sanitized(printed) != sanitized(committed):
                problems.append(f"cell {index}:\ncommitted:\n{committed}\nscript:\n{printed}")
        elif shape_of(printed) != shape_of(committed):
            problems.append(
                f"cell {index} (numbers masked):\ncommitted:\n{committed}\nscript:\n{printed}"
            )
    return problems
