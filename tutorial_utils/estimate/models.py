"""Your model, built with shapes and no weights: a ``transformers`` causal LM or a torchvision
classifier on the meta device, fully trained or with LoRA adapters.

Nothing is downloaded: a causal LM comes from a config (a preset below, a local
``config.json``, or one fetched by model id with ``AutoConfig`` when online), a torchvision
classifier from its builder with ``weights=None``. On the meta device an 8 B-parameter model
is built in a second or two and takes no memory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.blocks import decoder_layers, repeated_blocks
from tutorial_utils.network import reachable

if TYPE_CHECKING:
    from transformers.modeling_layers import GradientCheckpointingLayer

__all__ = [
    "ATTENTION",
    "ATTENTION_PROJECTIONS",
    "DEFAULT_LORA_TARGETS",
    "HUB_PROBE_TIMEOUT_S",
    "PRESETS",
    "add_lora",
    "build_causal_lm",
    "build_torchvision",
    "config_from_file",
    "config_from_hub",
    "decoder_blocks",
    "default_lora_targets",
    "describe_model",
    "hub_reachable",
    "preset_config",
    "quiet_bitsandbytes",
    "trainable_parameters",
]


ATTENTION = "sdpa"  # what transformers picks by default, and what users run

# Published configs (the config.json beside each model's weights), sizes only: the fields that
# set the shapes. Each cites its source; ``tests/test_estimate_models.py`` checks the parameter
# count of each against the count its page publishes.
PRESETS: dict[str, dict] = {
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    "llama-3.2-1b": {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "llama-3.1-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    "mistral-7b": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_positions": 1024,
        "vocab_size": 50257,
    },
}

# What LoRA adapts by default: the attention projections, as peft's examples do.
DEFAULT_LORA_TARGETS = {"gpt2": ("c_attn", "c_proj")}
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def preset_config(name: str):
    """A preset's ``transformers`` config (``PRESETS``)."""
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return _config_from_dict(dict(PRESETS[key]))


def config_from_file(path: str | Path):
    """The config in a local ``config.json`` (the file published beside a model's weights)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"no config file at {path}: pass the model's config.json")
    try:
        fields = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error.msg}, line {error.lineno})") from None
    if "model_type" not in fields:
        raise ValueError(f"{path} has no model_type: is it a transformers config.json?")
    return _config_from_dict(fields)


HUB_PROBE_TIMEOUT_S = 3.0


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hub (or the HTTPS proxy in the environment) opens within
    ``timeout_s``, name resolution included (in a thread: it has no timeout of its own).

    Why: offline, the Hub client retries for about half a minute before it gives up."""
    from urllib.parse import urlparse
    from urllib.request import getproxies

    from huggingface_hub import constants

    target = urlparse(getproxies().get("https") or constants.ENDPOINT)
    port = target.port or (443 if target.scheme == "https" else 80)
    return reachable(target.hostname or "", port, timeout_s)


def config_from_hub(model_id: str):
    """``AutoConfig.from_pretrained(model_id)``: the config only, fetched from the Hub, or read
    from the local Hub cache alone when the Hub cannot be reached (a one-line error in seconds
    if it is not there either)."""
    from transformers import AutoConfig

    online = hub_reachable()
    try:
        return AutoConfig.from_pretrained(model_id, local_files_only=not online)
    except (OSError, ValueError) as error:
        reason = str(error).splitlines()[0][:120] if online else "the Hub cannot be reached"
        raise ValueError(
            f"could not fetch the config of {model_id!r} ({reason}); "
            "offline? download its config.json and pass --hf-config PATH"
        ) from None


def _config_from_dict(fields: dict):
    from transformers import AutoConfig

    model_type = fields.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError:
        raise ValueError(f"transformers does not know model_type {model_type!r}") from None


def build_causal_lm(
    config, device: str = "cpu", dtype: torch.dtype | None = None, *, seed: int = 0
) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` (random weights, SDPA attention), in train mode;
    ``dtype`` None keeps transformers' default (float32).

    On ``device="meta"`` nothing is allocated or initialised: a model of any size in seconds.
    """
    from transformers import AutoModelForCausalLM

    config.use_cache = False
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation=ATTENTION, dtype=dtype
            )
    except ValueError as error:
        if "Unrecognized configuration class" in str(error):
            raise ValueError(
                f"{type(config).__name__} is not a causal language model's config "
                "(AutoModelForCausalLM has no class for it)"
            ) from None
        raise
    return model.train()


def build_torchvision(
    name: str,
    *,
    image_size: int,
    num_classes: int = 1000,
    dtype: torch.dtype = torch.float32,
    device: str = "meta",
) -> nn.Module:
    """A torchvision classifier by name (``torchvision.models.get_model``), random weights."""
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)
    if name not in known:
        raise ValueError(
            f"unknown torchvision classifier {name!r} (e.g. resnet50, vit_b_16, convnext_tiny)"
        )
    options: dict = {"weights": None, "num_classes": num_classes}
    if name.startswith("vit_"):
        options["image_size"] = image_size  # a ViT's position embeddings are per patch
    with torch.device(device):
        model = torchvision.models.get_model(name, **options)
    return model.to(dtype).train()


def default_lora_targets(model: nn.Module) -> tuple[str, ...]:
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("LoRA on a torchvision model needs target modules: pass --lora-targets")
    return DEFAULT_LORA_TARGETS.get(config.model_type, ATTENTION_PROJECTIONS)


@contextlib.contextmanager
def quiet_bitsandbytes() -> Iterator[None]:
    """Around ``import peft``: it imports bitsandbytes where that is installed, whose CPU
    backend then warns, once, of an inference kernel that no training step uses."""
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    was_disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was_disabled


def add_lora(
    model: nn.Module,
    rank: int = 8,
    targets: Sequence[str] | None = None,
    *,
    start_trained: bool = False,
    dropout: float = 0.0,
    custom_modules: dict[type[nn.Module], type[nn.Module]] | None = None,
) -> nn.Module:
    """LoRA adapters (``peft``, alpha = 2 x rank) on a frozen base: only the adapters train.

    ``peft`` keeps the adapters in float32 on a 16-bit base (its default). It starts every
    adapter's B at zero, which makes A's first gradient exactly zero; ``start_trained`` draws B
    as after some training, so every adapter has a gradient (for comparing gradients).
    ``custom_modules`` maps base layer types peft does not know to their LoRA layers.
    ``dropout`` is ``LoraConfig.lora_dropout``: above 0 each adapted projection keeps its own
    dropped copy of the input and a mask, where at 0 they share the input.
    """
    with quiet_bitsandbytes():
        from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, got {rank}")
    targets = list(targets or default_lora_targets(model))
    missing = [
        t for t in targets if not any(n.split(".")[-1] == t for n, _ in model.named_modules())
    ]
    if missing:
        raise ValueError(f"no module named {', '.join(missing)} in {type(model).__name__}")
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=dropout)
    if custom_modules:
        config._register_custom_module(custom_modules)
    device = next(model.parameters()).device
    with warnings.catch_warnings(), torch.device(device):
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        warnings.filterwarnings("ignore", "fan_in_fan_out")  # GPT-2's Conv1D: peft sets it
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
    blocks = decoder_layers(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no GradientCheckpointingLayer blocks")
    return cast("list[GradientCheckpointingLayer]", blocks)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def describe_model(model: nn.Module) -> str:
    packed = [p for p in model.parameters() if p.dtype == torch.uint8]  # 4-bit, two a byte
    total = sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in packed)
    trained = sum(p.numel() for p in trainable_parameters(model))
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if packed:
        dtype = f"4-bit NF4 in {len(packed)} linear layers, the rest {dtype}"
    base = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model
    return (
        f"{type(base).__name__}: {total / 1e6:,.1f} M parameters ({trained / 1e6:,.2f} M "
        f"trained), {len(repeated_blocks(model))} blocks, weights {dtype}"
    )
