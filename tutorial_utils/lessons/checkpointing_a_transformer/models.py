"""Notebook 06's models: GPT-2 small and a Llama-3.2-1B-shaped model from their configs (random
weights, nothing downloaded), LoRA on a frozen base, and the sizes each profile runs."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

import torch
import torch.nn as nn
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.estimate.models import PRESETS

ATTENTION = "sdpa"  # what transformers picks by default, and what users run

# A transformers causal LM, bare or with peft's LoRA adapters: what this lesson's functions take.
# Not just an nn.Module: it has a ``config`` and the ``activation_checkpointing_*`` methods.
CausalLM: TypeAlias = PreTrainedModel | PeftModel


# -- sizes per profile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """What runs for real on this machine; dry runs are at full size in every profile."""

    small_layers: int  # the small Llama of the real steps
    small_hidden: int
    small_batch: int
    small_sequence: int
    repeats: int  # timed steps per strategy (the fastest is reported)
    fit_strategies: tuple[str, ...]  # strategies searched for the longest sequence (all: ())


SIZES = {
    "ci": Sizes(2, 128, 2, 128, 1, ("none", "every block (default)")),
    "cpu": Sizes(4, 256, 2, 256, 7, ()),
    "gpu": Sizes(8, 512, 8, 1024, 7, ()),
    "article": Sizes(8, 512, 8, 1024, 7, ()),
}


def sizes_for(profile: Profile) -> Sizes:
    """This notebook's sizes for a profile; ``TUTORIAL_STEPS`` caps the timed repeats."""
    try:
        sizes = SIZES[profile.name]
    except KeyError:
        raise ValueError(
            f"no notebook-06 sizes for profile {profile.name!r}: add it to SIZES "
            f"(known: {', '.join(SIZES)})"
        ) from None
    return replace(sizes, repeats=profile.capped(sizes.repeats) or sizes.repeats)


# -- the models ----------------------------------------------------------------------------------


def gpt2_small_config(**overrides) -> GPT2Config:
    """GPT-2 small (124 M parameters, 12 layers, hidden 768, 12 heads, context 1024)."""
    return GPT2Config(bos_token_id=0, eos_token_id=0, use_cache=False, **overrides)


def llama_1b_config(**overrides) -> LlamaConfig:
    """Llama-3.2-1B's published shape (``estimate.models.PRESETS``, with its source): 16 layers,
    hidden 2048, 32 query / 8 key-value heads of 64, SwiGLU MLP of 8192, vocabulary 128,256, tied
    embeddings (1.24 B parameters); no cache, as in training."""
    published = {k: v for k, v in PRESETS["llama-3.2-1b"].items() if k != "model_type"}
    training = {"bos_token_id": 0, "eos_token_id": 0, "use_cache": False}
    return LlamaConfig(**{**published, **training, **overrides})


def small_llama_config(layers: int = 4, hidden: int = 128) -> LlamaConfig:
    """The same architecture at a size a CPU trains in well under a second a step."""
    return llama_1b_config(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        vocab_size=1000,
        max_position_embeddings=4096,
    )


def small_gpt2_config(layers: int = 2, hidden: int = 128) -> GPT2Config:
    """GPT-2 (with its dropout) at a CPU's size."""
    return gpt2_small_config(n_layer=layers, n_embd=hidden, n_head=4, vocab_size=1000)


def build_causal_lm(
    config, device: str = "cpu", dtype: torch.dtype | None = None, seed: int = 0
) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_config`` with random weights, SDPA attention, in train mode.

    On ``device="meta"`` nothing is allocated or initialised: a model of any size in a second.
    """
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION, dtype=dtype)
    return model.train()


def add_lora(
    model: PreTrainedModel,
    rank: int = 8,
    targets: Sequence[str] | None = None,
    *,
    start_trained: bool = False,
) -> PeftModel:
    """LoRA adapters (``peft``) on a frozen base: only the adapters train.

    ``peft`` starts every adapter's B at zero, which makes A's first gradient exactly zero;
    ``start_trained`` draws B as after some training, so every adapter has a gradient to compare.
    """
    targets = list(targets or ["q_proj", "k_proj", "v_proj", "o_proj"])
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0)
    with warnings.catch_warnings():  # peft reads a property transformers has renamed
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        lora = get_peft_model(model, config)
    if start_trained:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, parameter in lora.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
    return lora


def decoder_blocks(model: nn.Module) -> list[GradientCheckpointingLayer]:
    """The repeated layers ``transformers`` checkpoints (``GradientCheckpointingLayer``)."""
    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no GradientCheckpointingLayer blocks")
    return blocks


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def adamw(parameters) -> torch.optim.Optimizer:
    """Fine-tuning's optimizer: AdamW over the parameters that train."""
    return torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=1e-4)


def describe_model(model: nn.Module) -> str:
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in trainable_parameters(model))
    dtype = next(model.parameters()).dtype
    blocks = len(decoder_blocks(model))
    return (
        f"{type(model).__name__}: {total / 1e6:,.1f} M parameters ({trained / 1e6:,.2f} M trained), "
        f"{blocks} decoder blocks, {str(dtype).removeprefix('torch.')}, attention {ATTENTION}"
    )
