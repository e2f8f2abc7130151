"""QLoRA (``--precision nf4``): the meta emulation of ``estimate.qlora`` against real
``bitsandbytes`` on the CPU.

The real side is what people run: ``from_pretrained`` with ``BitsAndBytesConfig`` (NF4, double
quantization, bf16 compute), ``prepare_model_for_kbit_training`` and peft's LoRA, one training
step measured by the project's tracker. Two differences are expected and asserted exactly:

* bitsandbytes keeps each layer's quantization state (absmax, second-level absmax, offset, code
  tables) beside the weight, not as a buffer, so the tracker does not see it in the real model;
  the emulation holds the same tensors as buffers. real + quantization state = dry.
* AdamW's float32 step counters sit on the CPU (4 bytes per trained tensor; see
  ``test_estimate.py``): a CPU step counts them, a dry run does not, as a CUDA step does not.

What a CPU step cannot show: inside its one op (``bitsandbytes::gemm_4bit``) the forward
dequantizes the weight, which a dispatch-level tracker never sees. The dry run allocates it
visibly, as CUDA does for more than 1,536 tokens; the peaks here are in the backward, where
bitsandbytes dequantizes in Python and the tracker sees every tensor, and they agree to the byte.
"""

from __future__ import annotations

import json
import platform
import warnings

import pytest
import torch

from tutorial_utils.__main__ import main
from tutorial_utils.estimate.estimator import Workload, build_model, load_config, train_step
from tutorial_utils.estimate.qlora import (
    Linear4bitOnMeta,
    QuantizedStorage,
    quantized_storage_bytes,
)
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.measurement.tracker import TensorMemoryTracker

# bitsandbytes 0.50 publishes wheels for Linux (x86_64, aarch64), Windows and macOS arm64; none
# for macOS on Intel, so there (only) the real steps are skipped.
NO_WHEEL = platform.system() == "Darwin" and platform.machine() == "x86_64"
needs_bitsandbytes = pytest.mark.skipif(
    NO_WHEEL, reason="bitsandbytes publishes no wheel for macOS x86_64: no real 4-bit step here"
)
ADAM_STEP_BYTES = 4
RANK, TARGETS = 4, ("q_proj", "v_proj")
# 192 x 320 weights: 960 blocks of 64, not a multiple of 256
TINY_LLAMA = {"hidden_size": 192, "intermediate_size": 320, "num_attention_heads": 3,
              "num_key_value_heads": 1}  # fmt: skip
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny_llama(tiny_config) -> str:
    return tiny_config("llama", **TINY_LLAMA)


def bitsandbytes_config():
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def real_storage(layer) -> QuantizedStorage:
    """The bytes a real ``bnb.nn.Linear4bit`` keeps, read off its tensors."""
    state = layer.weight.quant_state

    def nbytes(tensor: torch.Tensor) -> int:
        return tensor.untyped_storage().nbytes()

    return QuantizedStorage(
        weight=nbytes(layer.weight),
        absmax=nbytes(state.absmax),
        nested_absmax=nbytes(state.state2.absmax),
        offset=nbytes(state.offset),
        code=nbytes(state.code),
        nested_code=nbytes(state.state2.code),
    )


@needs_bitsandbytes
def test_one_layer_stores_what_bitsandbytes_stores():
    """NF4 with double quantization of a 320 x 192 weight: 30,720 bytes packed, 960 uint8
    absmax, 4 float32 second-level absmax (960 / 256, rounded up), a float32 offset, the NF4
    table (16 float32) and a copy of the 256-entry dynamic table."""
    import bitsandbytes as bnb

    torch.manual_seed(0)
    real = bnb.nn.Linear4bit(
        192, 320, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4"
    ).to(torch.bfloat16)
    real = real.to("cpu")  # quantizes, as .to(device) does on a GPU
    expected = QuantizedStorage(30_720, 960, 16, 4, 64, 1024)
    assert real_storage(real) == quantized_storage_bytes(320, 192) == expected
    with torch.device("meta"):
        emulated = Linear4bitOnMeta(192, 320, bias=None)
    assert emulated.weight.shape == real.weight.shape and emulated.weight.dtype == torch.uint8
    held = sum(t.untyped_storage().nbytes() for t in [*emulated.parameters(), *emulated.buffers()])
    assert held == expected.total


def allocations_in(forward) -> list[int]:
    """The bytes of each CPU allocation ``forward()`` makes, in order, kernels' inner ones
    included: the profiler's memory events (a dispatch-level tracker sees only op outputs)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        forward()
    events = profiler.profiler.kineto_results.events()
    return [e.nbytes() for e in events if e.name() == "[memory]" and e.nbytes() > 0]


@needs_bitsandbytes
def test_the_forward_dequantizes_as_bitsandbytes_does():
    """Inside its one op a real Linear4bit's forward allocates the scales in float32 (960 x 4
    bytes: dequantized, then offset) and the whole weight in bf16 (320 x 192 x 2), then the
    product (128 tokens x 320 x 2): the emulation allocates the same, in the same order.
    (Where they differ: the CPU frees the first scales before the weight, CUDA's fallback after
    the product; the CPU's mm takes scratch the dry run does not count.)"""
    import bitsandbytes as bnb

    torch.manual_seed(0)
    real = bnb.nn.Linear4bit(192, 320, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    real = real.to(torch.bfloat16).to("cpu")
    x = torch.randn(2, 64, 192, dtype=torch.bfloat16, requires_grad=True)
    expected = [960 * 4, 960 * 4, 320 * 192 * 2, 2 * 64 * 320 * 2]
    assert allocations_in(lambda: real(x))[:4] == expected
    with torch.device("meta"):
        emulated = Linear4bitOnMeta(192, 320, bias=None)
    x_meta = torch.empty(2, 64, 192, dtype=torch.bfloat16, device="meta", requires_grad=True)
    with TensorMemoryTracker(record_allocations=True) as tracker:
        emulated(x_meta)
    assert tracker.allocations is not None
    assert [e.nbytes for e in tracker.allocations.events if e.kind == "malloc"] == expected


def real_qlora(config_path: str, tmp_path, targets: tuple[str, ...], recipe: str = "peft"):
    """The recipe people run, on the CPU: a checkpoint loaded in 4 bits, prepared, LoRA; with
    ``recipe`` "trl-bf16" or "no-upcast", cast afterwards as those TRL versions cast it."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    config = load_config(config_path)
    config.use_cache = False
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path,
        quantization_config=bitsandbytes_config(),
        device_map="cpu",
        dtype=torch.bfloat16,
        attn_implementation="sdpa",
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        if recipe != "no-upcast":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(targets), lora_dropout=0.0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        peft_model = get_peft_model(model, lora)
    if recipe == "trl-bf16":  # TRL 0.25's peft_module_casting_to_bf16, written out
        for name, module in peft_model.named_modules():
            if "norm" in name:
                module.to(torch.float32)
            elif "lm_head" in name or "embed_tokens" in name:
                module.to(torch.bfloat16)
    elif recipe == "no-upcast":  # TRL 1.9's SFTTrainer: trained parameters to bf16
        for parameter in peft_model.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.to(torch.bfloat16)
    return peft_model


def quantization_state_bytes(model) -> int:
    """What bitsandbytes keeps beside its 4-bit weights (every storage once)."""
    import bitsandbytes as bnb

    storages = {}
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            for tensor in (state.absmax, state.offset, state.code, *state.state2.__dict__.values()):
                if isinstance(tensor, torch.Tensor):
                    storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage()
    return sum(storage.nbytes() for storage in storages.values())


def real_and_dry(
    config_path: str, tmp_path, strategy: str, targets: tuple[str, ...], recipe: str = "peft"
):
    """One step of the real QLoRA model on the CPU and one dry run, with what the real model
    keeps beside its weights and its number of trained tensors."""
    import bitsandbytes as bnb

    workload = Workload(
        f"hf:{config_path}",
        batch=2,
        size=64,
        precision="nf4",
        lora_rank=RANK,
        lora_targets=targets,
        qlora_recipe=recipe,
        autocast_policy="cpu",  # the real step runs torch.autocast("cpu"), the dry run its rules
    )
    dry_model = build_model(workload)
    real_model = real_qlora(config_path, tmp_path, targets, recipe)
    dtypes = [(n, p.dtype) for n, p in real_model.named_parameters()]
    assert [(n, p.dtype) for n, p in dry_model.named_parameters()] == dtypes

    def quantized(model, kind) -> set[str]:
        return {n.removeprefix("base_model.model.") for n, m in model.named_modules()
                if isinstance(m, kind)}  # fmt: skip

    assert quantized(dry_model, Linear4bitOnMeta) == quantized(real_model, bnb.nn.Linear4bit)
    trained = sum(1 for p in real_model.parameters() if p.requires_grad)
    state_bytes = quantization_state_bytes(real_model)
    real = train_step(real_model, workload, parse_strategy(strategy))
    dry = train_step(dry_model, workload, parse_strategy(strategy))
    assert real.peak_bytes + state_bytes - dry.peak_bytes == ADAM_STEP_BYTES * trained
    assert real.breakdown["activations"] == dry.breakdown["activations"]
    assert real.breakdown["parameters"] + state_bytes == dry.breakdown["parameters"]
    return state_bytes


@needs_bitsandbytes
@pytest.mark.parametrize("strategy", ["none", "selective"])
def test_dry_run_equals_a_real_cpu_qlora_step(tiny_llama, tmp_path, strategy):
    """Selective checkpointing saves matmul outputs: bitsandbytes' 4-bit product is one op of
    its own, not ``aten.mm``, so both recompute it."""
    state_bytes = real_and_dry(tiny_llama, tmp_path, strategy, TARGETS)
    assert state_bytes == 2 * 7 * (64 + 4 + 1024) + 2 * (
        sum(b + 4 * -(-b // 256) for b in (576, 192, 192, 576, 960, 960, 960))
    )  # 7 layers a block, 2 blocks: tables and offset, absmax, second-level absmax


@needs_bitsandbytes
@pytest.mark.parametrize(
    ("recipe", "strategy"), [("trl-bf16", "every-block"), ("no-upcast", "none")]
)
def test_trl_recipes_equal_a_real_cpu_step_under_autocast(tiny_llama, tmp_path, recipe, strategy):
    """TRL's SFTTrainer(bf16=True) recipes: the same dtypes parameter by parameter, and the same
    step under bf16 autocast (the CPU's policy on both sides). Left open: no-upcast with every
    block checkpointed reads 65,024 bytes high in the backward of this tiny model."""
    real_and_dry(tiny_llama, tmp_path, strategy, TARGETS, recipe)


def test_the_recipes_order_the_peaks(tiny_llama):
    """Each recipe upcasts less than the one before: the peak falls."""
    peaks = []
    for recipe in ("peft", "trl-bf16", "no-upcast"):
        workload = Workload(f"hf:{tiny_llama}", batch=2, size=64, precision="nf4", lora_rank=RANK,
                            qlora_recipe=recipe)  # fmt: skip
        peaks.append(train_step(build_model(workload), workload, parse_strategy("none")).peak_bytes)
    assert peaks[0] > peaks[1] > peaks[2]


@needs_bitsandbytes
def test_gpt2_qlora_equals_a_real_cpu_step(tmp_path):
    """GPT-2's Conv1D layers are quantized too, and their biases, cast to float32 by
    prepare_model_for_kbit_training, are cast back to bf16 by bitsandbytes' first forward."""
    config = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128}
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps({**config, "vocab_size": 500, "bos_token_id": 0, "eos_token_id": 0}))
    real_and_dry(str(path), tmp_path / "checkpoint", "every-block", ("c_attn", "c_proj"))


def test_qlora_counts_the_flops_of_bf16_lora(tiny_llama):
    """The same products of the same shapes: a 4-bit base changes memory, not the FLOPs the
    column and the roofline count (its one-op product has a formula of its own). Recomputed
    inside an autograd Function (gradients off), as bitsandbytes' is, the 4-bit product counts
    as backward there, not recompute: the phases split differently, the total is the same."""
    sizes = {"batch": 2, "size": 64, "lora_rank": RANK, "lora_targets": TARGETS}
    for strategy in ("none", "every-block"):
        flops = [
            train_step(build_model(workload), workload, parse_strategy(strategy)).flops
            for workload in (
                Workload(f"hf:{tiny_llama}", precision=precision, **sizes)
                for precision in ("nf4", "bf16")
            )
        ]
        assert flops[0] is not None and flops[1] is not None
        assert (flops[0].forward, flops[0].total) == (flops[1].forward, flops[1].total)


def test_the_command_prints_qlora_rows(tiny_llama, capsys):
    arguments = ["estimate", "--hf-config", tiny_llama, "--seq", "64", "--precision", "nf4"]
    arguments += ["--lora", "4", "--strategies", "none,every-block", "--card", "1GB"]
    assert main([*arguments, "--no-search"]) == 0
    out = capsys.readouterr().out
    assert "4-bit NF4 in 14 linear layers" in out and "QLoRA: NF4 4-bit base" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("none", "every"))]
    assert [row[0] for row in rows] == ["none", "every"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--hf-config", "CONFIG", "--precision", "nf4"], "add --lora RANK"),
        (["--torchvision", "resnet18", "--precision", "nf4", "--lora", "4"], "language models"),
        (
            ["--hf-config", "CONFIG", "--precision", "nf4", "--lora", "4", "--gpus", "2"]
            + ["--shard", "fsdp2"],
            "not emulated",
        ),  # fmt: skip
    ],
)
def test_nf4_needs_a_language_model_lora_and_one_gpu_or_ddp(tiny_llama, arguments, message, capsys):
    arguments = [tiny_llama if a == "CONFIG" else a for a in arguments]
    assert main(["estimate", *arguments, "--no-search"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
