"""Tables: what a notebook, the bench and the GPU check print, so they show figures, not printing.

One renderer for both forms: aligned text (a saved notebook, a terminal and nbval's output check
all read it alike) and markdown (the bench's output and the GPU report). Columns are
``(key, title, format)``: a column formatted with ``"{}"`` holds names and is aligned left, any
other holds figures and is aligned right; a missing figure shows as n/a, never as a made-up 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

__all__ = ["cell_text", "Column", "columns_table", "markdown_cell", "TableStyle", "text_table"]

TableStyle = Literal["text", "markdown"]
Column = tuple[str, str, str]  # (key in each row, title, format such as "{:.1f}")


def text_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None
) -> str:
    """Columns as wide as their widest cell, aligned by ``align`` ('l' or 'r' per column; by
    default the first column left, numbers right). Cells are shown with ``str``: format numbers
    before passing them."""
    align = _checked_align(header, align)
    lines = [[str(cell) for cell in header]]
    for row in rows:
        cells = [str(cell) for cell in row]
        if len(cells) != len(header):
            raise ValueError(f"a row has {len(cells)} cells for {len(header)} columns: {cells}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if side == "l" else cell.rjust(width)
            for cell, width, side in zip(line, widths, align, strict=True)
        ).rstrip()
        for line in lines
    )


def _checked_align(header: Sequence[str], align: str | None) -> str:
    """``align`` (default: the first column left, the rest right), checked against ``header``."""
    align = align if align is not None else "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one 'l' or 'r' per column ({len(header)}), got {align!r}")
    return align


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None
) -> str:
    """A markdown table; ``align`` as for `text_table`. A cell's ``|`` and line breaks are
    escaped, so a message in a cell cannot break its row."""
    align = _checked_align(header, align)
    lines = [
        _markdown_row(header),
        _markdown_row("---" if side == "l" else "---:" for side in align),
    ]
    for row in rows:
        cells = [str(cell) for cell in row]
        if len(cells) != len(header):
            raise ValueError(f"a row has {len(cells)} cells for {len(header)} columns: {cells}")
        lines.append(_markdown_row(cells))
    return "\n".join(lines)


def markdown_cell(text: object) -> str:
    """``text`` safe inside a markdown table cell: ``|`` escaped, line breaks as spaces."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _markdown_row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"


def cell_text(value: object, fmt: str = "{}") -> str:
    """A value as a table shows it: n/a where absent (never a 0), yes/no for a flag."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return fmt.format(value)


def columns_table(
    rows: Sequence[Mapping[str, object]], columns: Sequence[Column], style: TableStyle = "text"
) -> str:
    """Dict rows as a table: ``columns`` are ``(key, title, format)``, names (format ``"{}"``)
    aligned left and figures right; a missing or None value shows as n/a."""
    header = [title for _, title, _ in columns]
    align = "".join("l" if fmt == "{}" else "r" for _, _, fmt in columns)
    cells = [[cell_text(row.get(key), fmt) for key, _, fmt in columns] for row in rows]
    if style == "markdown":
        return markdown_table(header, cells, align)
    return text_table(header, cells, align)
