"""The checks applied to a notebook's saved run must catch what nbval catches."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.saved_run import saved_run_problems

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "01_toy_summation_graph.ipynb"


def committed() -> dict:
    """The committed notebook as a Run All leaves it: its solutions, committed without their
    answers (scripts/hide_solutions.py), have run too."""
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        if "solution" in cell.get("metadata", {}).get("tags", []):
            cell["execution_count"] = cell.get("execution_count") or 1
    return notebook


def checked_cell(notebook: dict) -> dict:
    return next(
        c
        for c in notebook["cells"]
        if "nbval-check-output" in c.get("metadata", {}).get("tags", [])
        and any(o.get("output_type") == "stream" for o in c.get("outputs", []))
    )


def test_the_committed_run_passes_against_itself() -> None:
    assert saved_run_problems(NOTEBOOK, committed()) == []


def test_volatile_text_is_masked_as_nbval_masks_it() -> None:
    ran = committed()
    stream = next(o for o in checked_cell(ran)["outputs"] if o["output_type"] == "stream")
    text = "".join(stream["text"])
    stream["text"] = text + "took 3.5 s at 0x7f00deadbeef\n"
    reference = copy.deepcopy(committed())
    ref_stream = next(o for o in checked_cell(reference)["outputs"] if o["output_type"] == "stream")
    ref_stream["text"] = text + "took 0.2 s at 0x1234\n"
    path = NOTEBOOK.parent.parent / "test-artifacts" / "reference.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(reference), encoding="utf-8")
    assert saved_run_problems(path, ran) == []


def test_a_changed_checked_output_a_failure_and_a_skipped_cell_are_reported() -> None:
    changed = committed()
    stream = next(o for o in checked_cell(changed)["outputs"] if o["output_type"] == "stream")
    stream["text"] = "".join(stream["text"]).replace("1", "7", 1) + "x"
    assert any(
        "differs from its committed output" in p for p in saved_run_problems(NOTEBOOK, changed)
    )

    failed = committed()
    code = [c for c in failed["cells"] if c["cell_type"] == "code"]
    code[-1]["outputs"] = [
        {"output_type": "error", "ename": "KeyError", "evalue": "'gpu'", "traceback": []}
    ]
    assert any("failed: KeyError" in p for p in saved_run_problems(NOTEBOOK, failed))

    skipped = committed()
    code = [
        c for c in skipped["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()
    ]
    code[2]["execution_count"] = None
    assert any("did not run" in p for p in saved_run_problems(NOTEBOOK, skipped))
