"""The printed tables: aligned, complete, and made from what they are given."""

from __future__ import annotations

import pytest
import torch

from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.display.tables import text_table
from tutorial_utils.lessons.toy_summation_graph import (
    article_tree,
    compare_with_model,
    equal_blocks_chain,
    optimal_k,
    tables,
)
from tutorial_utils.measurement.step import sweep_strategies


def test_text_table_aligns_columns_and_refuses_ragged_rows() -> None:
    table = text_table(("name", "MiB"), [("plain", "12.5"), ("checkpointed", "3.0")])
    lines = table.splitlines()
    assert lines == ["name           MiB", "plain         12.5", "checkpointed   3.0"]
    assert text_table(("a", "b"), [("x", "y")], "rl").splitlines()[1] == "x  y"
    with pytest.raises(ValueError, match="one .l. or .r. per column"):
        text_table(("a", "b"), [], "l")
    with pytest.raises(ValueError, match="2 columns"):
        text_table(("name", "MiB"), [("plain",)])


def test_the_toy_tables_print_the_simulated_peaks() -> None:
    assert tables.conventions_table(article_tree()).splitlines()[0].split()[:2] == [
        "convention",
        "leaves",
    ]
    shapes = tables.tree_shapes_table((4, 8)).splitlines()
    assert [line.split()[0] for line in shapes[1:]] == ["4", "8"]
    rule = tables.sqrt_rule_table((16,)).splitlines()[1].split()
    assert rule[:3] == ["16", str(optimal_k(16).peak_activations), "8.0"]
    plans = tables.segment_plans_table(4, (0, 2)).splitlines()
    assert "[0,2)* [2,4)" in plans[2]


def test_the_measured_tables_show_each_record() -> None:
    torch.manual_seed(0)
    chain = equal_blocks_chain(4, 8)
    inputs, targets = torch.randn(4, 8), torch.randint(0, 8, (4,))
    unit = inputs.numel() * inputs.element_size()
    splits = [equal_segments(0), equal_segments(2)]
    records = sweep_strategies(chain, inputs, targets, splits, device="cpu")
    table = tables.measured_vs_model_table(compare_with_model(records, 4, unit), records)
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["0", "2"]
    no_grad = tables.no_grad_table(chain, inputs, 2, unit).splitlines()
    assert no_grad[1].startswith("recording gradients") and "no_grad" in no_grad[2]


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
