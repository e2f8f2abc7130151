"""Notebook 02's panel and sweeps on small Sequentials (fast), and on VGG16 where shapes suffice."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils.articles.models import vgg16_classifier
from tutorial_utils.lessons import vgg16_dogcat
from tutorial_utils.measurement.saved_tensors import saved_activations


def small_net(inplace: bool = False, dropout: float = 0.0) -> nn.Sequential:
    """Conv-ReLU-Conv-ReLU-pool-Flatten-Dropout-Linear on 3x8x8 inputs: 8 modules."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(inplace=inplace),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(inplace=inplace),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(4 * 4 * 4, 2),
    )


def test_saved_activations_match_a_real_forward_and_meta_costs_nothing() -> None:
    model = small_net()
    real = saved_activations(model, (2, 3, 8, 8), device=None)
    meta = saved_activations(model, (2, 3, 8, 8))
    assert [layer.saved_bytes for layer in real.layers] == [
        layer.saved_bytes for layer in meta.layers
    ]
    relu_out = 2 * 4 * 8 * 8 * 4
    assert real.layers[1].saved_bytes == relu_out  # the ReLU saves its output ...
    assert real.layers[2].saved_bytes == 0  # ... which the next conv saves too: counted once
    assert real.layers[4].output_shape == (2, 4, 4, 4)
    assert all(p.device.type == "cpu" for p in model.parameters())  # the model itself untouched


def test_saved_activations_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="batch, channels"):
        saved_activations(small_net(), (3, 8, 8))
    with pytest.raises(ValueError, match="meta"):
        saved_activations(small_net(), (2, 3, 8, 8), device="cpu")


def test_vgg16_at_224_px_is_dominated_by_the_first_block() -> None:
    account = saved_activations(vgg16_classifier(layout="flat"), (64, 3, 224, 224))
    relu_224 = 64 * 64 * 224 * 224 * 4
    assert account.layers[1].saved_bytes == relu_224
    first_block = sum(layer.saved_bytes for layer in account.layers[:5])
    assert first_block > 0.4 * account.total_saved_bytes


def test_article_layout_split_saves_almost_nothing_measured_by_dry_run() -> None:
    records = vgg16_dogcat.dry_run_sweep(vgg16_classifier(), 64, [0, 2])
    plain, split = records
    assert plain.dry_run and plain.seconds is None
    # the peak sits in the backward pass through the recomputed features: not one byte saved
    assert split.peak_bytes == plain.peak_bytes
    assert split.activation_peak_bytes == plain.activation_peak_bytes
    assert split.flops.recompute > 0.99 * plain.flops.forward  # it recomputes nearly everything


def test_flat_layout_best_split_and_table_at_224_px() -> None:
    records = vgg16_dogcat.dry_run_sweep(vgg16_classifier(layout="flat"), 64, [0, 2, 6, 40])
    best = min(records, key=lambda r: (r.peak_bytes, r.strategy.segments))
    assert best.strategy.segments == 6 and best.peak_bytes < 0.85 * records[0].peak_bytes
    assert records[-1].activation_peak_bytes > best.activation_peak_bytes  # too many segments
    table = vgg16_dogcat.format_sweep(records, chosen=6)
    assert "dry run (meta device)" in table and "GFLOP" in table and "<- chosen" in table


def test_segment_explorer_measures_once_per_scale_and_shows_the_chosen_count() -> None:
    calls = []

    def make_batch(batch_size):
        calls.append(batch_size)
        return torch.randn(batch_size, 3, 8, 8), torch.randint(0, 2, (batch_size,))

    pooled = nn.Sequential(  # any input size, as the explorer's 224 px scale needs
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.0),
        nn.Linear(16, 2),
    )
    explorer = vgg16_dogcat.SegmentExplorer(pooled, make_batch, initial_counts=(0, 2))
    text, sweep, breakdown = explorer.show(4, 2, vgg16_dogcat.MACHINE_SCALE)
    assert "<- chosen" in text and len(explorer.records) == 3 and "step s" in text
    explorer.show(4, 2, vgg16_dogcat.MACHINE_SCALE)
    assert calls == [2]  # nothing measured twice
    explorer.show(8, 2, vgg16_dogcat.MACHINE_SCALE)
    assert len(explorer.records) == 4 and calls == [2, 2]
    text, _, _ = explorer.show(4, 2, vgg16_dogcat.ARTICLE_SCALE)  # 224 px, never via make_batch
    assert calls == [2, 2] and "dry run" in text and len(explorer.records) == 7
    with pytest.raises(ValueError, match="out of range"):
        explorer.show(9, 2)
    with pytest.raises(ValueError, match="scale must be one of"):
        explorer.show(2, 2, "huge")
