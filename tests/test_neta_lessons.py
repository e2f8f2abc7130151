"""Notebook 03's experiments on tiny inputs: the requires-grad line, accumulation vs checkpointing,
BatchNorm runs and the segment panel."""

from __future__ import annotations

import pytest
import torch

from tutorial_utils import batchnorm_recompute as bn
from tutorial_utils import neta_lessons as lessons
from tutorial_utils.models import NetA

SIZE = 16


def batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, SIZE, SIZE, generator=generator), torch.arange(n) % 10


def test_card_budget_is_the_article_card_at_224_and_shrinks_with_pixels() -> None:
    assert lessons.card_budget(224) == lessons.ARTICLE_CARD_BYTES
    static = 16 * sum(p.numel() for p in NetA().parameters())
    small = lessons.card_budget(32)
    assert static < small < lessons.card_budget(64) < lessons.ARTICLE_CARD_BYTES
    assert small - static == pytest.approx((lessons.ARTICLE_CARD_BYTES - static) / 49, rel=1e-6)
    with pytest.raises(ValueError, match="image_size"):
        lessons.card_budget(0)


def test_the_requires_grad_line_matters_only_for_reentrant() -> None:
    outcomes = {
        (o.use_reentrant, o.trick, o.checkpointed): o
        for o in lessons.requires_grad_trick_outcomes(*batch(2))
    }
    assert len(outcomes) == 8
    failed = outcomes[(True, False, "all 5")]
    assert "does not require grad" in failed.backward
    silent = outcomes[(True, False, "seg0 only")]
    assert silent.backward == "ok" and silent.parameters_without_grad == 3
    others = [o for key, o in outcomes.items() if key[:2] != (True, False)]
    assert all(o.backward == "ok" and o.parameters_without_grad == 0 for o in others)
    assert "element 0" in lessons.format_trick_outcomes(outcomes.values())


def test_accumulated_halves_give_the_batch_loss_and_gradient_without_batchnorm() -> None:
    inputs, targets = batch(4)
    results = []
    for micro_batches in (1, 2):
        model = lessons.PLAIN.build().eval()  # eval: BatchNorm no longer depends on the split
        loss = lessons.accumulate_gradients(model, inputs, targets, micro_batches)
        results.append((loss, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (one_loss, one_grad), (two_loss, two_grad) = results
    assert one_loss == pytest.approx(two_loss, rel=1e-5)
    assert torch.allclose(one_grad, two_grad, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="micro_batches"):
        lessons.accumulate_gradients(model, inputs, targets, 5)


def test_train_step_takes_an_optimizer_step() -> None:
    model = lessons.PLAIN.build()
    before = [p.detach().clone() for p in model.parameters()]
    lessons.train_step(model, torch.optim.Adam(model.parameters(), 1e-3), *batch(4), 2)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_checkpointing_keeps_the_gradient_accumulation_changes_it() -> None:
    inputs, targets = batch(8)
    assert lessons.gradient_gap(lessons.CHECKPOINT, inputs, targets) < 1e-5
    assert lessons.gradient_gap(lessons.ACCUMULATION, inputs, targets) > 1e-3


def test_strategy_cost_measures_memory_and_time_of_each_strategy() -> None:
    inputs, targets = batch(8)
    plain, checkpointed, halves = (
        lessons.strategy_cost(strategy, inputs, targets, repeats=1)
        for strategy in (lessons.PLAIN, lessons.CHECKPOINT, lessons.ACCUMULATION)
    )
    assert (plain.batch_size, plain.micro_batch) == (8, 8)
    assert (halves.batch_size, halves.micro_batch) == (8, 4)
    assert checkpointed.activation_bytes < plain.activation_bytes
    assert plain.peak_bytes > 4 * 4 * sum(p.numel() for p in NetA().parameters())
    assert plain.seconds_per_sample > 0
    table = lessons.format_costs([plain, halves], budget_bytes=plain.peak_bytes)
    assert table.splitlines()[1].endswith("yes")
    with pytest.raises(ValueError, match="repeats"):
        lessons.strategy_cost(lessons.PLAIN, inputs, targets, repeats=0)


def test_train_strategies_tracks_statistics_per_step() -> None:
    batches = [batch(4, seed) for seed in range(2)]
    runs = lessons.train_strategies(lessons.STRATEGIES, batches, batches, epochs=1)
    plain = runs[lessons.PLAIN.label]
    assert len(plain.losses) == len(plain.stats) == 2
    assert 0 <= plain.test_accuracy <= 100
    fixed, article = runs[lessons.CHECKPOINT_FIXED.label], runs[lessons.CHECKPOINT.label]
    assert bn.stats_match(fixed.stats[-1], plain.stats[-1])
    assert bn.counter_ratio(article.stats[-1], plain.stats[-1]) == 2.0
    assert bn.counter_ratio(runs[lessons.ACCUMULATION.label].stats[-1], plain.stats[-1]) == 2.0
    assert lessons.PLAIN.label in lessons.format_trainings(runs, lessons.PLAIN.label)
    figure = lessons.plot_bn_trajectories(runs, lessons.PLAIN.label)
    assert len(figure.axes) == 2 and len(figure.axes[1].lines) == len(runs) - 1


def test_batchnorm_runs_fixes_match_plain() -> None:
    runs = lessons.batchnorm_runs([batch(4, seed) for seed in range(2)])
    plain = runs["plain"]
    assert bn.counter_ratio(runs["checkpoint"], plain) == 2.0
    assert not bn.stats_match(runs["checkpoint"], plain, counters=False)
    assert bn.stats_match(runs["checkpoint + momentum fix"], plain, counters=False)
    assert bn.stats_match(runs["checkpoint + frozen recompute"], plain)
    with pytest.raises(ValueError, match="batches"):
        lessons.batchnorm_runs([])


def test_segment_choice_more_checkpointing_less_activation_memory() -> None:
    size = 32  # at 16 px layer8's output is 1 x 1: BatchNorm cannot train on a batch of 1
    budget = lessons.card_budget(size)
    none = lessons.evaluate_segment_choice(set(), budget, 4, size, max_batch=4)
    first = lessons.evaluate_segment_choice({0}, budget, 4, size, max_batch=4)
    assert first.cost.activation_bytes < none.cost.activation_bytes
    assert first.max_batch == none.max_batch == 4  # the static part is far below the budget
    assert "seg0" in first.describe() and "none" in none.describe()
    with pytest.raises(ValueError, match="0..4"):
        lessons.evaluate_segment_choice({5}, budget, 4, size)


def test_segment_panel_runs_from_its_controls() -> None:
    panel = lessons.segment_panel(batch_size=2, image_size=32, budget_mb=100, max_batch=2)
    assert list(panel.controls) == ["budget_mb", "seg0", "seg1", "seg2", "seg3", "seg4"]
    for name in ("seg1", "seg2", "seg3", "seg4"):
        panel.controls[name].value = False
    text = panel.run()
    assert text.startswith("checkpointed: seg0\n") and "largest batch within 100 MB" in text
    assert panel.output.outputs and panel.runs == 1
