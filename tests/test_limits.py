"""The floor is a floor: no strategy measured at the articles' sizes goes below it; the planner
profiles on the meta device exactly as on the CPU, and its plan beats every uniform split there."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import NetA, neta_as_sequential, vgg16_classifier
from tutorial_utils.checkpointing.strategy import equal_segments, scheduled, selective
from tutorial_utils.measurement.dry_run import build_on_meta, meta_copy
from tutorial_utils.measurement.step import measure_step
from tutorial_utils.planning.budget import plan_checkpoints
from tutorial_utils.planning.limits import peak_floor
from tutorial_utils.planning.planner import evaluate_plan
from tutorial_utils.planning.profile import profile_sequential
from tutorial_utils.units import MiB


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
    strategies = [equal_segments(k) for k in range(0, len(model) + 1, 3)]
    strategies += [scheduled(plan), selective(regions=4)]
    peaks, optimizer_peaks = [], set()
    for strategy in strategies:
        report = measure_step(model, inputs, targets, strategy)
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
    planned = measure_step(model, inputs, targets, scheduled(plan))
    uniform = min(
        measure_step(model, inputs, targets, equal_segments(k)).peak_bytes
        for k in range(2, len(model) + 1)
    )
    assert planned.peak_bytes < 0.9 * uniform


def test_neta_floor_at_224_px_holds_for_its_checkpointed_segments():
    model = build_on_meta(lambda: neta_as_sequential(NetA()))
    inputs, targets = _meta_batch((31, 3, 224, 224))
    floor = peak_floor(model, inputs, targets, optimizer_factory=adam_optimizer)
    article = build_on_meta(lambda: NetA(use_checkpoint=True))
    checkpointed = measure_step(article, inputs, targets, optimizer_factory=adam_optimizer)
    assert checkpointed.peak_bytes >= floor.floor_bytes
    assert "BatchNorm2d" in floor.describe() or "ReLU" in floor.describe()


def _compositions(n):
    """Every split of 0..n into contiguous runs."""
    if n == 0:
        yield []
        return
    for first in range(1, n + 1):
        for rest in _compositions(n - first):
            yield [first, *rest]


def every_one_level_plan(n):
    """Every plan over top-level boundaries: each run of modules checkpointed or not."""
    for sizes in _compositions(n):
        bounds, start = [], 0
        for size in sizes:
            bounds.append((start, start + size))
            start += size
        for flags in itertools.product((False, True), repeat=len(bounds)):
            yield [(s, e, c) for (s, e), c in zip(bounds, flags, strict=True)]


def _chain(kind):
    torch.manual_seed(0)
    if kind == "the review's counterexample":
        layers = [
            nn.Conv2d(3, 16, 3, padding=1),
            nn.Sequential(nn.MaxPool2d(2), nn.ReLU()),
            nn.Flatten(),
            nn.Linear(16 * 16 * 16, 10),
        ]
        return nn.Sequential(*layers), (8, 3, 32, 32)
    if kind == "nested Sequentials":
        layers = [
            nn.Linear(64, 96),
            nn.Sequential(nn.Tanh(), nn.Linear(96, 96), nn.ReLU()),
            nn.Sequential(nn.Linear(96, 48), nn.Sequential(nn.Sigmoid(), nn.Linear(48, 10))),
            nn.ReLU(),
        ]
        return nn.Sequential(*layers), (16, 64)
    if kind == "views":
        layers = [
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),  # a view: allocates nothing
            nn.Linear(8 * 16 * 16, 10),
        ]
        return nn.Sequential(*layers), (4, 3, 16, 16)
    if kind == "frozen prefix":
        layers = [nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh()]
        for module in layers[:2]:
            module.requires_grad_(False)
        return nn.Sequential(*layers), (16, 32)
    if kind == "in-place ReLUs":
        layers = [
            nn.Linear(32, 64),
            nn.ReLU(inplace=True),
            nn.Linear(64, 64),
            nn.ReLU(inplace=True),
        ]
        return nn.Sequential(*layers), (16, 32)
    raise ValueError(kind)


CHAINS = [
    "the review's counterexample",
    "nested Sequentials",
    "views",
    "frozen prefix",
    "in-place ReLUs",
]


@pytest.mark.parametrize("kind", CHAINS)
def test_exhaustive_search_never_goes_below_the_measured_floor(kind):
    """Every one-level plan of the chain, and selective checkpointing, measured by dry run: none
    is below the floor, and the best is close to it (the floor is tight enough to mean something)."""
    model, shape = _chain(kind)
    model = meta_copy(model)
    inputs, targets = _meta_batch(shape)
    floor = peak_floor(model, inputs, targets)
    profile = profile_sequential(model, inputs)
    strategies = [scheduled(evaluate_plan(profile, b)) for b in every_one_level_plan(len(model))]
    strategies += [selective(regions=k) for k in (1, 2)]
    peaks = []
    for strategy in strategies:
        try:
            report = measure_step(model, inputs, targets, strategy)
        except RuntimeError as error:  # a checkpoint whose input an in-place op then modifies
            assert "inplace" in str(error) or "mutated" in str(error)
            continue
        peaks.append(report.peak_bytes)
    assert len(peaks) >= 10  # PyTorch refuses the rest
    assert min(peaks) >= floor.floor_bytes, kind
    assert min(peaks) < 1.5 * floor.floor_bytes, kind


def test_the_counterexample_is_a_counterexample_to_the_formula_not_to_the_floor():
    """Adding the input gradient to what a composite module saves overshoots: the inner ReLU's
    output is freed before MaxPool's input gradient exists. The measured floor is below plain."""
    model, shape = _chain("the review's counterexample")
    model = meta_copy(model)
    inputs, targets = _meta_batch(shape)
    floor = peak_floor(model, inputs, targets)
    block = next(m for m in floor.modules if m.name == "1: Sequential")
    pool_input, indices, small = 8 * 16 * 32 * 32 * 4, 8 * 16 * 16 * 16 * 8, 8 * 16 * 16 * 16 * 4
    # the formula: everything saved (pool input, indices, ReLU output) + output and input gradients
    formula = pool_input + indices + small + small + pool_input
    # measured: at MaxPool's backward, ReLU's output and the block's output gradient are gone; the
    # gradient between the two (small) and MaxPool's input gradient are there
    assert block.backward_peak_bytes == pool_input + indices + small + pool_input < formula
    plain = measure_step(model, inputs, targets)
    assert plain.peak_bytes >= floor.floor_bytes


def test_a_frozen_module_on_a_frozen_input_needs_nothing_in_backward():
    model, shape = _chain("frozen prefix")
    floor = peak_floor(meta_copy(model), *_meta_batch(shape))
    assert [m.backward_peak_bytes for m in floor.modules[:2]] == [0, 0]
    assert all(m.backward_peak_bytes > 0 for m in floor.modules[2:])


def test_the_floor_says_when_a_peak_sits_on_it_and_refuses_one_below():
    model, shape = _chain("in-place ReLUs")
    floor = peak_floor(meta_copy(model), *_meta_batch(shape))
    assert floor.distance(floor.floor_bytes).startswith("on the floor")
    assert "above the floor" in floor.distance(floor.floor_bytes + 2 * MiB)
    with pytest.raises(ValueError, match="below the floor"):
        floor.distance(floor.floor_bytes - 1)
