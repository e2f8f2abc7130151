"""Notebook 01's widget panels and what they draw: the first article's summation graph simulated
(``trees``), the chain-of-layers cost model (``chain``), the figures and the panels. The notebook's
measurements are in its own cells; it imports these names from here."""

from tutorial_utils.lessons.toy_summation_graph.chain import (
    every_kth_layer_cost,
    optimal_k,
    sequential_cost,
    sizes_for,
)
from tutorial_utils.lessons.toy_summation_graph.figures import draw_graph, idea_figure
from tutorial_utils.lessons.toy_summation_graph.panels import (
    chain_panel,
    evaluation_panel,
    growth_panel,
    show_figure,
)
from tutorial_utils.lessons.toy_summation_graph.trees import (
    CONVENTIONS,
    article_tree,
    balanced_tree,
    chain_tree,
    evaluation_steps,
    format_steps,
    peak_memory,
)

__all__ = [
    "CONVENTIONS",
    "article_tree",
    "balanced_tree",
    "chain_panel",
    "chain_tree",
    "draw_graph",
    "evaluation_panel",
    "evaluation_steps",
    "every_kth_layer_cost",
    "format_steps",
    "growth_panel",
    "idea_figure",
    "optimal_k",
    "peak_memory",
    "sequential_cost",
    "show_figure",
    "sizes_for",
]
