"""The sliders of notebook 01, each a thin shell around a plain ``*_view`` function.

The views return ``(text, Figure)`` so tests can call them without a kernel; the panels only wire
ipywidgets controls (APIs shared by ipywidgets 7.7 and 8) to them and redraw on every change.
"""

from __future__ import annotations

import io

import ipywidgets as widgets
from IPython.display import Image, display
from matplotlib.figure import Figure

from tutorial_utils.display.widgets import PanelBox, figure_output, int_slider
from tutorial_utils.lessons.toy_summation_graph.chain import (
    every_kth_layer_cost,
    optimal_k,
)
from tutorial_utils.lessons.toy_summation_graph.figures import (
    chain_cost_figure,
    evaluation_figure,
    peak_growth_figure,
)
from tutorial_utils.lessons.toy_summation_graph.trees import (
    CONVENTIONS,
    ORDERS,
    SHAPES,
    SummationTree,
    alive_labels,
    article_tree,
    build_tree,
    evaluation_steps,
    peak_memory,
)

__all__ = [
    "STRATEGY_LABELS",
    "chain_panel",
    "chain_view",
    "evaluation_panel",
    "evaluation_view",
    "growth_panel",
    "growth_view",
    "show_figure",
]

STRATEGY_LABELS = {"keep everything": "keep_all", "free as you go": "free_as_you_go"}


def show_figure(figure: Figure) -> None:
    """Display a Figure as a PNG, whatever matplotlib backend the kernel has."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    display(Image(data=buffer.getvalue(), format="png"))


def evaluation_view(
    tree: SummationTree, step: int, strategy: str, convention: str
) -> tuple[str, Figure]:
    """One step of the evaluation: a line of text and the figure (step clamped to the last)."""
    steps = evaluation_steps(tree, strategy, convention)
    index = min(max(step, 0), len(steps) - 1)
    current = steps[index]
    peak = max(s.memory for s in steps)
    text = (
        f"step {index} of {len(steps) - 1}: {current.action} | alive: "
        f"{alive_labels(tree, current.alive)} | memory {current.memory} (peak {peak})"
    )
    return text, evaluation_figure(tree, steps, index, f"{strategy}, convention '{convention}'")


def growth_view(shape: str, n_leaves: int, order: str, convention: str) -> tuple[str, Figure]:
    """Peaks of one tree under both strategies, and the growth curves around it."""
    tree = build_tree(shape, n_leaves)
    keep = peak_memory(tree, "keep_all", convention, order)
    free = peak_memory(tree, "free_as_you_go", convention, order)
    text = (
        f"{shape} tree, {n_leaves} leaves, {order}, convention '{convention}': "
        f"keep everything {keep}, free as you go {free}"
    )
    return text, peak_growth_figure(shape, n_leaves, order, convention)


def chain_view(n_layers: int, k: int) -> tuple[str, Figure]:
    """Cost of checkpointing every k-th layer of an n-layer chain, against the optimum."""
    k = min(max(k, 1), n_layers)
    plan = every_kth_layer_cost(n_layers, k)
    best = optimal_k(n_layers)
    text = (
        f"n={n_layers}, k={k}: {len(plan.segments)} segments, peak {plan.peak_activations} "
        f"activations (keep all: {n_layers}), {plan.recomputed_layers} layer forwards recomputed; "
        f"optimum k={best.segments[0][1]}: peak {best.peak_activations}"
    )
    return text, chain_cost_figure(n_layers, k)


def _show(view_result: tuple[str, Figure]) -> None:
    text, figure = view_result
    print(text)
    show_figure(figure)


def _panel(children: list[widgets.Widget], first: tuple[str, Figure]) -> PanelBox:
    """The panel's box, with a picture of its first view for pages without a kernel."""
    box = PanelBox(children)
    box.keep_picture((figure_output(first[1]),))
    return box


def evaluation_panel(tree: SummationTree | None = None) -> PanelBox:
    """Step slider over the evaluation, strategy and convention dropdowns."""
    tree = tree or article_tree()
    strategy = widgets.Dropdown(options=list(STRATEGY_LABELS.items()), description="strategy")
    convention = widgets.Dropdown(options=list(CONVENTIONS), value="article", description="count")
    step = int_slider(
        "step", 0, 0, len(evaluation_steps(tree, strategy.value, convention.value)) - 1
    )

    def fit_step_range(_change=None) -> None:
        step.max = len(evaluation_steps(tree, strategy.value, convention.value)) - 1

    strategy.observe(fit_step_range, names="value")
    convention.observe(fit_step_range, names="value")
    output = widgets.interactive_output(
        lambda step, strategy, convention: _show(evaluation_view(tree, step, strategy, convention)),
        {"step": step, "strategy": strategy, "convention": convention},
    )
    first = evaluation_view(tree, step.value, strategy.value, convention.value)
    return _panel([widgets.HBox([strategy, convention]), step, output], first)


def growth_panel() -> PanelBox:
    """Leaves slider with shape, order and convention dropdowns."""
    leaves = int_slider("leaves", 8, 2, 64)
    shape = widgets.Dropdown(options=list(SHAPES), value="balanced", description="shape")
    order = widgets.Dropdown(options=list(ORDERS), value="depth_first", description="order")
    convention = widgets.Dropdown(options=list(CONVENTIONS), value="article", description="count")
    output = widgets.interactive_output(
        lambda shape, n_leaves, order, convention: _show(
            growth_view(shape, n_leaves, order, convention)
        ),
        {"shape": shape, "n_leaves": leaves, "order": order, "convention": convention},
    )
    first = growth_view(shape.value, leaves.value, order.value, convention.value)
    return _panel([widgets.HBox([shape, order, convention]), leaves, output], first)


def chain_panel() -> PanelBox:
    """Sliders for the number of layers n and the checkpoint spacing k (k follows n)."""
    n_layers = int_slider("n layers", 16, 2, 100)
    k = int_slider("k", 4, 1, 16)

    def fit_k_range(change) -> None:
        k.max = change["new"]

    n_layers.observe(fit_k_range, names="value")
    output = widgets.interactive_output(
        lambda n_layers, k: _show(chain_view(n_layers, k)), {"n_layers": n_layers, "k": k}
    )
    return _panel([n_layers, k, output], chain_view(n_layers.value, k.value))
