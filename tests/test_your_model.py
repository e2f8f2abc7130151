"""Notebook 07's mechanics: the chart against the card, the panel, the sizes."""

from __future__ import annotations

import json

import pytest

from tutorial_utils.display.figure_check import figure_problems
from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, estimate
from tutorial_utils.estimate.strategies import DEFAULT_STRATEGIES
from tutorial_utils.lessons.your_model import (
    GPU_CARD,
    YourModelPanel,
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
    return estimate(workload, DEFAULT_STRATEGIES, parse_card("1GB", "10%"), search=False)


def test_chart_draws_every_measured_strategy_against_the_card(result):
    figure = plot_estimate(result, highlight="every block")
    (axes,) = figure.axes
    labels = [label.get_text() for label in axes.get_yticklabels()]
    assert labels == ["none", "every block", "every 2nd block", "selective: matmuls+convs"]
    bold = [
        label.get_text() for label in axes.get_yticklabels() if label.get_fontweight() == "bold"
    ]
    assert bold == ["every block"]
    card_lines = sorted(line.get_xdata()[0] for line in axes.get_lines())
    card = result.card
    assert card_lines == pytest.approx([card.budget_bytes / 2**30, card.total_bytes / 2**30])
    assert figure_problems(figure) == []


def test_panel_estimates_and_searches_the_chosen_strategy():
    panel = YourModelPanel(sizes_for("ci"))
    panel.panel.controls["size"].value = 128
    figure, text = panel.panel.run()
    assert "every block: longest sequence that fits the card" in text
    assert "GPT2LMHeadModel" in text and figure.axes
    assert "torchvision:resnet18" in panel.panel.controls["model"].options


@pytest.mark.slow  # its module's unit of work starts early, not last (tests/schedule.py)
def test_panel_offers_the_commands_gpu_qlora_and_allocator_choices():
    """The panel's GPU, nf4 and expandable-segments choices reach the estimate as the command's
    --gpu, --precision nf4 and --expandable-segments do: the T4's own memory and its kernel."""
    panel = YourModelPanel(sizes_for("ci"))
    controls = panel.panel.controls
    assert "nf4" in controls["precision"].options and "t4" in controls["gpu"].options
    controls["size"].value = 128
    controls["card"].value = GPU_CARD
    controls["gpu"].value = "t4"
    controls["expandable_segments"].value = True
    _, text = panel.panel.run()
    assert "card from --gpu (T4)" in text and "expandable" in text


def test_sizes_for_takes_a_profile_or_its_name():
    from tutorial_utils.articles.profiles import PROFILES

    assert sizes_for(PROFILES["cpu"]) == sizes_for("cpu")
    with pytest.raises(ValueError, match="no notebook-07 sizes"):
        sizes_for("laptop")


def test_the_selective_label_says_what_its_policy_saves():
    """'matmuls+convs': the policy keeps convolutions' and matrix products' outputs (a ResNet
    block's and a transformer block's) and recomputes the rest, BatchNorm and ReLU included."""
    import torch

    from tutorial_utils.estimate.strategies import parse_strategy

    selective = parse_strategy("selective")
    policy = selective.checkpoint_kwargs()["context_fn"].args[0]
    aten = torch.ops.aten
    kept = (aten.convolution.default, aten.mm.default, aten.addmm.default, aten.bmm.default)
    recomputed = (aten.native_batch_norm.default, aten.relu.default)
    assert all(policy(None, op).name == "MUST_SAVE" for op in kept)
    assert all(policy(None, op).name == "PREFER_RECOMPUTE" for op in recomputed)
    assert selective.name == "selective: matmuls+convs"
