"""QLoRA on the meta device: a 4-bit base as ``bitsandbytes`` stores and runs it, LoRA on top.

What is emulated is how ``from_pretrained`` loads the base, with
``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)``, then
one of three recipes (``QLORA_RECIPES``): peft's ``prepare_model_for_kbit_training`` (which
casts every parameter left in 16 bits to float32: embeddings, norms and the output layer), TRL's
``SFTTrainer`` with ``bf16=True`` as 0.8-0.25 ran it (the same, then embeddings and head back
to bf16, under autocast) or as 0.26 and later run it (nothing upcast, the adapters in bf16), and
``get_peft_model`` with LoRA. The checkpointing comes
from the estimate's strategy (``use_reentrant=False``), so ``prepare_model_for_kbit_training``
runs with ``use_gradient_checkpointing=False`` here (with it, it would also make the input
embeddings' output require a gradient).

What ``bitsandbytes`` (0.50) keeps per quantized linear layer of ``n = out x in`` weights
(``Linear4bitOnMeta`` holds the same tensors, on meta): the weight packed two 4-bit codes to a
byte (uint8, ``ceil(n / 2)`` bytes); one absmax per block of 64 weights, itself quantized to
uint8 by the double quantization; for those, a float32 absmax per 256 blocks, a float32 offset
(their mean) and its own copy of the 256-entry float32 code table; and the 16-entry float32
NF4 table. ``quantized_storage_bytes`` counts them.

What a training step allocates in each quantized layer, as bitsandbytes' CUDA path for more
than 1,536 tokens a step does (its fused kernel for fewer, on some GPUs, skips the forward's
weight copy; this keeps it, an upper bound there): forward: the input cast to the compute dtype,
the absmax dequantized (float32) and offset (float32), the whole weight dequantized in the
compute dtype, the product (cast back to the input's dtype); then all but the product freed.
Nothing is saved for backward but the packed weight itself. Backward, where the input needs a gradient: the absmax dequantized
again, the weight dequantized in the dtype it was quantized from (bf16 here), the product with
the output's gradient. No gradient for the 4-bit weight.

Nothing here imports ``bitsandbytes``: the estimate runs without it. ``tests/test_qlora.py``
checks the storage against a real ``Params4bit`` and a dry run against a real CPU step.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula

from tutorial_utils.estimate.models import add_lora, build_causal_lm, quiet_bitsandbytes
from tutorial_utils.measurement.flops import FORMULAS

__all__ = [
    "BLOCK",
    "COMPUTE_DTYPE",
    "Linear4bitOnMeta",
    "NESTED_BLOCK",
    "NESTED_CODES",
    "NF4_CODES",
    "QLORA_RECIPES",
    "QLORA_RECIPE_NAMES",
    "QUANTIZED_FROM",
    "QuantizedStorage",
    "blocks",
    "build_qlora",
    "linear_4bit",
    "quantize_on_meta",
    "quantized_storage_bytes",
]


BLOCK = 64  # weights per absmax: bitsandbytes' default blocksize for 4-bit
NESTED_BLOCK = 256  # absmax values per second-level absmax (double quantization)
NF4_CODES = 16  # the NF4 table: float32 values the 4-bit codes index
NESTED_CODES = 256  # the 8-bit dynamic table the absmax values are quantized with
COMPUTE_DTYPE = torch.bfloat16  # bnb_4bit_compute_dtype
QUANTIZED_FROM = torch.bfloat16  # the checkpoint's dtype: the backward dequantizes into it


@dataclass(frozen=True)
class QuantizedStorage:
    """Bytes one 4-bit linear layer keeps, tensor by tensor (bitsandbytes' names in comments)."""

    weight: int  # Params4bit: packed uint8
    absmax: int  # quant_state.absmax: uint8 after double quantization
    nested_absmax: int  # quant_state.state2.absmax: float32
    offset: int  # quant_state.offset: float32 scalar
    code: int  # quant_state.code: the NF4 table
    nested_code: int  # quant_state.state2.code: the dynamic table, copied per layer

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


def blocks(numel: int) -> int:
    return -(-numel // BLOCK)


def quantized_storage_bytes(out_features: int, in_features: int) -> QuantizedStorage:
    """What NF4 with double quantization keeps for an ``out x in`` weight (no bias)."""
    numel = out_features * in_features
    return QuantizedStorage(
        weight=(numel + 1) // 2,
        absmax=blocks(numel),
        nested_absmax=4 * -(-blocks(numel) // NESTED_BLOCK),
        offset=4,
        code=4 * NF4_CODES,
        nested_code=4 * NESTED_CODES,
    )


class Linear4bitOnMeta(nn.Linear):
    """A linear layer as ``bnb.nn.Linear4bit`` (NF4, double quantization) keeps and runs it.

    The packed weight is a frozen uint8 parameter of bitsandbytes' shape; its quantization
    state is held as buffers (bitsandbytes keeps it beside the parameter, where a tensor tracker
    does not look; the bytes are the same). Only for the meta device: the values are never
    computed."""

    absmax: torch.Tensor
    offset: torch.Tensor

    def __init__(self, in_features: int, out_features: int, bias: nn.Parameter | None):
        nn.Module.__init__(self)  # not nn.Linear's: no full-size weight
        self.in_features, self.out_features = in_features, out_features
        numel = self.in_features * self.out_features
        storage = quantized_storage_bytes(self.out_features, self.in_features)
        self.weight = nn.Parameter(
            torch.empty((numel + 1) // 2, 1, dtype=torch.uint8, device="meta"),
            requires_grad=False,
        )
        self.register_parameter("bias", bias)
        for name, count, dtype in (
            ("absmax", storage.absmax, torch.uint8),
            ("nested_absmax", storage.nested_absmax // 4, torch.float32),
            ("code", NF4_CODES, torch.float32),
            ("nested_code", NESTED_CODES, torch.float32),
        ):
            self.register_buffer(name, torch.empty(count, dtype=dtype, device="meta"), False)
        self.register_buffer("offset", torch.empty((), device="meta"), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(COMPUTE_DTYPE)
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias.data = bias.data.to(x.dtype)  # bitsandbytes recasts the bias once, for good
        needs_grad = x.requires_grad or (bias is not None and bias.requires_grad)
        if torch.is_grad_enabled() and needs_grad:
            out = _DequantizedMatmul.apply(x, self.weight, bias, self)
        else:
            out = self.dequantized_linear(x, bias)
        return out.to(input_dtype)

    def dequantized_absmax(self) -> torch.Tensor:
        """The block scales back in float32 (a fresh tensor, as bitsandbytes dequantizes)."""
        return torch.empty(self.absmax.shape, dtype=torch.float32, device=self.absmax.device)

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(
            self.out_features, self.in_features, dtype=dtype, device=self.weight.device
        )

    def dequantized_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The forward's matmul as bitsandbytes' CUDA fallback runs it: the scales dequantized
        and offset (both kept), the weight dequantized, the product; the three freed after."""
        _raw = self.dequantized_absmax()
        _scales = _raw + self.offset
        return linear_4bit(x, self.dequantized_weight(x.dtype), bias)

    def weight_for_backward(self) -> torch.Tensor:
        """The weight dequantized for the input's gradient: the scales (offset in place) are
        freed once it is, before the matmul."""
        _scales = self.dequantized_absmax()
        _scales += self.offset
        return self.dequantized_weight(QUANTIZED_FROM)


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


# The product as one op, as ``bitsandbytes::gemm_4bit`` is one: selective checkpointing saves
# ``aten.mm`` outputs, never this one's, so it recomputes them, as with bitsandbytes.
linear_4bit = torch.library.custom_op("tutorial_utils::linear_4bit", _product, mutates_args=())
linear_4bit.register_fake(_product)  # meta tensors run the same product


@register_flop_formula(torch.ops.tutorial_utils.linear_4bit)
def _linear_4bit_flops(x_shape, weight_shape, bias_shape, out_shape=None, **kwargs) -> int:
    """A matmul's FLOPs (the dequantization's are not counted, as no elementwise op is)."""
    return 2 * math.prod(x_shape[:-1]) * weight_shape[0] * weight_shape[1]


# the step's FLOP counter and the roofline read FORMULAS, copied from PyTorch's at import
FORMULAS[torch.ops.tutorial_utils.linear_4bit] = _linear_4bit_flops


class _DequantizedMatmul(torch.autograd.Function):
    """The 4-bit matmul's autograd: saves no activation (the packed weight is all it keeps);
    its backward dequantizes the weight again for the input's gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight, bias, layer: Linear4bitOnMeta) -> torch.Tensor:
        ctx.layer = layer
        return layer.dequantized_linear(x, bias)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor):
        grad_input = None
        if ctx.needs_input_grad[0]:
            weight = ctx.layer.weight_for_backward().to(grad_output.dtype)
            grad_input = torch.matmul(grad_output, weight)
        return grad_input, None, None, None


def quantize_on_meta(model: nn.Module) -> None:
    """Replace the layers ``from_pretrained`` quantizes: every ``nn.Linear`` (and GPT-2's
    ``Conv1D``, whose weight is in x out) but the output layer and weights tied to another."""
    from transformers.pytorch_utils import Conv1D

    output = cast(Any, model).get_output_embeddings()
    counts: dict[int, int] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        counts[id(parameter)] = counts.get(id(parameter), 0) + 1
    for name, module in list(model.named_modules()):
        if isinstance(module, Conv1D):
            in_features, out_features = module.weight.shape
        elif type(module) is nn.Linear:
            in_features, out_features = module.in_features, module.out_features
        else:
            continue
        if module is output or counts[id(module.weight)] > 1:
            continue
        parent_name, _, child = name.rpartition(".")
        quantized = Linear4bitOnMeta(in_features, out_features, module.bias)
        setattr(model.get_submodule(parent_name), child, quantized)


def _lora_layer_class() -> type[nn.Module]:
    """peft's LoRA layer for a linear base, with the forward of its bitsandbytes 4-bit layer
    (``peft.tuners.lora.bnb.Linear4bit``, which needs bitsandbytes to exist)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    class LoraLinear4bitOnMeta(LoraLinear):
        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            result = self.base_layer(x, *args, **kwargs).clone()  # peft clones a 4-bit output
            for adapter in self.active_adapters:
                if adapter not in self.lora_A:
                    continue
                lora_a, lora_b = self.lora_A[adapter], self.lora_B[adapter]
                target_dtype = result.dtype
                x = self._cast_input_dtype(x, lora_a.weight.dtype)
                delta = lora_b(lora_a(self.lora_dropout[adapter](x))) * self.scaling[adapter]
                result = result + delta.to(target_dtype)
            return result

    return LoraLinear4bitOnMeta


# How the non-4-bit weights and the adapters are cast, and whether the step runs under autocast:
# the recipes people run, by the library (version) and function that does the casting.
QLORA_RECIPES = {
    "peft": "peft's prepare_model_for_kbit_training alone (peft 0.21, peft.utils.other): every "
    "weight left in 16 bits and the LoRA adapters cast to fp32, no autocast",
    "trl-bf16": "TRL 0.8-0.25's SFTTrainer with bf16=True: prepare_model_for_kbit_training, then "
    "trl.trainer.utils.peft_module_casting_to_bf16 casts the embeddings and the head back to bf16 "
    "(norms and adapters stay fp32), all under bf16 autocast",
    "no-upcast": "TRL 0.26+'s SFTTrainer with bf16=True (trl/trainer/sft_trainer.py, 1.9): no "
    "prepare_model_for_kbit_training, the weights stay bf16 and the adapters are cast to bf16, "
    "under bf16 autocast",
}
QLORA_RECIPE_NAMES = tuple(QLORA_RECIPES)
_TRL_BF16_NAMES = ("lm_head", "embed_tokens", "wte", "wpe")  # peft_module_casting_to_bf16's


def _cast_as_trl(model: nn.Module) -> None:
    """``peft_module_casting_to_bf16``'s effect: norms float32, embeddings and head bfloat16."""
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm) or "norm" in name:
            module.to(torch.float32)
        elif any(part in name for part in _TRL_BF16_NAMES):
            weight = getattr(module, "weight", None)
            if weight is not None and weight.dtype == torch.float32:
                module.to(torch.bfloat16)


def build_qlora(
    config: Any,
    rank: int,
    targets: Sequence[str] | None = None,
    *,
    recipe: str = "peft",
    dropout: float = 0.0,
) -> nn.Module:
    """The QLoRA model of ``config`` on meta: 4-bit base, LoRA adapters, the rest cast as
    ``recipe`` (``QLORA_RECIPES``) casts it."""
    if recipe not in QLORA_RECIPES:
        raise ValueError(
            f"--qlora-recipe must be one of {', '.join(QLORA_RECIPES)}, got {recipe!r}"
        )
    with quiet_bitsandbytes():
        from peft import prepare_model_for_kbit_training

    model = build_causal_lm(config, "meta", QUANTIZED_FROM)
    quantize_on_meta(model)
    if recipe != "no-upcast":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
            prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = add_lora(
        model,
        rank,
        targets,
        dropout=dropout,
        custom_modules={Linear4bitOnMeta: _lora_layer_class()},
    )
    if recipe == "trl-bf16":
        _cast_as_trl(lora)
    elif recipe == "no-upcast":
        for parameter in lora.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.to(torch.bfloat16)
    return lora
