"""The tracker measures what a hand count of a simple chain predicts; the searches and readers work."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

from tutorial_utils.articles.models import NetA
from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.measurement import nvml
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.nvml import cuda_readings, nvml_used_mib
from tutorial_utils.measurement.step import measure_step, sweep_strategies
from tutorial_utils.measurement.tracker import CATEGORIES, MemoryLimitExceeded, TensorMemoryTracker

N_BLOCKS, BATCH, WIDTH = 64, 1024, 32  # activations dominate: BATCH >> WIDTH
FLOAT = 4


def linear_chain(n_blocks: int = N_BLOCKS, width: int = WIDTH) -> nn.Sequential:
    """Equal Linear+ReLU blocks: each keeps exactly one (BATCH, WIDTH) tensor for backward."""
    torch.manual_seed(0)
    layers = []
    for _ in range(n_blocks):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def chain_batch(batch: int = BATCH, width: int = WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(batch, width, generator=generator), torch.randint(0, width, (batch,))


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def plain_and_checkpointed():
    inputs, targets = chain_batch()
    segments = round(math.sqrt(2 * N_BLOCKS))  # modules = 2 per block
    reports = {}
    for count in (0, segments):
        model = linear_chain()
        reports[count] = measure_step(model, inputs, targets, strategy=equal_segments(count))
    return reports, segments


def test_plain_peak_is_the_hand_count_not_more(plain_and_checkpointed):
    reports, _ = plain_and_checkpointed
    report = reports[0]
    model = linear_chain()
    activation = BATCH * WIDTH * FLOAT
    saved = N_BLOCKS * activation  # one ReLU output per block, also the next Linear's input
    params = parameter_bytes(model)
    # inputs + targets, parameters, gradients, momentum, and a few (BATCH, WIDTH) temporaries
    # (logits, log-softmax, the gradient flowing back, a pre-ReLU output).
    ceiling = saved + activation + BATCH * 8 + 3 * params + 4 * activation
    assert saved <= report.peak_bytes <= ceiling
    assert report.breakdown["parameters"] == params
    assert report.breakdown["optimizer_state"] == params  # momentum existed before the step


def test_sqrt_n_segments_cut_the_peak_several_times(plain_and_checkpointed):
    reports, segments = plain_and_checkpointed
    assert reports[0].peak_bytes / reports[segments].peak_bytes > 2.5
    plain, checkpointed = reports[0], reports[segments]
    assert plain.activation_peak_bytes >= N_BLOCKS * BATCH * WIDTH * FLOAT
    assert plain.activation_peak_bytes / checkpointed.activation_peak_bytes > 2.5


def test_breakdown_sums_to_the_peak(plain_and_checkpointed):
    reports, _ = plain_and_checkpointed
    for report in reports.values():
        assert set(report.breakdown) == set(CATEGORIES)
        assert sum(report.breakdown.values()) == report.peak_bytes
        assert report.baseline_bytes <= report.peak_bytes


def _tracked_step(model, inputs, targets, step) -> TensorMemoryTracker:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with TensorMemoryTracker(model, optimizer, inputs=(inputs, targets), record_timeline=True) as t:
        loss = nn.functional.cross_entropy(step(model, inputs), targets)
        loss.backward()
        optimizer.step()
    return t


def test_backward_and_recomputation_are_seen():
    inputs, targets = chain_batch(batch=64)
    plain = _tracked_step(linear_chain(8), inputs, targets, lambda m, x: m(x))
    ops = [event.op for event in plain.timeline]
    assert any("threshold_backward" in op for op in ops)

    def count_addmm(tracker):
        return sum("addmm" in event.op for event in tracker.timeline)

    for reentrant in (False, True):
        tracker = _tracked_step(
            linear_chain(8),
            inputs.clone().requires_grad_(reentrant),  # reentrant needs an input requiring grad
            targets,
            lambda m, x, r=reentrant: checkpoint_sequential(m, 4, x, use_reentrant=r),
        )
        # 3 of 4 segments (2 blocks each) run their Linear layers again in backward
        assert count_addmm(tracker) == count_addmm(plain) + 3 * 2


def test_gradients_allocated_in_backward_are_in_the_peak():
    """Big weights, tiny batch: the peak comes once the gradients exist, i.e. during backward."""
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    inputs, targets = torch.randn(2, 512), torch.randint(0, 10, (2,))
    tracker = _tracked_step(model, inputs, targets, lambda m, x: m(x))
    assert tracker.breakdown_at_peak["gradients"] == parameter_bytes(model)
    assert tracker.baseline_bytes < tracker.peak_bytes
    # a weight gradient is allocated a few ops before it is accumulated: still not an activation
    assert tracker.activation_peak_bytes < 512 * 512 * FLOAT


def test_a_limit_stops_the_step_once_live_bytes_exceed_it():
    model = linear_chain(8)
    inputs, targets = chain_batch(batch=256)

    def forward_backward(limit_bytes):
        model.zero_grad(set_to_none=True)
        tracker = TensorMemoryTracker(model, inputs=(inputs, targets), limit_bytes=limit_bytes)
        with tracker:
            nn.functional.cross_entropy(model(inputs), targets).backward()
        return tracker.peak_bytes

    full = forward_backward(None)
    limit = full - 1  # just under what the whole step needs
    with pytest.raises(MemoryLimitExceeded) as stopped:
        forward_backward(limit)
    assert stopped.value.live_bytes == full


def test_views_and_in_place_ops_add_no_storage():
    with TensorMemoryTracker() as tracker:
        x = torch.ones(1000)
        view = x.view(10, 100).t()
        view.add_(1)
        x.mul_(2)
        assert tracker.current_bytes == 1000 * FLOAT
        del x, view
        assert tracker.current_bytes == 0
    assert tracker.peak_bytes == 1000 * FLOAT


def test_sweep_reports_ratios_to_no_checkpointing():
    inputs, targets = chain_batch(batch=256)
    splits = [equal_segments(k) for k in (0, 2, 4)]
    records = sweep_strategies(linear_chain(16), inputs, targets, splits)
    assert [r.strategy for r in records] == splits
    assert records[0].peak_ratio == 1.0 and records[0].time_ratio == 1.0
    assert records[2].peak_ratio < 1.0
    assert all(r.seconds > 0 for r in records)


def test_measure_step_refuses_segments_for_a_self_checkpointing_module():
    with pytest.raises(ValueError, match="NO_CHECKPOINTING for a model that checkpoints itself"):
        measure_step(
            NetA(), torch.randn(2, 3, 32, 32), torch.tensor([0, 1]), strategy=equal_segments(2)
        )


def test_checkpointed_neta_fits_a_larger_batch_under_one_budget():
    """The budget is what checkpointed NetA needs at the largest batch allowed; plain NetA must
    then stop below it. (Plain SGD keeps it cheap: no optimizer state to outweigh activations.)"""
    shape, max_batch = (3, 32, 32), 16

    def plain_sgd(parameters):
        return torch.optim.SGD(parameters, lr=1e-3)

    model = NetA(use_checkpoint=True)
    inputs, targets = torch.randn(max_batch, *shape), torch.randint(0, 10, (max_batch,))
    budget = measure_step(
        model, inputs, targets, optimizer_factory=plain_sgd, time_step=False
    ).peak_bytes
    kwargs = dict(optimizer_factory=plain_sgd, max_batch=max_batch)
    plain = find_max_batch_size(lambda: NetA(use_checkpoint=False), shape, budget, **kwargs)
    checkpointed = find_max_batch_size(lambda: NetA(use_checkpoint=True), shape, budget, **kwargs)
    assert 1 <= plain.batch_size < checkpointed.batch_size == max_batch
    for result in (plain, checkpointed):
        assert all(t.fits == (t.peak_bytes <= budget) for t in result.trials)
        assert max(t.batch_size for t in result.fitting()) == result.batch_size
        failing = [t for t in result.trials if not t.fits]
        assert all(t.batch_size > result.batch_size for t in failing)
        assert all(t.error.startswith("stopped") for t in failing)  # stopped once over budget


@pytest.mark.parametrize(
    "kwargs",
    [dict(budget_bytes=0), dict(sample_shape=()), dict(mode="guess"), dict(max_batch=0)],
)
def test_find_max_batch_size_rejects_bad_input(kwargs):
    args = dict(make_model=NetA, sample_shape=(3, 32, 32), budget_bytes=2**20) | kwargs
    with pytest.raises(ValueError):
        find_max_batch_size(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_mode_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="mode='tracked'"):
        find_max_batch_size(NetA, (3, 32, 32), 2**30, mode="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_nvml_and_cuda_readers_give_none_and_a_reason():
    reading = nvml_used_mib()
    assert reading.used_mib is None and reading.reason
    reason = cuda_readings(None, allocated_before_bytes=0)
    assert isinstance(reason, str) and "CUDA" in reason
    report = measure_step(linear_chain(2), *chain_batch(batch=8))
    assert report.cuda is None and report.nvml.used_mib is None
    assert report.missing["cuda"] and report.nvml.reason


def test_driver_version_comes_from_nvml_and_is_none_without_it(monkeypatch):
    class FakeNvml:
        @staticmethod
        def nvmlSystemGetDriverVersion():
            return b"580.159.03"

    monkeypatch.setattr(nvml, "_nvml", lambda: (FakeNvml, None))
    assert nvml.nvml_driver_version() == "580.159.03"
    monkeypatch.setattr(nvml, "_nvml", lambda: (None, "no NVIDIA driver reachable"))
    assert nvml.nvml_driver_version() is None
