"""The identical-blocks shortcut (``estimate.block_shortcut``) against the full dry run: every
figure of the step, the allocator's replay and the kernels equal to the byte."""

import pytest

from tutorial_utils.estimate import block_shortcut, estimator
from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, build_model
from tutorial_utils.estimate.strategies import parse_strategy

pytestmark = pytest.mark.slow  # tens of seconds: started early, beside the notebooks

LAYERS = 11  # 3, 4, 5 blocks dry-run (none: 5, 6, 7; every 2nd: 6, 8, 10), written out to 11


def both_ways(model, workload, card, strategy, monkeypatch):
    """(the full dry run's outcome, the shortcut's; None where it does not apply)."""
    monkeypatch.setattr(estimator, "SHORTCUT_BLOCKS", False)
    full = estimator._outcome(model, workload, card, None, strategy)
    monkeypatch.setattr(block_shortcut, "MIN_SAVED_BLOCKS", 1)
    monkeypatch.setattr(block_shortcut, "MAX_TRACED_SHARE", 10.0)  # a tiny model: run it anyway
    shortcut = block_shortcut.estimate_outcome(
        model,
        workload,
        card,
        strategy,
        train_step=estimator.train_step,
        predict_allocator=estimator.predict_allocator,
    )
    return full, shortcut


def assert_same(full, shortcut):
    report, allocator, gpu, kept = full
    assert shortcut is not None, "the shortcut did not apply"
    assert shortcut[0] == report  # peaks, breakdown, phases, FLOPs: every field
    assert shortcut[1] == allocator  # the replay of the written-out events
    assert shortcut[3] == kept
    assert shortcut[2].kernels == gpu.kernels
    # seconds are sums of floats: the extended sum may differ in its last bits
    assert shortcut[2].predicted_seconds == pytest.approx(gpu.predicted_seconds, rel=1e-12)


@pytest.mark.parametrize(
    ("strategy", "lora"),
    [("every-block", 4), ("every-2", 0), ("selective", 4), ("none", 4)],
)
def test_the_shortcut_equals_the_full_dry_run(tiny_config, monkeypatch, strategy, lora):
    workload = Workload(
        "hf:" + tiny_config("llama", num_hidden_layers=LAYERS),
        batch=1,
        size=32,
        precision="bf16",
        lora_rank=lora,
    )
    card = parse_card("24GB", "0", "a100-80gb", False)
    model = build_model(workload)
    full, shortcut = both_ways(model, workload, card, parse_strategy(strategy), monkeypatch)
    assert_same(full, shortcut)


def test_blocks_that_differ_are_dry_run_in_full(tiny_config, monkeypatch):
    workload = Workload("hf:" + tiny_config("llama", num_hidden_layers=LAYERS), batch=1, size=32)
    model = build_model(workload)
    layers = block_shortcut.identical_blocks(model)
    assert layers is not None
    layers[2][3].mlp.up_proj.weight.requires_grad_(False)  # one block now differs
    assert block_shortcut.identical_blocks(model) is None
    card = parse_card("24GB", "0", "any", False)
    full, shortcut = both_ways(model, workload, card, parse_strategy("every-block"), monkeypatch)
    assert shortcut is None
    assert not isinstance(full, str) and full[0].peak_bytes > 0
