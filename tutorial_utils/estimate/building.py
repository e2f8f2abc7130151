"""The parts of a workload's step: its model (``build_model``, from a preset, a config.json or a
Hub id: ``load_config``), its optimizer, its batch and the Trainer's loss. One place for them, so that one GPU's dry
run (``estimator``) and one rank's of N (``sharded``) build the same step."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn as nn

from tutorial_utils.estimate.models import (
    add_lora,
    build_causal_lm,
    build_torchvision,
    config_from_file,
    config_from_hub,
    preset_config,
    trainable_parameters,
)
from tutorial_utils.estimate.workload import QLORA, Workload
from tutorial_utils.measurement.step import next_token_loss

__all__ = [
    "batch_for",
    "build_model",
    "import_model_libraries",
    "language_model_loss",
    "load_config",
    "make_optimizer",
    "trainer_loss",
]


def load_config(name: str):
    """A preset, a local config.json (a path), or a model id fetched with ``AutoConfig``."""
    from pathlib import Path

    from tutorial_utils.estimate.models import PRESETS

    if name.lower() in PRESETS:
        return preset_config(name)
    if name.endswith(".json") or Path(name).expanduser().exists():
        return config_from_file(Path(name).expanduser())
    if "/" in name:
        return config_from_hub(name)
    raise ValueError(
        f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}, a config.json, "
        "or a model id such as Qwen/Qwen2.5-0.5B"
    )


def import_model_libraries(workload: Workload) -> None:
    """Import what ``build_model`` will need (transformers, peft; torchvision), so that the
    command times its dry runs apart from its imports."""
    if workload.model.startswith("torchvision:"):
        import torchvision  # noqa: F401

        return
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401

    if workload.lora_rank:
        import peft  # noqa: F401


def build_model(workload: Workload, device: str = "meta") -> nn.Module:
    """The workload's model (random weights; on meta by default), with LoRA if asked."""
    kind, _, name = workload.model.partition(":")
    if workload.precision == QLORA:
        if device != "meta":
            raise ValueError(
                "nf4 is emulated on the meta device; a real QLoRA step loads the model with "
                "transformers' BitsAndBytesConfig (bitsandbytes)"
            )
        from tutorial_utils.estimate.qlora import build_qlora

        return build_qlora(
            load_config(name),
            workload.lora_rank,
            workload.lora_targets or None,
            recipe=workload.qlora_recipe,
            dropout=workload.lora_dropout,
        )
    if kind == "hf":
        model = build_causal_lm(load_config(name), device, workload.weight_dtype)
    else:
        model = build_torchvision(
            name,
            image_size=workload.size,
            num_classes=workload.num_classes,
            dtype=workload.weight_dtype,
            device=device,
        )
    if workload.lora_rank:
        model = add_lora(
            model, workload.lora_rank, workload.lora_targets or None, dropout=workload.lora_dropout
        )
    return model.train()


def make_optimizer(workload: Workload, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW (lr 1e-4) or SGD with momentum 0.9 (lr 1e-3), over the parameters that train.

    ``foreach=True`` on every device: it is what a CUDA run does by default (its temporaries
    are part of the step's peak), and a dry run of it is a few ops instead of a few per tensor.
    """
    trained = trainable_parameters(model)
    if workload.optimizer == "adamw":
        return torch.optim.AdamW(trained, lr=1e-4, foreach=True)
    return torch.optim.SGD(trained, lr=1e-3, momentum=0.9, foreach=True)


def batch_for(
    workload: Workload, model: nn.Module, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets: token ids (targets the same ids) or images and class indices.

    On meta they are shapes; elsewhere random values (seeded)."""
    b, s = workload.batch, workload.size
    generator = torch.Generator().manual_seed(0)
    if workload.is_language_model:
        vocab = cast(Any, model).config.vocab_size
        if device == "meta":
            ids = torch.empty(b, s, dtype=torch.long, device="meta")
        else:
            ids = torch.randint(0, vocab, (b, s), generator=generator).to(device)
        return ids, ids
    dtype = workload.weight_dtype
    if device == "meta":
        images = torch.empty(b, 3, s, s, dtype=dtype, device="meta")
        return images, torch.empty(b, dtype=torch.long, device="meta")
    images = torch.randn(b, 3, s, s, generator=generator).to(device, dtype)
    return images, torch.randint(0, workload.num_classes, (b,), generator=generator).to(device)


def trainer_loss(
    outputs: Any,
    token_ids: torch.Tensor,
    token_loss: Callable[[Any, torch.Tensor], torch.Tensor] = next_token_loss,
) -> torch.Tensor:
    """``token_loss``, as the Trainer's ``compute_loss`` leaves the outputs: the logits are taken
    out of them, so that only what autograd saved outlives the loss."""
    logits = outputs.logits
    if isinstance(outputs, dict):  # a ModelOutput: drop its entry and its attribute
        dict.__delitem__(outputs, "logits")
        object.__setattr__(outputs, "logits", None)
    loss = token_loss(logits, token_ids)
    del logits
    return loss


def _shifted_copy_loss(outputs: Any, token_ids: torch.Tensor) -> torch.Tensor:
    """transformers 4.48.1's ``ForCausalLMLoss`` (loss/loss_utils.py): the logits upcast, then
    the shifted logits copied, both fp32 and both alive during the cross entropy."""
    logits = getattr(outputs, "logits", outputs).float()
    shifted = logits[..., :-1, :].contiguous()
    return nn.functional.cross_entropy(
        shifted.view(-1, shifted.size(-1)), token_ids[:, 1:].reshape(-1)
    )


def _logits_dtype_loss(outputs: Any, token_ids: torch.Tensor) -> torch.Tensor:
    """Cross entropy on the logits in their own dtype (a custom loop's): no fp32 copy."""
    logits = getattr(outputs, "logits", outputs)[:, :-1]
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), token_ids[:, 1:].reshape(-1)
    )


_TOKEN_LOSSES: dict[str, Callable[[Any, torch.Tensor], torch.Tensor]] = {
    "transformers": next_token_loss,
    "transformers-4.48": _shifted_copy_loss,
    "logits-dtype": _logits_dtype_loss,
}


def language_model_loss(workload: Workload) -> Callable[..., torch.Tensor]:
    """The loss a language model's step runs: ``workload.loss`` (``LOSSES``), in its loop
    (``LOOPS``: the Trainer's frees the logits before backward, a plain loop keeps them)."""
    token_loss = _TOKEN_LOSSES[workload.loss]
    if workload.loop == "trainer":
        return functools.partial(trainer_loss, token_loss=token_loss)
    return token_loss
