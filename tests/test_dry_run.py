"""A dry run on the meta device measures the same tensor bytes as the real step, to the byte.

Every case runs one step on the CPU (real data, real arithmetic) and the same step on the meta
device (shapes only) and compares the tracked peak, its breakdown, the activation peak and the peak
of every phase. The tolerance is 0 bytes, with one explained exception: Adam keeps its step
counters as 4-byte CPU scalars whatever the device of the parameters, so a CPU step counts them as
optimizer state and a meta (or CUDA) step does not: exactly 4 bytes per parameter tensor.

Independent reference: PyTorch's own ``MemTracker`` (``torch.distributed._tools.mem_tracker``, a
private API used here only as a check) on the same meta steps at the articles' sizes: equal to
the byte.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import NetA, vgg16_classifier
from tutorial_utils.checkpointing.batchnorm import freeze_stats_during_recompute
from tutorial_utils.checkpointing.strategy import Strategy, equal_segments, scheduled, selective
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step, meta_copy
from tutorial_utils.measurement.flops import StepFlopCounter
from tutorial_utils.measurement.step import (
    DRY_RUN_LABEL,
    Recording,
    default_optimizer,
    measure_step,
    prime_optimizer_state,
    sweep_strategies,
)
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.planning.budget import plan_checkpoints

ADAM_STEP_COUNTER_BYTES = 4  # torch.tensor(0.0) per parameter tensor, always on the CPU


def _batch(shape, classes, device="cpu"):
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(*shape, generator=generator)
    targets = torch.randint(0, classes, (shape[0],), generator=generator)
    return inputs.to(device), targets.to(device)


def _strategy(setting) -> Strategy:
    """A segment count (``checkpoint_sequential``'s split), a plan, or a Strategy as it is."""
    if isinstance(setting, int):
        return equal_segments(setting)
    return setting if isinstance(setting, Strategy) else scheduled(setting)


def _both(model, shape, classes, segments=0, optimizer_factory=default_optimizer):
    """The same step measured on the CPU and dry-run on a meta copy of the same model."""
    inputs, targets = _batch(shape, classes)
    segments = _strategy(segments)
    twin = meta_copy(model)
    real = measure_step(
        model, inputs, targets, segments, optimizer_factory=optimizer_factory, time_step=False
    )
    dry = measure_step(
        twin, inputs.to("meta"), targets.to("meta"), segments, optimizer_factory=optimizer_factory
    )
    return real, dry


def _assert_equal(real, dry, adam_counters: int = 0):
    counters = adam_counters * ADAM_STEP_COUNTER_BYTES
    assert dry.device == "meta" and dry.seconds is None and dry.dry_run
    assert real.peak_bytes - dry.peak_bytes == counters
    expected = dict(real.breakdown, optimizer_state=real.breakdown["optimizer_state"] - counters)
    assert dry.breakdown == expected
    assert dry.activation_peak_bytes == real.activation_peak_bytes
    assert {k: v + counters for k, v in dry.phase_peak_bytes.items()} == real.phase_peak_bytes


@pytest.fixture(scope="module")
def vgg_article():
    torch.manual_seed(0)
    return vgg16_classifier(2, layout="article")


@pytest.fixture(scope="module")
def vgg_flat(vgg_article):
    from tutorial_utils.articles.models import flatten_vgg16

    return flatten_vgg16(vgg_article)


@pytest.mark.parametrize("segments", [0, 2])
def test_article_vgg16_dry_run_equals_the_real_step(vgg_article, segments):
    _assert_equal(*_both(vgg_article, (2, 3, 32, 32), 2, segments))


def test_flat_vgg16_segments_plan_and_selective_equal_the_real_step(vgg_flat):
    sample, _ = _batch((2, 3, 32, 32), 2)
    plan = plan_checkpoints(vgg_flat, sample)
    for segments in (0, 2, plan, selective(regions=4)):
        _assert_equal(*_both(vgg_flat, (2, 3, 32, 32), 2, segments))


def test_flat_vgg16_with_adam_differs_only_by_the_cpu_step_counters(vgg_flat):
    real, dry = _both(vgg_flat, (2, 3, 32, 32), 2, 6, adam_optimizer)
    _assert_equal(real, dry, adam_counters=len(list(vgg_flat.parameters())))


@pytest.mark.parametrize(
    "checkpoint, reentrant, bn_fix",
    [(False, False, False), (True, False, False), (True, True, False), (True, False, True)],
)
def test_neta_dry_run_equals_the_real_step(checkpoint, reentrant, bn_fix):
    torch.manual_seed(0)
    model = NetA(use_checkpoint=checkpoint, use_reentrant=reentrant)
    twin = NetA(use_checkpoint=checkpoint, use_reentrant=reentrant).to("meta")
    if bn_fix:
        freeze_stats_during_recompute(model)
        freeze_stats_during_recompute(twin)
    inputs, targets = _batch((4, 3, 32, 32), 10)
    real = measure_step(model, inputs, targets, optimizer_factory=adam_optimizer, time_step=False)
    dry = measure_step(
        twin, inputs.to("meta"), targets.to("meta"), optimizer_factory=adam_optimizer
    )
    _assert_equal(real, dry, adam_counters=len(list(model.parameters())))


def test_gradient_accumulation_dry_run_equals_the_real_step():
    peaks = {}
    for device in ("cpu", "meta"):
        torch.manual_seed(0)
        model = NetA().to(device)
        optimizer = adam_optimizer(model.parameters())
        prime_optimizer_state(optimizer)
        inputs, targets = _batch((8, 3, 32, 32), 10, device)
        tracker = TensorMemoryTracker(model, optimizer, inputs=(inputs, targets), device=device)
        with tracker:  # notebook 03's accumulation step: two halves, then one optimizer step
            optimizer.zero_grad(set_to_none=True)
            for x, y in zip(inputs.chunk(2), targets.chunk(2), strict=True):
                (nn.functional.cross_entropy(model(x), y) / 2).backward()
            optimizer.step()
        peaks[device] = (tracker.peak_bytes, tracker.activation_peak_bytes)
    counters = len(list(model.parameters())) * ADAM_STEP_COUNTER_BYTES
    assert peaks["cpu"][0] - peaks["meta"][0] == counters
    assert peaks["cpu"][1] == peaks["meta"][1]


def test_notebook_01_chain_dry_run_equals_the_real_step():
    model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(16)))
    for segments in (0, 4):
        _assert_equal(*_both(model, (256, 32), 32, segments))


def test_dry_run_reports_flops_by_phase_and_recompute_only_when_checkpointing(vgg_flat):
    plain = dry_run_step(vgg_flat, (2, 3, 32, 32))
    checkpointed = dry_run_step(vgg_flat, (2, 3, 32, 32), equal_segments(4))
    assert plain.flops.recompute == 0 < checkpointed.flops.recompute
    assert checkpointed.flops.forward == plain.flops.forward
    assert checkpointed.flops.backward == plain.flops.backward
    # recomputing 3 of 4 equal-count segments re-runs part of the forward, never more than all
    assert 0 < checkpointed.flops.recompute < plain.flops.forward
    assert 1 < checkpointed.flops.overhead_vs(plain.flops) < 1.5


def test_flop_counts_match_pytorchs_flop_counter(vgg_flat):
    from torch.utils.flop_counter import FlopCounterMode

    model = build_on_meta(lambda: vgg16_classifier(2, layout="flat"))
    inputs, targets = torch.empty(2, 3, 64, 64, device="meta"), torch.zeros(2, dtype=torch.long)
    totals = []
    for counter in (StepFlopCounter(), FlopCounterMode(display=False)):
        with counter:
            nn.functional.cross_entropy(
                equal_segments(4).run(model, inputs), targets.to("meta")
            ).backward()
        totals.append(counter.result().total if isinstance(counter, StepFlopCounter) else None)
        totals[-1] = totals[-1] if totals[-1] is not None else counter.get_total_flops()
        model.zero_grad(set_to_none=True)
    assert totals[0] == totals[1] > 0


def test_a_dry_run_leaves_the_callers_model_alone(vgg_flat):
    before = vgg_flat[0].weight.detach().clone()
    report = dry_run_step(vgg_flat, (64, 3, 224, 224), equal_segments(6))
    assert torch.equal(vgg_flat[0].weight, before) and vgg_flat[0].weight.device.type == "cpu"
    assert report.source == DRY_RUN_LABEL
    assert report.batch_size == 64


def test_article_size_dry_run_is_fast_and_checkpointing_moves_the_peak():
    model = build_on_meta(lambda: vgg16_classifier(2, layout="flat"))
    started = time.perf_counter()
    plain = dry_run_step(model, (64, 3, 224, 224))
    elapsed = time.perf_counter() - started
    checkpointed = dry_run_step(model, (64, 3, 224, 224), equal_segments(6))
    assert elapsed < 5  # the target; about 0.1 s on a 2-core machine
    assert plain.peak_bytes > 5.5 * 2**30  # activations of 224 px, batch 64 are gigabytes
    assert checkpointed.peak_bytes < 0.85 * plain.peak_bytes


def test_rounding_to_cuda_blocks_never_lowers_and_rounds_every_storage():
    model = build_on_meta(lambda: NetA())
    exact = dry_run_step(model, (3, 3, 17, 17), optimizer_factory=adam_optimizer)
    blocks = dry_run_step(
        model,
        (3, 3, 17, 17),
        optimizer_factory=adam_optimizer,
        recording=Recording(round_to_blocks=True),
    )
    assert blocks.peak_bytes > exact.peak_bytes
    assert blocks.peak_bytes % 512 == 0 and blocks.rounded_to_blocks


def test_sweep_and_batch_search_run_as_dry_runs():
    model = build_on_meta(lambda: vgg16_classifier(2, layout="flat"))
    inputs = torch.empty(8, 3, 224, 224, device="meta")
    targets = torch.empty(8, dtype=torch.long, device="meta")
    splits = [equal_segments(0), equal_segments(6)]
    records = sweep_strategies(model, inputs, targets, splits, device="meta")
    assert all(r.seconds is None and r.time_ratio is None for r in records)
    assert records[1].peak_ratio < 1
    card = dict(budget_bytes=int(2.5 * 2**30), device="meta", optimizer_factory=adam_optimizer)
    plain = find_max_batch_size(NetA, (3, 224, 224), **card)
    checkpointed = find_max_batch_size(lambda: NetA(use_checkpoint=True), (3, 224, 224), **card)
    assert plain.device == "meta" and 1 < plain.batch_size < checkpointed.batch_size
    fitting = [t for t in checkpointed.trials if t.fits]
    assert all(t.peak_bytes <= 2.5 * 2**30 for t in fitting)


def test_timeline_categories_add_up_and_phases_come_in_order():
    model = build_on_meta(lambda: NetA(use_checkpoint=True))
    report = dry_run_step(
        model, (8, 3, 64, 64), optimizer_factory=adam_optimizer, recording=Recording(timeline=True)
    )
    assert len(report.timeline) == len(report.category_timeline) > 0
    for event, categories in zip(report.timeline, report.category_timeline, strict=True):
        assert sum(categories.values()) == event.current_bytes
    phases = [event.phase for event in report.timeline]
    assert phases[0] == "forward" and phases[-1] == "optimizer"
    assert "recompute" in phases
    first_backward = phases.index("backward")
    assert "forward" not in phases[first_backward:]
    assert max(e.current_bytes for e in report.timeline) == report.peak_bytes


def _memtracker_peak(model, inputs, targets, segments, optimizer):
    from torch.distributed._tools.mem_tracker import MemTracker

    prime_optimizer_state(optimizer)
    tracker = MemTracker()
    tracker.track_external(model, optimizer, inputs, targets)
    with tracker:
        outputs = _strategy(segments).run(model, inputs)
        nn.functional.cross_entropy(outputs, targets).backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return tracker.get_tracker_snapshot("peak")[torch.device("meta")]["Total"]


@pytest.mark.parametrize(
    "name, make, shape, segments, factory",
    [
        (
            "VGG16 flat",
            lambda: vgg16_classifier(2, layout="flat"),
            (64, 3, 224, 224),
            0,
            default_optimizer,
        ),
        (
            "VGG16 flat",
            lambda: vgg16_classifier(2, layout="flat"),
            (64, 3, 224, 224),
            6,
            default_optimizer,
        ),
        ("VGG16 article", lambda: vgg16_classifier(2), (64, 3, 224, 224), 2, default_optimizer),
        ("NetA", NetA, (23, 3, 224, 224), 0, adam_optimizer),
        (
            "NetA checkpointed, reentrant",
            lambda: NetA(use_checkpoint=True, use_reentrant=True),
            (23, 3, 224, 224),
            0,
            adam_optimizer,
        ),
        (
            "NetA checkpointed",
            lambda: NetA(use_checkpoint=True),
            (31, 3, 224, 224),
            0,
            adam_optimizer,
        ),
    ],
)
def test_pytorchs_memtracker_agrees_at_the_articles_sizes(name, make, shape, segments, factory):
    ours = dry_run_step(build_on_meta(make), shape, _strategy(segments), optimizer_factory=factory)
    model = build_on_meta(make)
    inputs = torch.empty(*shape, device="meta")
    targets = torch.empty(shape[0], dtype=torch.long, device="meta")
    theirs = _memtracker_peak(model, inputs, targets, segments, factory(model.parameters()))
    # Two trackers written apart (theirs classifies by module hooks, ours by storage) agree to
    # the byte at the articles' sizes: neither counts anything the other misses.
    assert ours.peak_bytes == theirs, (name, ours.peak_bytes, theirs)


def test_op_tensors_finds_what_pytree_finds_in_op_arguments():
    """The dispatch modes' fast walk gives pytree's tensors, in pytree's order, for what aten
    ops pass: tensors, scalars, lists (foreach), nested tuples and keyword arguments."""
    from torch.utils._pytree import tree_leaves

    from tutorial_utils.measurement.op_tensors import op_tensors

    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    cases = [((a, 2.0), {}), (([a, b, c], [b]), {"alpha": 1}), ((a, (b, [c, None])), {"out": a})]
    for args, kwargs in cases:
        expected = [v for v in tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        found = op_tensors(args, kwargs)
        assert len(found) == len(expected)
        assert all(x is y for x, y in zip(found, expected, strict=True))
    assert [t.numel() for t in op_tensors((b, a))] == [2, 1]  # order kept
