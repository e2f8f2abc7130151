"""The floor is a floor: no strategy measured at the articles' sizes goes below it; the planner
profiles on the meta device exactly as on the CPU, and its plan beats every uniform split there."""

from __future__ import annotations

import pytest
import torch

from tutorial_utils.articles.models import NetA, vgg16_classifier
from tutorial_utils.checkpointing.selective import SelectiveCheckpoint
from tutorial_utils.measurement.dry_run import build_on_meta, meta_copy
from tutorial_utils.measurement.step import adam_optimizer, default_optimizer, measure_step
from tutorial_utils.planning.budget import plan_checkpoints
from tutorial_utils.planning.limits import backward_working_sets, peak_floor
from tutorial_utils.planning.planner import neta_as_sequential, profile_sequential


def _meta_batch(shape):
    return (
        torch.empty(shape, device="meta"),
        torch.empty(shape[0], dtype=torch.long, device="meta"),
    )


@pytest.fixture(scope="module")
def vgg_at_article_size():
    return build_on_meta(lambda: vgg16_classifier(2, layout="flat")), _meta_batch((64, 3, 224, 224))


def test_meta_profile_has_the_cpu_profiles_bytes_and_flops_and_no_time():
    torch.manual_seed(0)
    model = neta_as_sequential(NetA())
    sample = torch.randn(4, 3, 32, 32)
    real = profile_sequential(model, sample)
    dry = profile_sequential(meta_copy(model), sample.to("meta"))
    assert real.baseline_bytes == dry.baseline_bytes
    for a, b in zip(real.layers, dry.layers, strict=True):
        assert (a.input_bytes, a.output_bytes, a.internal_bytes, a.parameter_bytes) == (
            b.input_bytes,
            b.output_bytes,
            b.internal_bytes,
            b.parameter_bytes,
        )
        assert (a.saves_input, a.saves_output, a.forward_flops) == (
            b.saves_input,
            b.saves_output,
            b.forward_flops,
        )
        assert a.forward_seconds is not None and b.forward_seconds is None
    assert real.timed and not dry.timed
    assert sum(layer.forward_flops for layer in dry.layers) > 0


def test_no_strategy_goes_below_the_floor_for_vgg16_at_224_px(vgg_at_article_size):
    model, (inputs, targets) = vgg_at_article_size
    floor = peak_floor(model, inputs, targets)
    plan = plan_checkpoints(model, inputs)
    strategies = [*range(0, len(model) + 1, 3), plan, SelectiveCheckpoint(4)]
    peaks, optimizer_peaks = [], set()
    for segments in strategies:
        report = measure_step(
            model, inputs, targets, segments, default_optimizer(model.parameters())
        )
        peaks.append(report.peak_bytes)
        optimizer_peaks.add(report.phase_peak_bytes["optimizer"])
    assert min(peaks) >= floor.floor_bytes
    assert optimizer_peaks == {floor.optimizer_bytes}  # the same for every plan, as claimed
    assert floor.backward_bytes > floor.optimizer_bytes  # at 224 px the backward pass sets it
    # the floor is close enough to mean something: within 30% of the best plan measured
    assert min(peaks) < 1.3 * floor.floor_bytes


def test_planned_least_peak_beats_every_uniform_split_at_the_article_size(vgg_at_article_size):
    model, (inputs, targets) = vgg_at_article_size
    plan = plan_checkpoints(model, inputs)
    assert plan.recompute_seconds is None and plan.recompute_flops > 0
    planned = measure_step(model, inputs, targets, plan, default_optimizer(model.parameters()))
    uniform = min(
        measure_step(model, inputs, targets, k, default_optimizer(model.parameters())).peak_bytes
        for k in range(2, len(model) + 1)
    )
    assert planned.peak_bytes < 0.9 * uniform


def test_neta_floor_at_224_px_holds_for_its_checkpointed_segments():
    model = build_on_meta(lambda: neta_as_sequential(NetA()))
    inputs, targets = _meta_batch((31, 3, 224, 224))
    floor = peak_floor(model, inputs, targets, optimizer_factory=adam_optimizer)
    article = build_on_meta(lambda: NetA(use_checkpoint=True))
    checkpointed = measure_step(article, inputs, targets, 0, adam_optimizer(article.parameters()))
    assert checkpointed.peak_bytes >= floor.floor_bytes
    assert "BatchNorm2d" in floor.describe() or "ReLU" in floor.describe()


def test_working_sets_grow_with_what_a_module_saves():
    model = build_on_meta(lambda: vgg16_classifier(2, layout="flat"))
    profile = profile_sequential(model, torch.empty(8, 3, 64, 64, device="meta"))
    sets = backward_working_sets(profile, baseline_bytes=0)
    assert len(sets) == len(profile)
    # the first block's full-resolution ReLU/conv pair needs more than the final classifier
    assert max(sets[:4]) > sets[-1]
