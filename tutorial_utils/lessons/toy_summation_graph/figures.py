"""Notebook 01's figures (each returns a Figure): the graph, its growth, the chain's costs."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from tutorial_utils.lessons.toy_summation_graph.chain import (
    ModelComparison,
    every_kth_layer_cost,
    optimal_k,
    sequential_cost,
)
from tutorial_utils.lessons.toy_summation_graph.trees import (
    ORDERS,
    Step,
    SummationTree,
    build_tree,
    evaluation_steps,
    peak_growth,
    peak_index,
)
from tutorial_utils.units import MiB

# --- figures ----------------------------------------------------------------------------------

ALIVE_COLOR = "#f28e2b"
FREED_COLOR = "#d9d9d9"
PENDING_COLOR = "white"


def node_positions(tree: SummationTree) -> dict[int, tuple[float, float]]:
    """Leaves spread left to right in depth-first order, each sum centred above its inputs."""
    positions: dict[int, tuple[float, float]] = {}
    next_leaf_x = [0.0]

    def place(node: int) -> float:
        if not tree.inputs[node]:
            x = next_leaf_x[0]
            next_leaf_x[0] += 1.0
        else:
            x = sum(place(source) for source in tree.inputs[node]) / len(tree.inputs[node])
        positions[node] = (x, float(tree.height(node)))
        return x

    place(tree.root)
    return positions


def draw_graph(tree: SummationTree, step: Step | None = None, ax=None) -> Figure:
    """The tree, alive values filled, freed ones grey, not yet computed ones hollow."""
    if ax is None:
        figure = Figure(figsize=(4.5, 3.2), layout="constrained")
        ax = figure.subplots()
    positions = node_positions(tree)
    many = len(tree.values) > 31
    for node, node_inputs in enumerate(tree.inputs):
        for source in node_inputs:
            (x0, y0), (x1, y1) = positions[source], positions[node]
            ax.plot([x0, x1], [y0, y1], color="0.6", linewidth=0.8, zorder=1)
    for node, (x, y) in positions.items():
        if step is None or node in step.alive:
            face = ALIVE_COLOR if step is not None else "#a0cbe8"
        else:
            face = FREED_COLOR if node in step.computed else PENDING_COLOR
        ax.scatter(x, y, s=60 if many else 520, color=face, edgecolors="0.25", zorder=2)
        if not many:
            ax.annotate(tree.label(node), (x, y), ha="center", va="center", fontsize=9, zorder=3)
    ax.set_axis_off()
    ax.margins(0.12)
    return ax.figure


def evaluation_figure(tree: SummationTree, steps: list[Step], index: int, title: str) -> Figure:
    """The tree at step ``index`` next to the memory count of every step (peak marked)."""
    if not 0 <= index < len(steps):
        raise ValueError(f"step index must be in 0..{len(steps) - 1}, got {index}")
    figure = Figure(figsize=(9, 3.4), layout="constrained")
    graph_ax, memory_ax = figure.subplots(1, 2, width_ratios=[1.1, 1])
    draw_graph(tree, steps[index], ax=graph_ax)
    graph_ax.set_title(f"step {index}: {steps[index].action}", fontsize=10)
    memory = [step.memory for step in steps]
    colors = ["0.75"] * len(steps)
    colors[index] = ALIVE_COLOR
    memory_ax.bar(range(len(steps)), memory, color=colors)
    memory_ax.axhline(max(memory), color="crimson", linestyle="--", linewidth=1)
    memory_ax.text(0, max(memory) + 0.1, f"peak {max(memory)}", color="crimson", va="bottom")
    memory_ax.set_xlabel("step")
    memory_ax.set_ylabel("values in memory")
    memory_ax.set_ylim(0, max(memory) + 1.2)
    memory_ax.set_title(title, fontsize=10)
    return figure


def peak_growth_figure(
    shape: str, n_leaves: int, order: str, convention: str, max_leaves: int = 64
) -> Figure:
    """The tree at its peak (free as you go), next to peak memory against leaf count."""
    tree = build_tree(shape, n_leaves)
    steps = evaluation_steps(tree, "free_as_you_go", convention, order)
    figure = Figure(figsize=(10, 3.6), layout="constrained")
    graph_ax, curve_ax = figure.subplots(1, 2, width_ratios=[1.2, 1])
    peak_at = peak_index(steps)
    draw_graph(tree, steps[peak_at], ax=graph_ax)
    graph_ax.set_title(
        f"{shape} tree, {n_leaves} leaves, {order}: peak {steps[peak_at].memory}", fontsize=10
    )
    counts = list(range(2, max(max_leaves, n_leaves) + 1))
    curve_ax.plot(counts, peak_growth(shape, counts, "keep_all", convention), label="keep all")
    for name in ORDERS:
        curve_ax.plot(
            counts,
            peak_growth(shape, counts, "free_as_you_go", convention, name),
            label=f"free as you go, {name}",
            linewidth=2.5 if name == order else 1.2,
        )
    curve_ax.plot([n_leaves], [steps[peak_at].memory], "o", color="crimson", label="this tree")
    curve_ax.set_xlabel("leaves")
    curve_ax.set_ylabel("peak values in memory")
    curve_ax.set_title(f"{shape} trees, convention '{convention}'", fontsize=10)
    curve_ax.legend(fontsize=8)
    return figure


def chain_cost_figure(n_layers: int, k: int) -> Figure:
    """Peak activations and recomputed layers against k, the optimum and the chosen k marked."""
    ks = list(range(1, n_layers + 1))
    plans = [every_kth_layer_cost(n_layers, value) for value in ks]
    best = optimal_k(n_layers)
    best_k = best.segments[0][1]
    figure = Figure(figsize=(9, 3.6), layout="constrained")
    memory_ax, recompute_ax = figure.subplots(1, 2)
    memory_ax.plot(ks, [p.peak_activations for p in plans], label="checkpoint every k-th layer")
    memory_ax.axhline(n_layers, color="0.5", linestyle="--", label=f"keep all ({n_layers})")
    memory_ax.plot(
        ks, [n_layers / value + value for value in ks], ":", color="0.3", label="n/k + k"
    )
    memory_ax.plot([best_k], [best.peak_activations], "*", markersize=14, color="crimson")
    memory_ax.annotate(
        f"optimum k={best_k}: {best.peak_activations}\n(2*sqrt(n) = {2 * math.sqrt(n_layers):.1f})",
        (best_k, best.peak_activations),
        textcoords="offset points",
        xytext=(8, 12),
        fontsize=8,
    )
    recompute_ax.plot(ks, [p.recomputed_layers for p in plans], color="tab:green")
    recompute_ax.axhline(n_layers, color="0.5", linestyle="--", label="one full forward")
    for ax in (memory_ax, recompute_ax):
        ax.axvline(k, color=ALIVE_COLOR, linewidth=2, label=f"k={k}")
        ax.set_xlabel("k (layers per segment)")
        ax.legend(fontsize=8)
    memory_ax.set_ylabel("peak stored activations")
    memory_ax.set_ylim(0, n_layers * 1.35 + 2)
    memory_ax.set_title(f"chain of n={n_layers} layers", fontsize=10)
    recompute_ax.set_ylabel("recomputed layer forwards")
    recompute_ax.set_title("extra work", fontsize=10)
    return figure


def measured_vs_model_figure(
    comparisons: list[ModelComparison], n_blocks: int, unit_bytes: int, title: str
) -> Figure:
    """Measured activations next to the model curve (units), and the whole measured peak (MiB)."""
    figure = Figure(figsize=(10, 3.8), layout="constrained")
    units_ax, breakdown_ax = figure.subplots(1, 2)
    counts = list(range(0, n_blocks + 1))
    model = [sequential_cost(n_blocks, count).peak_activations for count in counts]
    units_ax.plot(counts, model, color="0.4", label="chain model (stored layer inputs)")
    measured = [c.measured_units for c in comparisons]
    segments = [c.segments for c in comparisons]
    units_ax.plot(segments, measured, "o", color=ALIVE_COLOR, label="measured activations at peak")
    units_ax.plot(segments, [c.model_units for c in comparisons], "x", color="0.2")
    units_ax.set_xlabel("segments (checkpoint_sequential)")
    units_ax.set_ylabel(f"activations (1 unit = {unit_bytes / MiB:.2f} MiB)")
    units_ax.set_ylim(0, max(max(measured), max(model)) * 1.15)
    units_ax.legend(fontsize=8)
    units_ax.set_title(title, fontsize=10)
    bottom = [0.0] * len(comparisons)
    positions = range(len(comparisons))
    for category in ("parameters", "optimizer_state", "gradients", "activations"):
        heights = [c.breakdown[category] / MiB for c in comparisons]
        breakdown_ax.bar(positions, heights, bottom=bottom, label=category.replace("_", " "))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    breakdown_ax.set_xticks(list(positions), [str(s) for s in segments])
    breakdown_ax.set_xlabel("segments")
    breakdown_ax.set_ylabel("tracked peak of the training step (MiB)")
    breakdown_ax.legend(fontsize=8)
    breakdown_ax.set_title("what the peak is made of", fontsize=10)
    return figure
