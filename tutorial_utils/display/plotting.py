"""The tutorial's figures. Each function returns a matplotlib Figure, titled with device and profile.

Figures are detached from pyplot before they are returned: a notebook shows the returned figure
once (not once more at the end of the cell), and figures made in a loop or a widget callback do
not pile up in pyplot's registry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tutorial_utils.articles.profiles import get_profile
from tutorial_utils.measurement.devices import describe_device
from tutorial_utils.measurement.phases import PHASES
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import MiB

__all__ = [
    "CATEGORY_COLORS",
    "CATEGORY_NAMES",
    "figure_subtitle",
    "plot_breakdown",
    "plot_histories",
    "plot_segment_sweep",
    "plot_step_timelines",
]

CATEGORY_COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_state": "#55a868",
    "activations": "#c44e52",
}
CATEGORY_NAMES = {
    "parameters": "parameters and buffers",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations and other",
}
PHASE_COLORS = {
    "forward": "#8da0cb",
    "backward": "#fc8d62",
    "recompute": "#e78ac3",
    "optimizer": "#a6d854",
}


def figure_subtitle(device: Any = None, profile_name: str | None = None) -> str:
    """'profile ci · cpu (2 cores, torch ...)': where a figure's numbers come from."""
    return f"profile {get_profile(profile_name).name} · {describe_device(device)}"


def _new_figure(ncols: int = 1, width: float = 7.0, height: float = 4.2):
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    plt.close(fig)  # detached: displayed once when returned, never leaked
    return fig, list(axes[0])


def _finish(fig: Figure, title: str, subtitle: str | None, device: Any) -> Figure:
    fig.suptitle(f"{title}\n{subtitle or figure_subtitle(device)}", fontsize=11)
    fig.tight_layout()
    return fig


def _source_subtitle(report: Any, subtitle: str | None) -> str:
    """How a report's figures were obtained (dry run or measured), then profile and device."""
    source = getattr(report, "source", None)
    where = subtitle or figure_subtitle(getattr(report, "device", None))
    return f"{source} · {where}" if source else where


def _first_device(items: Iterable[Any]) -> Any:
    return next((getattr(item, "device", None) for item in items), None)


def plot_breakdown(reports: Mapping[str, Any], *, subtitle: str | None = None) -> Figure:
    """Stacked bars of the tracked peak by category, one bar per ``StepReport``.

    The CUDA peak allocated is marked beside a bar where it was measured; the legend sits outside
    the bars so it never covers one.
    """
    if not reports:
        raise ValueError("reports is empty: pass {'label': measure_step(...), ...}")
    fig, (ax,) = _new_figure(width=max(6.5, 1.3 * len(reports) + 4.5))
    labels = list(reports)
    bottoms = [0.0] * len(labels)
    for category in CATEGORIES:
        heights = [reports[label].breakdown.get(category, 0) / MiB for label in labels]
        ax.bar(
            labels,
            heights,
            bottom=bottoms,
            color=CATEGORY_COLORS[category],
            label=CATEGORY_NAMES[category],
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    cuda_marked = False
    for position, label in enumerate(labels):
        report = reports[label]
        ax.annotate(
            f"{report.peak_bytes / MiB:,.1f}",
            (position, bottoms[position]),
            ha="center",
            va="bottom",
            fontsize=8,
        )
        if report.cuda is not None:
            ax.plot(
                position + 0.45,
                report.cuda.peak_allocated_bytes / MiB,
                "k<",
                label=None if cuda_marked else "CUDA peak allocated",
            )
            cuda_marked = True
    ax.set_ylim(0, 1.12 * max(bottoms))
    ax.set_ylabel("peak memory (MiB)")
    ax.set_xlabel("run")
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    first = next(iter(reports.values()))
    return _finish(fig, "Peak memory by category", _source_subtitle(first, subtitle), None)


def plot_segment_sweep(
    records: Sequence[Any], n_modules: int | None = None, *, subtitle: str | None = None
) -> Figure:
    """Peak memory and its activation part (left) and step time (right) against segment count.

    ``records`` are ``SweepRecord``s; with ``n_modules`` the sqrt(n) rule of thumb is marked. The
    activation peak gets its own panel, scaled to itself, since beside the weights it can be a
    flat line at the bottom. In a dry run (no time) the right axis is the predicted time ratio,
    the step's FLOPs over the plain step's.
    """
    if not records:
        raise ValueError("records is empty: pass sweep_strategies(...)")
    records = sorted(records, key=lambda r: r.strategy.segments)
    segments = [r.strategy.segments for r in records]
    fig, (ax, act_ax) = _new_figure(ncols=2, width=11.5)
    ax.plot(segments, [r.peak_bytes / MiB for r in records], "o-", color="C0", label="tracked peak")
    cuda = [(r.strategy.segments, r.cuda.peak_allocated_bytes / MiB) for r in records if r.cuda]
    if cuda:
        ax.plot(*zip(*cuda, strict=True), "^:", color="C2", label="CUDA peak allocated")
    ax.set_ylabel("peak memory (MiB)", color="C0")
    ax.set_ylim(bottom=0, top=1.1 * max(r.peak_bytes / MiB for r in records))
    time_ax = _time_axis(ax, records, segments)
    act_ax.plot(
        segments,
        [r.activation_peak_bytes / MiB for r in records],
        "s-",
        color="C1",
        label="activation peak",
    )
    act_ax.set_ylabel("activation peak (MiB)")
    act_ax.set_title("what checkpointing changes: activations alone", fontsize=10)
    for axis in (ax, act_ax):
        axis.set_xlabel("checkpoint segments (0/1 = none)")
        axis.grid(alpha=0.3)
        if n_modules:
            axis.axvline(
                math.sqrt(n_modules),
                color="gray",
                linestyle=":",
                label=f"sqrt(n) = {math.sqrt(n_modules):.1f}",
            )
    ax.set_title("the whole step", fontsize=10)
    handles, names = ax.get_legend_handles_labels()
    time_handles, time_names = time_ax.get_legend_handles_labels()
    ax.legend(
        handles + time_handles,
        names + time_names,
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=2,
    )
    act_ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return _finish(
        fig, "Memory and time against segment count", _source_subtitle(records[0], subtitle), None
    )


def _time_axis(ax: Axes, records: Sequence[Any], segments: list[int]) -> Axes:
    """The sweep's step time on a second y axis; in a dry run (no time) the predicted time
    ratio, the step's FLOPs over the plain step's."""
    time_ax = ax.twinx()
    if all(r.seconds is None for r in records):
        plain = next((r for r in records if r.strategy.kind == "none"), records[0])
        ratios = [r.flops.overhead_vs(plain.flops) for r in records]
        time_ax.plot(segments, ratios, "D-", color="C3", label="predicted time / plain (FLOPs)")
        time_ax.set_ylabel("predicted step time / plain (FLOPs)", color="C3")
        time_ax.set_ylim(0, 1.1 * max(ratios))
    else:
        time_ax.plot(segments, [r.seconds for r in records], "D-", color="C3", label="step time")
        time_ax.set_ylabel("step time (s)", color="C3")
        time_ax.set_ylim(bottom=0)
    return time_ax


def plot_histories(
    histories: Mapping[str, Any], *, subtitle: str | None = None, device: Any = None
) -> Figure:
    """Accuracy, loss and seconds per epoch of several training runs, side by side.

    Each value is a ``History`` (anything with ``.records`` of epoch records) or the records
    themselves; validation curves are solid, training curves dashed.
    """
    if not histories:
        raise ValueError("histories is empty: pass {'label': history, ...}")
    fig, (acc_ax, loss_ax, time_ax) = _new_figure(ncols=3, width=13.0)
    for index, (label, history) in enumerate(histories.items()):
        records = list(getattr(history, "records", history))
        color = f"C{index}"
        epochs = [r.epoch for r in records]
        for ax, name in ((acc_ax, "accuracy"), (loss_ax, "loss")):
            ax.plot(
                epochs,
                [getattr(r, f"val_{name}") for r in records],
                "o-",
                color=color,
                label=f"{label} (validation)",
            )
            train = [
                (r.epoch, getattr(r, f"train_{name}"))
                for r in records
                if getattr(r, f"train_{name}") is not None
            ]
            if train:
                ax.plot(*zip(*train, strict=True), "--", color=color, label=f"{label} (train)")
        time_ax.plot(epochs, [r.seconds for r in records], "o-", color=color, label=label)
    acc_ax.set_ylabel("accuracy (%)")
    loss_ax.set_ylabel("loss (cross-entropy)")
    time_ax.set_ylabel("training time per epoch (s)")
    slowest = max(
        (r.seconds for h in histories.values() for r in getattr(h, "records", h)), default=0
    )
    time_ax.set_ylim(bottom=0, top=1.5 * slowest or None)  # room above the lines for the legend
    all_epochs = sorted({r.epoch for h in histories.values() for r in getattr(h, "records", h)})
    for ax in (acc_ax, loss_ax, time_ax):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        if len(all_epochs) == 1:  # one epoch: one tick, not decimals around it
            ax.set_xlim(all_epochs[0] - 0.5, all_epochs[0] + 0.5)
            ax.set_xticks(all_epochs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _finish(fig, "Training histories", subtitle, device)


def _phase_runs(phases: Sequence[str]) -> list[tuple[str, int, int]]:
    """``(phase, first op, op count)`` for each run of consecutive ops in one phase."""
    runs: list[tuple[str, int, int]] = []
    for index, phase in enumerate(phases):
        if runs and runs[-1][0] == phase:
            name, start, count = runs[-1]
            runs[-1] = (name, start, count + 1)
        else:
            runs.append((phase, index, 1))
    return runs


def plot_step_timelines(reports: Mapping[str, Any], *, subtitle: str | None = None) -> Figure:
    """Live memory of one training step, op by op, stacked by category, one panel per report.

    What PyTorch's CUDA memory snapshot viewer draws, from the tracker: each report must come
    from ``measure_step(..., recording=Recording(timeline=True))`` (or ``dry_run_step``). A strip
    under each panel marks the phase of every op (forward, backward, recompute, optimizer);
    panels share the memory axis so their peaks compare at a glance.
    """
    if not reports:
        raise ValueError(
            "reports is empty: pass {'label': dry_run_step(..., recording=Recording(timeline=True))}"
        )
    missing = [label for label, r in reports.items() if not getattr(r, "category_timeline", None)]
    if missing:
        raise ValueError(
            f"no timeline in {missing}: measure with recording=Recording(timeline=True)"
        )
    fig, axes = plt.subplots(
        2,
        len(reports),
        figsize=(5.6 * len(reports), 4.8),
        squeeze=False,
        sharey="row",
        gridspec_kw={"height_ratios": [12, 1]},
    )
    plt.close(fig)
    top = max(r.peak_bytes for r in reports.values()) / MiB
    for column, (label, report) in enumerate(reports.items()):
        _timeline_panel(axes[0][column], axes[1][column], label, report, top)
    axes[0][0].set_ylabel("live tensor memory (MiB)")
    handles, names = axes[0][0].get_legend_handles_labels()
    phase_handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS[p]) for p in PHASES]
    fig.legend(
        handles[::-1] + phase_handles,
        names[::-1] + [f"phase: {p}" for p in PHASES],
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        fontsize=8,
        frameon=False,
    )
    first = next(iter(reports.values()))
    fig.suptitle(f"One training step, op by op\n{_source_subtitle(first, subtitle)}", fontsize=11)
    fig.tight_layout()
    return fig


def _timeline_panel(ax: Axes, strip: Axes, label: str, report: Any, top_mib: float) -> None:
    """One report's live memory stacked by category over its ops, its peak marked, and a strip
    under it with the phase of every op."""
    ops = range(1, len(report.category_timeline) + 1)
    end = len(ops) + 1  # op k occupies [k, k + 1): the last one ends here
    stacks = [
        [step[category] / MiB for step in report.category_timeline] for category in CATEGORIES
    ]
    ax.stackplot(
        [*ops, end],
        [stack + stack[-1:] for stack in stacks],
        colors=[CATEGORY_COLORS[c] for c in CATEGORIES],
        labels=[CATEGORY_NAMES[c] for c in CATEGORIES],
        step="post",
    )
    peak_op = max(ops, key=lambda op: report.timeline[op - 1].current_bytes)
    ax.annotate(
        f"peak {report.peak_bytes / MiB:,.0f} MiB",
        (peak_op, report.peak_bytes / MiB),
        xytext=(0, 4),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=8,
    )
    ax.set_ylim(0, 1.15 * top_mib)
    ax.set_xlim(1, end)
    ax.set_title(label, fontsize=10)
    ax.tick_params(labelbottom=False)
    ax.grid(alpha=0.3, axis="y")
    for phase, start, count in _phase_runs([event.phase for event in report.timeline]):
        strip.broken_barh([(start + 1, count)], (0, 1), color=PHASE_COLORS[phase])
    strip.set_xlim(1, end)
    strip.set_yticks([])
    strip.set_xlabel("op number in the step")
