"""The ways to checkpoint a ``transformers`` model (each a ``Strategy`` whose ``applied`` calls
``activation_checkpointing_enable``), one training step under each (a dry run at full size, or
a real step to check it against), and their tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict

import torch

from tutorial_utils.checkpointing.selective import ATTENTION_OPS, MATRIX_PRODUCT_OPS
from tutorial_utils.checkpointing.strategy import (
    NO_CHECKPOINTING,
    Strategy,
    StrategyKind,
    every_nth_block,
    offloaded,
    selective,
)
from tutorial_utils.display.tables import columns_table, text_table
from tutorial_utils.lessons.checkpointing_a_transformer.models import (
    CausalLM,
    adamw,
)
from tutorial_utils.measurement.step import StepReport, measure_step, next_token_loss
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import MiB, ratio

__all__ = [
    "DRY_COLUMNS",
    "LMStrategyRow",
    "OFFLOAD_NOT_RUN",
    "breakdown_table",
    "lm_step",
    "rows_table",
    "transformer_menu",
    "strategy_rows",
    "token_batch",
]

# -- the strategies ------------------------------------------------------------------------------


def transformer_menu(layers: int, *, on_cuda: bool = False) -> list[Strategy]:
    """None, every block (reentrant and not), every 2nd and 4th block, two selective policies,
    and offloading where there is a GPU to offload from. Each applied through the model's own
    call (``Strategy.applied``: ``activation_checkpointing_enable``)."""
    menu = [
        NO_CHECKPOINTING,
        every_nth_block(1, use_reentrant=True, name="every block, use_reentrant=True"),
        every_nth_block(1, name="every block (default)"),
    ]
    menu += [every_nth_block(n) for n in (2, 4) if n < layers]
    menu += [
        selective(MATRIX_PRODUCT_OPS, name="selective: save matmuls"),
        selective(MATRIX_PRODUCT_OPS | ATTENTION_OPS, name="selective: save matmuls + attention"),
    ]
    if on_cuda:
        menu.append(offloaded())
    return menu


OFFLOAD_NOT_RUN = (
    "offloading (activation_checkpointing_enable(offload=True)) keeps the checkpoints in pinned "
    "host memory instead of GPU memory; on a CPU they are in host memory already, so there is "
    "nothing to measure here: not run"
)


# -- one step, every strategy ---------------------------------------------------------------------


def token_batch(batch: int, sequence: int, device: str, vocab_size: int) -> torch.Tensor:
    """Random token ids (values only matter on a real device)."""
    if batch < 1 or sequence < 2:
        raise ValueError(f"need batch >= 1 and sequence >= 2 tokens, got {batch}, {sequence}")
    if device == "meta":
        return torch.empty(batch, sequence, dtype=torch.long, device="meta")
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (batch, sequence), generator=generator).to(device)


def lm_step(
    model: CausalLM,
    strategy: Strategy,
    batch: int,
    sequence: int,
    *,
    limit_bytes: int | None = None,
) -> StepReport:
    """One AdamW training step of ``model`` under ``strategy``, tracked: a dry run on meta, else
    a real step (untimed: the notebook times real steps with ``tools.time_turns``)."""
    device = next(model.parameters()).device.type
    ids = token_batch(batch, sequence, device, model.config.vocab_size)
    return measure_step(
        model,
        ids,
        ids,
        strategy,
        optimizer_factory=adamw,
        loss_fn=next_token_loss,
        device=device,
        time_step=False,
        limit_bytes=limit_bytes,
    )


class LMStrategyRow(TypedDict):
    """One strategy's ``lm_step`` as a table row: MiB and GFLOP (None where not counted)."""

    checkpointing: str  # the strategy's name
    kind: StrategyKind
    tracked_peak_mib: float
    activations_mib: float  # activations at the tracked peak
    activation_peak_mib: float
    recompute_gflop: float | None
    step_gflop: float | None
    source: str
    # ratios to the first row ("none"), set once every strategy has run
    peak_ratio: NotRequired[float]
    flops_ratio: NotRequired[float | None]


def strategy_rows(
    model: CausalLM, menu: Sequence[Strategy], batch: int, sequence: int
) -> list[LMStrategyRow]:
    """One ``lm_step`` per strategy, as rows; ratios to the first (which should be "none")."""
    rows: list[LMStrategyRow] = []
    for strategy in menu:
        report = lm_step(model, strategy, batch, sequence)
        rows.append(
            {
                "checkpointing": strategy.name,
                "kind": strategy.kind,
                "tracked_peak_mib": report.peak_mib,
                "activations_mib": report.breakdown["activations"] / MiB,
                "activation_peak_mib": report.activation_peak_bytes / MiB,
                "recompute_gflop": None if report.flops is None else report.flops.recompute / 1e9,
                "step_gflop": None if report.flops is None else report.flops.total / 1e9,
                "source": report.source,
            }
        )
    base = rows[0]
    for row in rows:
        row["peak_ratio"] = row["tracked_peak_mib"] / base["tracked_peak_mib"]
        row["flops_ratio"] = ratio(row["step_gflop"], base["step_gflop"])
    return rows


DRY_COLUMNS = (
    ("checkpointing", "strategy", "{}"),
    ("tracked_peak_mib", "peak MiB", "{:,.0f}"),
    ("activation_peak_mib", "activations MiB", "{:,.0f}"),
    ("peak_ratio", "peak vs none", "{:.2f}"),
    ("recompute_gflop", "recompute GFLOP", "{:,.0f}"),
    ("flops_ratio", "FLOPs vs none", "{:.2f}"),
)


def breakdown_table(reports: dict[str, StepReport]) -> str:
    """The tracked peak of each step split by category, in MiB, headed by how it was obtained."""
    names = {"optimizer_state": "optimizer", "activations": "activations/other"}
    rows = [
        (
            label,
            *(f"{report.breakdown[c] / MiB:,.0f}" for c in CATEGORIES),
            f"{report.peak_mib:,.0f}",
        )
        for label, report in reports.items()
    ]
    header = ("MiB", *(names.get(c, c) for c in CATEGORIES), "tracked peak")
    return next(iter(reports.values())).source + "\n" + text_table(header, rows)


def rows_table(rows: Sequence[LMStrategyRow]) -> str:
    """Rows as an aligned table headed by how they were obtained."""
    return rows[0]["source"] + "\n" + columns_table(rows, DRY_COLUMNS)
