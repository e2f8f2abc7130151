"""checkpointing.transformers_api: the same checkpointing under both of transformers' names.

The suite runs a transformers with ``activation_checkpointing_enable`` (5.23 and later); the
releases before it (Colab ships 5.15) are stood in for by a model class whose new names are
hidden and whose ``gradient_checkpointing_enable`` takes only the kwargs, as 5.15's does. The
Colab-like test runs notebook 06 on 5.15 itself.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import PreTrainedModel

from tutorial_utils.checkpointing.transformers_api import (
    disable_checkpointing,
    enable_checkpointing,
)
from tutorial_utils.estimate.models import add_lora, build_causal_lm, decoder_blocks
from tutorial_utils.lessons.checkpointing_a_transformer import small_llama_config, token_batch
from tutorial_utils.measurement.gradients import gradients_match, named_gradients
from tutorial_utils.measurement.step import next_token_loss

LAYERS = 5


def show_the_api_before_5_23(monkeypatch) -> None:
    """Hide the new names and give ``gradient_checkpointing_enable`` 5.15's signature."""
    for name in ("activation_checkpointing_enable", "activation_checkpointing_disable"):
        monkeypatch.delattr(PreTrainedModel, name)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self._activation_checkpointing_enable(gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self):
        self._activation_checkpointing_disable()

    monkeypatch.setattr(
        PreTrainedModel, "gradient_checkpointing_enable", gradient_checkpointing_enable
    )
    monkeypatch.setattr(
        PreTrainedModel, "gradient_checkpointing_disable", gradient_checkpointing_disable
    )


@pytest.fixture(params=["5.23 and later", "before 5.23"])
def api(request, monkeypatch) -> str:
    """Which of transformers' APIs the model shows: its own, or 5.15's."""
    if request.param == "before 5.23":
        show_the_api_before_5_23(monkeypatch)
    return request.param


def small_model() -> torch.nn.Module:
    return build_causal_lm(small_llama_config(layers=LAYERS, hidden=64))


def checkpointed_layers(model: torch.nn.Module) -> list[int]:
    return [i for i, block in enumerate(decoder_blocks(model)) if block.gradient_checkpointing]


@pytest.mark.parametrize("every_n_layers, expected", [(1, [0, 1, 2, 3, 4]), (2, [0, 2, 4])])
def test_every_n_th_layer_is_checkpointed_under_either_name(api, every_n_layers, expected):
    model = small_model()
    enable_checkpointing(model, {"use_reentrant": True}, every_n_layers=every_n_layers)
    assert checkpointed_layers(model) == expected
    func = decoder_blocks(model)[0]._gradient_checkpointing_func
    assert func.keywords == {"use_reentrant": True}  # the kwargs reach checkpoint
    disable_checkpointing(model)
    assert checkpointed_layers(model) == []
    assert not getattr(model, "_require_grads_hooks", None)  # the input hook went with it


def test_lora_gradients_are_the_plain_steps_under_either_name(api):
    """Reentrant checkpointing of a frozen base: the input hook enabling adds gives the
    adapters their gradients, on either API."""
    model = add_lora(small_model(), start_trained=True)
    base = model.get_base_model()
    ids = token_batch(2, 16, "cpu", base.config.vocab_size)

    def gradients():
        model.zero_grad(set_to_none=True)
        next_token_loss(model(ids), ids).backward()
        return named_gradients(model)

    plain = gradients()
    enable_checkpointing(base, {"use_reentrant": True}, every_n_layers=2)
    checkpointed = gradients()
    disable_checkpointing(base)
    assert all(g is not None for g in checkpointed.values())
    assert gradients_match(checkpointed, plain)


def test_offload_before_5_23_wraps_each_checkpoint_in_save_on_cpu(monkeypatch):
    """Before 5.23 the offloading is added here (5.23 and later offload by themselves); pinned
    memory needs CUDA, so the context is recorded rather than run."""
    show_the_api_before_5_23(monkeypatch)
    entered = []

    @contextlib.contextmanager
    def save_on_cpu(pin_memory, device_type):
        entered.append((pin_memory, device_type))
        yield

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", save_on_cpu)
    model = small_model()
    ids = token_batch(1, 8, "cpu", model.config.vocab_size)
    enable_checkpointing(model, every_n_layers=2, offload=True)
    next_token_loss(model(ids), ids).backward()
    assert entered == [(True, "cpu")] * 3  # layers 0, 2 and 4, in the forward


def test_every_n_layers_below_one_says_what_it_needs():
    with pytest.raises(ValueError, match="every_n_layers must be at least 1, got 0"):
        enable_checkpointing(small_model(), every_n_layers=0)
