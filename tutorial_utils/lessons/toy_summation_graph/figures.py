"""Notebook 01's figures (each returns a Figure): the graph, its growth, the chain's costs."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from tutorial_utils.lessons.toy_summation_graph.chain import every_kth_layer_cost, optimal_k
from tutorial_utils.lessons.toy_summation_graph.trees import (
    ORDERS,
    Step,
    SummationTree,
    build_tree,
    evaluation_steps,
    peak_index,
    peak_memory,
)

__all__ = [
    "ALIVE_COLOR",
    "activation_roles",
    "chain_cost_figure",
    "draw_graph",
    "evaluation_figure",
    "idea_figure",
    "node_positions",
    "peak_growth_figure",
]

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
    trees = [build_tree(shape, count) for count in counts]
    curve_ax.plot(counts, [peak_memory(t, "keep_all", convention) for t in trees], label="keep all")
    for name in ORDERS:
        curve_ax.plot(
            counts,
            [peak_memory(t, "free_as_you_go", convention, name) for t in trees],
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


KEPT_COLOR, RECOMPUTED_COLOR = "#f28e2b", "#4e79a7"


def activation_roles(n_layers: int, segments: int) -> list[str]:
    """Each layer output's role under ``checkpoint_sequential(segments)``: "kept" through the
    forward pass for backward, or "dropped" there and "recomputed" in backward (0: none)."""
    if segments <= 1:
        return ["kept"] * n_layers
    size = n_layers // segments
    last_start = size * (segments - 1)  # the last segment runs as usual
    inputs = {size * j for j in range(1, segments)}  # outputs that start a later segment
    return [
        "kept" if layer >= last_start or layer + 1 in inputs else "recomputed"
        for layer in range(n_layers)
    ]


def idea_figure(n_layers: int = 8, segment_counts: tuple[int, ...] = (0, 4)) -> Figure:
    """The idea in one picture: for each segment count, the layer outputs the forward pass keeps
    for backward, and those it drops and the backward pass computes again."""
    figure = Figure(figsize=(9, 1.9 * len(segment_counts) + 0.5), layout="constrained")
    axes = figure.subplots(len(segment_counts), 1, squeeze=False)[:, 0]
    for ax, segments in zip(axes, segment_counts, strict=True):
        roles = activation_roles(n_layers, segments)
        for row, (pass_name, y) in enumerate((("forward", 1.0), ("backward", 0.0))):
            ax.annotate(pass_name, (-0.7, y), ha="right", va="center", fontsize=10)
            for layer, role in enumerate(roles):
                x = layer
                face = KEPT_COLOR if role == "kept" else "white"
                edge, style = "0.25", "-"
                if role == "recomputed":
                    face, style = ("white", "--") if row == 0 else (RECOMPUTED_COLOR, "-")
                ax.add_patch(_box(x, y, face, edge, style))
                ax.annotate(f"a{layer + 1}", (x, y), ha="center", va="center", fontsize=9,
                            color="white" if face == RECOMPUTED_COLOR else "black")  # fmt: skip
        ax.annotate(
            "", (-0.3, 0.5), (n_layers - 0.7, 0.5), arrowprops={"arrowstyle": "->", "color": "0.5"}
        )  # fmt: skip: backward's way
        if segments > 1:
            size = n_layers // segments
            for start in range(0, size * (segments - 1), size):
                ax.plot([start - 0.4, start + size - 0.6], [1.45, 1.45], color="0.3", lw=2)
        kept = roles.count("kept")
        title = (
            f"no checkpointing: the forward pass keeps all {n_layers} layer outputs"
            if segments <= 1
            else f"{segments} segments (bars: checkpointed): keeps {kept}, drops "
            f"{n_layers - kept} and recomputes them in backward"
        )
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlim(-2.2, n_layers)
        ax.set_ylim(-0.6, 1.7)
        ax.set_axis_off()
    handles = [
        _box(0, 0, KEPT_COLOR, "0.25", "-"),
        _box(0, 0, "white", "0.25", "--"),
        _box(0, 0, RECOMPUTED_COLOR, "0.25", "-"),
    ]
    labels = ["kept for backward", "dropped after use", "recomputed in backward"]
    figure.legend(handles, labels, loc="outside lower center", ncols=3, frameon=False)
    return figure


def _box(x: float, y: float, face: str, edge: str, style: str):
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x - 0.35, y - 0.3), 0.7, 0.6, boxstyle="round,pad=0.02",
                          facecolor=face, edgecolor=edge, linestyle=style)  # fmt: skip
