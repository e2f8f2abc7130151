"""Notebook 02's mechanics on small Sequentials (fast), and on VGG16 only where shapes suffice."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tutorial_utils.articles.models import vgg16_classifier
from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.lessons import vgg16_dogcat
from tutorial_utils.measurement.gradients import max_difference, parameter_gradients
from tutorial_utils.training.loop import EpochRecord, History

MiB = 2**20


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


INPUTS = torch.randn(2, 3, 8, 8)


def history(label: str, seconds: float, tracked: float, accuracy: float) -> History:
    record = EpochRecord(0, None, None, accuracy, 0.5, seconds, 10.0, tracked_peak_mib=tracked)
    return History(label, [record])


def test_article_figures_are_the_quoted_ones() -> None:
    assert vgg16_dogcat.ARTICLE.memory_ratio == pytest.approx(10550.125 / 14222.125)
    assert vgg16_dogcat.ARTICLE.time_ratio == pytest.approx(405 / 300)


def test_comparison_uses_the_measured_numbers() -> None:
    plain, ckpt = history("p", 10.0, 200.0, 70.0), history("c", 13.0, 150.0, 70.0)
    table = vgg16_dogcat.comparison_table(plain, ckpt)
    assert "14222.1" in table and "not reported" in table
    assert "1.30" in table and "0.75" in table  # our time and memory ratios
    statements = " ".join(vgg16_dogcat.comparison_statements(plain, ckpt))
    assert "+30%" in statements and "75.0% of the plain run's 200.0 MiB" in statements
    assert "CUDA peak allocated): not measurable" in statements
    fig = vgg16_dogcat.plot_ratio_comparison(plain, ckpt)
    assert len(fig.axes) == 2


def test_the_time_statement_gives_one_ratio_the_tables_with_ranges_and_flops() -> None:
    def two_epochs(label: str, first: float, second: float) -> History:
        run = history(label, first, 100.0, 70.0)
        run.records.append(
            EpochRecord(1, None, None, 70.0, 0.5, second, 10.0, tracked_peak_mib=100.0)
        )
        return run

    plain, ckpt = two_epochs("p", 60.0, 70.0), two_epochs("c", 80.0, 82.0)
    statement = " ".join(vgg16_dogcat.comparison_statements(plain, ckpt, flops_ratio=1.33))
    assert "+25%" in statement  # the ratio of mean epoch times, 81 / 65: the table's
    assert "60.0-70.0 over 2 runs" in statement and "FLOPs predict x1.33" in statement
    assert "fastest" not in statement  # one statistic for the time, not two


def test_the_flop_ratio_of_segments_2_counts_the_recomputed_forward() -> None:
    model = vgg16_classifier(2, layout="article")
    ratio = vgg16_dogcat.checkpointed_flops_ratio(model, batch_size=2, image_size=32)
    assert 1.2 < ratio < 1.4  # most of the network's forward runs twice
    assert all(p.device.type == "cpu" for p in model.parameters())  # dry run on a copy


def test_summarize_rejects_an_empty_history() -> None:
    with pytest.raises(ValueError, match="no epochs"):
        vgg16_dogcat.summarize_run(History("empty"))


def test_saved_activations_match_a_real_forward_and_meta_costs_nothing() -> None:
    model = small_net()
    real = vgg16_dogcat.saved_activations(model, (2, 3, 8, 8), device=None)
    meta = vgg16_dogcat.saved_activations(model, (2, 3, 8, 8))
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
        vgg16_dogcat.saved_activations(small_net(), (3, 8, 8))
    with pytest.raises(ValueError, match="meta"):
        vgg16_dogcat.saved_activations(small_net(), (2, 3, 8, 8), device="cpu")


def test_vgg16_at_224_px_is_dominated_by_the_first_block() -> None:
    account = vgg16_dogcat.saved_activations(vgg16_classifier(layout="flat"), (64, 3, 224, 224))
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
    best = vgg16_dogcat.best_uniform_split(records)
    assert best.strategy.segments == 6 and best.peak_bytes < 0.85 * records[0].peak_bytes
    assert records[-1].activation_peak_bytes > best.activation_peak_bytes  # too many segments
    table = vgg16_dogcat.format_sweep(records, chosen=6)
    assert "dry run (meta device)" in table and "GFLOP" in table and "<- chosen" in table


def test_step_timelines_are_real_or_dry_by_the_inputs_device() -> None:
    model = small_net()
    targets = torch.tensor([0, 1])
    real = vgg16_dogcat.step_timelines(model, INPUTS, targets)
    dry = vgg16_dogcat.step_timelines(model, INPUTS.to("meta"), targets.to("meta"))
    assert list(real) == ["segments=0", "segments=2"]
    for label in real:
        assert not real[label].dry_run and dry[label].dry_run
        assert real[label].peak_bytes == dry[label].peak_bytes
        assert len(real[label].category_timeline) == len(real[label].timeline) > 10
    assert all(p.grad is None and p.device.type == "cpu" for p in model.parameters())


def test_reentrant_without_input_grad_leaves_the_checkpointed_segment_without_gradients() -> None:
    model = small_net()
    counts, messages = vgg16_dogcat.gradients_per_segment(
        model, INPUTS, 2, use_reentrant=True, input_requires_grad=False
    )
    assert counts[0].checkpointed and counts[0].with_gradient == 0 < counts[0].parameters
    assert counts[1].with_gradient == counts[1].parameters
    assert any("requires_grad" in message for message in messages)
    for reentrant, requires_grad in ((True, True), (False, False)):
        counts, _ = vgg16_dogcat.gradients_per_segment(
            model, INPUTS, 2, use_reentrant=reentrant, input_requires_grad=requires_grad
        )
        assert all(c.with_gradient == c.parameters for c in counts)


def test_omitting_use_reentrant_warns_and_behaves_reentrant() -> None:
    counts, messages = vgg16_dogcat.gradients_per_segment(
        small_net(), INPUTS, 2, use_reentrant=None, input_requires_grad=False
    )
    assert counts[0].with_gradient == 0
    assert any("use_reentrant" in message for message in messages)


def test_dropout_gradients_match_only_with_the_rng_state_preserved() -> None:
    model = small_net(dropout=0.5)
    # 8 modules in 4 segments: the Dropout (module 6) is in the last; 8 segments checkpoint it
    assert vgg16_dogcat.dropout_segments(model, 4) == [(6, 8, False)]
    assert vgg16_dogcat.dropout_segments(model, 8) == [(6, 7, True)]
    reference = parameter_gradients(model, INPUTS, seed=3)
    preserved = parameter_gradients(model, INPUTS, equal_segments(8), seed=3)
    fresh = parameter_gradients(model, INPUTS, equal_segments(8, preserve_rng_state=False), seed=3)
    assert max_difference(reference, preserved) == 0.0
    assert max_difference(reference, fresh) > 0.0


def test_call_counts_show_recomputation_and_the_early_stop() -> None:
    model = small_net()
    assert vgg16_dogcat.forward_call_counts(model, INPUTS, 0) == [1] * 8
    assert vgg16_dogcat.forward_call_counts(model, INPUTS, 1) == [1] * 8
    non_reentrant = vgg16_dogcat.forward_call_counts(model, INPUTS, 2)
    assert non_reentrant[:3] == [2, 2, 2] and non_reentrant[4:] == [1] * 4
    assert non_reentrant[3] == 1  # stopped inside the segment's last module
    reentrant = vgg16_dogcat.forward_call_counts(model, INPUTS, 2, use_reentrant=True)
    assert reentrant == [2, 2, 2, 2, 1, 1, 1, 1]


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


def test_sqrt_rule() -> None:
    assert vgg16_dogcat.sqrt_rule(40) == 6
    assert vgg16_dogcat.sqrt_rule(2) == 2


def test_run_state_report_lists_what_was_written(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    (tmp_path / "plain").mkdir()
    torch.save(model.state_dict(), tmp_path / "plain" / "epoch_1.pt")
    report = vgg16_dogcat.run_state_report(tmp_path, True, model, "gpu")
    assert report.startswith(f"1 file, 0 MiB under {tmp_path}") and "plain/epoch_1.pt" in report


def test_run_state_report_counts_what_an_unsaved_run_would_weigh(tmp_path) -> None:
    torch.manual_seed(0)
    vgg = vgg16_classifier(2, layout="article")
    # weights and one momentum buffer per parameter, 4 bytes each, no buffers in VGG16
    assert vgg16_dogcat.sgd_momentum_state_bytes(vgg) == 2 * 4 * 134_268_738
    frozen = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    frozen[0].weight.requires_grad_(False)
    # state_dict: 12 + 3 + 3 + 3 + 3 + 3 floats and one int64 counter; momentum: 3 + 3 + 3
    assert vgg16_dogcat.sgd_momentum_state_bytes(frozen) == 27 * 4 + 8 + 9 * 4
    report = vgg16_dogcat.run_state_report(tmp_path, False, vgg, "cpu")
    assert "profile cpu wrote no training state" in report and "1,024 MiB a run" in report
    assert list(tmp_path.iterdir()) == []


def test_fresh_cuda_state_says_there_is_nothing_to_reset_off_a_gpu() -> None:
    assert vgg16_dogcat.fresh_cuda_state("cpu").startswith("cpu: no CUDA state to reset")


def test_gradients_per_segment_reports_torch_warnings_only() -> None:
    """A warning raised by other code during the step (a kernel's deprecation, say) is not shown."""
    import warnings

    model = small_net()
    hook = model[0].register_forward_hook(lambda *_: warnings.warn("not torch's", stacklevel=1))
    try:
        _, messages = vgg16_dogcat.gradients_per_segment(
            model, INPUTS, 2, use_reentrant=True, input_requires_grad=False
        )
    finally:
        hook.remove()
    assert messages and all("not torch's" not in m for m in messages)
    assert any("requires_grad" in m or "gradient" in m.lower() for m in messages)
