"""The summation-graph simulation, the chain cost model and the notebook-01 widget callbacks."""

import math

import pytest
import torch
from matplotlib.figure import Figure

from tutorial_utils import plan_checkpoints
from tutorial_utils.checkpointing.segments import segment_boundaries
from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.lessons.toy_summation_graph import (
    CONVENTIONS,
    ORDERS,
    STRATEGIES,
    SummationTree,
    article_tree,
    balanced_tree,
    build_tree,
    chain_cost,
    chain_panel,
    chain_tree,
    chain_view,
    compare_with_model,
    draw_graph,
    equal_blocks_chain,
    evaluation_order,
    evaluation_panel,
    evaluation_steps,
    evaluation_view,
    every_kth_layer_cost,
    forward_peak_bytes,
    growth_panel,
    growth_view,
    measured_vs_model_figure,
    node_positions,
    optimal_k,
    peak_growth,
    peak_index,
    peak_memory,
    schedules_table,
    sequential_cost,
)
from tutorial_utils.measurement.step import sweep_strategies


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


@pytest.fixture(scope="module")
def small_chain():
    torch.manual_seed(0)
    n_blocks, width, batch = 8, 16, 128
    model = equal_blocks_chain(n_blocks, width)
    inputs = torch.randn(batch, width)
    targets = torch.randint(0, width, (batch,))
    return model, inputs, targets, batch * width * 4


def test_equal_blocks_chain_has_one_module_per_block():
    model = equal_blocks_chain(5, 8)
    assert len(model) == 5
    assert all(len(block) == 2 for block in model)
    with pytest.raises(ValueError):
        equal_blocks_chain(0, 8)


def test_measured_activations_follow_the_chain_model_up_to_a_constant(small_chain):
    model, inputs, targets, unit_bytes = small_chain
    splits = [equal_segments(k) for k in (0, 2, 4, 8)]
    records = sweep_strategies(model, inputs, targets, splits)
    comparisons = compare_with_model(records, len(model), unit_bytes)
    assert [c.model_units for c in comparisons] == [
        sequential_cost(len(model), c.segments).peak_activations for c in comparisons
    ]
    extras = [c.extra_units for c in comparisons]
    assert max(extras) - min(extras) < 0.5, extras
    assert min(extras) > 0  # the output, the loss and the gradients are real memory too
    assert isinstance(measured_vs_model_figure(comparisons, len(model), unit_bytes, "t"), Figure)


def test_checkpointing_saves_memory_only_when_gradients_are_recorded(small_chain):
    model, inputs, _, _ = small_chain
    with_grad = {s: forward_peak_bytes(model, inputs, s, grad_enabled=True) for s in (0, 4)}
    no_grad = {s: forward_peak_bytes(model, inputs, s, grad_enabled=False) for s in (0, 4)}
    assert with_grad[4] < with_grad[0]
    assert no_grad[4] >= no_grad[0]
    assert no_grad[0] < with_grad[4]


def test_checkpointed_backward_keeps_gradients_and_lowers_the_peak():
    from torch.utils.checkpoint import checkpoint_sequential

    from tutorial_utils.lessons.toy_summation_graph import backward_peak_and_gradients

    torch.manual_seed(0)
    chain = equal_blocks_chain(8, 16)
    inputs, targets = torch.randn(64, 16), torch.randint(0, 16, (64,))
    plain_peak, plain = backward_peak_and_gradients(chain, chain, inputs, targets)
    peak, gradients = backward_peak_and_gradients(
        chain,
        lambda x: checkpoint_sequential(chain, 4, x, use_reentrant=False),
        inputs,
        targets,
    )
    assert peak < plain_peak
    assert all(torch.equal(gradients[name], plain[name]) for name in plain)


def test_predicted_time_ratios_grow_with_recomputation():
    from tutorial_utils.lessons.toy_summation_graph import predicted_time_ratios

    ratios = predicted_time_ratios(equal_blocks_chain(8, 16), (64, 16), (0, 2, 8))
    assert ratios[0] == 1.0
    assert 1.0 < ratios[2] < ratios[8] < 1.5


def test_one_thread_restores_the_thread_count():
    from tutorial_utils.measurement.timing import one_thread

    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_a_nested_schedule_fits_below_one_levels_least_peak_and_says_its_price():
    torch.manual_seed(0)
    chain = equal_blocks_chain(16, 64)  # notebook 01's chain in the ci profile
    inputs, targets = torch.randn(1024, 64), torch.randint(0, 64, (1024,))
    unit = 1024 * 64 * 4
    one_level = plan_checkpoints(chain, inputs)
    assert set(one_level.runs) == {1, 2} and len(one_level.runs) == len(chain)
    nested = plan_checkpoints(chain, inputs, one_level.measured_peak_bytes - unit, nested=True)
    assert max(nested.runs) >= 3
    forwards = {
        "one level": lambda x: one_level.forward(chain, x),
        "nested": lambda x: nested.forward(chain, x),
    }
    runs = {"one level": one_level.runs, "nested": nested.runs}
    lines = schedules_table(chain, forwards, runs, inputs, targets, unit).splitlines()
    one, deep = (line.split()[-4:] for line in lines[1:])  # the columns after the name
    assert float(deep[0]) < float(one[0])  # peak in units, measured
    assert int(deep[1]) == max(nested.runs) and float(deep[2]) > float(one[2])
    assert one[3] == deep[3] == "True"  # gradients bitwise equal
