"""Writes docs/VALIDATION.md's table: every published GPU figure with a complete configuration
that ``python -m tutorial_utils estimate`` can describe, beside what the estimate predicts now.

Each point below cites its source (repository, file, commit) and the configuration as the source
states it; the published figure is typed from the source, the estimate and the error are computed
here, never typed. ``tests/test_validation_table.py`` re-runs every estimate and fails when one
moves by more than 0.5% from the committed table. Run it as
``OMP_NUM_THREADS=1 .venv/bin/python scripts/validation_table.py`` after a change to the estimator.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "VALIDATION.md"
BEGIN, END = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"
GIB = 2**30

# github.com/ljm565/universal-llm-trainer, docs/gpu_test.md ("GPU Test", section "1. NVIDIA H100"
# and "3. NVIDIA A100"), configs config/llm_llama3.1_{full,lora}.yaml and
# config_lora/llm_lora_config.yaml at commit 00ed70b2ad6fdb9c0f6787c02fc0b4cc5d53fb5b: torch 2.5.1,
# transformers 4.49.0, batch 2 x 8,192 tokens (no padding), bf16 weights (bit: bfloat16, no
# autocast), torch.optim.AdamW, Hugging Face gradient checkpointing on every layer, logits deleted
# after the forward (the Trainer's loop here), attention left to transformers' default (SDPA).
# LoRA: r 8, alpha 16, dropout 0.05 on q/k/v. "Peak Mem." does not say what it reads.
ULT = "ljm565/universal-llm-trainer docs/gpu_test.md @ 00ed70b"
ULT_FULL = "Llama-3.1-8B full, bf16, AdamW, b2 x 8192, every layer checkpointed"
ULT_LORA = "Llama-3.1-8B LoRA r8 q/k/v p0.05, bf16, AdamW, b2 x 8192, every layer checkpointed"


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
    strategy: str = "every-block"
    time: bool = False  # a seconds-per-step point

    @property
    def compared_with(self) -> str:
        """The estimate's figure that reads what the published one reads."""
        if self.time:
            return "predicted s/step"
        return {
            "max_memory_allocated": "allocated",
            "max_memory_reserved": "reserved",
            "nvidia-smi": "smi",
        }.get(self.measures, "smi")


def ult_lora(gpu: str, published: float, measures: str, time: bool = False) -> Point:
    """A point of the source's LoRA run: r8 on q/k/v, dropout 0.05, as its config sets them."""
    return Point(
        ULT,
        ULT_LORA,
        gpu,
        published,
        measures,
        lora_rank=8,
        lora_targets=("q_proj", "k_proj", "v_proj"),
        lora_dropout=0.05,
        time=time,
    )


POINTS = [
    Point(ULT, ULT_FULL, "h100", 78, "unstated: compared with nvidia-smi"),
    ult_lora("h100", 36, "unstated: compared with nvidia-smi"),
    Point(ULT, ULT_FULL, "a100-80gb", 78, "unstated: compared with nvidia-smi"),
    Point(ULT, ULT_FULL, "h100", 4.7, "seconds per step", time=True),
    Point(ULT, ULT_FULL, "a100-80gb", 9.7, "seconds per step", time=True),
    ult_lora("h100", 6.4, "seconds per micro-step", time=True),
    ult_lora("a100-80gb", 11.5, "seconds per micro-step", time=True),
]


def estimated(point: Point) -> dict[str, float]:
    """The estimate's figures for a point: GiB allocated, reserved and on nvidia-smi, and the
    predicted seconds per step (one estimate per run described, shared by its points)."""
    return _estimated(dataclasses.replace(point, published=0, measures="", time=False))


@functools.cache
def _estimated(point: Point) -> dict[str, float]:
    from tutorial_utils.estimate.card import parse_card
    from tutorial_utils.estimate.estimator import Workload, estimate
    from tutorial_utils.estimate.strategies import parse_strategy

    workload = Workload(
        point.model,
        batch=point.batch,
        size=point.size,
        precision=point.precision,
        lora_rank=point.lora_rank,
        lora_targets=point.lora_targets,
        lora_dropout=point.lora_dropout,
    )
    card = parse_card(None, "0", point.gpu)
    result = estimate(workload, [parse_strategy(point.strategy)], card, search=False)
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
    """The markdown table, estimates computed now."""
    lines = [
        "| # | source | configuration | GPU | published | what it reads | estimate | error |",
        "|---|---|---|---|---:|---|---:|---:|",
    ]
    for index, point in enumerate(points, 1):
        figure = estimated(point)[point.compared_with]
        unit = "s" if point.time else "GiB"
        error = (figure - point.published) / point.published
        lines.append(
            f"| {index} | {point.source} | {point.configuration} | {point.gpu} | "
            f"{point.published:g} {unit} | {point.measures} | {figure:.2f} {unit} "
            f"({point.compared_with}) | {error:+.1%} |"
        )
    return "\n".join(lines)


ESTIMATE_CELL = re.compile(r"\| ([0-9.]+) (GiB|s) \(")


def committed_estimates(text: str) -> list[float]:
    """The estimates of the committed table, in row order."""
    inside = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return [float(m.group(1)) for m in ESTIMATE_CELL.finditer(inside)]


def main() -> int:
    text = DOC.read_text()
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    DOC.write_text(f"{before}{BEGIN}\n{table(POINTS)}\n{END}{after}")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
