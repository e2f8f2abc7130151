"""Notebook 07's mechanics: the chart against the card, the panel, the sizes."""

from __future__ import annotations

import json

import pytest

from tutorial_utils.display.figure_check import figure_problems
from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, estimate
from tutorial_utils.estimate.strategies import DEFAULT_STRATEGIES
from tutorial_utils.lessons.your_model import (
    YourModelPanel,
    model_options,
    plot_estimate,
    sizes_for,
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    config = tmp_path_factory.mktemp("config") / "config.json"
    config.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 500}
        )
    )
    workload = Workload(f"hf:{config}", batch=2, size=128, precision="amp-bf16", lora_rank=4)
    return estimate(workload, DEFAULT_STRATEGIES, parse_card("0.05GB", "10%"), search=False)


def test_chart_draws_every_measured_strategy_against_the_card(result):
    figure = plot_estimate(result, highlight="every block")
    (axes,) = figure.axes
    labels = [label.get_text() for label in axes.get_yticklabels()]
    assert labels == ["none", "every block", "every 2nd block", "selective: save matmuls"]
    bold = [
        label.get_text() for label in axes.get_yticklabels() if label.get_fontweight() == "bold"
    ]
    assert bold == ["every block"]
    card_lines = sorted(line.get_xdata()[0] for line in axes.get_lines())
    assert card_lines == pytest.approx([0.045, 0.05])
    assert figure_problems(figure) == []


def test_panel_estimates_and_searches_the_chosen_strategy():
    panel = YourModelPanel(sizes_for("ci"))
    panel.panel.controls["size"].value = 128
    figure, text = panel.panel.run()
    assert "every block: longest sequence that fits the card" in text
    assert "GPT2LMHeadModel" in text and figure.axes
    assert "torchvision:resnet18" in model_options()


def test_sizes_for_takes_a_profile_or_its_name():
    from tutorial_utils.articles.profiles import PROFILES

    assert sizes_for(PROFILES["cpu"]) == sizes_for("cpu")
    with pytest.raises(ValueError, match="no notebook-07 sizes"):
        sizes_for("laptop")
