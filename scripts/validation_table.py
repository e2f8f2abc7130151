"""Writes docs/VALIDATION.md's table: every published GPU figure with a complete configuration
that ``python -m tutorial_utils estimate`` can describe, beside what the estimate predicts now.

Each point below cites its source (repository, file, commit) and the configuration as the source
states it; the published figure is typed from the source, the estimate and the error are computed
here, never typed. ``tests/test_validation_table.py`` re-runs every estimate and fails when one
moves by more than 0.5% from the committed table. Step times have their own table (``TIME_POINTS``):
each row says whether it set a constant of the time model (fit) or checks it (held out). Run it as
``OMP_NUM_THREADS=1 .venv/bin/python scripts/validation_table.py`` after a change to the estimator.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tutorial_utils.units import MiB

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "VALIDATION.md"
BEGIN, END = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"
TIME_BEGIN, TIME_END = "<!-- time-table:begin -->", "<!-- time-table:end -->"
MODELS = ROOT / "scripts" / "validation_models"  # config.json files of models without a preset
GIB = 2**30

# github.com/ljm565/universal-llm-trainer, docs/gpu_test.md ("GPU Test", section "1. NVIDIA H100"
# and "3. NVIDIA A100"), configs config/llm_llama3.1_{full,lora}.yaml and
# config_lora/llm_lora_config.yaml at commit 9efd14b5 (2025-09-02, the table's last edit): torch
# 2.5.1, transformers 4.49.0, batch 2 x 8,192 tokens (no padding), bf16 weights (bit: bfloat16, no
# autocast), torch.optim.AdamW, Hugging Face gradient checkpointing on every layer, logits deleted
# after the forward (the Trainer's loop here), attention left to transformers' default (SDPA).
# LoRA: r 8, alpha 16, dropout 0.05 on all seven projections (q, k, v, o, gate, up, down), as
# config_lora/llm_lora_config.yaml sets them. "Peak Mem." does not say what it reads. Its loss
# (src/models/llama3.py, Llama3.forward) is nn.CrossEntropyLoss on the bf16 logits, with no fp32
# upcast: --loss logits-dtype.
ULT = "ljm565/universal-llm-trainer docs/gpu_test.md @ 9efd14b"
ULT_FULL = (
    "Llama-3.1-8B full, bf16, AdamW, b2 x 8192, every layer checkpointed, loss on bf16 logits"
)
ULT_LORA = (
    "Llama-3.1-8B LoRA r8 q/k/v/o/gate/up/down p0.05, bf16, AdamW, b2 x 8192, "
    "every layer checkpointed, loss on bf16 logits"
)
ULT_LOSS = "logits-dtype"
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# github.com/foundation-model-stack/fms-acceleration, scripts/benchmarks/refs/a100_80gb.csv at
# commit 24bdadb2 (2025-02-07), with the run's settings at the same commit: scenarios.yaml
# (scenarios full-finetuning, standard-peft, baseline-peft-bnb; framework_config empty = plain
# fms-hf-tuning), defaults.yaml, benchmark.py, accelerate.yaml and refs/requirements.txt (torch
# 2.4.1, transformers 4.48.1, peft 0.13.2, trl 0.13.0, accelerate 1.0.1, bitsandbytes 0.43.3).
# Mistral-7B-v0.1 on A100-80GB, packed to 4,096 tokens (benchmark.py's --packing_matrix and
# --max_seq_len_matrix defaults), per-GPU batch = effective batch (4 or 8) / GPUs, gradient
# checkpointing (HF, every layer), flash_attention_2, AdamW (the Trainer's default), bf16 weights
# (torch_dtype bfloat16). Full and LoRA runs set no bf16 flag (no autocast); LoRA r16, alpha 16,
# dropout 0.1 on q/k/v/o. QLoRA (baseline-peft-bnb): the plugin loads NF4 with double
# quantization, compute dtype bf16 (plugins/accelerated-peft framework_plugin_bnb.py), and leaves
# peft to TRL's SFTTrainer with bf16=True (no_peft_model: true): the trl-bf16 recipe. 2 GPUs: FSDP
# (FULL_SHARD, transformer-based wrap, mixed_precision 'no'). Memory columns
# (scripts/benchmarks/README.md, "Logging GPU Memory"): mem_peak_torch_mem_alloc_in_bytes is
# torch.cuda.max_memory_allocated over train() on rank 0 (the Trainer's memory metrics);
# mem_nvidia_mem_reserved is nvidia-smi's memory.used in MiB, its peak less what was in use before
# the run, averaged over the GPUs. transformers 4.48.1's loss copies the shifted logits in fp32:
# --loss transformers-4.48.
FMS = "foundation-model-stack/fms-acceleration scripts/benchmarks/refs/a100_80gb.csv @ 24bdadb"
FMS_CHECKPOINTED = "b{batch} x 4096 packed, every layer checkpointed, transformers 4.48's loss"
FMS_SHARDED = "b{batch} per GPU x 4096 packed, every layer checkpointed, transformers 4.48's loss"
FMS_FULL = "Mistral-7B full, bf16, AdamW, " + FMS_CHECKPOINTED
FMS_LORA = "Mistral-7B LoRA r16 q/k/v/o p0.1, bf16, AdamW, " + FMS_CHECKPOINTED
FMS_QLORA = (
    "Mistral-7B QLoRA NF4 double-quant, r16 q/k/v/o p0.1, TRL SFTTrainer bf16=True, AdamW, "
    + FMS_CHECKPOINTED
)
FMS_FSDP = "Mistral-7B full, bf16, AdamW, 2 GPUs FSDP full shard, " + FMS_SHARDED
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Point:
    """One published figure and the estimate's description of its run."""

    source: str
    configuration: str
    gpu: str  # the estimate's --gpu
    published: float  # GiB, or seconds per step for a time point
    measures: str  # what the published figure reads
    model: str = "hf:llama-3.1-8b"
    batch: int = 2
    size: int = 8192
    precision: str = "bf16"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    qlora_recipe: str = "peft"  # with precision nf4: how the rest is cast (--qlora-recipe)
    loss: str = "transformers"  # how the loss treats the logits (--loss)
    gpus: int = 1  # above 1: rank 0 of this many GPUs, batch per GPU (--gpus)
    shard: Literal["fsdp2", "ddp"] = "fsdp2"  # with gpus above 1 (--shard)
    strategy: str = "every-block"
    time: bool = False  # a seconds-per-step point
    tokens_per_second: bool = False  # a time point published as tokens per second (per GPU)
    role: str = ""  # a time point: "fit" (sets BANDWIDTH_SHARE) or "held out"

    @property
    def compared_with(self) -> str:
        """The estimate's figure that reads what the published one reads."""
        if self.time:
            return "predicted s/step"
        for counter, figure in (
            ("max_memory_allocated", "allocated"),
            ("max_memory_reserved", "reserved"),
            ("nvidia-smi", "smi"),
        ):
            if self.measures.startswith(counter):
                return figure
        return "smi"  # unstated: the largest of the three


def ult_lora(gpu: str, published: float, measures: str, time: bool = False) -> Point:
    """A point of the source's LoRA run: r8 on all seven projections, dropout 0.05, as its
    config sets them."""
    return Point(
        ULT,
        ULT_LORA,
        gpu,
        published,
        measures,
        lora_rank=8,
        lora_targets=ALL_PROJECTIONS,
        lora_dropout=0.05,
        loss=ULT_LOSS,
        time=time,
        role="held out" if time else "",
    )


def fms(configuration: str, batch: int, published_gib: float, measures: str, **run) -> Point:
    """A point of fms-acceleration's Mistral-7B runs on A100-80GB at 4,096 tokens; ``run``:
    the LoRA, QLoRA or sharding settings that tell one run from another."""
    return Point(
        FMS,
        configuration.format(batch=batch),
        "a100-80gb",
        published_gib,
        measures,
        model="hf:mistral-7b",
        batch=batch,
        size=4096,
        loss="transformers-4.48",
        **run,
    )


FMS_ALLOCATED = "max_memory_allocated (rank 0)"
FMS_SMI = "nvidia-smi memory.used (peak, mean of the GPUs)"
LORA = {"lora_rank": 16, "lora_targets": ATTENTION_PROJECTIONS, "lora_dropout": 0.1}
QLORA = {"precision": "nf4", "qlora_recipe": "trl-bf16", **LORA}
FSDP = {"gpus": 2, "shard": "fsdp2"}

POINTS = [
    Point(ULT, ULT_FULL, "h100", 78, "unstated: compared with nvidia-smi", loss=ULT_LOSS),
    ult_lora("h100", 36, "unstated: compared with nvidia-smi"),
    Point(ULT, ULT_FULL, "a100-80gb", 78, "unstated: compared with nvidia-smi", loss=ULT_LOSS),
    # fms-acceleration: each run's bytes (max_memory_allocated) and MiB (nvidia-smi), as published
    fms(FMS_FULL, 4, 72434837504 / GIB, FMS_ALLOCATED),
    fms(FMS_FULL, 4, 77256 * MiB / GIB, FMS_SMI),
    fms(FMS_LORA, 4, 26704571904 / GIB, FMS_ALLOCATED, **LORA),
    fms(FMS_LORA, 4, 29576 * MiB / GIB, FMS_SMI, **LORA),
    fms(FMS_LORA, 8, 38742912512 / GIB, FMS_ALLOCATED, **LORA),
    fms(FMS_LORA, 8, 43232 * MiB / GIB, FMS_SMI, **LORA),
    fms(FMS_QLORA, 4, 20669338112 / GIB, FMS_ALLOCATED, **QLORA),
    fms(FMS_QLORA, 4, 26056 * MiB / GIB, FMS_SMI, **QLORA),
    fms(FMS_QLORA, 8, 37002646016 / GIB, FMS_ALLOCATED, **QLORA),
    fms(FMS_QLORA, 8, 46050 * MiB / GIB, FMS_SMI, **QLORA),
    fms(FMS_FSDP, 2, 36225939968 / GIB, FMS_ALLOCATED, **FSDP),
    fms(FMS_FSDP, 2, 44382 * MiB / GIB, FMS_SMI, **FSDP),
]

# github.com/pytorch/torchtitan, docs/performance.md @ 041336434916bdc0f88c1f89fda176fd3c2092e4
# ("Llama 3 performance numbers" and "Llama 2 performance numbers": WPS, tokens per second per
# GPU, on 64 A100 80GB with FSDP2) and train_configs/llama3_8b.toml @ 0011fb905e95: batch 1 x
# 8,192 per GPU, AdamW, compile false, float8 off, bf16 compute (FSDP2's mixed precision),
# F.scaled_dot_product_attention with is_causal (FlashAttention on an A100). Llama 2: batch 2 x
# 4,096 per GPU, as the page says. "selective op" saves matmul outputs (here: "selective",
# which saves every matmul where torchtitan recomputes every second one); "selective layer"
# checkpoints every n-th block, n not stated: here every 2nd (torchtitan's example value).
# The dry run is one GPU's step with bf16 weights: it steps AdamW over all parameters where each
# of torchtitan's 64 ranks steps 1/64 of them, and it does not time FSDP2's collectives.
TT = "pytorch/torchtitan docs/performance.md @ 0413364"
TT_8B = "Llama-3-8B full, bf16, AdamW, b1 x 8192, FSDP2 on 64 A100, selective {} AC"
TT_13B = "Llama-2-13B full, bf16, AdamW, b2 x 4096, FSDP2 on 64 A100, {}"
# github.com/pytorch/torchtitan, docs/performance.md @ eaea6f6a2fa940f03a10906be1df3489cf30af85
# (Table 1: Llama 3.1 8B, 8 GPUs, local batch 2, selective AC, FSDP, no compile, no Float8): H100
# with 96 GB HBM2e at 2.4 TB/s and a 500 W power limit (the page's "Grand Teton" hosts); the
# --gpu h100 card is the 80 GB SXM at 3.35 TB/s and 700 W. Sequence 8,192 and "selective" as op
# (the 8B config's defaults; the table does not say which).
TT_H100 = "pytorch/torchtitan docs/performance.md @ eaea6f6"
TT_H100_8B = "Llama-3.1-8B full, bf16, AdamW, b2 x 8192, FSDP on 8 H100 96GB (500 W), selective AC"
LLAMA_2_13B = f"hf:{MODELS / 'llama-2-13b.json'}"  # huggingface.co/meta-llama/Llama-2-13b-hf


def torchtitan(configuration: str, published: float, role: str, **run) -> Point:
    """A torchtitan row: published as tokens per second per GPU (WPS)."""
    source = TT_H100 if run.get("gpu") == "h100" else TT
    fields = {"gpu": "a100-80gb", "batch": 1, "size": 8192, **run}
    return Point(source, configuration, published=published, measures="tokens/s per GPU",
                 time=True, tokens_per_second=True, role=role, **fields)  # fmt: skip


TIME_POINTS = [
    torchtitan(TT_13B.format("no AC"), 2162, "fit", model=LLAMA_2_13B, batch=2, size=4096,
               strategy="none"),
    torchtitan(TT_8B.format("op"), 2973, "fit", strategy="selective"),
    torchtitan(TT_13B.format("selective layer AC"), 1914, "held out", model=LLAMA_2_13B,
               batch=2, size=4096, strategy="every-2"),
    torchtitan(TT_8B.format("layer"), 2904, "held out", strategy="every-2"),
    torchtitan(TT_H100_8B, 5762, "held out", gpu="h100", batch=2, strategy="selective"),
    Point(ULT, ULT_FULL, "h100", 4.7, "seconds per step", loss=ULT_LOSS, time=True,
          role="held out"),
    Point(ULT, ULT_FULL, "a100-80gb", 9.7, "seconds per step", loss=ULT_LOSS, time=True,
          role="held out"),
    ult_lora("h100", 6.4, "seconds per micro-step", time=True),
    ult_lora("a100-80gb", 11.5, "seconds per micro-step", time=True),
]  # fmt: skip


def estimated(point: Point) -> dict[str, float]:
    """The estimate's figures for a point: GiB allocated, reserved and on nvidia-smi, and the
    predicted seconds per step (one estimate per run described, shared by its points)."""
    keep = {"published": 0, "measures": "", "time": False, "tokens_per_second": False, "role": ""}
    return _estimated(dataclasses.replace(point, **keep))


@functools.cache
def _estimated(point: Point) -> dict[str, float]:
    from tutorial_utils.estimate.card import parse_card
    from tutorial_utils.estimate.estimator import Workload, estimate
    from tutorial_utils.estimate.sharded import Sharding
    from tutorial_utils.estimate.strategies import parse_strategy

    workload = Workload(
        point.model,
        batch=point.batch,
        size=point.size,
        precision=point.precision,
        lora_rank=point.lora_rank,
        lora_targets=point.lora_targets,
        lora_dropout=point.lora_dropout,
        qlora_recipe=point.qlora_recipe,
        loss=point.loss,
    )
    card = parse_card(None, "0", point.gpu)
    sharding = Sharding(point.gpus, point.shard) if point.gpus > 1 else None
    result = estimate(
        workload, [parse_strategy(point.strategy)], card, search=False, sharding=sharding
    )
    row = result.rows[0]
    if row.allocator is None or row.gpu is None:
        raise RuntimeError(f"{point.configuration}: the estimate did not run ({row.error})")
    allocator = row.allocator
    return {
        "allocated": allocator.max_allocated_bytes / GIB,
        "reserved": allocator.max_reserved_bytes / GIB,
        "smi": (allocator.max_reserved_bytes + card.context_bytes) / GIB,
        "predicted s/step": row.gpu.predicted_seconds or float("nan"),
    }


def table(points: list[Point]) -> str:
    """The markdown table of memory points, estimates computed now."""
    lines = [
        "| # | source | configuration | GPU | published | what it reads | estimate | error |",
        "|---|---|---|---|---:|---|---:|---:|",
    ]
    for index, point in enumerate(points, 1):
        figure = estimated(point)[point.compared_with]
        error = (figure - point.published) / point.published
        lines.append(
            f"| {index} | {point.source} | {point.configuration} | {point.gpu} | "
            f"{point.published:.2f} GiB | {point.measures} | {figure:.2f} GiB "
            f"({point.compared_with}) | {error:+.1%} |"
        )
    return "\n".join(lines)


def published_seconds(point: Point) -> float:
    """A time point's published seconds per step (per GPU): tokens per second turned into the
    seconds its batch takes."""
    if point.tokens_per_second:
        return point.batch * point.size / point.published
    return point.published


def time_table(points: list[Point]) -> str:
    """The markdown table of step times: published, predicted, error, and the point's role."""
    lines = [
        "| # | source | configuration | GPU | published | s/step published | estimate | "
        "error | role |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for index, point in enumerate(points, 1):
        seconds = published_seconds(point)
        figure = estimated(point)["predicted s/step"]
        unit = "tok/s per GPU" if point.tokens_per_second else "s"
        lines.append(
            f"| {index} | {point.source} | {point.configuration} | {point.gpu} | "
            f"{point.published:,g} {unit} | {seconds:.3g} | {figure:.2f} s (predicted s/step) | "
            f"{(figure - seconds) / seconds:+.1%} | {point.role} |"
        )
    return "\n".join(lines)


ESTIMATE_CELL = re.compile(r"\| ([0-9.]+) (GiB|s) \(")


def committed_estimates(text: str, begin: str = BEGIN, end: str = END) -> list[float]:
    """The estimates of a committed table (the memory table; the time table with its markers),
    in row order."""
    inside = text.split(begin, 1)[1].split(end, 1)[0]
    return [float(m.group(1)) for m in ESTIMATE_CELL.finditer(inside)]


def _replaced(text: str, begin: str, end: str, body: str) -> str:
    before, rest = text.split(begin, 1)
    return f"{before}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"


def main() -> int:
    text = _replaced(DOC.read_text(), BEGIN, END, table(POINTS))
    DOC.write_text(_replaced(text, TIME_BEGIN, TIME_END, time_table(TIME_POINTS)))
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
