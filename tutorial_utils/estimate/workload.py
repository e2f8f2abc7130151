"""What is trained, and how: ``Workload`` (model, batch, sequence or image size, precision,
optimizer, LoRA, QLoRA's recipe, the training loop), with the spellings the command line takes
and how each precision runs, in words. No model is built here (``estimator.build_model``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tutorial_utils.measurement.autocast import POLICIES, EmulatedAutocast

__all__ = [
    "DTYPES",
    "LOOPS",
    "LOSSES",
    "PRECISIONS",
    "QLORA",
    "QLORA_RECIPE_NAMES",
    "Workload",
    "cuda_autocast_precision",
    "describe_precision",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
QLORA = "nf4"  # a 4-bit base with LoRA (QLoRA), emulated by ``estimate.qlora``
QLORA_RECIPE_NAMES = ("peft", "trl-bf16", "no-upcast")  # ``qlora.QLORA_RECIPES``' keys
# The training loop a language model's step follows: what is alive during backward.
LOOPS = {
    "trainer": "transformers' Trainer (and TRL's): compute_loss returns the loss alone, so the "
    "model's outputs, the logits among them, are freed before backward",
    "plain": "a plain loop (outputs = model(ids); loss = ...; loss.backward()): the outputs, the "
    "logits among them, stay alive through backward",
}
# How a language model's loss treats the logits: what it holds at its peak.
LOSSES = {
    "transformers": "transformers' ForCausalLMLoss (4.49 and later): the logits upcast to fp32, "
    "the labels shifted",
    "transformers-4.48": "transformers 4.48's ForCausalLMLoss: the logits upcast to fp32, then the "
    "shifted logits copied, in fp32 too (logits[..., :-1, :].contiguous())",
    "logits-dtype": "cross entropy on the logits in their own dtype, no fp32 upcast (a custom "
    "loop's nn.CrossEntropyLoss()(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1)))",
}


def cuda_autocast_precision() -> str:
    """``amp-bf16`` on a GPU that computes in bfloat16 (compute capability 8.0 and later), else
    ``amp-fp16``: a T4 only emulates bfloat16, and its fused attention kernels take float16."""
    return "amp-bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "amp-fp16"


_RECIPE_WORDS = {
    "peft": "other weights and adapters fp32 (peft's prepare_model_for_kbit_training)",
    "trl-bf16": "embeddings and head bf16, norms and adapters fp32, under autocast(bf16) "
    "(TRL <=0.25 SFTTrainer, bf16=True)",
    "no-upcast": "other weights and adapters bf16, under autocast(bf16) (TRL >=0.26 "
    "SFTTrainer, bf16=True)",
}


def describe_precision(precision: str, qlora_recipe: str = "peft") -> str:
    """How each figure's step ran, in words."""
    if precision.startswith("amp-"):
        return f"fp32 weights, forward under autocast({precision[4:]}) (CUDA's cast policy)"
    if precision == QLORA:
        return f"QLoRA: NF4 4-bit base (double quantization), {_RECIPE_WORDS[qlora_recipe]}"
    return f"pure {precision}: weights, gradients and activations in {precision}"


@dataclass(frozen=True)
class Workload:
    """What is trained, and how. ``model`` is ``"hf:<preset, config.json or model id>"`` or
    ``"torchvision:<name>"``; ``size`` is the sequence length (tokens) or the image side (px)."""

    model: str
    batch: int = 1
    size: int = 2048
    precision: str = "bf16"
    optimizer: str = "adamw"
    lora_rank: int = 0  # 0: full fine-tuning
    lora_targets: tuple[str, ...] = ()
    num_classes: int = 1000
    autocast_policy: str = "cuda"  # whose casts a dry run under autocast follows
    lora_dropout: float = 0.0  # LoraConfig.lora_dropout
    qlora_recipe: str = "peft"  # with nf4: how the rest is cast (``qlora.QLORA_RECIPES``)
    loop: str = "trainer"  # a language model's training loop (``LOOPS``)
    loss: str = "transformers"  # how a language model's loss treats the logits (``LOSSES``)

    def __post_init__(self) -> None:
        kind, _, name = self.model.partition(":")
        if kind not in ("hf", "torchvision") or not name:
            raise ValueError(
                f"model must be 'hf:<name>' or 'torchvision:<name>', got {self.model!r}"
            )
        if self.batch < 1 or self.size < (2 if kind == "hf" else 1):
            raise ValueError(
                f"batch and size must be at least 1 (2 tokens), got {self.batch}, {self.size}"
            )
        if self.precision not in (*PRECISIONS, QLORA):
            raise ValueError(
                f"precision must be one of {', '.join(PRECISIONS)}, {QLORA}, got {self.precision!r}"
            )
        if self.precision == QLORA and kind != "hf":
            raise ValueError("nf4 (QLoRA) is for language models: use --hf-preset/config/model")
        if self.precision == QLORA and not self.lora_rank:
            raise ValueError("nf4 (QLoRA) trains LoRA adapters on a 4-bit base: add --lora RANK")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be adamw or sgd, got {self.optimizer!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_dropout and not self.lora_rank:
            raise ValueError("--lora-dropout needs --lora RANK")
        if self.qlora_recipe not in QLORA_RECIPE_NAMES:
            raise ValueError(
                f"--qlora-recipe must be one of {', '.join(QLORA_RECIPE_NAMES)}, "
                f"got {self.qlora_recipe!r}"
            )
        if self.qlora_recipe != "peft" and self.precision != QLORA:
            raise ValueError("--qlora-recipe is for --precision nf4 (QLoRA)")
        if self.loop not in LOOPS:
            raise ValueError(f"--loop must be one of {', '.join(LOOPS)}, got {self.loop!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"--loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.loss != "transformers" and kind != "hf":
            raise ValueError("--loss is for language models: a classifier's loss is on its classes")
        if self.lora_rank < 0:
            raise ValueError(
                f"LoRA rank must be 0 (full fine-tuning) or more, got {self.lora_rank}"
            )

    @property
    def is_language_model(self) -> bool:
        return self.model.startswith("hf:")

    @property
    def size_name(self) -> str:
        return "sequence" if self.is_language_model else "image size"

    @property
    def weight_dtype(self) -> torch.dtype:
        if self.precision == QLORA:
            return torch.bfloat16  # the checkpoint's dtype and the compute dtype
        return torch.float32 if self.precision.startswith("amp-") else DTYPES[self.precision]

    def autocast(self) -> EmulatedAutocast | None:
        if self.precision == QLORA and self.qlora_recipe != "peft":  # TRL's bf16=True
            return EmulatedAutocast(torch.bfloat16, POLICIES[self.autocast_policy])
        if not self.precision.startswith("amp-"):
            return None
        return EmulatedAutocast(DTYPES[self.precision[4:]], POLICIES[self.autocast_policy])

    def with_size(self, *, batch: int | None = None, size: int | None = None) -> Workload:
        fields = dict(vars(self))
        fields.update({k: v for k, v in (("batch", batch), ("size", size)) if v is not None})
        return Workload(**fields)
