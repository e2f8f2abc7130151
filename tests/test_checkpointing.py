import copy

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

from tutorial_utils.articles.models import NetA, vgg16_classifier
from tutorial_utils.checkpointing.segments import segment_boundaries
from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, equal_segments


def gradients_of(model: nn.Module, run) -> dict[str, torch.Tensor]:
    """Gradients after one backward of ``run()``'s summed loss, from a fixed RNG state."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    run().sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_out_of_range_segments_name_the_valid_range():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    x = torch.randn(1, 2)
    with pytest.raises(ValueError, match=r"0 or 1 for no checkpointing, or 2\.\.3"):
        equal_segments(4).run(model, x)
    with pytest.raises(ValueError, match="0 or more"):
        equal_segments(-1)
    with pytest.raises(ValueError, match="integer"):
        equal_segments(2.0)  # type: ignore[arg-type]


def narrow_copy(model: nn.Sequential, divisor: int = 16) -> nn.Sequential:
    """``model``'s modules in the same order, every width divided by ``divisor`` except the
    image's 3 input channels and the classes: the same segments, dropouts and ReLUs, with the
    parameters of a small model (the full VGG16 holds 138 M, and its gradients took tens of
    seconds on a loaded machine)."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    narrow = []
    for module in model:
        if isinstance(module, nn.Conv2d):
            in_channels = (
                module.in_channels if module.in_channels == 3 else module.in_channels // divisor
            )
            narrow.append(nn.Conv2d(in_channels, module.out_channels // divisor, module.kernel_size,
                                    module.stride, module.padding))  # fmt: skip
        elif isinstance(module, nn.Linear):
            out_features = module.out_features
            if module is not linears[-1]:
                out_features //= divisor
            narrow.append(nn.Linear(module.in_features // divisor, out_features))
        else:
            narrow.append(copy.deepcopy(module))
    return nn.Sequential(*narrow)


def test_flat_vgg16_with_dropout_in_train_mode_gets_the_plain_gradients():
    with torch.device("meta"):  # the real layout, without allocating its 138 M parameters
        layout = vgg16_classifier(layout="flat")
    torch.manual_seed(0)
    model = narrow_copy(layout).train()
    assert [type(m) for m in model] == [type(m) for m in layout]
    dropouts = [index for index, m in enumerate(model) if isinstance(m, nn.Dropout)]
    assert len(dropouts) == 2 and all(model[i].p == 0.5 for i in dropouts)
    # at 2 and 7 segments both dropouts sit in the last segment, which is never checkpointed;
    # at 10 one is recomputed, so its mask must be drawn again from the saved RNG state
    recomputed = segment_boundaries(len(model), 10)[:-1]
    assert any(start <= i < end for i in dropouts for start, end in recomputed)
    x = torch.randn(2, 3, 32, 32)
    plain = gradients_of(model, lambda: NO_CHECKPOINTING.run(model, x))
    assert len(plain) == len(list(model.parameters()))
    for segments in (2, 7, 10):
        checkpointed = gradients_of(model, lambda s=segments: equal_segments(s).run(model, x))
        assert checkpointed.keys() == plain.keys(), "every parameter receives a gradient"
        for name, grad in plain.items():
            assert torch.allclose(checkpointed[name], grad, rtol=1e-4, atol=1e-6), name


def test_neta_with_batchnorm_in_train_mode_gets_the_plain_gradients():
    torch.manual_seed(0)
    plain_net = NetA(use_checkpoint=False).train()
    checkpointed_net = NetA(use_checkpoint=True).train()
    checkpointed_net.load_state_dict(plain_net.state_dict())
    x = torch.rand(4, 3, 32, 32)
    plain = gradients_of(plain_net, lambda: plain_net(x))
    checkpointed = gradients_of(checkpointed_net, lambda: checkpointed_net(x))
    assert checkpointed.keys() == plain.keys() == {n for n, _ in plain_net.named_parameters()}
    for name, grad in plain.items():
        assert torch.allclose(checkpointed[name], grad, rtol=1e-4, atol=1e-6), name


def test_reentrant_mode_without_an_input_that_needs_grad_leaves_checkpointed_segments_without_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4)])
    x = torch.randn(3, 8)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        out = equal_segments(2, use_reentrant=True).run(model, x)
    out.sum().backward()
    first_segment, last_segment = model[0][0], model[3][0]
    assert first_segment.weight.grad is None  # silently untrained
    assert last_segment.weight.grad is not None

    model.zero_grad(set_to_none=True)
    hacked = x.clone().requires_grad_(True)  # the first article's images.requires_grad=True
    equal_segments(2, use_reentrant=True).run(model, hacked).sum().backward()
    assert first_segment.weight.grad is not None

    model.zero_grad(set_to_none=True)
    equal_segments(2).run(model, x).sum().backward()
    assert first_segment.weight.grad is not None  # non-reentrant needs no hack


def test_neta_zeros_trick_is_what_reentrant_mode_needs_and_non_reentrant_does_not():
    x = torch.rand(2, 3, 32, 32)

    def layer1_grad(**kwargs):
        torch.manual_seed(0)
        net = NetA(use_checkpoint=True, **kwargs).train()
        net(x).sum().backward()
        return net.layer1[0].weight.grad

    # every segment checkpointed, reentrant, input needing no grad: the output has no graph at all
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        with pytest.raises(RuntimeError, match="does not require grad"):
            layer1_grad(use_reentrant=True, input_requires_grad_trick=False)
    assert layer1_grad(use_reentrant=True, input_requires_grad_trick=True) is not None
    assert layer1_grad(use_reentrant=False, input_requires_grad_trick=False) is not None


@pytest.mark.parametrize("n_modules,segments", [(10, 2), (40, 6), (7, 3), (5, 1)])
def test_segment_boundaries_are_the_ranges_checkpoint_sequential_recomputes(n_modules, segments):
    calls = [0] * n_modules
    layers = [nn.Linear(4, 4) for _ in range(n_modules)]
    for index, layer in enumerate(layers):
        layer.register_forward_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    model = nn.Sequential(*layers)
    x = torch.randn(2, 4, requires_grad=True)
    if segments > 1:  # reentrant recomputes whole segments (non-reentrant may stop early)
        out = checkpoint_sequential(model, segments, x, use_reentrant=True)
    else:
        out = model(x)
    out.sum().backward()
    bounds = segment_boundaries(n_modules, segments)
    assert bounds[0][0] == 0 and bounds[-1][1] == n_modules
    checkpointed = bounds[:-1]
    for index in range(n_modules):
        recomputed = any(start <= index < end for start, end in checkpointed)
        assert calls[index] == (2 if recomputed else 1), index
