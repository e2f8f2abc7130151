"""BatchNorm statistics under checkpointing: the double update is measured, both fixes undo it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from tutorial_utils.articles.models import NetA, neta_as_sequential
from tutorial_utils.checkpointing import batchnorm as bn


class Block(nn.Module):
    """conv-BN-ReLU, optionally run under checkpoint: the smallest case of the pitfall."""

    def __init__(self, use_checkpoint: bool, use_reentrant: bool = False, momentum=0.1):
        super().__init__()
        self.use_checkpoint, self.use_reentrant = use_checkpoint, use_reentrant
        self.body = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=momentum), nn.ReLU()
        )
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = x.requires_grad_()  # so reentrant checkpoint keeps the graph
        if self.use_checkpoint:
            x = checkpoint(self.body, x, use_reentrant=self.use_reentrant)
        else:
            x = self.body(x)
        return self.head(x.mean(dim=(2, 3)))


def train(model: nn.Module, steps: int = 3) -> bn.RunningStats:
    generator = torch.Generator().manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(6, 3, 8, 8, generator=generator)
        y = torch.randint(0, 3, (6,), generator=generator)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return bn.running_stats(model)


def build(use_checkpoint: bool, use_reentrant: bool = False, momentum=0.1) -> Block:
    torch.manual_seed(0)
    return Block(use_checkpoint, use_reentrant, momentum)


SAMPLE = (torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(2)), torch.arange(6) % 3)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_batchnorm_is_updated_twice(use_reentrant: bool) -> None:
    assert bn.updates_per_step(build(False), *SAMPLE) == {"body.1": 1}
    assert bn.updates_per_step(build(True, use_reentrant), *SAMPLE) == {"body.1": 2}
    plain, doubled = train(build(False)), train(build(True, use_reentrant))
    assert bn.counter_ratio(doubled, plain) == 2.0
    assert not bn.stats_match(doubled, plain, counters=False)
    assert bn.relative_distance(doubled, plain) > 1e-3


def test_updates_per_step_leaves_the_model_untouched() -> None:
    model = build(True)
    before = bn.running_stats(model)
    bn.updates_per_step(model, *SAMPLE)
    assert bn.stats_match(bn.running_stats(model), before, rtol=0, atol=0)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_freezing_during_recompute_matches_the_plain_run(use_reentrant: bool) -> None:
    model = build(True, use_reentrant)
    handles = bn.freeze_stats_during_recompute(model)
    fixed, plain = train(model), train(build(False))
    assert bn.stats_match(fixed, plain)
    assert bn.counter_ratio(fixed, plain) == 1.0
    for handle in handles:
        handle.remove()
    assert bn.counter_ratio(train(model, steps=1), fixed) > 1.0  # removed: doubling again


def test_freezing_handles_a_cumulative_average() -> None:
    model = build(True, momentum=None)
    bn.freeze_stats_during_recompute(model)
    assert bn.stats_match(train(model), train(build(False, momentum=None)))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_compensated_momentum_matches_running_stats_not_the_counter(use_reentrant: bool) -> None:
    model = build(True, use_reentrant)
    changed = bn.compensate_momentum(model, bn.updates_per_step(model, *SAMPLE))
    assert changed == {"body.1": pytest.approx(bn.compensated_momentum(0.1))}
    fixed, plain = train(model), train(build(False))
    assert bn.stats_match(fixed, plain, counters=False)
    assert bn.counter_ratio(fixed, plain) == 2.0


def test_compensated_momentum_makes_n_updates_one() -> None:
    for momentum in (0.1, 0.5, 1.0):
        for updates in (1, 2, 3):
            compensated = bn.compensated_momentum(momentum, updates)
            assert (1 - compensated) ** updates == pytest.approx(1 - momentum)
    with pytest.raises(ValueError, match="momentum"):
        bn.compensated_momentum(0.0)


def test_compensation_refuses_a_cumulative_average() -> None:
    model = build(True, momentum=None)
    with pytest.raises(ValueError, match="freeze_stats_during_recompute"):
        bn.compensate_momentum(model, {"body.1": 2})


def test_is_recomputing_only_inside_backward() -> None:
    seen = []
    x = torch.ones(2, requires_grad=True)
    y = (x * 2).sum()
    y.grad_fn.register_hook(lambda *_: seen.append(bn.is_recomputing()))
    assert not bn.is_recomputing()
    y.backward()
    assert seen == [True]


def test_counter_ratio_needs_a_trained_reference() -> None:
    untouched = bn.running_stats(build(False))
    with pytest.raises(ValueError, match="training step"):
        bn.counter_ratio(untouched, untouched)


def test_freezing_survives_early_stop_inside_a_batchnorm() -> None:
    """Non-reentrant early stop ends the recomputation inside ``m[1]``, once it has saved the last
    tensor backward needs: momentum and counter still come back (stats_match compares counters)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))  # fmt: skip
    plain = copy.deepcopy(m)
    bn.freeze_stats_during_recompute(m)
    x = torch.randn(4, 3, 8, 8, requires_grad=True)
    y = m[2:](checkpoint(m[:2], x, use_reentrant=False))
    y.sum().backward()
    plain(x).sum().backward()
    assert m[1].momentum == 0.1
    assert bn.stats_match(bn.running_stats(m), bn.running_stats(plain), rtol=0, atol=0)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_freezing_survives_an_exception_inside_a_recomputed_batchnorm(
    use_reentrant: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever ends a recomputation inside a BatchNorm, momentum and counter come back."""
    real_batch_norm = nn.functional.batch_norm

    def batch_norm(*args, **kwargs):
        if bn.is_recomputing():
            raise RuntimeError("recomputation failed")
        return real_batch_norm(*args, **kwargs)

    model = build(True, use_reentrant)
    bn.freeze_stats_during_recompute(model)
    monkeypatch.setattr(nn.functional, "batch_norm", batch_norm)
    with pytest.raises(RuntimeError, match="recomputation failed"):
        train(model, steps=1)
    assert model.body[1].momentum == 0.1
    assert int(bn.running_stats(model)["body.1"]["num_batches_tracked"]) == 1


NETA = neta_as_sequential(NetA())  # conv, BN and ReLU each a module: a cut after any of them
NETA_INPUTS = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
NETA_TARGETS = torch.arange(2)
# three ways to cut NetA into segments of three modules: every module ends a segment in one of them
NETA_SEGMENT_ENDS = [range(first, len(NETA) + 1, 3) for first in (1, 2, 3)]


def neta_step(model: nn.Sequential, ends: range | None = None, use_reentrant: bool = False):
    """One training step of ``model``, each segment that ends after the ``ends``-th modules
    checkpointed (None: the plain step): the loss, the input's and every parameter's gradient,
    the BatchNorm statistics and momenta."""
    y = x = NETA_INPUTS.clone().requires_grad_()
    start = 0
    for end in ends or ():
        y = checkpoint(model[start:end], y, use_reentrant=use_reentrant)
        start = end
    loss = nn.functional.cross_entropy(model[start:](y), NETA_TARGETS)
    loss.backward()
    gradients = [x.grad] + [p.grad for p in model.parameters()]
    momenta = [layer.momentum for layer in bn.batchnorm_layers(model).values()]
    return loss.detach(), gradients, bn.running_stats(model), momenta


@pytest.fixture(scope="module")
def neta_plain_step():
    return neta_step(copy.deepcopy(NETA))


@pytest.mark.parametrize("early_stop", [True, False], ids=["early-stop", "no-early-stop"])
@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_freezing_matches_the_plain_step_at_every_neta_boundary(
    use_reentrant: bool, early_stop: bool, neta_plain_step
) -> None:
    """Whatever module ends a checkpointed segment (conv, BN, ReLU, pooling, flatten or the
    classifier), one step leaves every BatchNorm's statistics, counter and momentum as the plain
    step does, with equal loss and gradients."""
    plain_loss, plain_gradients, plain_stats, plain_momenta = neta_plain_step
    wrong = []
    for ends in NETA_SEGMENT_ENDS:
        model = copy.deepcopy(NETA)
        bn.freeze_stats_during_recompute(model)
        with set_checkpoint_early_stop(early_stop):
            loss, gradients, stats, momenta = neta_step(model, ends, use_reentrant)
        same = (
            torch.equal(loss, plain_loss)
            and all(map(torch.equal, gradients, plain_gradients))
            and bn.stats_match(stats, plain_stats, rtol=0, atol=0)
            and momenta == plain_momenta
        )
        if not same:
            ending = sorted({type(NETA[end - 1]).__name__ for end in ends})
            wrong.append(f"segments ending after modules {list(ends)} ({', '.join(ending)})")
    assert not wrong, "; ".join(wrong)


def test_freezing_twice_is_harmless() -> None:
    """A model frozen twice (say, a deep copy of a frozen model, frozen again) still updates once."""
    model = build(True)
    bn.freeze_stats_during_recompute(model)
    model = copy.deepcopy(model)
    bn.freeze_stats_during_recompute(model)
    assert bn.stats_match(train(model), train(build(False)))
    assert model.body[1].momentum == 0.1
