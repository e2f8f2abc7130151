"""Aligned text tables: what a notebook prints, so its cells show the experiment, not the printing.

Text (not HTML) because a saved notebook, a terminal and nbval's output check all read it alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tutorial_utils.training.loop import History


def text_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None
) -> str:
    """Columns as wide as their widest cell, aligned by ``align`` ('l' or 'r' per column; by
    default the first column left, numbers right). Cells are shown with ``str``: format numbers
    before passing them."""
    align = align if align is not None else "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one 'l' or 'r' per column ({len(header)}), got {align!r}")
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


def epoch_table(histories: Mapping[str, History]) -> str:
    """Every epoch of every run: accuracies, test loss and the training pass's seconds."""
    rows = [
        (
            label,
            record.epoch,
            "n/a" if record.train_accuracy is None else f"{record.train_accuracy:.1f}",
            f"{record.val_accuracy:.1f}",
            f"{record.val_loss:.4f}",
            f"{record.seconds:.2f}",
        )
        for label, history in histories.items()
        for record in history.records
    ]
    header = ("run", "epoch", "train acc %", "test acc %", "test loss", "s/epoch")
    return text_table(header, rows)


def columns_table(rows: Sequence[Mapping[str, object]], columns: Sequence[tuple]) -> str:
    """Dict rows as a `text_table`: ``columns`` are ``(key, title, format)``; a missing or None
    value shows as n/a (nothing to show, never a 0)."""
    cells = [
        ["n/a" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in columns]
        for row in rows
    ]
    return text_table([title for _, title, _ in columns], cells)
