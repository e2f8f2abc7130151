"""The one ``Strategy``: validated at construction, applied to a Sequential, a torchvision ResNet
and a ``transformers`` model, each computing what no checkpointing computes with less kept."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tutorial_utils.checkpointing.selective import MATRIX_PRODUCT_OPS
from tutorial_utils.checkpointing.strategy import (
    NO_CHECKPOINTING,
    Strategy,
    equal_segments,
    every_nth_block,
    offloaded,
    selective,
)
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.tools import saved_bytes


def _bn_chain() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU()]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(3 * 8 * 8, 2))


def _loss_and_grads(model: nn.Module, strategy: Strategy, inputs, targets):
    model.zero_grad(set_to_none=True)
    with strategy.applied(model):
        loss = F.cross_entropy(model(inputs), targets)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _running_means(model: nn.Module) -> list[torch.Tensor]:
    return [m.running_mean.clone() for m in model.modules() if isinstance(m, nn.BatchNorm2d)]


def test_a_kind_outside_the_literal_is_rejected_in_one_line():
    with pytest.raises(ValueError, match="unknown strategy kind 'every-block'") as error:
        Strategy("every-block")  # type: ignore[arg-type]
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Strategy("segments", segments=1), "checkpoints nothing"),
        (lambda: every_nth_block(0), "every must be at least 1"),
        (lambda: selective(frozenset()), "needs saved_ops"),
        (lambda: selective(use_reentrant=True), "use_reentrant=False"),
        (lambda: Strategy("plan"), "needs schedule"),
        (lambda: Strategy("segments", segments=2, saved_ops=MATRIX_PRODUCT_OPS), "for selective"),
    ],
)
def test_bad_settings_fail_at_construction(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_equal_segments_zero_or_one_is_no_checkpointing_as_in_checkpoint_sequential():
    assert equal_segments(0).kind == equal_segments(1).kind == "none"
    assert equal_segments(4).segments == 4


def test_segments_on_a_sequential_match_no_checkpointing_and_keep_less():
    model = _bn_chain()
    inputs, targets = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])
    model.eval()  # the same statistics in both runs, so losses and gradients are equal
    plain = _loss_and_grads(model, NO_CHECKPOINTING, inputs, targets)
    split = _loss_and_grads(model, equal_segments(3), inputs, targets)
    torch.testing.assert_close(split, plain)
    with equal_segments(3).applied(model):
        kept = saved_bytes(model, lambda: model(inputs))
    assert kept < saved_bytes(model, lambda: model(inputs))
    assert "forward" not in model.__dict__  # as before on exit


@pytest.mark.parametrize("keep_batchnorm", [True, False])
def test_keep_batchnorm_decides_whether_recomputation_updates_running_statistics(keep_batchnorm):
    inputs, targets = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])
    plain, split = _bn_chain(), _bn_chain()
    _loss_and_grads(plain, NO_CHECKPOINTING, inputs, targets)
    _loss_and_grads(split, equal_segments(3, keep_batchnorm=keep_batchnorm), inputs, targets)
    same = [
        torch.equal(a, b) for a, b in zip(_running_means(plain), _running_means(split), strict=True)
    ]
    # the last segment is never recomputed, so its BatchNorm is right either way
    assert all(same) if keep_batchnorm else not all(same)


def test_selective_and_segments_need_a_sequential():
    tiny = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="splits an nn.Sequential"):
        with equal_segments(2).applied(tiny):
            pass
    with pytest.raises(ValueError, match="regions"):
        with selective().applied(_bn_chain()):
            pass
    with pytest.raises(ValueError, match="no repeated blocks"):
        with every_nth_block(2).applied(_bn_chain()):
            pass


def test_offloading_off_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="run it on CUDA"):
        with offloaded().applied(_bn_chain()):
            pass


def test_every_nth_block_of_a_resnet_matches_no_checkpointing_and_keeps_less():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    inputs, targets = torch.randn(2, 3, 32, 32), torch.tensor([0, 2])
    plain = _loss_and_grads(model, NO_CHECKPOINTING, inputs, targets)
    for strategy in (every_nth_block(2), selective(every=1)):
        torch.testing.assert_close(_loss_and_grads(model, strategy, inputs, targets), plain)
        with strategy.applied(model):
            kept = saved_bytes(model, lambda: model(inputs))
        assert kept < saved_bytes(model, lambda: model(inputs))
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_transformers_model_is_checkpointed_by_its_own_call():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 64, (2, 16))

    def loss_and_grads(strategy: Strategy):
        model.zero_grad(set_to_none=True)
        with strategy.applied(model):
            loss = model(ids, labels=ids).loss
            kept = saved_bytes(model, lambda: model(ids))
        loss.backward()
        return loss.detach(), [copy.deepcopy(p.grad) for p in model.parameters()], kept

    plain_loss, plain_grads, plain_kept = loss_and_grads(NO_CHECKPOINTING)
    for strategy in (every_nth_block(1), every_nth_block(2), selective(MATRIX_PRODUCT_OPS)):
        loss, grads, kept = loss_and_grads(strategy)
        torch.testing.assert_close((loss, grads), (plain_loss, plain_grads))
        assert kept < plain_kept, strategy.name
        assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def _activation_peaks(model: nn.Module, shape, strategies, **options) -> list[int]:
    return [dry_run_step(model, shape, s, **options).activation_peak_bytes for s in strategies]


def test_on_a_meta_dry_run_each_kind_of_model_keeps_less_than_no_checkpointing():
    """The same three applications, dry-run at a size where activations dominate: less kept."""
    torchvision = pytest.importorskip("torchvision")
    transformers = pytest.importorskip("transformers")
    plain, *checkpointed = _activation_peaks(
        _bn_chain(), (64, 3, 8, 8), [NO_CHECKPOINTING, equal_segments(4), selective(regions=3)]
    )
    assert all(peak < plain for peak in checkpointed)
    resnet = build_on_meta(lambda: torchvision.models.resnet18(num_classes=3))
    plain, every_2nd = _activation_peaks(
        resnet, (8, 3, 64, 64), [NO_CHECKPOINTING, every_nth_block(2)]
    )
    assert every_2nd < plain
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=256,
    )
    llama = build_on_meta(lambda: transformers.LlamaForCausalLM(config))
    plain, every, every_2nd = _activation_peaks(
        llama,
        (2, 256),
        [NO_CHECKPOINTING, every_nth_block(1), every_nth_block(2)],
        token_ids=True,
    )
    assert every < every_2nd < plain


def test_a_strategy_pickles_with_its_ops_for_the_estimators_workers():
    import pickle

    for strategy in (selective(MATRIX_PRODUCT_OPS), equal_segments(3, name="three")):
        copy_back = pickle.loads(pickle.dumps(strategy))
        assert copy_back == strategy and copy_back.saved_ops == strategy.saved_ops


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloading needs a CUDA device")
def test_offloading_a_resnets_blocks_on_cuda_gives_the_plain_gradients():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).cuda().eval()
    inputs, targets = torch.randn(2, 3, 32, 32, device="cuda"), torch.tensor([0, 2], device="cuda")
    plain = _loss_and_grads(model, NO_CHECKPOINTING, inputs, targets)
    torch.testing.assert_close(_loss_and_grads(model, offloaded(), inputs, targets), plain)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(8, 8), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class _Stack(nn.Module):
    """Not a Sequential itself: checkpointed through its repeated blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[_Block() for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


@pytest.mark.filterwarnings("error:.*respect_saved_tensors_hooks:FutureWarning")
@pytest.mark.parametrize("sequential", [True, False], ids=["regions", "blocks"])
def test_a_selective_policy_inside_saved_tensor_hooks_chooses_explicitly(sequential: bool) -> None:
    """torch 2.15 warns that SAC under saved-tensor hooks will change; the package says False."""
    torch.manual_seed(0)
    model: nn.Module = _Stack()
    if sequential:
        model = model.blocks
    x = torch.randn(2, 8, requires_grad=True)
    strategy = selective(MATRIX_PRODUCT_OPS, regions=2 if sequential else 0)
    kept = saved_bytes(model, lambda: strategy.run(model, x))  # inside SavedTensors' hooks
    assert 0 < kept < saved_bytes(model, lambda: model(x))
