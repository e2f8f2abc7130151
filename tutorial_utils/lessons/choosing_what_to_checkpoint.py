"""Notebook 04's sizes, models, figures and budget slider: strategies on a Pareto plot, a plan on
its layers, the roofline against the clock, one-level against nested plans as a table.

The experiments the bench runs too live below the lessons: BatchNorm under each strategy in
``measurement.batchnorm``, the deep chain in ``articles.models``, one level against nested in
``planning.nested``.

Figures follow ``plotting``'s conventions (returned detached, titled with profile and device).
The budget explorer re-plans on every slider change (planning a profiled model takes well under
a second) and writes its figure and text straight into an Output widget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch.nn as nn
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tutorial_utils.articles.models import vgg16_classifier
from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.kinds import families
from tutorial_utils.display.labels import annotate_points
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.tables import columns_table
from tutorial_utils.display.widgets import PanelBox, budget_slider, result_outputs
from tutorial_utils.measurement.timing import Timing
from tutorial_utils.planning.limits import PeakFloor
from tutorial_utils.planning.nested import NestedComparison, NestedPlan, nested_from_profile
from tutorial_utils.planning.planner import Plan, evaluate_plan, plan_from_profile
from tutorial_utils.planning.profile import ModelProfile
from tutorial_utils.planning.strategies import StrategyRow
from tutorial_utils.units import MiB

CHECKPOINTED_COLOR, KEPT_COLOR, NESTED_COLOR = "#c6d4e8", "#dd8452", "#4c72b0"
RUNS_COLORS = {1: KEPT_COLOR, 2: CHECKPOINTED_COLOR, 3: NESTED_COLOR}  # runs of a module per step
RUNS_LABELS = {
    1: "kept: saved in forward",
    2: "checkpointed: recomputed once in backward",
    3: "nested: recomputed two or more times",
}


@dataclass(frozen=True)
class Sizes:
    """Notebook 04's sizes for one profile."""

    timing_side: int  # convolutional VGG16 input side for the timed steps, pixels
    timing_batch: int
    repeats: int  # timed steps per strategy, in turns: their range is the noise
    chain_pairs: int  # Linear+Tanh pairs of the deep chain (dry run)
    chain_batch: int
    compile_budgets: tuple[float, ...]  # torch.compile's activation memory budgets to sweep


def sizes_for(profile: Profile) -> Sizes:
    """Timed steps where convolutions dominate (128 px on a CPU: recompute shows beyond noise)."""
    small = profile.name == "ci"
    return Sizes(
        timing_side=32 if small else max(128, profile.image_size),
        timing_batch=2 if small else max(8, profile.sweep_batch_size),
        repeats=1 if small else profile.capped(3),
        chain_pairs=16 if small else (64 if profile.name == "cpu" else 128),
        chain_batch=512 if small else 4096,
        compile_budgets=(0.0, 1.0) if small else (0.0, 0.3, 0.6, 1.0),
    )


def conv_vgg16(num_classes: int = 2) -> nn.Sequential:
    """VGG16's 31 convolutional-part modules (out-of-place ReLUs) and a small head: the weights'
    own backward and optimizer step no longer dilute the recompute, as the 120 M-parameter
    classifier does."""
    features = list(vgg16_classifier(num_classes, layout="flat"))[:31]
    for module in features:
        if isinstance(module, nn.ReLU):
            module.inplace = False
    return nn.Sequential(
        *features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)
    )


def recompute_accounting(plan: Plan, plain_gflop: float, planned_gflop: float) -> str:
    """The planner's recompute count beside the extra FLOPs the dry-run step really did."""
    return (
        f"planner's recompute: {plan.recompute_flops / 1e9:,.1f} GFLOP; dry-run step: "
        f"{planned_gflop:,.1f} - {plain_gflop:,.1f} = {planned_gflop - plain_gflop:,.1f} GFLOP"
    )


def nested_table(result: NestedComparison) -> str:
    """Activation memory and recompute of the two plans, as a dry run measured them."""
    base = result.reports["one level"].activation_peak_bytes
    lines = [
        f"{'plan':<10}  {'activation peak MiB':>19}  {'vs one level':>12}  "
        f"{'recompute (forward passes)':>26}  most runs of a module"
    ]
    for name, plan in result.plans.items():
        peak = result.reports[name].activation_peak_bytes
        runs = max(plan.runs)
        lines.append(
            f"{name:<10}  {peak / MiB:>19,.1f}  {peak / base:>12.2f}  "
            f"{plan.recompute_flops / result.forward_flops:>26.2f}  {runs}"
        )
    return "\n".join(lines)


Row = TypeVar("Row", bound=Mapping[str, Any])


def pareto_front(rows: Sequence[Row], x: str, y: str) -> list[Row]:
    """The rows no other row beats on both ``x`` and ``y`` (lower is better), by ``x``."""
    front, best_y = [], float("inf")
    for row in sorted(rows, key=lambda r: (r[x], r[y])):
        if row[y] < best_y:
            front.append(row)
            best_y = row[y]
    return front


def plot_pareto(
    rows: Sequence[StrategyRow],
    title: str,
    *,
    y: Literal["added_mib", "tracked_peak_mib"] = "added_mib",
    subtitle: str | None = None,
    floor_mib: float | None = None,
) -> Figure:
    """Memory against time for every strategy, the Pareto front joined by a line.

    ``y="added_mib"`` plots what the step adds on top of parameters, batch and optimizer state
    (gradients + activations at the tracked peak); ``"tracked_peak_mib"`` the whole peak. Rows of
    real steps are placed by measured step time; rows of dry runs (no time) by their FLOPs over
    the first row's, the predicted time ratio. ``floor_mib`` draws the peak no plan can beat
    (``limits.peak_floor``), in the units of ``y``.
    """
    dry = all(row["step_seconds"] is None for row in rows)
    x: Literal["flops_ratio", "step_seconds"] = "flops_ratio" if dry else "step_seconds"
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    plt.close(fig)
    for kind, style in families().items():  # the table of kinds' styles, in menu order
        points = [row for row in rows if row["family"] == kind]
        if points:
            ax.scatter(
                [row[x] for row in points],
                [row[y] for row in points],
                c=style.color,
                marker=style.marker,
                s=120 if kind == "planned" else 45,
                label=kind,
                zorder=3,
            )
    front = pareto_front(rows, x, y)
    ax.step(
        [row[x] for row in front],
        [row[y] for row in front],
        where="post",
        color="#c44e52",
        alpha=0.4,
        label="Pareto front",
    )
    if floor_mib is not None:
        ax.axhline(
            floor_mib, color="black", linestyle="--", linewidth=1, label="floor: no plan below"
        )
    labels: dict[tuple[float, float], list[str]] = {}  # points drawn on top of each other share one
    for row in rows:
        if row["family"] not in ("uniform", "planned") or row["checkpointing"].endswith(
            "least peak"
        ):
            point = row[x]
            if point is None:
                raise ValueError(f"{row['checkpointing']!r} has no {x}: plot the rows of one run")
            labels.setdefault((point, row[y]), []).append(row["checkpointing"])
    ax.set_xlabel(
        "predicted step time / no checkpointing (FLOPs, dry run)"
        if dry
        else "step time (s, fastest of the measured steps)"
    )
    ax.set_ylabel(
        "gradients + activations at the peak (MiB)" if y == "added_mib" else "tracked peak (MiB)"
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3)
    ax.margins(x=0.12, y=0.15)  # room inside the axes for the labels
    source = rows[0].get("source") if rows else None
    where = subtitle or figure_subtitle()
    fig.suptitle(f"{title}\n{source} · {where}" if source else f"{title}\n{where}", fontsize=11)
    fig.tight_layout()
    annotate_points(ax, [(px, py, " = ".join(names)) for (px, py), names in labels.items()])
    return fig


def plot_plan(
    profile: ModelProfile, plan: Plan | NestedPlan, title: str, subtitle: str | None = None
) -> Figure:
    """Per-layer activation bytes as bars, coloured by how many times each module runs per step:
    once (its activations kept), twice (checkpointed once) or more (nested checkpoints)."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    plt.close(fig)
    colors = [RUNS_COLORS[min(runs, 3)] for runs in plan.runs]
    for start, _, _ in plan.boundaries:
        if start:
            ax.axvline(start - 0.5, color="black", linewidth=0.8, linestyle="--")
    ax.bar(range(len(profile)), [b / MiB for b in profile.kept_bytes_per_layer()], color=colors)
    ax.set_xticks(range(len(profile)))
    ax.set_xticklabels([layer.name for layer in profile.layers], rotation=90, fontsize=6)
    ax.set_ylabel("kept for backward\nwithout checkpointing (MiB)")
    shown = sorted({min(runs, 3) for runs in plan.runs})
    ax.legend(
        handles=[Patch(color=RUNS_COLORS[runs], label=RUNS_LABELS[runs]) for runs in shown],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),  # beside the bars: "best" moved with the title's length
    )
    added = (plan.predicted_peak_bytes - plan.baseline_bytes) / MiB
    most = f", most runs of a module {max(plan.runs)}" if max(plan.runs) > 2 else ""
    fig.suptitle(
        f"{title}: predicted {added:.1f} MiB above parameters and batch, "
        f"{plan.recompute_label()}{most}\n{subtitle or figure_subtitle()}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


class BudgetExplorer:
    """A budget slider (MiB of gradients + activations) that re-plans and redraws on every change,
    one level or nested (a checkbox).

    ``explore(budget_mib, nested)`` is the callback as a plain function: it returns the figure
    and the plan's table, or the planner's error message when the budget cannot be met.
    """

    def __init__(self, profile: ModelProfile, title: str):
        self.profile = profile
        self.title = title
        least = plan_from_profile(profile)
        plain = evaluate_plan(profile, [(0, len(profile), False)])
        low = (least.predicted_peak_bytes - profile.baseline_bytes) / MiB
        high = (plain.predicted_peak_bytes - profile.baseline_bytes) / MiB
        self.slider = budget_slider(
            max_mib=float(int(high) + 1),
            value=float(round((low + high) / 2)),
            min_mib=max(1.0, float(int(low) - 1)),
            description="budget: gradients + activations (MiB)",
        )
        self.nested = widgets.Checkbox(
            value=False, description="nested: modules may run 3+ times", indent=False
        )
        self.output = widgets.Output()
        self.widget = PanelBox([widgets.HBox([self.slider, self.nested]), self.output])
        self.slider.observe(lambda _: self.show(), names="value")
        self.nested.observe(lambda _: self.show(), names="value")
        self.show()

    def explore(self, budget_mib: float, nested: bool = False) -> tuple[Figure, str] | str:
        budget = self.profile.baseline_bytes + int(budget_mib * MiB)
        planner = nested_from_profile if nested else plan_from_profile
        try:
            plan = planner(self.profile, budget)
        except ValueError as error:
            return f"budget {budget_mib:.0f} MiB: {error}"
        figure = plot_plan(self.profile, plan, f"{self.title}, budget {budget_mib:.0f} MiB")
        return figure, f"budget {budget_mib:.0f} MiB added -> {plan}\n{plan.describe()}"

    def show(self) -> None:
        outputs = result_outputs(self.explore(self.slider.value, self.nested.value))
        self.widget.keep_picture(outputs)  # a static page shows the first plan's figure
        self.output.outputs = outputs


TABLE_COLUMNS = (
    ("checkpointing", "strategy", "{}"),
    ("tracked_peak_mib", "tracked peak MiB", "{:,.1f}"),
    ("added_mib", "grads+acts MiB", "{:,.1f}"),
    ("predicted_added_mib", "predicted", "{:,.1f}"),
    ("added_ratio", "vs none", "{:.2f}"),
    ("added_vs_best_uniform", "vs best uniform", "{:.2f}"),
)
MEASURED_TIME_COLUMNS = (
    ("step_seconds", "step s", "{:.2f}"),
    ("step_ratio", "vs none", "{:.2f}"),
)
DRY_RUN_TIME_COLUMNS = (
    ("step_gflop", "GFLOP", "{:,.0f}"),
    ("flops_ratio", "FLOPs vs none", "{:.2f}"),
)


def strategy_table(rows: Sequence[StrategyRow]) -> str:
    """``measure_strategies`` rows as an aligned text table, headed by how they were obtained;
    measured seconds for real steps, FLOPs for dry runs; n/a where there is no prediction."""
    dry = all(row["step_seconds"] is None for row in rows)
    columns = TABLE_COLUMNS + (DRY_RUN_TIME_COLUMNS if dry else MEASURED_TIME_COLUMNS)
    table = columns_table(rows, columns)
    return f"{rows[0]['source']}\n{table}" if rows and rows[0].get("source") else table


def key_rows(rows: Sequence[StrategyRow]) -> list[StrategyRow]:
    """The rows the text discusses: none, the best uniform split measured, sqrt(n), the plans,
    selective checkpointing and compile budgets (the full table is ``strategy_table(rows)``)."""
    uniform = [row for row in rows if row["family"] == "uniform"]
    best = min(uniform, key=lambda row: row["tracked_peak_mib"], default=None)
    return [row for row in rows if row["family"] != "uniform" or row is best]


def above_none(rows: Sequence[StrategyRow]) -> str:
    """The strategies whose tracked peak is above no checkpointing's, each with its FLOP ratio:
    the points of a Pareto plot that the text must explain."""
    none = next(row for row in rows if row["family"] == "none")
    above = [
        f"{row['checkpointing']} ({row['tracked_peak_mib']:,.1f} MiB, FLOPs x{row['flops_ratio']:.2f})"
        for row in rows
        if row["tracked_peak_mib"] > none["tracked_peak_mib"]
    ]
    listed = ", ".join(above) if above else "none of them"
    return f"above none's {none['tracked_peak_mib']:,.1f} MiB: {listed}"


def floor_table(rows: Sequence[StrategyRow], floor: PeakFloor) -> str:
    """None, the best uniform split, the planner, and the least peak of each other family
    (nested, selective, compile budget) against the floor."""
    chosen: dict[str, StrategyRow] = {"none": rows[0]}
    uniform = [row for row in rows if row["family"] in ("uniform", "sqrt(n)")]
    if uniform:
        best = min(uniform, key=lambda row: row["tracked_peak_mib"])
        chosen[f"best uniform ({best['checkpointing']})"] = best
    planned = [row for row in rows if row["family"] == "planned"]
    if planned:
        chosen["planner, least peak"] = min(planned, key=lambda row: row["tracked_peak_mib"])
    shown_above = ("none", "uniform", "sqrt(n)", "planned", "offload")
    for kind in [name for name in families() if name not in shown_above]:
        family = [row for row in rows if row["family"] == kind]
        if family:
            best = min(family, key=lambda row: row["tracked_peak_mib"])
            chosen[f"best {best['checkpointing']}"] = best
    floor_mib = floor.floor_bytes / MiB
    width = max(len(name) for name in chosen)
    lines = [f"{'strategy':<{width}}  {'tracked peak MiB':>15}  {'above the floor':>15}"]
    for name, row in chosen.items():
        above = row["tracked_peak_mib"] / floor_mib - 1
        lines.append(f"{name:<{width}}  {row['tracked_peak_mib']:>15,.1f}  {above:>14.1%}")
    lines.append(f"{'floor (no plan goes below)':<{width}}  {floor_mib:>15,.1f}")
    lines.append(floor.describe())
    if planned:
        peak = round(chosen["planner, least peak"]["tracked_peak_mib"] * MiB)
        lines.append(f"planner, least peak: {floor.distance(peak)}")
    return "\n".join(lines)


def prediction_errors(
    measured: Sequence[StrategyRow], dry: Sequence[StrategyRow], roofline: dict[str, float]
) -> str:
    """Median measured time ratios to "none" beside the FLOP and roofline predictions, with each
    prediction's error. The last column says whether the wall-time ranges of the repeats are
    apart or overlap ("beyond noise" is kept for ``tools.time_turns``' CPU-time medians): where
    they overlap, the errors mean little."""
    reference = _timing(measured[0])
    width = max(len(row["checkpointing"]) for row in measured)
    lines = [
        f"{'strategy':<{width}}  {'measured':>8}  {'FLOPs':>13}  {'roofline':>13}  wall ranges"
    ]
    for real, counted in zip(measured[1:], dry[1:], strict=True):
        timing, name = _timing(real), real["checkpointing"]
        ratio = timing.median / reference.median
        flops, roof = counted.get("flops_ratio"), roofline[name]
        if flops is None:
            raise ValueError(f"{name!r} has no FLOP ratio: pass the rows of a dry run as dry")
        noise = (
            "1 run"
            if timing.repeats == 1
            else ("apart" if not timing.overlaps(reference) else "overlap")
        )
        lines.append(
            f"{name:<{width}}  {f'x{ratio:.2f}':>8}  x{flops:.2f} {ratio / flops - 1:>+5.0%}  "
            f"x{roof:.2f} {ratio / roof - 1:>+5.0%}  {noise}"
        )
    return "\n".join(lines)


def _timing(row: StrategyRow) -> Timing:
    timing = row["step_timing"]
    if timing is None:
        raise ValueError(f"{row['checkpointing']!r} was not timed: pass the rows of real steps")
    return timing


# at the end, apart from the styles above (their table is moving to checkpointing/)
__all__ = [
    "BudgetExplorer",
    "Sizes",
    "above_none",
    "conv_vgg16",
    "floor_table",
    "key_rows",
    "nested_table",
    "pareto_front",
    "plot_pareto",
    "plot_plan",
    "prediction_errors",
    "recompute_accounting",
    "sizes_for",
    "strategy_table",
]
