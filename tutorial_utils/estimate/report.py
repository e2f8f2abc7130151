"""The estimate as text: what ran, one row per strategy (the dry run's tensor bytes by category,
then what the caching allocator would count and whether the step runs in the card, with the
margin left), and below the table, once, what the columns are and where the figures come from.

The table fits 120 columns; figures are in GiB, or in MiB when every figure is below 1 GiB.
Every figure, unrounded and with its unit in its name, is in ``record.estimate_record``
(``--json``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from tutorial_utils.checkpointing.strategy import OFFLOAD_NOTE
from tutorial_utils.estimate.estimator import (
    Estimate,
    StrategyEstimate,
    Workload,
    describe_precision,
)
from tutorial_utils.measurement.step import DRY_RUN_LABEL, StepReport
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import GiB, MiB

__all__ = [
    "CATEGORY_LABELS",
    "TABLE_COLUMNS",
    "cuda_comparison",
    "describe_workload",
    "display_unit",
    "estimate_table",
]

TABLE_COLUMNS = 120
CATEGORY_LABELS = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer_state": "optimizer",
    "activations": "activations",
}
_NAME_COLUMNS = 24  # the strategy's column: as wide as "selective: matmuls+convs" at least
_SHORT = {"optimizer_state": "optim", "activations": "activ"}  # column headers
COMM_CATEGORIES = ("all_gather", "reduce_scatter", "buckets")  # fake_ranks.BUFFER_CATEGORIES


def describe_workload(result: Estimate) -> str:
    w = result.workload
    size = f"{w.size:,} tokens" if w.is_language_model else f"{w.size} x {w.size} px images"
    tuning = "full fine-tuning"
    if w.lora_rank:
        targets = ",".join(w.lora_targets) if w.lora_targets else "attention projections"
        tuning = f"LoRA rank {w.lora_rank} on {targets}"
        if w.lora_dropout:
            tuning += f", dropout {w.lora_dropout:g}"
    optimizer = "AdamW" if w.optimizer == "adamw" else "SGD, momentum 0.9"
    if w.is_language_model:
        optimizer += "; " + ("Trainer's loop" if w.loop == "trainer" else "plain loop")
        if w.loss != "transformers":
            optimizer += f", loss: {w.loss}"
    precision = describe_precision(w.precision, w.qlora_recipe)
    if result.sharding is not None and result.sharding.mixed_precision(w) is not None:
        precision = "FSDP2's MixedPrecisionPolicy (next line)"
    return f"step: batch {w.batch} x {size}; {precision}; {optimizer}; {tuning}"


def display_unit(result: Estimate) -> tuple[str, int]:
    """GiB, or MiB when every reserved peak is below 1 GiB (so small models do not read 0.00)."""
    peaks = [row.allocator.max_reserved_bytes for row in result.rows if row.allocator is not None]
    return ("GiB", GiB) if not peaks or max(peaks) >= GiB else ("MiB", MiB)


def _size(nbytes: int, unit: int) -> str:
    return f"{nbytes / unit:,.2f}" if unit == GiB else f"{nbytes / unit:,.1f}"


def _rate(per_second: float) -> str:
    """Tokens or images a second, in millions from a million (the table stays in 120 columns)."""
    return f"{per_second / 1e6:,.2f}M" if per_second >= 1e6 else f"{per_second:,.0f}"


def _largest(row: StrategyEstimate, workload: Workload) -> str:
    if row.largest is None:
        return "-"
    return f"{row.largest:,}" if row.largest else "none"


def _cells(row: StrategyEstimate, result: Estimate, unit: int) -> list[str]:
    """One measured row's cells, in the order of ``_headers``."""
    report, allocator, w = row.report, row.allocator, result.workload
    assert report is not None
    cells = [row.strategy.name, row.gpu.kernel if row.gpu else "-"]
    cells += [_size(report.breakdown[c], unit) for c in CATEGORIES]
    if result.sharding is not None:  # the communication buffers, together
        cells.append(_size(sum(report.breakdown.get(c, 0) for c in COMM_CATEGORIES), unit))
    if allocator is None:
        cells += ["-"] * 4
    else:
        smi = allocator.max_reserved_bytes + result.card.context_bytes
        cells += [
            _size(b, unit)
            for b in (allocator.max_allocated_bytes, allocator.max_reserved_bytes, smi)
        ]
        margin = (allocator.margin_bytes or 0) / unit
        cells.append(f"{margin:+,.2f}" if unit == GiB else f"{margin:+,.0f}")
    seconds = row.gpu.predicted_seconds if row.gpu is not None else None
    per_step = w.batch * (w.size if w.is_language_model else 1)
    cells += [
        "-" if row.flops_ratio is None else f"{row.flops_ratio:.2f}",
        _largest(row, w),
        "-" if not seconds else _rate(per_step / seconds),
    ]
    return cells


def _headers(workload: Workload, sharded: bool = False) -> list[str]:
    rate = "tok/s" if workload.is_language_model else "img/s"
    longest = "longest" if workload.is_language_model else "batch"
    return (
        ["strategy", "attention"]
        + [_SHORT.get(c, CATEGORY_LABELS[c]) for c in CATEGORIES]
        + (["comm"] if sharded else [])
        + ["alloc", "reserved", "smi", "margin", "FLOPs", longest, rate]
    )


def _aligned(rows: Sequence[Sequence[str]], notes: dict[int, str]) -> list[str]:
    """Columns as wide as their widest cell, the first left-aligned; ``notes``: rows (by index)
    printed as one line of text after the strategy's name."""
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(len(rows[0]))]
    widths[0] = max(widths[0], _NAME_COLUMNS)
    lines = []
    for index, row in enumerate(rows):
        if index in notes:
            lines.append(f"{row[0]:<{widths[0]}} {notes[index]}")
            continue
        first = f"{row[0]:<{widths[0]}}"
        lines.append(
            " ".join([first, *(f"{c:>{w}}" for c, w in zip(row[1:], widths[1:], strict=True))])
        )
    return lines


def _table(result: Estimate, unit: int) -> list[str]:
    rows: list[list[str]] = [_headers(result.workload, result.sharding is not None)]
    notes = {}
    for row in result.rows:
        if row.report is None:
            notes[len(rows)] = row.error or OFFLOAD_NOTE
            rows.append([row.strategy.name])
        else:
            rows.append(_cells(row, result, unit))
    return _aligned(rows, notes)


def _kept_lines(result: Estimate, unit: int, unit_name: str) -> list[str]:
    """A language model's activations alive at the loss, by region, one line per strategy; one
    more where the logits and the loss are most of them once blocks are checkpointed."""
    rows = [row for row in result.rows if row.kept is not None]
    if not rows:
        return []
    whose = "rank 0's activations" if result.sharding is not None else "activations"
    lines = [f"{whose} kept at the loss ({unit_name}): blocks / logits and loss / the rest"]
    for row in rows:
        assert row.kept is not None
        parts = " / ".join(_size(b, unit) for b in row.kept.bytes_by_region.values())
        lines.append(f"  {row.strategy.name}: {parts}")
    dominated = [
        r.strategy.name
        for r in rows
        if r.strategy.kind != "none" and r.kept and r.kept.logits_dominate()
    ]
    if dominated:
        lines.append(
            "the logits and the loss are most of what is kept once blocks are checkpointed: "
            + ", ".join(dominated)
        )
    return [part for line in lines for part in textwrap.wrap(line, TABLE_COLUMNS)]


def _caveats(result: Estimate, unit_name: str) -> list[str]:
    """What the columns are and where each figure comes from, once, below the table."""
    w, card = result.workload, result.card
    largest = (
        "longest: the longest sequence that fits"
        if w.is_language_model
        else ("batch: the largest batch that fits")
    )
    lines = [
        f"{DRY_RUN_LABEL}; {unit_name}; params..activ: tensor bytes at the step's tensor peak",
        "alloc, reserved: predicted max_memory_allocated/_reserved (the step's allocations "
        "replayed through the emulated caching allocator, two steps)",
        "smi: reserved + the CUDA context, what nvidia-smi would show; margin: the budget less "
        "reserved, by the replay (negative: it does not fit, by that much); FLOPs: over no "
        f"checkpointing's; {largest} (-: not searched); attention: the SDPA kernel it ran",
        *card.describe().splitlines(),
        result.attention_rules,
        f"{_headers(w)[-1]}: "
        + (result.time_source or "no quoted peaks to predict it from: no GPU named (--gpu NAME)"),
        *_sharded_caveats(result),
    ]
    retried = [
        f"{row.strategy.name} ({row.allocator.retries})"
        for row in result.rows
        if row.fits and row.allocator is not None and row.allocator.retries
    ]
    if retried:
        lines.append(
            f"fits only by freeing the allocator's cache on a failed cudaMalloc: {', '.join(retried)}"
        )
    return [part for line in lines for part in textwrap.wrap(line, TABLE_COLUMNS)]


def _sharded_caveats(result: Estimate) -> list[str]:
    """On N GPUs: what a row is, what ``comm`` holds, what the replay and the time leave out."""
    if result.sharding is None:
        return []
    n = result.sharding.world_size
    return [
        f"N GPUs: each row is rank 0 of {n}, on fake tensors over PyTorch's fake process group "
        "(one process); comm: FSDP2's all-gather and reduce-scatter buffers, DDP's gradient "
        "buckets (split in --json); not in any figure: NCCL's own buffers; "
        f"{_headers(result.workload)[-1]}: per GPU, by one rank's ops (x{n} for all GPUs); "
        "collectives not timed",
    ]


def estimate_table(result: Estimate) -> str:
    """What ran, the strategies side by side, then how the figures were obtained."""
    unit_name, unit = display_unit(result)
    timing = f"dry runs of the strategies: {result.seconds or 0:.1f} s"
    if result.search_seconds is not None:
        step = "256 tokens" if result.workload.is_language_model else "1 sample"
        timing += f"; largest-fit search (steps of {step}): {result.search_seconds:.1f} s"
    header = [result.model_description, describe_workload(result)]
    if result.sharding is not None:
        header.append(result.sharding.describe(result.workload))
    header = [part for line in header for part in textwrap.wrap(line, TABLE_COLUMNS)]
    kept = _kept_lines(result, unit, unit_name)
    body = [*_table(result, unit), *([""] + kept if kept else [])]
    return "\n".join([*header, "", *body, "", *_caveats(result, unit_name), timing])


def cuda_comparison(
    workload: Workload, strategy_name: str, dry: StepReport, real: StepReport
) -> str:
    """A real CUDA step's ``max_memory_allocated`` beside the dry run's peak, in MiB."""
    if real.cuda is None:
        raise ValueError(f"the real step has no CUDA peak ({real.missing['cuda']})")
    peak_allocated_bytes = real.cuda.peak_allocated_bytes
    gap = (peak_allocated_bytes - dry.peak_bytes) / dry.peak_bytes
    return (
        f"{strategy_name}, {workload.model}, batch {workload.batch} x {workload.size}, "
        f"{describe_precision(workload.precision, workload.qlora_recipe)}: dry run "
        f"{dry.peak_bytes / MiB:,.1f} MiB, torch.cuda.max_memory_allocated "
        f"{peak_allocated_bytes / MiB:,.1f} MiB (measured; {gap:+.2%})"
    )
