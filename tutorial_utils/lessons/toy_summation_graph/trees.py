"""The first article's summation graph, simulated step by step.

The article adds the leaves 1, 2, 4, 5 of a small tree up to 12 and says that storing every node
costs 7 units while freeing the inputs of each sum costs 3. Whether it is 3 depends on how one
counts, so the counting convention is an explicit argument here and every peak is computed by
walking the evaluation, never asserted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CONVENTIONS",
    "Convention",
    "ORDERS",
    "SHAPES",
    "STRATEGIES",
    "Step",
    "SummationTree",
    "alive_labels",
    "article_tree",
    "balanced_tree",
    "build_tree",
    "chain_tree",
    "evaluation_order",
    "evaluation_steps",
    "format_steps",
    "peak_index",
    "peak_memory",
]

STRATEGIES = ("keep_all", "free_as_you_go")

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


def tree_from_sums(leaf_values: list[int], sums: Sequence[tuple[int, ...]]) -> SummationTree:
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
    rules = convention if isinstance(convention, Convention) else CONVENTIONS.get(convention)
    if rules is None:
        raise ValueError(f"convention must be one of {tuple(CONVENTIONS)}, got {convention!r}")
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
