"""The tables notebook 01 prints: each a function of the simulation or of measured records."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from tutorial_utils.display.tables import text_table
from tutorial_utils.lessons.toy_summation_graph.chain import (
    ModelComparison,
    backward_peak_and_gradients,
    every_kth_layer_cost,
    forward_peak_bytes,
    optimal_k,
    sequential_cost,
)
from tutorial_utils.lessons.toy_summation_graph.trees import (
    CONVENTIONS,
    SummationTree,
    balanced_tree,
    chain_tree,
    peak_memory,
)
from tutorial_utils.measurement.gradients import gradients_identical
from tutorial_utils.measurement.step import StepReport
from tutorial_utils.measurement.timing import Timing
from tutorial_utils.units import MiB

__all__ = [
    "conventions_table",
    "measured_vs_model_table",
    "no_grad_table",
    "schedules_table",
    "segment_plans_table",
    "sqrt_rule_table",
    "tree_shapes_table",
]


def conventions_table(tree: SummationTree) -> str:
    """The peak of both strategies under each counting convention."""
    rows = []
    for name, rules in CONVENTIONS.items():
        rows.append(
            (
                name,
                "up front" if rules.leaves_up_front else "when needed",
                "in place" if rules.sum_in_place else "out of place",
                peak_memory(tree, "keep_all", rules),
                peak_memory(tree, "free_as_you_go", rules),
            )
        )
    header = ("convention", "leaves", "sum", "keep everything", "free as you go")
    return text_table(header, rows, "lllrr")


def tree_shapes_table(leaf_counts: Iterable[int]) -> str:
    """Peaks (article convention) of balanced trees in two orders and of a chain, by size."""
    rows = []
    for n_leaves in leaf_counts:
        balanced = balanced_tree(n_leaves)
        rows.append(
            (
                n_leaves,
                peak_memory(balanced, "keep_all", "article"),
                peak_memory(balanced, "free_as_you_go", "article", "depth_first"),
                peak_memory(balanced, "free_as_you_go", "article", "level_order"),
                peak_memory(chain_tree(n_leaves), "free_as_you_go", "article"),
            )
        )
    header = ("leaves", "keep all", "depth first", "level order", "chain tree")
    return text_table(header, rows, "rrrrr")


def sqrt_rule_table(layer_counts: Iterable[int]) -> str:
    """The least peak of every-k-th-layer checkpointing against 2*sqrt(n), and which k reach it."""
    rows = []
    for n_layers in layer_counts:
        best = optimal_k(n_layers)
        ks = [
            k
            for k in range(1, n_layers + 1)
            if every_kth_layer_cost(n_layers, k).peak_activations == best.peak_activations
        ]
        rows.append(
            (
                n_layers,
                best.peak_activations,
                f"{2 * n_layers**0.5:.1f}",
                ", ".join(map(str, ks)),
                f"k={best.segments[0][1]}: {best.recomputed_layers} layers",
            )
        )
    header = ("n", "peak", "2*sqrt(n)", "k reaching it", "least recompute")
    return text_table(header, rows, "rrrll")


def segment_plans_table(n_blocks: int, segment_counts: Iterable[int]) -> str:
    """checkpoint_sequential's plans for a chain: peak, recomputed blocks and the boundaries."""
    rows = []
    for segments in segment_counts:
        plan = sequential_cost(n_blocks, segments)
        marks = " ".join(
            f"[{start},{end}){'*' if flag else ''}"
            for (start, end), flag in zip(plan.segments, plan.checkpointed, strict=True)
        )
        rows.append((segments, plan.peak_activations, plan.recomputed_layers, marks))
    header = ("segments", "peak", "recomputed", "boundaries ([start, end), * = checkpointed)")
    return text_table(header, rows, "rrrl")


def measured_vs_model_table(
    comparisons: Sequence[ModelComparison],
    records: Sequence[StepReport],
    predicted_ratios: Mapping[int, float] | None = None,
) -> str:
    """The model's peak in activations beside the measured step's peak in MiB above its start
    (what ``torch.cuda.max_memory_allocated() - start`` reads), and the fastest step time read
    against the plain step's (first record) and, if given, the FLOP-predicted ratio."""
    plain = records[0].timing
    predicted = predicted_ratios or {}
    rows = [
        (
            c.segments,
            c.model_units,
            f"{(r.peak_bytes - r.baseline_bytes) / MiB:.2f}",
            "n/a" if r.timing is None else r.timing.describe(),
            "n/a" if r.timing is None or plain is None else _fastest_ratio(r.timing, plain),
            f"x{predicted[c.segments]:.2f}" if c.segments in predicted else "n/a",
        )
        for c, r in zip(comparisons, records, strict=True)
    ]
    header = (
        "segments",
        "model (activations)",
        "peak MiB above start",
        "step time, fastest (range)",
        "fastest vs none",
        "FLOPs predict",
    )
    return text_table(header, rows, "rrrllr")


def _fastest_ratio(timing: Timing, reference: Timing) -> str:
    """Fastest against fastest, and whether the ranges overlap: a quick read, not the CPU-time
    medians that the tutorial calls "beyond noise" (tools.compare_times)."""
    apart = "ranges apart" if not timing.overlaps(reference) else "ranges overlap"
    return f"x{timing.fastest / reference.fastest:.2f} ({apart})"


def no_grad_table(
    chain: nn.Sequential, inputs: torch.Tensor, segments: int, unit_bytes: int
) -> str:
    """Forward-pass peaks in units, with and without checkpointing, recording gradients or not."""
    rows = []
    for grad_enabled, label in ((True, "recording gradients"), (False, "under torch.no_grad()")):
        peaks = [
            forward_peak_bytes(chain, inputs, count, grad_enabled=grad_enabled) / unit_bytes
            for count in (0, segments)
        ]
        rows.append((label, f"{peaks[0]:.2f}", f"{peaks[1]:.2f}"))
    header = ("forward pass (peak in activations)", "no checkpointing", f"{segments} segments")
    return text_table(header, rows)


def schedules_table(
    chain: nn.Sequential,
    forwards: Mapping[str, Callable[[torch.Tensor], torch.Tensor]],
    runs: Mapping[str, Sequence[int]],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    unit_bytes: int,
) -> str:
    """Each way of running ``chain``: its step's peak in MiB above its start (measured), how often its most
    recomputed module runs and the forward passes it recomputes (counted from the schedule),
    and whether its gradients equal the plain run's bit for bit."""
    _, plain_gradients = backward_peak_and_gradients(chain, chain, inputs, targets)
    rows = []
    for name, forward in forwards.items():
        peak, gradients = backward_peak_and_gradients(chain, forward, inputs, targets)
        same = gradients_identical(gradients, plain_gradients)
        counts = runs[name]
        recomputed = (sum(counts) - len(counts)) / len(counts)
        rows.append((name, f"{peak / MiB:.2f}", max(counts), f"{recomputed:.2f}", same))
    header = (
        "forward",
        "peak MiB above start",
        "most runs of a module",
        "forward passes recomputed",
        "gradients bitwise equal",
    )
    return text_table(header, rows)
