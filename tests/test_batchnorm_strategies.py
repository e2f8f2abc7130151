"""Every strategy the package recommends leaves BatchNorm as an un-checkpointed step leaves it;
``equal_segments(k, keep_batchnorm=False)`` keeps PyTorch's double update (``checkpoint_sequential``),
and the default ``keep_batchnorm=True`` fixes it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_utils.articles.models import NetA, neta_as_sequential
from tutorial_utils.checkpointing.batchnorm import running_stats
from tutorial_utils.checkpointing.strategy import (
    NO_CHECKPOINTING,
    equal_segments,
    scheduled,
    selective,
)
from tutorial_utils.measurement.batchnorm import batchnorm_updates
from tutorial_utils.measurement.dry_run import meta_copy
from tutorial_utils.planning.budget import plan_checkpoints


class ResidualBlock(nn.Module):
    """A ResNet basic block: two conv/BN pairs and the skip connection."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


def resnet_style():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        ResidualBlock(8),
        ResidualBlock(8),
        ResidualBlock(8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


MODELS = {"NetA": lambda: neta_as_sequential(NetA()), "ResNet-style": resnet_style}


def _step(model, x, y, strategy):
    model.train()
    F.cross_entropy(strategy.run(model, x), y).backward()
    return running_stats(model)


def _same(stats, reference):
    return all(
        torch.equal(stats[name][stat], reference[name][stat])
        for name in reference
        for stat in reference[name]
    )


@pytest.fixture(scope="module", params=list(MODELS))
def setting(request):
    torch.manual_seed(0)
    model = MODELS[request.param]()
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    reference = _step(copy.deepcopy(model), x, y, NO_CHECKPOINTING)
    return model, x, y, reference


def _strategies(model, x):
    plan = plan_checkpoints(meta_copy(model), x.to("meta"))  # planned on meta, as a learner would
    assert plan.checkpointed_segments > 0
    return {"plan": scheduled(plan), "selective": selective(regions=3), "equal": equal_segments(4)}


def test_recommended_strategies_update_batchnorm_once(setting):
    model, x, y, reference = setting
    for name, strategy in _strategies(model, x).items():
        stats = _step(copy.deepcopy(model), x, y, strategy)
        assert _same(stats, reference), name


def test_plain_segments_keep_pytorchs_double_update_and_one_word_fixes_it(setting):
    model, x, y, reference = setting
    doubled = _step(copy.deepcopy(model), x, y, equal_segments(4, keep_batchnorm=False))
    counts = [int(layer["num_batches_tracked"]) for layer in doubled.values()]
    assert max(counts) == 2  # PyTorch's behaviour, as notebooks 02 and 03 teach
    assert _same(_step(copy.deepcopy(model), x, y, equal_segments(4)), reference)


def test_gradients_are_unchanged_by_the_fix(setting):
    model, x, y, _ = setting
    grads = []
    for strategy in (NO_CHECKPOINTING, equal_segments(4), selective(regions=3)):
        probe = copy.deepcopy(model)
        _step(probe, x, y, strategy)
        grads.append([p.grad for p in probe.parameters()])
    for other in grads[1:]:
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads[0], other, strict=True))


def test_the_lessons_table_counts_double_updates_and_how_far_statistics_moved(setting):
    model, x, y, _ = setting
    table = batchnorm_updates(
        model,
        x,
        y,
        {"segments=4": equal_segments(4, keep_batchnorm=False), "equal": equal_segments(4)},
    )
    plain_split, equal = table.splitlines()[1:]
    assert " 0 of " not in plain_split and "differ by up to" in plain_split
    assert equal.split()[1:] == ["0", "of", str(len(running_stats(model))), "identical"]
