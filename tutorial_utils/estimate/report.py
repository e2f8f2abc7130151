"""The estimate as text: what ran, the card's budget, and one row per strategy: the dry run's
tensor bytes by category, then what the caching allocator would count (allocated, reserved) and
whether the step runs in the card, with the margin left."""

from __future__ import annotations

from tutorial_utils.checkpointing.strategy import OFFLOAD_NOTE
from tutorial_utils.estimate.estimator import Estimate, Workload, describe_precision
from tutorial_utils.estimate.gpu_step import describe_rules, quoted_machine
from tutorial_utils.measurement.step import DRY_RUN_LABEL, StepReport
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import GiB

CATEGORY_LABELS = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer_state": "optimizer",
    "activations": "activations",
}


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
    return f"step: batch {w.batch} x {size}; {describe_precision(w.precision, w.qlora_recipe)}; {optimizer}; {tuning}"


def estimate_table(result: Estimate) -> str:
    """The strategies side by side, headed by how the figures were obtained."""
    w = result.workload
    largest = "longest sequence" if w.is_language_model else "largest batch"
    rate = "tokens/s" if w.is_language_model else "images/s"
    widths = {c: max(len(CATEGORY_LABELS[c]), 6) for c in CATEGORIES}
    header = (
        f"{'strategy':<24} {'attention':<13}"
        + "".join(f" {CATEGORY_LABELS[c]:>{widths[c]}}" for c in CATEGORIES)
        + f" {'tensors':>7} {'allocated':>9} {'reserved':>8} {'fixed':>5}"
        + f" {'FLOPs':>5} {'fits':>4} {'margin':>6} {largest:>16} {'step s':>7} {rate:>8}"
    )
    machine = quoted_machine(result.card, w.precision)
    time_line = (
        f"step s, {rate}: {machine.source}; FLOPs: the step's over no checkpointing's"
        if machine is not None
        else "step s: no GPU named, no quoted peaks to predict it from (--gpu NAME); "
        "FLOPs: the step's over no checkpointing's"
    )
    lines = [
        result.model_description,
        describe_workload(result),
        f"{DRY_RUN_LABEL}; GiB (2**30 bytes); by category at the step's tensor peak",
        "allocated, reserved: predicted torch.cuda.max_memory_allocated and max_memory_reserved: "
        "the dry run's allocations replayed",
        "through the emulated CUDA caching allocator (two steps, cuBLAS workspaces included); "
        "fits: the replay runs in the card,",
        "free-and-retry included; margin: the allocator's budget less the reserved peak "
        "(negative: what is missing)",
        result.card.describe(),
        describe_rules(result.card),
        "fixed: the card's memory outside the allocator (the CUDA context, --reserve)",
        time_line,
        "",
        header,
    ]
    fixed = (result.card.total_bytes - result.card.budget_bytes) / GiB
    for row in result.rows:
        if row.report is None:
            lines.append(f"{row.strategy.name:<24} {row.error or OFFLOAD_NOTE}")
            continue
        cells = "".join(f" {row.report.breakdown[c] / GiB:>{widths[c]},.2f}" for c in CATEGORIES)
        flops = "-" if row.flops_ratio is None else f"{row.flops_ratio:.2f}"
        if row.largest is None:
            fit = "not searched"
        elif w.is_language_model:
            fit = f"{row.largest:,} tokens" if row.largest else "none fits"
        else:
            fit = f"batch {row.largest:,}" if row.largest else "none fits"
        seconds = row.gpu.predicted_seconds if row.gpu is not None else None
        kernel = row.gpu.kernel if row.gpu is not None else "-"
        step = "-" if seconds is None else f"{seconds:,.3g}"
        throughput = (
            "-"
            if not seconds
            else f"{w.batch * (w.size if w.is_language_model else 1) / seconds:,.0f}"
        )
        allocator = row.allocator
        if allocator is None:
            predicted = f" {'-':>9} {'-':>8}"
            margin = "-"
        else:
            predicted = (
                f" {allocator.max_allocated_bytes / GiB:>9,.2f}"
                f" {allocator.max_reserved_bytes / GiB:>8,.2f}"
            )
            margin = f"{(allocator.margin_bytes or 0) / GiB:+,.2f}"
        lines.append(
            f"{row.strategy.name:<24} {kernel:<13}{cells} {row.report.peak_bytes / GiB:>7,.2f}"
            f"{predicted} {fixed:>5.2f} {flops:>5} {'yes' if row.fits else 'no':>4} {margin:>6}"
            f" {fit:>16} {step:>7} {throughput:>8}"
        )
    retried = [
        f"{row.strategy.name} ({row.allocator.retries})"
        for row in result.rows
        if row.fits and row.allocator is not None and row.allocator.retries
    ]
    if retried:
        lines += [
            "fits only by freeing the allocator's cache when cudaMalloc fails (requests that "
            f"needed it): {', '.join(retried)}"
        ]
    timing = f"dry runs of the strategies: {result.seconds:.1f} s"
    if result.search_seconds is not None:
        unit = "256 tokens" if w.is_language_model else "1 sample"
        timing += f"; largest-fit search (steps of {unit}): {result.search_seconds:.1f} s"
    lines += ["", timing]
    return "\n".join(lines)


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
        f"{describe_precision(workload.precision)}: dry run {dry.peak_bytes / 2**20:,.1f} MiB, "
        f"torch.cuda.max_memory_allocated {peak_allocated_bytes / 2**20:,.1f} MiB "
        f"(measured; {gap:+.2%})"
    )
