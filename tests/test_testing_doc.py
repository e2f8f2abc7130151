"""docs/TESTING.md stays readable: each table cell says what a test checks, how to run it or its
last result, and no cell carries history (that is the git log's job)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "TESTING.md"
MAX_WORDS_PER_CELL = 80


def table_cells(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of every cell of every markdown table, header rows included."""
    cells = []
    for number, line in enumerate(markdown.splitlines(), start=1):
        if not line.startswith("|") or re.fullmatch(r"[|\s:-]+", line):
            continue
        cells += [(number, cell.strip()) for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
    return cells


def test_the_splitter_reads_cells_and_skips_rules() -> None:
    table = "| a | b c |\n| --- | --- |\n| `x \\| y` | d |\n"
    assert table_cells(table) == [(1, "a"), (1, "b c"), (3, "`x \\| y`"), (3, "d")]


def test_no_table_cell_runs_over_80_words() -> None:
    long = [
        f"line {number}: {len(text.split())} words: {text[:60]}..."
        for number, text in table_cells(DOC.read_text(encoding="utf-8"))
        if len(text.split()) > MAX_WORDS_PER_CELL
    ]
    assert not long, "shorten these cells of docs/TESTING.md (history goes to the git log):\n" + (
        "\n".join(long)
    )
