"""The printed tables: aligned, complete, and made from what they are given."""

from __future__ import annotations

import pytest

from tutorial_utils.display.tables import text_table


def test_text_table_aligns_columns_and_refuses_ragged_rows() -> None:
    table = text_table(("name", "MiB"), [("plain", "12.5"), ("checkpointed", "3.0")])
    lines = table.splitlines()
    assert lines == ["name           MiB", "plain         12.5", "checkpointed   3.0"]
    assert text_table(("a", "b"), [("x", "y")], "rl").splitlines()[1] == "x  y"
    with pytest.raises(ValueError, match="one .l. or .r. per column"):
        text_table(("a", "b"), [], "l")
    with pytest.raises(ValueError, match="2 columns"):
        text_table(("name", "MiB"), [("plain",)])


def test_one_renderer_gives_text_and_markdown_from_the_same_columns() -> None:
    from tutorial_utils.display.tables import columns_table

    rows = [
        {"name": "plain", "peak": 12.5, "fits": True},
        {"name": "a | b\nc", "peak": None, "fits": False},
    ]
    columns = [("name", "run", "{}"), ("peak", "peak MiB", "{:.1f}"), ("fits", "fits", "{}")]
    text = columns_table(rows, columns).splitlines()
    assert text[1].split() == ["plain", "12.5", "yes"]
    assert text[1].index("12.5") + 4 == text[0].index("peak MiB") + 8  # figures right-aligned
    markdown = columns_table(rows, columns, "markdown").splitlines()
    assert markdown[:2] == ["| run | peak MiB | fits |", "| --- | ---: | --- |"]
    assert markdown[2] == "| plain | 12.5 | yes |"
    assert markdown[3] == "| a \\| b c | n/a | no |"  # a cell cannot break its row
