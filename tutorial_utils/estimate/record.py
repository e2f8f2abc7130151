"""The estimate as data: every figure of ``estimate --json``, unrounded, with its unit in its
name (``_bytes``, ``_seconds``, ``_tokens``), so that a script reads it without parsing the table.

A figure that was not obtained is ``null`` (a GPU-only strategy, no GPU named for the time, a
search not run); ``predicted`` marks what comes from the emulation, never measured on a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tutorial_utils.estimate.estimator import Estimate, StrategyEstimate

__all__ = ["estimate_record"]


def _card(result: Estimate) -> dict[str, Any]:
    card = result.card
    return {
        "name": card.name,
        "gpu": card.model.name,
        "total_bytes": card.total_bytes,
        "cuda_context_bytes": card.context_bytes,
        "cuda_context_source": card.context_source,
        "reserve_bytes": card.reserve_bytes,
        "budget_bytes": card.budget_bytes,
        "cublas_workspace_bytes": card.workspace_bytes,
        "cublas_workspace_per_call": card.workspace_per_call,
        "expandable_segments": card.expandable_segments,
    }


def _sharding(result: Estimate) -> dict[str, Any] | None:
    """N GPUs: how the step is spread and cast (None: one GPU); every row is then rank 0's."""
    sharding, w = result.sharding, result.workload
    if sharding is None:
        return None
    policy = sharding.mixed_precision(w)
    return {
        "gpus": sharding.world_size,
        "shard": sharding.shard,
        "rank": 0,
        "fsdp2_param_dtype": str(policy.param_dtype).removeprefix("torch.") if policy else None,
        "fsdp2_reduce_dtype": str(policy.reduce_dtype).removeprefix("torch.") if policy else None,
        "ddp_autocast": sharding.shard == "ddp" and sharding.autocast(w) is not None,
        "description": sharding.describe(w),
    }


def _row(row: StrategyEstimate, result: Estimate) -> dict[str, Any]:
    """One strategy's figures; the allocator's and the time are predictions."""
    w, report, allocator = result.workload, row.report, row.allocator
    record: dict[str, Any] = {"strategy": row.strategy.name, "measured": report is not None}
    record["not_measured_because"] = None if report is not None else row.error or "GPU-only"
    if report is not None:
        record |= {f"{c}_bytes": b for c, b in report.breakdown.items()}
        record["tensor_peak_bytes"] = report.peak_bytes
        record["flops"] = report.flops.total if report.flops else None
    record["flops_over_no_checkpointing"] = row.flops_ratio
    if row.kept is not None:  # a language model's activations alive at the loss, by region
        record |= {f"kept_at_loss_{r}_bytes": b for r, b in row.kept.bytes_by_region.items()}
    if allocator is not None:
        record |= {
            "predicted_max_allocated_bytes": allocator.max_allocated_bytes,
            "predicted_max_reserved_bytes": allocator.max_reserved_bytes,
            "predicted_nvidia_smi_bytes": allocator.max_reserved_bytes + result.card.context_bytes,
            "margin_bytes": allocator.margin_bytes,
            "fits": row.fits,
            "allocator_retries": allocator.retries,
        }
    key = "largest_sequence_tokens" if w.is_language_model else "largest_batch"
    record[key] = row.largest
    seconds = row.gpu.predicted_seconds if row.gpu is not None else None
    record["attention_kernel"] = row.gpu.kernel if row.gpu is not None else None
    record["predicted_step_seconds"] = seconds
    per_step = w.batch * (w.size if w.is_language_model else 1)
    rate = "predicted_tokens_per_second" if w.is_language_model else "predicted_images_per_second"
    record[rate] = per_step / seconds if seconds else None
    return record


def estimate_record(result: Estimate) -> dict[str, Any]:
    """Every figure of ``result`` as JSON-ready data (``json.dumps`` takes it as it is)."""
    workload = dataclasses.asdict(result.workload)
    workload["lora_targets"] = list(workload["lora_targets"])
    return {
        "model": result.model_description,
        "workload": workload,
        "card": _card(result),
        "attention_rules": result.attention_rules,
        "step_time_source": result.time_source,
        "sharding": _sharding(result),
        "strategies": [_row(row, result) for row in result.rows],
        "dry_runs_seconds": result.seconds,
        "search_seconds": result.search_seconds,
    }
