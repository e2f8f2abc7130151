"""A memory snapshot's timeline drawn offline, in the style of pytorch.org/memory_viz.

The viewer's "Active Memory Timeline" draws every live allocation as a band, stacked in the
order the allocations were made, over the trace's actions: a freed band leaves and the bands
above it fall. ``torch.cuda._memory_viz.trace_plot`` writes that viewer as HTML that loads its
script from the internet, so it shows nothing offline or on GitHub. This draws the same picture
with matplotlib from the snapshot dict (``torch.cuda.memory._snapshot()``'s format, or a dry
run's from ``estimate.snapshot``), so a notebook can commit it as an image.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from tutorial_utils.units import GiB

__all__ = ["Band", "plot_snapshot_timeline", "timeline_bands"]


@dataclass
class Band:
    """One allocation's band: from its alloc to its free (or the end), at a height that falls
    whenever an earlier band below it is freed."""

    size: int
    start: int  # the index of its alloc among the trace's allocs and frees
    xs: list[int] = field(default_factory=list)
    bottoms: list[int] = field(default_factory=list)


def timeline_bands(
    snapshot: dict[str, Any], largest: int = 1500
) -> tuple[list[Band], list[int], list[str]]:
    """The ``largest`` allocations as stacked bands; the rest summed into one band at the bottom
    (the viewer summarizes its small allocations too). Returns the bands, the summed band's height
    at each action, and each action's frame name (what asked: "step 1", say)."""
    trace = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    if not trace:
        raise ValueError("the snapshot's trace has no allocations: record it with history on")
    allocs = [t for t, e in enumerate(trace) if e["action"] == "alloc"]
    chosen = set(sorted(allocs, key=lambda t: -trace[t]["size"])[:largest])
    live: dict[int, Band] = {}  # address -> band, in allocation order (dicts keep it)
    small: dict[int, int] = {}  # address -> bytes of the summarized allocations
    bands: list[Band] = []
    summed: list[int] = []
    names: list[str] = []
    for t, entry in enumerate(trace):
        address, size = entry["addr"], entry["size"]
        if entry["action"] == "alloc":
            if t in chosen:
                live[address] = Band(size, t)
                bands.append(live[address])
            else:
                small[address] = size
        else:
            live.pop(address, None)
            small.pop(address, None)
        offset = sum(small.values())
        summed.append(offset)
        names.append(entry["frames"][0]["name"] if entry.get("frames") else "")
        for band in live.values():
            band.xs.append(t)
            band.bottoms.append(offset)
            offset += band.size
    return bands, summed, names


def plot_snapshot_timeline(snapshot: dict[str, Any], title: str, largest: int = 1500) -> Figure:
    """The active-memory timeline: one coloured band per large allocation, the small ones summed
    in grey at the bottom, a dotted line where each step of the trace begins."""
    bands, summed, names = timeline_bands(snapshot, largest)
    fig, ax = plt.subplots(figsize=(9.5, 3.6))
    xs = list(range(len(summed)))
    ax.fill_between(xs, 0, [s / GiB for s in summed], step="post", color="0.75", lw=0)
    colors = plt.get_cmap("tab20").colors
    for index, band in enumerate(bands):
        bottom = [b / GiB for b in band.bottoms]
        top = [b + band.size / GiB for b in bottom]
        ax.fill_between(band.xs, bottom, top, step="post", color=colors[index % 20], lw=0)
    for t, name in enumerate(names):
        if name.startswith("step") and name not in names[:t]:
            ax.axvline(t, color="black", lw=0.8, ls=":")
            ax.text(t, ax.get_ylim()[1] * 0.97, f" {name} begins", va="top", fontsize=8)
    ax.set_xlabel("allocations and frees, in order")
    ax.set_ylabel("active memory (GiB)")
    ax.set_title(title, fontsize=10)
    ax.margins(x=0)
    fig.tight_layout()
    return fig
