"""The first article's summation graph, simulated step by step, and its chain-of-layers sequel.

The article adds the leaves 1, 2, 4, 5 of a small tree up to 12 and says that storing every node
costs 7 units while freeing the inputs of each sum costs 3. Whether it is 3 depends on how one
counts, so the counting convention is an explicit argument here and every peak is computed by
walking the evaluation, never asserted. The chain model is the same bookkeeping for backprop
through ``n`` layers: keep every activation, or keep every k-th and recompute the rest; a real
chain of equal blocks, measured by ``tutorial_utils.measurement``, is set beside it. The figures are
notebook 01's (each returns a Figure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.segments import forward_segments, segment_boundaries
from tutorial_utils.measurement.step import SweepRecord
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.units import MB

STRATEGIES = ("keep_all", "free_as_you_go")


@dataclass(frozen=True)
class ChainSizes:
    """The real chain of equal blocks that notebook 01 measures."""

    depth: int  # blocks
    width: int  # features per block
    batch: int
    repeats: int  # timed steps per segment count: their range is the noise


def sizes_for(profile: Profile) -> ChainSizes:
    """Notebook 01's chain for a profile: seconds in ``ci``, larger where timing can resolve it."""
    if profile.name == "ci":
        depth, width, batch, repeats = 16, 64, 1024, 1
    elif profile.name == "cpu":
        depth, width, batch, repeats = 16, 256, 2048, 3
    else:  # gpu and article: a chain long enough for sqrt(n) to be visible
        depth, width, batch, repeats = 25, 512, 4096, 3
    return ChainSizes(depth, width, batch, profile.capped(repeats) or repeats)


ORDERS = ("depth_first", "level_order")
SHAPES = ("balanced", "chain")


@dataclass(frozen=True)
class Convention:
    """How memory is counted: one unit per value held, plus these two choices."""

    name: str
    leaves_up_front: bool  # every leaf is in memory before the first sum (else read just in time)
    sum_in_place: bool  # a sum may write over an input whose last use it is


CONVENTIONS: dict[str, Convention] = {
    convention.name: convention
    for convention in (
        Convention("plain", leaves_up_front=True, sum_in_place=False),
        Convention("leaves_read_when_needed", leaves_up_front=False, sum_in_place=False),
        Convention("sum_in_place", leaves_up_front=True, sum_in_place=True),
        Convention("article", leaves_up_front=False, sum_in_place=True),
    )
}


@dataclass(frozen=True)
class SummationTree:
    """A tree whose leaves hold numbers and whose inner nodes add their inputs.

    Node ids are positions in ``values``; every input id is smaller than the id of its sum, so the
    ids are a valid evaluation order and the last node is the root.
    """

    values: tuple[int, ...]
    inputs: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.values) != len(self.inputs) or not self.values:
            raise ValueError("values and inputs must be non-empty and of equal length")
        consumers = [0] * len(self.values)
        for node, node_inputs in enumerate(self.inputs):
            if node_inputs and self.values[node] != sum(self.values[i] for i in node_inputs):
                raise ValueError(f"node {node} must hold the sum of its inputs {node_inputs}")
            for source in node_inputs:
                if not 0 <= source < node:
                    raise ValueError(f"node {node} reads {source}: inputs must come earlier")
                consumers[source] += 1
        if any(count != 1 for count in consumers[:-1]) or consumers[-1] != 0:
            raise ValueError("every node but the last (the root) must feed exactly one sum")

    @property
    def root(self) -> int:
        return len(self.values) - 1

    @property
    def leaves(self) -> tuple[int, ...]:
        return tuple(node for node, node_inputs in enumerate(self.inputs) if not node_inputs)

    @property
    def sums(self) -> tuple[int, ...]:
        return tuple(node for node, node_inputs in enumerate(self.inputs) if node_inputs)

    def height(self, node: int) -> int:
        """0 for a leaf, else one more than its highest input."""
        return 1 + max((self.height(i) for i in self.inputs[node]), default=-1)

    def label(self, node: int) -> str:
        return str(self.values[node])


def tree_from_sums(leaf_values: list[int], sums: list[tuple[int, ...]]) -> SummationTree:
    """Leaves get ids 0.., each sum (a tuple of earlier ids) the next id."""
    values = list(leaf_values)
    for node_inputs in sums:
        values.append(sum(values[i] for i in node_inputs))
    return SummationTree(tuple(values), tuple([()] * len(leaf_values) + [tuple(s) for s in sums]))


def article_tree() -> SummationTree:
    """The article's graph: 1 + 2 = 3, 4 + 5 = 9, 3 + 9 = 12."""
    return tree_from_sums([1, 2, 4, 5], [(0, 1), (2, 3), (4, 5)])


def _check_leaf_count(n_leaves: int) -> None:
    if isinstance(n_leaves, bool) or not isinstance(n_leaves, int) or n_leaves < 2:
        raise ValueError(
            f"a summation tree needs an integer number of leaves >= 2, got {n_leaves!r}"
        )


def balanced_tree(n_leaves: int) -> SummationTree:
    """Leaves 1..n added pairwise, level by level (an odd node out moves up a level)."""
    _check_leaf_count(n_leaves)
    sums: list[tuple[int, ...]] = []
    level = list(range(n_leaves))
    next_id = n_leaves
    while len(level) > 1:
        upper = []
        for left in range(0, len(level) - 1, 2):
            sums.append((level[left], level[left + 1]))
            upper.append(next_id)
            next_id += 1
        if len(level) % 2:
            upper.append(level[-1])
        level = upper
    return tree_from_sums(list(range(1, n_leaves + 1)), sums)


def chain_tree(n_leaves: int) -> SummationTree:
    """Leaves 1..n added left to right, ((1 + 2) + 3) + ...: the shape of a chain of layers."""
    _check_leaf_count(n_leaves)
    sums = [(0, 1)] + [(n_leaves + i - 1, i + 1) for i in range(1, n_leaves - 1)]
    return tree_from_sums(list(range(1, n_leaves + 1)), sums)


def build_tree(shape: str, n_leaves: int) -> SummationTree:
    """``balanced_tree`` or ``chain_tree`` by name."""
    builders = {"balanced": balanced_tree, "chain": chain_tree}
    if shape not in builders:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    return builders[shape](n_leaves)


def evaluation_order(tree: SummationTree, order: str = "depth_first") -> list[int]:
    """The sums in the order they are computed.

    ``depth_first`` finishes one subtree before starting the next (post-order from the root);
    ``level_order`` computes every sum of height 1 first, then height 2, and so on.
    """
    if order == "depth_first":
        visited: list[int] = []

        def visit(node: int) -> None:
            for source in tree.inputs[node]:
                visit(source)
            if tree.inputs[node]:
                visited.append(node)

        visit(tree.root)
        return visited
    if order == "level_order":
        return sorted(tree.sums, key=lambda node: (tree.height(node), node))
    raise ValueError(f"order must be one of {ORDERS}, got {order!r}")


@dataclass(frozen=True)
class Step:
    """What memory holds right after one action of the evaluation."""

    action: str
    alive: frozenset[int]
    computed: frozenset[int]  # every node that has held its value at some point so far

    @property
    def memory(self) -> int:
        return len(self.alive)


def _convention(convention: Convention | str) -> Convention:
    if isinstance(convention, Convention):
        return convention
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {tuple(CONVENTIONS)}, got {convention!r}")
    return CONVENTIONS[convention]


def evaluation_steps(
    tree: SummationTree,
    strategy: str = "free_as_you_go",
    convention: Convention | str = "plain",
    order: str = "depth_first",
) -> list[Step]:
    """Every action (read leaves, add, free) with the set of values alive after it.

    ``keep_all`` never frees (so nothing can be overwritten in place either); ``free_as_you_go``
    drops each input right after the sum that uses it, the root is kept as the answer.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    rules = _convention(convention)
    label = tree.label
    alive: set[int] = set()
    computed: set[int] = set()
    steps: list[Step] = []

    def record(action: str) -> None:
        steps.append(Step(action, frozenset(alive), frozenset(computed)))

    if rules.leaves_up_front:
        alive.update(tree.leaves)
        computed.update(tree.leaves)
        record("read leaves " + ", ".join(label(leaf) for leaf in tree.leaves))
    for node in evaluation_order(tree, order):
        node_inputs = tree.inputs[node]
        unread = [source for source in node_inputs if source not in computed]
        if unread:
            alive.update(unread)
            computed.update(unread)
            record("read " + ", ".join(label(leaf) for leaf in unread))
        formula = f"{label(node)} = " + " + ".join(label(source) for source in node_inputs)
        to_free = list(node_inputs) if strategy == "free_as_you_go" else []
        if rules.sum_in_place and to_free:
            overwritten = to_free.pop(0)
            alive.discard(overwritten)
            formula += f" (written over {label(overwritten)})"
        alive.add(node)
        computed.add(node)
        record(formula)
        if to_free:
            alive.difference_update(to_free)
            record("free " + ", ".join(label(source) for source in to_free))
    return steps


def alive_labels(tree: SummationTree, alive: frozenset[int]) -> str:
    """The alive values as text, smallest first."""
    ordered = sorted(alive, key=lambda node: (tree.values[node], node))
    return ", ".join(tree.label(node) for node in ordered) or "nothing"


def format_steps(tree: SummationTree, steps: list[Step]) -> str:
    """One line per step: memory count, action, values alive after it."""
    width = max(len(step.action) for step in steps)
    return "\n".join(
        f"{index:>2}  memory {step.memory}  {step.action:<{width}}  alive: "
        f"{alive_labels(tree, step.alive)}"
        for index, step in enumerate(steps)
    )


def peak_memory(
    tree: SummationTree,
    strategy: str = "free_as_you_go",
    convention: Convention | str = "plain",
    order: str = "depth_first",
) -> int:
    """The most values alive at once during the evaluation."""
    return max(step.memory for step in evaluation_steps(tree, strategy, convention, order))


def peak_index(steps: list[Step]) -> int:
    """The first step at which memory peaks."""
    return max(range(len(steps)), key=lambda index: (steps[index].memory, -index))


def peak_growth(
    shape: str,
    leaf_counts: list[int],
    strategy: str,
    convention: Convention | str = "article",
    order: str = "depth_first",
) -> list[int]:
    """``peak_memory`` of ``build_tree(shape, n)`` for each n in ``leaf_counts``."""
    return [peak_memory(build_tree(shape, n), strategy, convention, order) for n in leaf_counts]


# --- backprop through a chain of layers -------------------------------------------------------


@dataclass(frozen=True)
class ChainCost:
    """Activation memory and recomputation of one way to cut a chain of layers into segments.

    Counting convention: layer i's backward needs its input a_(i-1), one unit each; parameters,
    gradients, the output and the loss are not counted. A checkpointed segment keeps only its
    input during the forward pass and re-runs its layers before its backward; segments are
    processed from last to first and freed when done.
    """

    n_layers: int
    segments: tuple[tuple[int, int], ...]
    checkpointed: tuple[bool, ...]
    peak_activations: int
    recomputed_layers: int


def chain_cost(
    n_layers: int, segments: list[tuple[int, int]], checkpointed: list[bool]
) -> ChainCost:
    """Peak stored activations and recomputed layer forwards for the given ``[start, end)`` cuts.

    While segment j runs its backward, memory holds what segments 0..j-1 stored (their input if
    checkpointed, all their layer inputs if not) plus all of segment j's layer inputs.
    """
    if not segments or segments[0][0] != 0 or segments[-1][1] != n_layers:
        raise ValueError(f"segments must cover layers 0..{n_layers} from start to end")
    if any(a[1] != b[0] for a, b in zip(segments, segments[1:], strict=False)) or any(
        end <= start for start, end in segments
    ):
        raise ValueError("segments must be contiguous, non-empty [start, end) ranges")
    if len(checkpointed) != len(segments):
        raise ValueError("give one checkpointed flag per segment")
    lengths = [end - start for start, end in segments]
    stored = [1 if flag else length for flag, length in zip(checkpointed, lengths, strict=True)]
    peak = max(sum(stored[:index]) + lengths[index] for index in range(len(segments)))
    recomputed = sum(length for flag, length in zip(checkpointed, lengths, strict=True) if flag)
    return ChainCost(n_layers, tuple(segments), tuple(checkpointed), peak, recomputed)


def _check_layer_count(n_layers: int) -> None:
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")


def every_kth_layer_cost(n_layers: int, k: int) -> ChainCost:
    """Keep the input of every k-th layer (segments of k layers); recompute all but the last."""
    _check_layer_count(n_layers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_layers:
        raise ValueError(f"k must be an integer in 1..{n_layers}, got {k!r}")
    segments = [(start, min(start + k, n_layers)) for start in range(0, n_layers, k)]
    checkpointed = [True] * (len(segments) - 1) + [False]
    return chain_cost(n_layers, segments, checkpointed)


def optimal_k(n_layers: int) -> ChainCost:
    """The every-k-th plan with the lowest peak (then the least recomputation, then the largest k)."""
    _check_layer_count(n_layers)
    plans = [every_kth_layer_cost(n_layers, k) for k in range(1, n_layers + 1)]
    return min(plans, key=lambda p: (p.peak_activations, p.recomputed_layers, -len(p.segments)))


def sequential_cost(n_layers: int, segments: int) -> ChainCost:
    """What ``checkpoint_sequential(model, segments, ...)`` does to a chain of ``n_layers`` blocks.

    It cuts ``n_layers // segments``-sized runs (the remainder goes to the last one) and
    checkpoints every segment except the last, so 0 or 1 segments checkpoint nothing.
    """
    _check_layer_count(n_layers)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 0 <= segments <= n_layers:
        raise ValueError(f"segments must be an integer in 0..{n_layers}, got {segments!r}")
    bounds = segment_boundaries(n_layers, segments)
    return chain_cost(n_layers, bounds, [True] * (len(bounds) - 1) + [False])


# --- the real thing: a chain of equal blocks, measured ------------------------------------------


def equal_blocks_chain(n_blocks: int, width: int) -> nn.Sequential:
    """``n_blocks`` blocks of Linear(width, width) + ReLU, each one module of the Sequential.

    The ReLU is out of place, so each block leaves exactly one saved tensor of batch x width
    behind (its output, which is also the next Linear's saved input): one "activation" of the
    chain model per block.
    """
    _check_layer_count(n_blocks)
    if width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(n_blocks))
    )


@dataclass(frozen=True)
class ModelComparison:
    """One measured segment count next to the chain model's prediction, in activation units."""

    segments: int
    model_units: int  # sequential_cost(...).peak_activations
    measured_units: float  # tracked "activations" at the step's peak / bytes of one activation
    peak_bytes: int
    breakdown: dict[str, int]

    @property
    def extra_units(self) -> float:
        """What the measurement holds beyond the model's stored layer inputs."""
        return self.measured_units - self.model_units


def compare_with_model(
    records: list[SweepRecord], n_blocks: int, unit_bytes: int
) -> list[ModelComparison]:
    """Pair each measured sweep record with ``sequential_cost`` of the same segment count."""
    if unit_bytes <= 0:
        raise ValueError(f"unit_bytes must be positive, got {unit_bytes}")
    return [
        ModelComparison(
            segments=record.segments,
            model_units=sequential_cost(n_blocks, record.segments).peak_activations,
            measured_units=record.breakdown["activations"] / unit_bytes,
            peak_bytes=record.peak_bytes,
            breakdown=dict(record.breakdown),
        )
        for record in records
    ]


def forward_peak_bytes(
    model: nn.Sequential, inputs: torch.Tensor, segments: int, *, grad_enabled: bool
) -> int:
    """Tracked peak of one forward pass above what existed before it (parameters, inputs)."""
    with torch.set_grad_enabled(grad_enabled):
        with TensorMemoryTracker(model, inputs=(inputs,)) as tracker:
            output = forward_segments(model, inputs, segments, use_reentrant=False)
        del output
    return tracker.peak_bytes - tracker.baseline_bytes


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
    """Measured activations next to the model curve (units), and the whole measured peak (MB)."""
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
    units_ax.set_ylabel(f"activations (1 unit = {unit_bytes / MB:.2f} MB)")
    units_ax.set_ylim(0, max(max(measured), max(model)) * 1.15)
    units_ax.legend(fontsize=8)
    units_ax.set_title(title, fontsize=10)
    bottom = [0.0] * len(comparisons)
    positions = range(len(comparisons))
    for category in ("parameters", "optimizer_state", "gradients", "activations"):
        heights = [c.breakdown[category] / MB for c in comparisons]
        breakdown_ax.bar(positions, heights, bottom=bottom, label=category.replace("_", " "))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    breakdown_ax.set_xticks(list(positions), [str(s) for s in segments])
    breakdown_ax.set_xlabel("segments")
    breakdown_ax.set_ylabel("tracked peak of the training step (MB)")
    breakdown_ax.legend(fontsize=8)
    breakdown_ax.set_title("what the peak is made of", fontsize=10)
    return figure
