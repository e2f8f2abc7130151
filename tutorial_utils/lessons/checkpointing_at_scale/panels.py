"""Notebook 05's table, figure and slider panel over the measured records."""

from __future__ import annotations

from dataclasses import replace

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure

from tutorial_utils.display.plotting import CATEGORY_COLORS, CATEGORY_NAMES
from tutorial_utils.display.tables import columns_table
from tutorial_utils.lessons.checkpointing_at_scale.memory import (
    MemoryRecord,
    compare_memory,
)
from tutorial_utils.lessons.checkpointing_at_scale.model import (
    HIDDEN_FACTOR,
    NUM_CLASSES,
    BlockNetConfig,
)
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.training.distributed import DeviceType
from tutorial_utils.units import MB

TABLE_COLUMNS = (  # key, heading, format: what columns_table reads from each record's row
    ("setup", "setup", "{}"),
    ("rank", "rank", "{}"),
    ("batch", "batch", "{}"),
    ("parameters", "params", "{:.2f}"),
    ("gradients", "grads", "{:.2f}"),
    ("optimizer_state", "optim", "{:.2f}"),
    ("activations", "activ.", "{:.2f}"),
    ("peak", "peak", "{:.2f}"),
    ("buckets", "buckets", "{:.2f}"),
    ("loss", "loss", "{:.4f}"),
    ("gradient_norm", "grad norm", "{:.6f}"),
)


def memory_table(records: list[MemoryRecord]) -> str:
    """One line per setup and rank, tracked MiB at the step's peak: the numbers behind the bars.

    "buckets" is DDP's gradient-bucket memory, held outside the step and not in "peak".
    """
    rows = [
        {
            "setup": r.setup,
            "rank": r.rank,
            "batch": r.local_batch,
            **{category: r.mib(category) for category in CATEGORIES},
            "peak": r.peak_bytes / MB,
            "buckets": r.ddp_bucket_bytes / MB,
            "loss": r.loss,
            "gradient_norm": r.gradient_norm,
        }
        for r in records
    ]
    return columns_table(rows, TABLE_COLUMNS)


def plot_memory_by_setup(records: list[MemoryRecord], title: str = "") -> Figure:
    """Stacked bars of the tracked peak by category, one bar per setup and rank.

    DDP's gradient buckets, held outside the step, sit on top, hatched, so they are not mistaken
    for part of the tracked peak.
    """
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(records)), 4.8))
    # one word per line under each bar: labels as wide as a bar, never over the next one
    labels = [
        "\n".join([*r.setup.replace(" + ", " ").split(), f"rank {r.rank}/{r.world_size}"])
        for r in records
    ]
    positions = range(len(records))
    bottoms = [0.0] * len(records)
    for category in CATEGORIES:
        heights = [r.mib(category) for r in records]
        axes.bar(
            positions,
            heights,
            bottom=bottoms,
            label=CATEGORY_NAMES[category],
            color=CATEGORY_COLORS[category],
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    buckets = [r.ddp_bucket_bytes / MB for r in records]
    if any(buckets):
        axes.bar(
            positions,
            buckets,
            bottom=bottoms,
            color="white",
            edgecolor="grey",
            hatch="//",
            label="DDP buckets (outside the step)",
        )
    tops = [b + k for b, k in zip(bottoms, buckets, strict=True)]
    for position, (total, top) in enumerate(zip(bottoms, tops, strict=True)):
        axes.annotate(f"{total:.1f}", (position, top), ha="center", va="bottom", fontsize=7)
    axes.set_ylim(0, 1.12 * max(tops))  # every bar and its label inside the axes
    axes.set_xlim(-0.6, len(records) - 0.4)
    axes.set_xticks(list(positions), labels, fontsize=7)
    axes.set_ylabel("tracked MiB at the step's peak (per rank)")
    axes.set_title(title or "Memory per rank by category", fontsize=9)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside the bars
    figure.tight_layout()
    return figure


def describe_plan(config: BlockNetConfig, world_size: int) -> str:
    """What a run with these sizes will do, computed instantly (the slider's live feedback)."""
    config.check_splits(world_size)
    per_block = 2 * HIDDEN_FACTOR * config.width**2 + (HIDDEN_FACTOR + 1) * config.width
    n_params = per_block * config.depth + config.width**2 + config.width
    n_params += (config.width + 1) * NUM_CLASSES
    state_mib = 4 * n_params * 4 / MB  # fp32 weights, gradients and two Adam moments
    return (
        f"{config.depth} blocks of width {config.width}: {n_params:,} parameters; "
        f"weights + gradients + Adam state = {state_mib:.1f} MiB per DDP rank, "
        f"{state_mib / world_size:.1f} MiB per FSDP rank; "
        f"global batch {config.global_batch} = {config.global_batch // world_size} per rank"
    )


def memory_comparison_panel(
    config: BlockNetConfig,
    world_size: int,
    device_type: DeviceType,
    title: str,
    initial_records: list[MemoryRecord] | None = None,
) -> widgets.VBox:
    """Sliders for depth and global batch, a Run button that re-runs ``compare_memory``."""
    depth = widgets.IntSlider(value=config.depth, min=2, max=4 * config.depth, description="blocks")
    batch_step = world_size * max(1, config.global_batch // (8 * world_size))
    batch = widgets.IntSlider(
        value=config.global_batch,
        min=batch_step,
        max=4 * config.global_batch,
        step=batch_step,  # a multiple of world_size: every rank gets an equal share
        description="global batch",
        style={"description_width": "initial"},
    )
    plan = widgets.Output()
    results = widgets.Output()
    run = widgets.Button(description="Run", button_style="primary")

    def chosen() -> BlockNetConfig:
        return replace(config, depth=depth.value, global_batch=batch.value)

    def show_plan(_change=None) -> None:
        plan.clear_output()
        with plan:
            print(describe_plan(chosen(), world_size))

    def show(records: list[MemoryRecord]) -> None:
        results.clear_output(wait=True)
        with results:
            print(memory_table(records))
            figure = plot_memory_by_setup(records, title)
            display(figure)
            plt.close(figure)

    def on_run(_button=None) -> None:
        run.disabled = True
        try:
            show(compare_memory(chosen(), world_size, device_type))
        finally:
            run.disabled = False

    depth.observe(show_plan, names="value")
    batch.observe(show_plan, names="value")
    run.on_click(on_run)
    show_plan()
    if initial_records:
        show(initial_records)
    return widgets.VBox([widgets.HBox([depth, batch, run]), plan, results])
