"""Put every exercise's answer behind a click, in JupyterLab, Colab and on GitHub.

A solution cell (tag ``solution``) is committed with its source hidden
(``jupyter.source_hidden``), its outputs marked hidden (``jupyter.outputs_hidden``, which
JupyterLab honours when the learner runs the cell) and no outputs at all: Colab and GitHub show
every committed output and ignore both flags, so an answer that is not committed is the only one
they cannot show early. The learner sees the answer by running the cell. nbval and the saved-run
check still execute solution cells (they run every code cell; none is tagged to check output).

Idempotent; ``scripts/execute_notebooks.py`` calls ``hide_solutions`` after each run.

Usage: python scripts/hide_solutions.py [--check] [notebooks...]   (default: notebooks/*.ipynb)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTION_TAG = "solution"


def is_solution(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def answer_shown(cell: nbformat.NotebookNode) -> str | None:
    """Why a solution cell could show its answer before it is opened, or None."""
    jupyter = cell.get("metadata", {}).get("jupyter", {})
    if cell.get("outputs"):
        return "it has committed outputs (Colab and GitHub show them)"
    if cell.get("execution_count") is not None:
        return "it has an execution count (a run's trace)"
    if jupyter.get("source_hidden") is not True:
        return "its source is not hidden (jupyter.source_hidden)"
    if jupyter.get("outputs_hidden") is not True:
        return "its outputs are not hidden once run (jupyter.outputs_hidden)"
    return None


def hide_solutions(notebook: nbformat.NotebookNode) -> int:
    """Hide every solution cell's source and outputs in place; the number of cells changed."""
    changed = 0
    for cell in notebook.cells:
        if not is_solution(cell) or answer_shown(cell) is None:
            continue
        cell.outputs = []
        cell.execution_count = None
        jupyter = cell.metadata.setdefault("jupyter", {})
        jupyter["source_hidden"] = True
        jupyter["outputs_hidden"] = True
        changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if an answer shows; write none")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    shown = []
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        if args.check:
            shown += [f"{path.name}: a solution shows: {why}" for cell in notebook.cells
                      if is_solution(cell) and (why := answer_shown(cell))]  # fmt: skip
        elif hide_solutions(notebook):
            nbformat.write(notebook, path)
            print(f"{path.name}: solutions hidden")
    print("\n".join(shown), file=sys.stderr)
    return 1 if shown else 0


if __name__ == "__main__":
    sys.exit(main())
