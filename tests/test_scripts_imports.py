"""``scripts/`` stand on the public API and the package's lower layers, never on a lesson.

A lesson is one notebook's story and changes with it; a script that imported one (the GPU check
once took its gradient helpers from notebook 02's lesson) would break when the notebook is rewritten.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
NOT_FOR_SCRIPTS = ("tutorial_utils.lessons", "tutorial_utils.bench", "tutorial_utils.__main__")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_no_lesson(path: Path) -> None:
    offending = [m for m in imported_modules(path) if m.startswith(NOT_FOR_SCRIPTS)]
    assert not offending, f"{path.name} imports {offending}: move what it needs to a lower layer"


def test_the_check_sees_an_import_of_a_lesson(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("from tutorial_utils.lessons.setup import report_environment\n")
    assert imported_modules(script) == ["tutorial_utils.lessons.setup"]
