"""Notebook 03's panel: tick which of NetA's segments to checkpoint, pick a batch, click Run. It
measures the notebook's own ``NetA`` and ``random_batch`` (passed in) with the notebook's tools."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch.optim import Optimizer
from torch.utils.checkpoint import checkpoint

from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.tables import text_table
from tutorial_utils.display.widgets import RunPanel, batch_size_slider, wide_layout
from tutorial_utils.tools import MiB, StepTimes, compare_times, peak_bytes, saved_bytes, time_turns

__all__ = ["SegmentsRun", "forward_with", "measure_segments", "segments_panel"]

SEGMENTS = 5  # NetA's seg0..seg4
Batch = tuple[torch.Tensor, torch.Tensor]
MakeBatch = Callable[[int], Batch]


def forward_with(net: nn.Module, x: torch.Tensor, chosen: frozenset[int]) -> torch.Tensor:
    """NetA's forward with only the ``chosen`` segments checkpointed (non-reentrant); the input
    trick of the notebook's forward kept, so all five chosen is ``NetA(use_checkpoint=True)``."""
    y = x + torch.zeros(1, dtype=x.dtype, device=x.device, requires_grad=True)
    for index in range(SEGMENTS):
        segment = getattr(net, f"seg{index}")
        y = checkpoint(segment, y, use_reentrant=False) if index in chosen else segment(y)
    return y


def _train_step(net: nn.Module, optim: Optimizer, chosen: frozenset[int], batch: Batch) -> None:
    optim.zero_grad()
    F.cross_entropy(forward_with(net, batch[0], chosen), batch[1]).backward()
    optim.step()


def _train_on_new_batch(step: Callable[[Batch], None], make_batch: MakeBatch, size: int) -> None:
    step(make_batch(size))


def _segment_labels(net: nn.Module, images: torch.Tensor) -> list[str]:
    """'seg1: layer2, layer3 -> 128x16x16': each segment's layers and its output's shape."""
    fired: list[str] = []
    hooks = [
        m.register_forward_hook(lambda *_, n=n: fired.append(n)) for n, m in net.named_children()
    ]
    labels, y = [], images
    with torch.no_grad():
        for index in range(SEGMENTS):
            fired.clear()
            y = getattr(net, f"seg{index}")(y)
            labels.append(f"seg{index}: {', '.join(fired)} -> {'x'.join(map(str, y.shape[1:]))}")
    for hook in hooks:
        hook.remove()
    return labels


@dataclass(frozen=True)
class SegmentsRun:
    """One Run: plain and, when any segment is ticked, the chosen segments checkpointed."""

    batch: int
    chosen: frozenset[int]
    saved_bytes: dict[str, int]  # by step name: "plain", "checkpointed"
    peak_bytes: dict[str, int]  # training peak: kept between steps + one step's peak
    times: dict[str, StepTimes]
    budget_bytes: int | None

    def __str__(self) -> str:
        chosen = ", ".join(f"seg{i}" for i in sorted(self.chosen)) or "none (tick a segment)"
        budget = self.budget_bytes
        header = ["step", "saved for backward MiB", "training peak MiB"]
        header += [] if budget is None else [f"fits {budget / MiB:.0f} MiB"]
        rows = [
            [name, f"{saved / MiB:.2f}", f"{self.peak_bytes[name] / MiB:.1f}"]
            + ([] if budget is None else ["yes" if self.peak_bytes[name] <= budget else "no"])
            for name, saved in self.saved_bytes.items()
        ]
        return (
            f"batch {self.batch}; checkpointed (non-reentrant): {chosen}\n"
            f"{text_table(header, rows)}\n{compare_times(self.times, reference='plain')}"
        )


def measure_segments(
    net_class: Callable[[], nn.Module],
    make_batch: MakeBatch,
    chosen: Iterable[int],
    batch: int,
    device: torch.device | str = "cpu",
    budget_bytes: int | None = None,
    turns: int = 3,
) -> SegmentsRun:
    """Real steps on this machine: NetA from seed 0, plain and with ``chosen`` checkpointed."""
    chosen = frozenset(chosen)
    if not chosen <= set(range(SEGMENTS)):
        raise ValueError(f"segments are 0..{SEGMENTS - 1}, got {sorted(chosen)}: tick seg0..seg4")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}: move the batch slider up")
    images = make_batch(batch)
    setups = {"plain": frozenset(), "checkpointed": chosen} if chosen else {"plain": chosen}
    saved, peaks = {}, {}
    steps: dict[str, Callable[[], object]] = {}
    for name, segments in setups.items():
        torch.manual_seed(0)
        net = net_class().to(device)
        optim = torch.optim.Adam(net.parameters(), 1e-3)
        step = partial(_train_step, net, optim, segments)
        saved[name] = saved_bytes(net, partial(forward_with, net, images[0], segments))
        step(make_batch(2))  # a first step creates Adam's state (two images: BatchNorm's need)
        optim.zero_grad()
        kept = [*net.state_dict().values(), *(t for s in optim.state.values() for t in s.values())]
        # the batch is made inside the measured call, so that its peak counts it, as section 2's
        held = peak_bytes(partial(_train_on_new_batch, step, make_batch, batch), device)
        peaks[name] = sum(t.nbytes for t in kept) + held
        steps[name] = partial(step, images)
    times = time_turns(steps, turns=turns, device=device)
    return SegmentsRun(batch, chosen, saved, peaks, times, budget_bytes)


def _plot_segments_run(run: SegmentsRun, device: torch.device | str) -> Figure:
    """Training peak beside CPU time per step (median, bar from fastest to slowest turn)."""
    names = list(run.peak_bytes)
    figure, (memory, cpu) = plt.subplots(1, 2, figsize=(8.0, 1.2 + 0.5 * len(names)))
    plt.close(figure)  # detached: shown once, by the panel
    memory.barh(names, [run.peak_bytes[n] / MiB for n in names], color="#4c72b0")
    memory.set_xlabel("training peak (MiB)")
    if run.budget_bytes is not None:
        memory.axvline(run.budget_bytes / MiB, color="k", linestyle="--")
        memory.set_xlabel(
            f"training peak (MiB); dashed: the {run.budget_bytes / MiB:.0f} MiB budget"
        )
    cpu_s = [run.times[n].cpu_s for n in names]
    medians = [statistics.median(s) for s in cpu_s]
    spread = [
        [m - min(s) for s, m in zip(cpu_s, medians, strict=True)],
        [max(s) - m for s, m in zip(cpu_s, medians, strict=True)],
    ]
    cpu.barh(names, medians, xerr=spread, color="#dd8452", capsize=3)
    cpu.set_xlabel("CPU time per step (s)")
    cpu.set_yticklabels([])
    memory.invert_yaxis()  # plain on top; the axes share no y, so each is turned
    cpu.invert_yaxis()
    figure.suptitle(
        f"NetA, batch {run.batch}: memory against time\n{figure_subtitle(device)}", fontsize=10
    )
    figure.tight_layout(w_pad=3.0)  # the two x axes meet: keep their labels apart
    return figure


def segments_panel(
    net_class: Callable[[], nn.Module],
    make_batch: MakeBatch,
    device: torch.device | str = "cpu",
    budget_bytes: int | None = None,
    batch: int = 16,
    max_batch: int = 64,
) -> RunPanel:
    """Five segment checkboxes (all ticked), a batch slider and Run; Run measures the choice."""
    net = net_class()
    missing = [f"seg{i}" for i in range(SEGMENTS) if not hasattr(net, f"seg{i}")]
    if missing:
        raise ValueError(f"net_class has no {', '.join(missing)}: pass the notebook's NetA")
    labels = _segment_labels(net.to(device), make_batch(2)[0])  # two: BatchNorm needs more than one
    controls: dict[str, widgets.Widget] = {
        "batch": batch_size_slider(max_batch=max_batch, value=batch, description="batch"),
        **{
            f"seg{i}": widgets.Checkbox(
                value=True, description=label, style={"description_width": "initial"}
            )
            for i, label in enumerate(labels)
        },
    }
    for control in controls.values():
        control.layout = wide_layout()

    def compute(batch: int, **ticked: bool) -> tuple[SegmentsRun, Figure]:
        chosen = [int(name[3:]) for name, on in ticked.items() if on]
        run = measure_segments(net_class, make_batch, chosen, batch, device, budget_bytes)
        return run, _plot_segments_run(run, device)

    return RunPanel(
        controls, compute, title="Which of NetA's segments to checkpoint, at which batch"
    )
