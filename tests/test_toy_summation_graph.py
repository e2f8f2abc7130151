"""The summation-graph simulation, the chain cost model and the notebook-01 widget callbacks."""

import math

import pytest
import torch
from matplotlib.figure import Figure

from tutorial_utils import plan_checkpoints
from tutorial_utils.checkpointing.segments import segment_boundaries
from tutorial_utils.lessons.toy_summation_graph.chain import (
    chain_cost,
    every_kth_layer_cost,
    optimal_k,
    sequential_cost,
)
from tutorial_utils.lessons.toy_summation_graph.figures import (
    activation_roles,
    draw_graph,
    idea_figure,
    node_positions,
)
from tutorial_utils.lessons.toy_summation_graph.panels import (
    chain_panel,
    chain_view,
    evaluation_panel,
    evaluation_view,
    growth_panel,
    growth_view,
)
from tutorial_utils.lessons.toy_summation_graph.trees import (
    CONVENTIONS,
    ORDERS,
    STRATEGIES,
    SummationTree,
    article_tree,
    balanced_tree,
    build_tree,
    chain_tree,
    evaluation_order,
    evaluation_steps,
    peak_index,
    peak_memory,
)
from tutorial_utils.tools import peak_bytes


def peak_growth(shape, leaf_counts, strategy, convention="article", order="depth_first"):
    return [peak_memory(build_tree(shape, n), strategy, convention, order) for n in leaf_counts]


def brute_force_peak(tree: SummationTree, order: list[int], free: bool, up_front: bool) -> int:
    """An independent count for out-of-place sums: leaves alive from their read, nodes until used."""
    n_nodes = len(tree.values)
    position = {node: index for index, node in enumerate(order)}
    consumer = {src: node for node, inputs in enumerate(tree.inputs) for src in inputs}
    peak = 0
    for node in order:
        alive = 0
        for other in range(n_nodes):
            if tree.inputs[other]:
                born = position[other] <= position[node]
            else:
                born = up_front or position[consumer[other]] <= position[node]
            dead = free and other in consumer and position[consumer[other]] < position[node]
            alive += born and not dead
        peak = max(peak, alive)
    return peak


def test_article_tree_is_the_articles_graph():
    tree = article_tree()
    assert [tree.label(node) for node in tree.leaves] == ["1", "2", "4", "5"]
    assert [tree.label(node) for node in evaluation_order(tree)] == ["3", "9", "12"]
    assert len(tree.values) == 7


@pytest.mark.parametrize("convention", list(CONVENTIONS))
def test_keep_all_ends_with_every_node_stored(convention):
    tree = article_tree()
    steps = evaluation_steps(tree, "keep_all", convention)
    assert steps[-1].alive == frozenset(range(len(tree.values)))
    assert peak_memory(tree, "keep_all", convention) == len(tree.values)


def test_free_as_you_go_peaks_depend_on_the_convention():
    tree = article_tree()
    peaks = {name: peak_memory(tree, "free_as_you_go", name) for name in CONVENTIONS}
    assert peaks["article"] == 3
    assert peaks["plain"] > peaks["leaves_read_when_needed"] >= peaks["article"]
    assert peaks["plain"] > peaks["sum_in_place"] >= peaks["article"]


@pytest.mark.parametrize("shape", ["balanced", "chain"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n_leaves", [2, 3, 4, 7, 8, 13])
@pytest.mark.parametrize("convention", ["plain", "leaves_read_when_needed"])
def test_out_of_place_peaks_match_an_independent_count(shape, order, n_leaves, convention):
    tree = build_tree(shape, n_leaves)
    up_front = CONVENTIONS[convention].leaves_up_front
    sequence = evaluation_order(tree, order)
    for strategy in STRATEGIES:
        expected = brute_force_peak(tree, sequence, strategy == "free_as_you_go", up_front)
        assert peak_memory(tree, strategy, convention, order) == expected


def test_free_as_you_go_ends_with_only_the_root():
    tree = balanced_tree(9)
    for convention in CONVENTIONS:
        steps = evaluation_steps(tree, "free_as_you_go", convention, "level_order")
        assert steps[-1].alive == {tree.root}
        assert steps[-1].computed == frozenset(range(len(tree.values)))


def test_in_place_sum_never_needs_more_than_out_of_place():
    for n_leaves in range(2, 20):
        for order in ORDERS:
            tree = balanced_tree(n_leaves)
            assert peak_memory(tree, "free_as_you_go", "sum_in_place", order) <= peak_memory(
                tree, "free_as_you_go", "plain", order
            )


def test_balanced_depth_first_grows_logarithmically_and_level_order_linearly():
    counts = [2**power for power in range(2, 8)]
    depth_first = peak_growth("balanced", counts, "free_as_you_go", "article", "depth_first")
    level_order = peak_growth("balanced", counts, "free_as_you_go", "article", "level_order")
    keep_all = peak_growth("balanced", counts, "keep_all", "article")
    assert keep_all == [2 * n - 1 for n in counts]
    steps_per_doubling = {b - a for a, b in zip(depth_first, depth_first[1:], strict=False)}
    assert steps_per_doubling == {1}
    assert all(peak >= n // 2 for peak, n in zip(level_order, counts, strict=True))


def test_chain_tree_depth_first_needs_constant_memory():
    peaks = peak_growth("chain", list(range(3, 40)), "free_as_you_go", "article")
    assert len(set(peaks)) == 1


def test_trees_are_sums_of_their_leaves():
    for n_leaves in (2, 5, 16):
        for tree in (balanced_tree(n_leaves), chain_tree(n_leaves)):
            assert tree.values[tree.root] == n_leaves * (n_leaves + 1) // 2
            assert len(tree.leaves) == n_leaves
            assert len(evaluation_order(tree, "level_order")) == n_leaves - 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: balanced_tree(1),
        lambda: build_tree("star", 4),
        lambda: evaluation_order(article_tree(), "random"),
        lambda: evaluation_steps(article_tree(), "keep_some"),
        lambda: evaluation_steps(article_tree(), "keep_all", "lazy"),
        lambda: SummationTree((1, 2, 4), ((), (), (0, 1))),
        lambda: SummationTree((1, 2, 3, 3), ((), (), (0, 1), (0,))),
        lambda: every_kth_layer_cost(10, 0),
        lambda: sequential_cost(10, 11),
        lambda: chain_cost(4, [(0, 2), (3, 4)], [True, False]),
    ],
)
def test_bad_input_raises_a_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_peak_index_points_at_the_peak():
    steps = evaluation_steps(article_tree(), "free_as_you_go", "plain")
    index = peak_index(steps)
    assert steps[index].memory == max(step.memory for step in steps)
    assert all(step.memory < steps[index].memory for step in steps[:index])


@pytest.mark.parametrize("n_layers", [1, 2, 9, 16, 17, 50, 100])
def test_every_kth_ends_are_keep_all_and_optimum_is_near_two_sqrt_n(n_layers):
    assert every_kth_layer_cost(n_layers, 1).peak_activations == n_layers
    assert every_kth_layer_cost(n_layers, n_layers).peak_activations == n_layers
    assert every_kth_layer_cost(n_layers, n_layers).recomputed_layers == 0
    best = optimal_k(n_layers)
    assert best.peak_activations <= math.ceil(2 * math.sqrt(n_layers))
    assert abs(best.segments[0][1] - math.sqrt(n_layers)) <= math.sqrt(n_layers) / 2 + 1
    all_peaks = [every_kth_layer_cost(n_layers, k).peak_activations for k in range(1, n_layers + 1)]
    assert best.peak_activations == min(all_peaks)


def simulate_chain_backprop(n_layers: int, segments, checkpointed) -> int:
    """Peak of a set of stored layer inputs, walked forward then backward segment by segment."""
    stored: set[int] = set()
    for (start, end), flag in zip(segments, checkpointed, strict=True):
        stored.update([start] if flag else range(start, end))
    peak = len(stored)
    for (start, end), _flag in reversed(list(zip(segments, checkpointed, strict=True))):
        stored.update(range(start, end))  # recomputed (a no-op for an un-checkpointed segment)
        peak = max(peak, len(stored))
        stored.difference_update(range(start, end))
    return peak


@pytest.mark.parametrize(("n_layers", "k"), [(17, 5), (16, 4), (30, 7), (9, 2)])
def test_every_kth_matches_a_step_by_step_walk_and_recomputes_under_one_forward(n_layers, k):
    plan = every_kth_layer_cost(n_layers, k)
    assert plan.peak_activations == simulate_chain_backprop(
        n_layers, plan.segments, plan.checkpointed
    )
    last_start = k * (len(plan.segments) - 1)
    assert plan.recomputed_layers == last_start
    assert plan.recomputed_layers < n_layers


def test_sequential_cost_follows_checkpoint_sequential_boundaries():
    for segments in (0, 1):
        plan = sequential_cost(16, segments)
        assert plan.peak_activations == 16 and plan.recomputed_layers == 0
    plan = sequential_cost(18, 4)
    assert list(plan.segments) == segment_boundaries(18, 4)
    assert plan.checkpointed == (True, True, True, False)
    assert plan.recomputed_layers == sum(end - start for start, end in plan.segments[:-1])


def test_node_positions_put_sums_above_their_inputs():
    tree = balanced_tree(6)
    positions = node_positions(tree)
    for node, inputs in enumerate(tree.inputs):
        for source in inputs:
            assert positions[node][1] > positions[source][1]


def test_draw_graph_returns_a_figure():
    tree = article_tree()
    assert isinstance(draw_graph(tree, evaluation_steps(tree)[2]), Figure)


def test_evaluation_view_text_and_figure_change_with_the_step():
    tree = article_tree()
    first_text, first_figure = evaluation_view(tree, 0, "free_as_you_go", "article")
    later_text, _ = evaluation_view(tree, 3, "free_as_you_go", "article")
    assert isinstance(first_figure, Figure)
    assert first_text != later_text
    assert "memory 3 (peak 3)" in later_text
    clamped_text, _ = evaluation_view(tree, 99, "keep_all", "article")
    assert clamped_text.startswith(f"step {len(evaluation_steps(tree, 'keep_all', 'article')) - 1}")


def test_growth_and_chain_views_report_the_simulated_numbers():
    text, figure = growth_view("balanced", 16, "depth_first", "article")
    assert isinstance(figure, Figure)
    assert f"keep everything {2 * 16 - 1}" in text
    free = peak_memory(balanced_tree(16), "free_as_you_go", "article", "depth_first")
    assert text.endswith(f"free as you go {free}")
    text, figure = chain_view(25, 5)
    assert isinstance(figure, Figure)
    assert f"peak {every_kth_layer_cost(25, 5).peak_activations} activations" in text
    assert chain_view(10, 50)[0].startswith("n=10, k=10")


def test_panels_keep_slider_ranges_consistent():
    panel = evaluation_panel()
    strategy, convention = panel.children[0].children
    step = panel.children[1]
    strategy.value = "keep_all"
    assert step.max == len(evaluation_steps(article_tree(), "keep_all", convention.value)) - 1
    strategy.value = "free_as_you_go"
    assert step.max == len(evaluation_steps(article_tree(), "free_as_you_go", "article")) - 1

    n_layers, k = chain_panel().children[:2]
    k.value = 12
    n_layers.value = 9
    assert k.max == 9 and k.value == 9

    leaves = growth_panel().children[1]
    assert (leaves.min, leaves.max) == (2, 64)


def test_the_idea_figure_keeps_the_segment_inputs_and_the_last_segment():
    assert activation_roles(8, 0) == ["kept"] * 8
    roles = activation_roles(8, 4)  # segments [0,2) [2,4) [4,6) checkpointed, [6,8) not
    assert [i for i, role in enumerate(roles) if role == "kept"] == [1, 3, 5, 6, 7]
    assert isinstance(idea_figure(8, (0, 4)), Figure)


def test_one_thread_restores_the_thread_count():
    from tutorial_utils.measurement.timing import one_thread

    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_a_nested_schedule_fits_below_one_levels_least_peak_and_recomputes_more():
    torch.manual_seed(0)
    chain = torch.nn.Sequential(
        *(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(16))
    )  # notebook 01's chain in the ci profile
    inputs, targets = torch.randn(1024, 64), torch.randint(0, 64, (1024,))
    one_level = plan_checkpoints(chain, inputs)
    assert set(one_level.runs) == {1, 2} and len(one_level.runs) == len(chain)
    nested = plan_checkpoints(
        chain, inputs, one_level.measured_peak_bytes - 1024 * 64 * 4, nested=True
    )
    assert max(nested.runs) >= 3 and sum(nested.runs) > sum(one_level.runs)

    def step_peak(forward):
        loss = lambda: torch.nn.functional.cross_entropy(forward(inputs), targets).backward()  # noqa: E731
        chain.zero_grad(set_to_none=True)
        return peak_bytes(loss)

    one_peak = step_peak(lambda x: one_level.forward(chain, x))
    assert step_peak(lambda x: nested.forward(chain, x)) < one_peak < step_peak(chain)
