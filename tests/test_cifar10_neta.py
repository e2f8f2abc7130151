"""Notebook 03's experiments on tiny inputs: the requires-grad line, accumulation vs checkpointing,
BatchNorm runs and the segment panel; the article's card by dry run, on a small card."""

from __future__ import annotations

from functools import partial
from itertools import pairwise

import pytest
import torch

from tutorial_utils.articles.models import NetA
from tutorial_utils.checkpointing import batchnorm as bn
from tutorial_utils.lessons import cifar10_neta as lesson
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.step import DRY_RUN_LABEL
from tutorial_utils.units import MB

SIZE = 16
SMALL_CARD = 400 * MB  # at 224 px: 5 plain and 6 checkpointed samples, a table of 13 dry runs


def batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, SIZE, SIZE, generator=generator), torch.arange(n) % 10


def test_card_budget_is_the_article_card_at_224_and_shrinks_with_pixels() -> None:
    assert lesson.card_budget(224) == lesson.ARTICLE_CARD_BYTES
    static = 16 * sum(p.numel() for p in NetA().parameters())
    small = lesson.card_budget(32)
    assert static < small < lesson.card_budget(64) < lesson.ARTICLE_CARD_BYTES
    assert small - static == pytest.approx((lesson.ARTICLE_CARD_BYTES - static) / 49, rel=1e-6)
    with pytest.raises(ValueError, match="image_size"):
        lesson.card_budget(0)


def test_the_requires_grad_line_matters_only_for_reentrant() -> None:
    outcomes = {
        (o.use_reentrant, o.trick, o.checkpointed): o
        for o in lesson.requires_grad_trick_outcomes(*batch(2))
    }
    assert len(outcomes) == 8
    failed = outcomes[(True, False, "all 5")]
    assert "does not require grad" in failed.backward
    silent = outcomes[(True, False, "seg0 only")]
    assert silent.backward == "ok" and silent.parameters_without_grad == 3
    others = [o for key, o in outcomes.items() if key[:2] != (True, False)]
    assert all(o.backward == "ok" and o.parameters_without_grad == 0 for o in others)
    assert "element 0" in lesson.format_trick_outcomes(outcomes.values())


def test_accumulated_halves_give_the_batch_loss_and_gradient_without_batchnorm() -> None:
    inputs, targets = batch(4)
    results = []
    for micro_batches in (1, 2):
        model = lesson.PLAIN.build().eval()  # eval: BatchNorm no longer depends on the split
        loss = lesson.accumulate_gradients(model, inputs, targets, micro_batches)
        results.append((loss, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (one_loss, one_grad), (two_loss, two_grad) = results
    assert one_loss == pytest.approx(two_loss, rel=1e-5)
    assert torch.allclose(one_grad, two_grad, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="micro_batches"):
        lesson.accumulate_gradients(model, inputs, targets, 5)


def test_train_step_takes_an_optimizer_step() -> None:
    model = lesson.PLAIN.build()
    before = [p.detach().clone() for p in model.parameters()]
    lesson.train_step(model, torch.optim.Adam(model.parameters(), 1e-3), *batch(4), 2)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_checkpointing_keeps_the_gradient_accumulation_changes_it() -> None:
    inputs, targets = batch(8)
    assert lesson.gradient_gap(lesson.CHECKPOINT, inputs, targets) < 1e-5
    assert lesson.gradient_gap(lesson.ACCUMULATION, inputs, targets) > 1e-3


def test_strategy_cost_measures_memory_and_time_of_each_strategy() -> None:
    inputs, targets = batch(8)
    plain, checkpointed, halves = lesson.strategy_costs(
        (lesson.PLAIN, lesson.CHECKPOINT, lesson.ACCUMULATION), inputs, targets, repeats=2
    )
    assert plain.timing.repeats == 2
    alone = lesson.strategy_cost(lesson.PLAIN, inputs, targets, repeats=1)
    assert (alone.peak_bytes, alone.activation_bytes) == (plain.peak_bytes, plain.activation_bytes)
    # recomputation is more work, accumulation the same work in two passes
    assert checkpointed.gflop > 1.05 * plain.gflop
    assert halves.gflop == pytest.approx(plain.gflop, rel=1e-6)
    assert (plain.batch_size, plain.micro_batch) == (8, 8)
    assert (halves.batch_size, halves.micro_batch) == (8, 4)
    assert checkpointed.activation_bytes < plain.activation_bytes
    assert plain.peak_bytes > 4 * 4 * sum(p.numel() for p in NetA().parameters())
    assert plain.seconds_per_sample > 0
    table = lesson.format_costs([plain, checkpointed, halves], budget_bytes=plain.peak_bytes)
    assert "yes  x1.00, within noise" in table.splitlines()[1]
    assert f"FLOPs predict x{checkpointed.gflop / plain.gflop:.2f}" in table.splitlines()[2]
    assert (
        "activation peak MiB" in table.splitlines()[0] and "ms per sample" in table.splitlines()[0]
    )
    with pytest.raises(ValueError, match="repeats"):
        lesson.strategy_cost(lesson.PLAIN, inputs, targets, repeats=0)


def test_train_strategies_tracks_statistics_per_step() -> None:
    batches = [batch(4, seed) for seed in range(2)]
    runs = lesson.train_strategies(lesson.STRATEGIES, batches, batches, epochs=1)
    plain = runs[lesson.PLAIN.label]
    assert len(plain.losses) == len(plain.stats) == 2
    assert 0 <= plain.test_accuracy <= 100
    fixed, article = runs[lesson.CHECKPOINT_FIXED.label], runs[lesson.CHECKPOINT.label]
    assert bn.stats_match(fixed.stats[-1], plain.stats[-1])
    assert bn.counter_ratio(article.stats[-1], plain.stats[-1]) == 2.0
    assert bn.counter_ratio(runs[lesson.ACCUMULATION.label].stats[-1], plain.stats[-1]) == 2.0
    assert plain.recent_train_loss == pytest.approx(sum(plain.losses) / len(plain.losses))
    assert fixed.recent_eval_loss == pytest.approx(plain.recent_eval_loss, rel=1e-5)
    table = lesson.format_trainings(runs, lesson.PLAIN.label)
    assert f"{plain.recent_eval_loss:.4f}" in table.splitlines()[1]
    figure = lesson.plot_bn_trajectories(runs, lesson.PLAIN.label)
    assert len(figure.axes) == 2 and len(figure.axes[1].lines) == len(runs) - 1


def test_batch_statistics_change_the_training_mode_loss_of_the_same_weights() -> None:
    model = NetA().train()
    inputs, targets = batch(8)
    before = [b.clone() for b in model.buffers()]
    whole = lesson.batch_statistics_loss(model, inputs, targets)
    assert whole == pytest.approx(lesson.batch_statistics_loss(model, inputs, targets))
    assert lesson.batch_statistics_loss(model, inputs, targets, 2) != pytest.approx(whole, rel=1e-4)
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers(), strict=True))
    with pytest.raises(ValueError, match="micro_batches"):
        lesson.batch_statistics_loss(model, inputs, targets, 9)


def test_batchnorm_runs_fixes_match_plain() -> None:
    runs = lesson.batchnorm_runs([batch(4, seed) for seed in range(2)])
    plain = runs["plain"]
    assert bn.counter_ratio(runs["checkpoint"], plain) == 2.0
    assert not bn.stats_match(runs["checkpoint"], plain, counters=False)
    assert bn.stats_match(runs["checkpoint + momentum fix"], plain, counters=False)
    assert bn.stats_match(runs["checkpoint + frozen recompute"], plain)
    with pytest.raises(ValueError, match="batches"):
        lesson.batchnorm_runs([])


def test_segment_choice_more_checkpointing_less_activation_memory() -> None:
    size = 32  # at 16 px layer8's output is 1 x 1: BatchNorm cannot train on a batch of 1
    card = lesson.ARTICLE_CARD_BYTES  # scaled to 32 px by the machine scale
    none = lesson.evaluate_segment_choice(set(), card, 4, size, max_batch=4)
    first = lesson.evaluate_segment_choice({0}, card, 4, size, max_batch=4)
    assert first.activation_bytes < none.activation_bytes
    assert first.max_batch == none.max_batch == 4  # the static part is far below the budget
    assert first.plain_max_batch == none.max_batch
    assert "seg0" in first.describe() and "none" in none.describe()
    assert "measured" in first.describe() and "step " in first.cost
    with pytest.raises(ValueError, match="0..4"):
        lesson.evaluate_segment_choice({5}, card, 4, size)
    with pytest.raises(ValueError, match="scale must be one of"):
        lesson.evaluate_segment_choice({0}, card, 4, size, scale="huge")


def test_segment_choice_at_the_article_size_is_a_dry_run() -> None:
    """At 224 px by dry run: checkpointing every segment lowers the step's peak, costs FLOPs,
    and fits a larger batch in the card than the plain step (5 against 6 in SMALL_CARD)."""
    choose = partial(lesson.evaluate_segment_choice, scale=lesson.ARTICLE_SCALE, max_batch=8)
    every = choose(range(5), SMALL_CARD, 2, 32)
    none = choose((), SMALL_CARD, 2, 32)
    assert every.image_size == none.image_size == 224
    assert every.peak_bytes < none.peak_bytes
    assert every.max_batch > every.plain_max_batch == none.max_batch
    assert "dry run" in every.describe() and "FLOPs x1.00" in none.cost
    assert float(every.cost.split("x")[1].split()[0]) > 1.1


def test_segment_panel_runs_from_its_controls() -> None:
    panel = lesson.segment_panel(
        batch_size=2, image_size=32, max_batch=2, scale=lesson.MACHINE_SCALE
    )
    assert list(panel.controls) == [
        "batch_size",
        "card_mib",
        "scale",
        "seg0",
        "seg1",
        "seg2",
        "seg3",
        "seg4",
    ]
    assert panel.controls["scale"].options == lesson.SCALES
    for name in ("seg1", "seg2", "seg3", "seg4"):
        panel.controls[name].value = False
    text = panel.run()
    assert text.startswith("checkpointed: seg0 · 32 px") and "largest batch within" in text
    assert panel.output.outputs and panel.runs == 1


# -- the article's card by dry run, on a small card at 224 px -----------------------------------


@pytest.fixture(scope="module")
def small_card() -> dict[str, lesson.PeakTable]:
    return lesson.article_card_tables(card_bytes=SMALL_CARD)


def test_peak_table_lookup_is_bisection_over_peaks() -> None:
    table = lesson.PeakTable("x", 224, 25, (10, 20, 30), 0.0)
    lookups = [table.largest_batch(budget) for budget in (0, 9, 10, 19, 20, 25)]
    assert lookups == [0, 0, 1, 1, 2, 2]
    assert table.bytes_per_sample == 10
    for budget in (-1, 26):
        with pytest.raises(ValueError, match="budget_bytes must be in 0..25"):
            table.largest_batch(budget)


def test_peak_table_stops_at_the_first_batch_over_the_card(small_card) -> None:
    for table in small_card.values():
        assert all(a < b for a, b in pairwise(table.peaks))
        assert table.peaks[-2] <= SMALL_CARD < table.peaks[-1]
    with pytest.raises(ValueError, match="raise max_batch"):
        lesson.dry_run_peak_table("plain", NetA, image_size=32, card_bytes=2**40, max_batch=1)
    with pytest.raises(ValueError, match="positive"):
        lesson.dry_run_peak_table("plain", NetA, image_size=0)


def test_lookup_equals_a_direct_batch_search_at_the_boundaries(small_card) -> None:
    plain, checkpointed = small_card["no checkpoint"], small_card["checkpoint"]
    for label, budget, expected in (
        ("no checkpoint", plain.peaks[2], 3),  # a peak exactly at the budget fits
        ("checkpoint", checkpointed.peaks[3] - 1, 3),  # one byte less: it does not
    ):
        search = find_max_batch_size(
            lesson.CARD_MODELS[label], (3, 224, 224), budget, device="meta", max_batch=8
        )
        assert small_card[label].largest_batch(budget) == search.batch_size == expected


def test_checkpointing_fits_more_and_a_reserve_fits_less(small_card) -> None:
    full = lesson.largest_batches(small_card, 0)
    assert full["checkpoint"] > full["no checkpoint"] > 0
    plain = small_card["no checkpoint"].describe()
    assert plain.endswith(f"largest batch in the whole 400 MiB: {full['no checkpoint']}")
    reserved = lesson.largest_batches(small_card, 200)
    assert all(reserved[label] < full[label] for label in full)
    with pytest.raises(ValueError, match="reserve_mib must be in 0..400"):
        lesson.largest_batches(small_card, 401)


def test_reserve_fit_intervals_agree_with_the_lookup(small_card) -> None:
    fit = lesson.reserve_fit(small_card, {"no checkpoint": 4, "checkpoint": 5})
    assert fit.runs[0].first_mib == 0 and fit.runs[-1].last_mib == SMALL_CARD // MB
    assert all(a.last_mib + 1 == b.first_mib for a, b in pairwise(fit.runs))
    assert len(fit.reproducing) == 1
    both = fit.reproducing[0]
    for reserve in (both.first_mib, both.last_mib):
        assert lesson.largest_batches(small_card, reserve) == fit.quoted
    for reserve in (both.first_mib - 1, both.last_mib + 1):
        assert lesson.largest_batches(small_card, reserve) != fit.quoted
    assert f"all at once: reserve {both.first_mib}..{both.last_mib} MiB" in fit.describe()


def test_reserve_fit_reports_the_closest_miss_when_none_fits(small_card) -> None:
    fit = lesson.reserve_fit(small_card, {"no checkpoint": 5, "checkpoint": 3})
    assert fit.reproducing == [] and fit.matching("no checkpoint") and fit.matching("checkpoint")
    least = fit.miss(fit.closest[0])
    assert least > 0 and all(fit.miss(run) >= least for run in fit.runs)
    assert f"no reserve. Closest, {least} batches off" in fit.describe()
    with pytest.raises(ValueError, match="no table for"):
        lesson.reserve_fit(small_card, {"selective": 3})


def test_tables_for_different_cards_are_refused() -> None:
    tables = {
        "no checkpoint": lesson.PeakTable("no checkpoint", 224, 25, (10, 30), 0.0),
        "checkpoint": lesson.PeakTable("checkpoint", 224, 26, (10, 30), 0.0),
    }
    with pytest.raises(ValueError, match="one card"):
        lesson.largest_batches(tables, 0)


def test_reserve_panel_redraws_from_the_slider(small_card) -> None:
    text, figure = lesson.reserve_view(small_card, 0)
    full = lesson.largest_batches(small_card, 0)
    assert DRY_RUN_LABEL in text and DRY_RUN_LABEL in figure._suptitle.get_text()
    assert f"  no checkpoint  {full['no checkpoint']:>5}   (the article: 23)\n" in text
    panel = lesson.reserve_panel(small_card, max_reserve_mib=300)
    slider, output = panel.children
    assert (slider.min, slider.max, slider.value) == (0, 300, 0)
    assert output.outputs[0]["text"].startswith("reserve 0 MiB: tensor budget 400 MiB")
    slider.value = 200
    assert output.outputs[0]["text"].startswith("reserve 200 MiB: tensor budget 200 MiB")
    assert output.outputs[1]["output_type"] == "display_data"


def test_reentrant_checkpoint_is_compared_with_the_tables(small_card) -> None:
    text = lesson.checkpoint_modes(small_card, batch=4)
    rows = {line[:38].strip(): line.split() for line in text.splitlines()[2:]}
    assert list(rows) == [
        "no checkpoint",
        "checkpoint, non-reentrant",
        "checkpoint, reentrant (the article's)",
    ]
    peak = {label: float(row[-3]) for label, row in rows.items()}
    assert peak["checkpoint, reentrant (the article's)"] > peak["checkpoint, non-reentrant"]
    with pytest.raises(ValueError, match="batch must be in 1..6"):
        lesson.checkpoint_modes(small_card, batch=7)


def test_step_timelines_plain_beside_checkpointed() -> None:
    figure = lesson.article_step_timelines(batch=2, image_size=32)
    panels = [axis for axis in figure.axes if axis.get_title()]
    assert [axis.get_title() for axis in panels] == [
        "no checkpoint, batch 2, 32 px",
        "checkpoint, batch 2, 32 px",
    ]
    assert DRY_RUN_LABEL in figure._suptitle.get_text()
