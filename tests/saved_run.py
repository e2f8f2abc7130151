"""nbval's checks, applied to a notebook a reader's JupyterLab has just run and saved.

The suite executes each notebook once: the browser test runs it in JupyterLab (as a reader does)
and saves it, and these functions then check what nbval would have checked on its own run: every
code cell ran and none failed, and every cell tagged ``nbval-check-output`` (or marked
``# NBVAL_CHECK_OUTPUT``) reproduced its committed output, with the volatile text that
``tests/nbval_sanitize.cfg`` lists masked. nbval's own stream handling and sanitize-file reader are
used, so a cell passes here exactly when it would pass under ``pytest --nbval-lax``.
"""

from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from pathlib import Path

import nbformat
from nbval.plugin import (
    coalesce_streams,
    get_sanitize_patterns,
    transform_streams_for_comparison,
)

SANITIZE_FILE = Path(__file__).resolve().parent / "nbval_sanitize.cfg"
CHECK_TAG, CHECK_COMMENT = "nbval-check-output", "# NBVAL_CHECK_OUTPUT"
# what nbval leaves out of a comparison (its defaults, without --nbdime)
SKIP_COMPARE = {
    "metadata",
    "traceback",
    "prompt_number",
    "output_type",
    "name",
    "execution_count",
    "application/vnd.jupyter.widget-view+json",
    "image/png",
    "image/jpeg",
}


def sanitize_patterns(path: Path = SANITIZE_FILE) -> dict[str, str]:
    return dict(get_sanitize_patterns(path.read_text(encoding="utf-8")))


def checked_output(cell: nbformat.NotebookNode) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return CHECK_TAG in tags or any(
        line.strip() == CHECK_COMMENT for line in cell.source.splitlines()
    )


def comparable(outputs: list, patterns: dict[str, str]) -> dict[str, list]:
    """Outputs flattened by key (data MIME types included), sanitized, as nbval compares them."""

    def clean(value: object) -> object:
        if not isinstance(value, str):
            return value
        for regex, replace in patterns.items():
            value = re.sub(regex, replace, value)
        return value

    flat: dict[str, list] = defaultdict(list)
    streams = transform_streams_for_comparison(coalesce_streams(copy.deepcopy(outputs)))
    for output in streams:
        for key, value in output.items():
            if key in SKIP_COMPARE:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in SKIP_COMPARE:
                        flat[mime].append(clean(data))
            else:
                flat[key].append(clean(value))
    return dict(flat)


def saved_run_problems(committed: Path, ran: dict) -> list[str]:
    """What nbval would report on ``ran`` (a notebook's JSON after Run All) against ``committed``."""
    reference = nbformat.read(committed, as_version=4)
    executed = nbformat.reads(json.dumps(ran), as_version=4)  # multi-line sources joined
    patterns = sanitize_patterns()
    reference_cells = [c for c in reference.cells if c.cell_type == "code"]
    executed_cells = [c for c in executed.cells if c.cell_type == "code"]
    if len(reference_cells) != len(executed_cells):
        return [f"{len(executed_cells)} code cells ran, the notebook has {len(reference_cells)}"]
    problems = []
    for number, (ref, run) in enumerate(zip(reference_cells, executed_cells, strict=True)):
        if not run.source.strip():
            continue
        if run.get("execution_count") is None:
            problems.append(f"code cell {number} did not run")
        errors = [o for o in run.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            problems.append(f"code cell {number} failed: {errors[0].get('ename')}: "
                            f"{errors[0].get('evalue')}")  # fmt: skip
        elif checked_output(ref):
            expected = comparable(ref.get("outputs", []), patterns)
            got = comparable(run.get("outputs", []), patterns)
            if expected != got:
                problems.append(
                    f"code cell {number} ({CHECK_TAG}) differs from its committed output:\n"
                    f"committed: {expected}\nthis run:  {got}"
                )
    return problems
