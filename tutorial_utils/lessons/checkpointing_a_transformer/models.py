"""Notebook 06's models: GPT-2 small and a Llama-3.2-1B-shaped model from their configs (random
weights, nothing downloaded), and the sizes each profile runs. Building them, LoRA and the blocks
checkpointing wraps come from ``estimate.models``, which notebook 07 uses for your own model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import torch
from peft import PeftModel
from transformers import GPT2Config, LlamaConfig, PreTrainedModel

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.estimate.models import PRESETS

__all__ = [
    "CausalLM",
    "SIZES",
    "Sizes",
    "adamw",
    "gpt2_small_config",
    "llama_1b_config",
    "sizes_for",
    "small_gpt2_config",
    "small_llama_config",
]

# A transformers causal LM, bare or with peft's LoRA adapters: what this lesson's functions take.
# Not just an nn.Module: it has a ``config`` and the ``activation_checkpointing_*`` methods.
CausalLM: TypeAlias = PreTrainedModel | PeftModel


# -- sizes per profile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """What a profile runs beyond the core (whose copy cells size by device)."""

    fit_strategies: tuple[str, ...]  # --strategies spellings searched for the longest sequence


SIZES = {
    "ci": Sizes(("none", "every-block")),
    "cpu": Sizes(()),
    "gpu": Sizes(()),
    "article": Sizes(()),
}


def sizes_for(profile: Profile) -> Sizes:
    """This notebook's sizes for a profile."""
    try:
        return SIZES[profile.name]
    except KeyError:
        raise ValueError(
            f"no notebook-06 sizes for profile {profile.name!r}: add it to SIZES "
            f"(known: {', '.join(SIZES)})"
        ) from None


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


def adamw(parameters) -> torch.optim.Optimizer:
    """Fine-tuning's optimizer: AdamW over the parameters that train."""
    return torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=1e-4)
