"""Notebook 04's Going deeper: its sizes per profile, the strategy tables, the Pareto plot, a plan
on its layers and the budget slider. Figures are returned detached, as ``plotting``'s are."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.kinds import families
from tutorial_utils.display.labels import annotate_points
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.tables import columns_table
from tutorial_utils.display.widgets import PanelBox, budget_slider, result_outputs
from tutorial_utils.planning.limits import PeakFloor
from tutorial_utils.planning.nested import NestedPlan, nested_from_profile
from tutorial_utils.planning.planner import Plan, evaluate_plan, plan_from_profile
from tutorial_utils.planning.profile import ModelProfile
from tutorial_utils.planning.strategies import StrategyRow
from tutorial_utils.units import MiB

__all__ = [
    "BudgetExplorer",
    "Sizes",
    "floor_table",
    "key_rows",
    "pareto_front",
    "plot_pareto",
    "plot_plan",
    "sizes_for",
    "strategy_table",
]

RUNS_STYLES = {  # how many times a module runs per step: its bar's colour and legend
    1: ("#dd8452", "kept: saved in forward"),
    2: ("#c6d4e8", "checkpointed: recomputed once in backward"),
    3: ("#4c72b0", "nested: recomputed two or more times"),
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

    ``y="added_mib"``: what the step adds on top of parameters, batch and optimizer state
    (gradients + activations at the tracked peak); ``"tracked_peak_mib"``: the whole peak. Real
    steps sit at their measured time, dry runs (no time) at their FLOPs over the first row's.
    ``floor_mib`` draws the peak no plan can beat (``limits.peak_floor``), in ``y``'s units.
    """
    dry = all(row["step_seconds"] is None for row in rows)
    x: Literal["flops_ratio", "step_seconds"] = "flops_ratio" if dry else "step_seconds"
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    plt.close(fig)
    for kind, style in families().items():  # the table of kinds' styles, in menu order
        points = [row for row in rows if row["family"] == kind]
        if points:
            size = 120 if kind == "planned" else 45
            xs, ys = [row[x] for row in points], [row[y] for row in points]
            ax.scatter(xs, ys, c=style.color, marker=style.marker, s=size, label=kind, zorder=3)
    front = list(zip(*[(r[x], r[y]) for r in pareto_front(rows, x, y)], strict=True))
    ax.step(*front, where="post", color="#c44e52", alpha=0.4, label="Pareto front")
    if floor_mib is not None:
        ax.axhline(floor_mib, color="black", linestyle="--", lw=1, label="floor: no plan below")
    labels: dict[tuple[float, float], list[str]] = {}  # points drawn on top of each other share one
    for row in rows:
        name = row["checkpointing"]
        point = row[x]
        if row["family"] not in ("uniform", "planned") or name.endswith("least peak"):
            if point is None:
                raise ValueError(f"{name!r} has no {x}: plot the rows of one run")
            labels.setdefault((point, row[y]), []).append(name)
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
    colors = [RUNS_STYLES[min(runs, 3)][0] for runs in plan.runs]
    for start, _, _ in plan.boundaries:
        if start:
            ax.axvline(start - 0.5, color="black", linewidth=0.8, linestyle="--")
    ax.bar(range(len(profile)), [b / MiB for b in profile.kept_bytes_per_layer()], color=colors)
    ax.set_xticks(range(len(profile)))
    ax.set_xticklabels([layer.name for layer in profile.layers], rotation=90, fontsize=6)
    ax.set_ylabel("kept for backward\nwithout checkpointing (MiB)")
    shown = sorted({min(runs, 3) for runs in plan.runs})
    handles = [Patch(color=RUNS_STYLES[runs][0], label=RUNS_STYLES[runs][1]) for runs in shown]
    # beside the bars: "best" moved with the title's length
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
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
    """A budget slider (MiB of gradients + activations) and a nested checkbox that re-plan and
    redraw on every change (well under a second); ``explore`` is the callback as a function."""

    def __init__(self, profile: ModelProfile, title: str):
        self.profile, self.title = profile, title
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
    """``measure_strategies`` rows as a table: seconds for real steps, FLOPs for dry runs."""
    dry = all(row["step_seconds"] is None for row in rows)
    columns = TABLE_COLUMNS + (DRY_RUN_TIME_COLUMNS if dry else MEASURED_TIME_COLUMNS)
    table = columns_table(rows, columns)
    return f"{rows[0]['source']}\n{table}" if rows and rows[0].get("source") else table


def _least_peak(rows: Sequence[StrategyRow], *kinds: str) -> StrategyRow | None:
    return min(
        (row for row in rows if row["family"] in kinds),
        key=lambda row: row["tracked_peak_mib"],
        default=None,
    )


def key_rows(rows: Sequence[StrategyRow]) -> list[StrategyRow]:
    """The rows the text discusses: none, the best uniform split measured, sqrt(n), the plans,
    selective checkpointing and compile budgets (the full table is ``strategy_table(rows)``)."""
    best = _least_peak(rows, "uniform")
    return [row for row in rows if row["family"] != "uniform" or row is best]


def floor_table(rows: Sequence[StrategyRow], floor: PeakFloor) -> str:
    """None, the best uniform split, the planner, and the least peak of each other family
    (nested, selective, compile budget) against the floor."""
    uniform, planned = _least_peak(rows, "uniform", "sqrt(n)"), _least_peak(rows, "planned")
    chosen: dict[str, StrategyRow] = {"none": rows[0]}
    if uniform:
        chosen[f"best uniform ({uniform['checkpointing']})"] = uniform
    if planned:
        chosen["planner, least peak"] = planned
    for kind in families():
        best = _least_peak(rows, kind)
        if best and kind not in ("none", "uniform", "sqrt(n)", "planned", "offload"):
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
        peak = round(planned["tracked_peak_mib"] * MiB)
        lines.append(f"planner, least peak: {floor.distance(peak)}")
    return "\n".join(lines)
