"""Notebook 03's panels on tiny inputs: the segments panel, and the article's card by dry run on a
small card at 224 px (the notebook's other code runs in its cells, under nbval)."""

from __future__ import annotations

from functools import partial
from itertools import pairwise

import pytest
import torch

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import NetA
from tutorial_utils.display.figure_check import figure_problems
from tutorial_utils.lessons.cifar10_neta import article_card as card
from tutorial_utils.lessons.cifar10_neta import segments_panel as segments
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.step import DRY_RUN_LABEL
from tutorial_utils.tools import saved_bytes
from tutorial_utils.units import MiB

SIZE = 16
SMALL_CARD = 400 * MiB  # at 224 px: 5 plain and 6 checkpointed samples, a table of 13 dry runs


def batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, SIZE, SIZE, generator=generator), torch.arange(n) % 10


# -- the article's card by dry run, on a small card at 224 px -----------------------------------


@pytest.fixture(scope="module")
def small_card() -> dict[str, card.PeakTable]:
    return card.article_card_tables(card_bytes=SMALL_CARD)


def test_peak_table_lookup_is_bisection_over_peaks() -> None:
    table = card.PeakTable("x", 224, 25, (10, 20, 30))
    lookups = [table.largest_batch(budget) for budget in (0, 9, 10, 19, 20, 25)]
    assert lookups == [0, 0, 1, 1, 2, 2]
    assert "+0.0 MiB per sample" in table.describe()
    for budget in (-1, 26):
        with pytest.raises(ValueError, match="budget_bytes must be in 0..25"):
            table.largest_batch(budget)


def test_peak_table_stops_at_the_first_batch_over_the_card(small_card) -> None:
    for table in small_card.values():
        assert all(a < b for a, b in pairwise(table.peaks))
        assert table.peaks[-2] <= SMALL_CARD < table.peaks[-1]
    with pytest.raises(ValueError, match="raise max_batch"):
        card.dry_run_peak_table("plain", NetA, image_size=32, card_bytes=2**40, max_batch=1)
    with pytest.raises(ValueError, match="positive"):
        card.dry_run_peak_table("plain", NetA, image_size=0)


def test_lookup_equals_a_direct_batch_search_at_the_boundaries(small_card) -> None:
    plain, checkpointed = small_card["no checkpoint"], small_card["checkpoint"]
    for label, budget, expected in (
        ("no checkpoint", plain.peaks[2], 3),  # a peak exactly at the budget fits
        ("checkpoint", checkpointed.peaks[3] - 1, 3),  # one byte less: it does not
    ):
        search = find_max_batch_size(
            card.CARD_MODELS[label],
            (3, 224, 224),
            budget,
            device="meta",
            max_batch=8,
            optimizer_factory=adam_optimizer,
        )
        assert small_card[label].largest_batch(budget) == search.batch_size == expected


def test_checkpointing_fits_more_and_a_reserve_fits_less(small_card) -> None:
    full = card.largest_batches(small_card, 0)
    assert full["checkpoint"] > full["no checkpoint"] > 0
    plain = small_card["no checkpoint"].describe()
    assert plain.endswith(f"largest batch in the whole 400 MiB: {full['no checkpoint']}")
    reserved = card.largest_batches(small_card, 200)
    assert all(reserved[label] < full[label] for label in full)
    with pytest.raises(ValueError, match="reserve_mib must be in 0..400"):
        card.largest_batches(small_card, 401)


def test_tables_for_different_cards_are_refused() -> None:
    tables = {
        "no checkpoint": card.PeakTable("no checkpoint", 224, 25, (10, 30)),
        "checkpoint": card.PeakTable("checkpoint", 224, 26, (10, 30)),
    }
    with pytest.raises(ValueError, match="one card"):
        card.largest_batches(tables, 0)


def test_reserve_panel_redraws_from_the_slider(small_card) -> None:
    text, figure = card.reserve_view(small_card, 0)
    full = card.largest_batches(small_card, 0)
    assert DRY_RUN_LABEL in text and DRY_RUN_LABEL in figure._suptitle.get_text()
    assert f"  no checkpoint  {full['no checkpoint']:>5}   (the article: 23)\n" in text
    panel = card.reserve_panel(small_card, max_reserve_mib=300)
    slider, output = panel.children
    assert (slider.min, slider.max, slider.value) == (0, 300, 0)
    assert output.outputs[0]["text"].startswith("reserve 0 MiB: tensor budget 400 MiB")
    slider.value = 200
    assert output.outputs[0]["text"].startswith("reserve 200 MiB: tensor budget 200 MiB")
    assert output.outputs[1]["output_type"] == "display_data"


# -- the segments panel: the notebook's NetA, chosen segments checkpointed ----------------------


def test_forward_with_keeps_what_neta_keeps_for_the_same_segments() -> None:
    images, _ = batch(2)
    for chosen in (frozenset(), frozenset({0, 2}), frozenset(range(5))):
        torch.manual_seed(0)
        ours = NetA()
        torch.manual_seed(0)
        theirs = NetA(use_checkpoint=chosen, use_reentrant=False)
        ours_saved = saved_bytes(ours, partial(segments.forward_with, ours, images, chosen))
        assert ours_saved == saved_bytes(theirs, partial(theirs, images)), chosen
        assert torch.equal(segments.forward_with(ours, images, chosen), theirs(images))


def test_segments_panel_measures_the_ticked_segments_beside_plain() -> None:
    panel = segments.segments_panel(NetA, batch, budget_bytes=112 * MiB, batch=2, max_batch=8)
    labels = [control.description for control in panel.controls.values()]
    assert labels[0] == "batch" and labels[1] == "seg0: layer1 -> 64x16x16"
    assert labels[5] == "seg4: layer8, layer9 -> 10"
    for name in ("seg0", "seg1", "seg2", "seg3", "seg4"):
        panel.controls[name].value = name == "seg0"
    run, figure = panel.run()
    assert run.chosen == frozenset({0}) and run.batch == 2
    assert run.saved_bytes["checkpointed"] < run.saved_bytes["plain"]
    assert all(len(run.times[name].cpu_s) == 3 for name in ("plain", "checkpointed"))
    text = panel.output.outputs[0]["text"]
    assert text.startswith("batch 2; checkpointed (non-reentrant): seg0\n")
    assert "fits 112 MiB" in text.splitlines()[1]
    assert " cpu time  checkpointed   median " in text and "beyond noise: " in text
    assert panel.output.outputs[1]["output_type"] == "display_data"
    assert figure_problems(figure) == []


def test_segments_run_with_nothing_ticked_is_the_plain_step_alone() -> None:
    run = segments.measure_segments(NetA, batch, chosen=(), batch=2, turns=1)
    assert list(run.saved_bytes) == list(run.times) == ["plain"]
    assert "checkpointed (non-reentrant): none (tick a segment)" in str(run)
    assert "fits" not in str(run)  # no budget given


def test_segments_panel_refuses_bad_input_in_one_line() -> None:
    for chosen, size, message in (((), 0, "batch must be at least 1"), ((5,), 2, "seg0..seg4")):
        with pytest.raises(ValueError, match=message) as error:
            segments.measure_segments(NetA, batch, chosen, size, turns=1)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="pass the notebook's NetA"):
        segments.segments_panel(lambda: torch.nn.Linear(2, 2), batch)
