"""The table of strategy kinds is the one place a kind is described: a kind added to it in a
fixture is parsed, helped, grouped, drawn and put on the default menu, with no other edit."""

from __future__ import annotations

from typing import get_args

import pytest

from tutorial_utils.__main__ import build_parser
from tutorial_utils.checkpointing import kinds
from tutorial_utils.checkpointing.kinds import STRATEGY_KINDS, FamilyStyle, KindRow
from tutorial_utils.checkpointing.strategy import Strategy, StrategyKind, parse_strategy
from tutorial_utils.estimate.strategies import default_strategies
from tutorial_utils.planning.strategies import family

NEW = KindRow(
    "toy",
    "a kind that only this test knows",
    (FamilyStyle("toy family", "#123456", "p"),),
    spellings=("toy",),
    default_spellings=("toy",),
)


@pytest.fixture
def new_kind(monkeypatch: pytest.MonkeyPatch) -> KindRow:
    monkeypatch.setitem(STRATEGY_KINDS, NEW.kind, NEW)
    return NEW


def _help(parser_args: list[str]) -> str:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    return subparsers.choices[parser_args[0]].format_help()  # type: ignore[attr-defined]


def test_the_type_checkers_list_of_kinds_is_the_table():
    assert get_args(StrategyKind) == tuple(STRATEGY_KINDS)


def test_a_kind_added_to_the_table_is_seen_everywhere(new_kind: KindRow):
    strategy = Strategy(new_kind.kind)  # type: ignore[arg-type]
    assert strategy.name == "toy"
    assert parse_strategy("toy") == strategy
    assert family(strategy, n_modules=4) == "toy family"
    assert kinds.families()["toy family"] == new_kind.families[0]
    assert strategy in default_strategies()
    assert "toy" in build_parser().parse_args(["estimate", "--hf-preset", "gpt2"]).strategies
    assert "toy: a kind that only this test knows" in " ".join(_help(["estimate"]).split())
    assert "toy" in " ".join(_help(["train"]).split())
    assert build_parser().parse_args(["train", "--experiment", "vgg16-dogcat", "--strategy", "toy"])


def test_a_kind_added_to_the_table_gets_its_style_on_the_pareto_plot(new_kind: KindRow):
    from tutorial_utils.lessons.choosing_what_to_checkpoint import plot_pareto

    rows = [
        {"family": "none", "checkpointing": "none", "step_seconds": None, "flops_ratio": 1.0,
         "added_mib": 10.0, "source": "dry run"},
        {"family": "toy family", "checkpointing": "toy", "step_seconds": None,
         "flops_ratio": 1.2, "added_mib": 5.0, "source": "dry run"},
    ]  # fmt: skip
    figure = plot_pareto(rows, "toy")  # type: ignore[arg-type]
    (ax,) = figure.axes
    labels = ax.get_legend_handles_labels()[1]
    assert labels[:2] == ["none", "toy family"]  # the table's order


def test_a_word_no_row_spells_is_one_clear_line():
    with pytest.raises(ValueError, match="unknown strategy 'every-0': use one of none") as error:
        parse_strategy("every-0")
    assert "\n" not in str(error.value)
    assert parse_strategy("every-3").every == 3 and parse_strategy("segments-4").segments == 4
