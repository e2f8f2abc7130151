"""Notebook 02, Going deeper: the article's two training runs beside the figures it quotes."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.articles.quoted import VGG16_ARTICLE, VGG16Figures
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.measurement.timing import Timing
from tutorial_utils.training.loop import History
from tutorial_utils.units import MiB, ratio

__all__ = [
    "ARTICLE",
    "RunSummary",
    "Sizes",
    "comparison_statements",
    "comparison_table",
    "epoch_timing",
    "fresh_cuda_state",
    "plot_ratio_comparison",
    "run_state_report",
    "sgd_momentum_state_bytes",
    "sizes_for",
    "summarize_run",
]

# -- sizes per profile -----------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """What notebook 02 runs beyond the profile's own image size, batch and epochs."""

    sweep_counts: tuple[int, ...]  # segment counts the flat-layout panel measures first


def sizes_for(profile: Profile) -> Sizes:
    """Notebook 02's sizes: the panel's first counts, fewer where the profile is small. (Section
    1's experiment takes its sizes from the device, not the profile, so a learner's copy of its
    cells needs no profile.)"""
    if profile.name == "ci":
        return Sizes((0, 2, 6))
    if profile.name == "cpu":
        return Sizes((0, 2, 4, 6, 10))
    return Sizes((0, 2, 4, 6, 8, 10, 20))  # gpu and article


# -- the article's figures and ours ----------------------------------------------------------


ARTICLE = VGG16_ARTICLE


@dataclass(frozen=True)
class RunSummary:
    """One training run reduced to the figures the article compares; None where not measured."""

    seconds_per_epoch: float
    tracked_peak_mib: float | None
    cuda_peak_allocated_mib: float | None
    nvml_used_mib: float | None
    val_accuracy: float


def _largest(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def summarize_run(history: History) -> RunSummary:
    """Mean epoch time, the largest memory figure over the epochs, the last validation accuracy."""
    records = history.records
    if not records:
        raise ValueError(f"history {history.label!r} has no epochs: train at least one")
    return RunSummary(
        seconds_per_epoch=sum(r.seconds for r in records) / len(records),
        tracked_peak_mib=_largest([r.tracked_peak_mib for r in records]),
        cuda_peak_allocated_mib=_largest([r.cuda_peak_allocated_mib for r in records]),
        nvml_used_mib=_largest([r.nvml_used_mib for r in records]),
        val_accuracy=records[-1].val_accuracy,
    )


def _cell(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def comparison_table(plain: History, checkpointed: History, article: VGG16Figures = ARTICLE) -> str:
    """The article's quoted figures beside ours, plain and checkpointed, with their ratios.

    The article measured NVML only; "not reported" marks what it does not give, "n/a" what our
    machine cannot measure (no CUDA, no NVIDIA driver).
    """
    ours_plain, ours_ckpt = summarize_run(plain), summarize_run(checkpointed)
    rows = [
        (
            "seconds per epoch (training pass)",
            (article.epoch_seconds_plain, article.epoch_seconds_checkpointed),
            (ours_plain.seconds_per_epoch, ours_ckpt.seconds_per_epoch),
        ),
        (
            "NVML used (MiB)",
            (article.nvml_mib_plain, article.nvml_mib_checkpointed),
            (ours_plain.nvml_used_mib, ours_ckpt.nvml_used_mib),
        ),
        (
            "CUDA peak allocated (MiB)",
            None,
            (ours_plain.cuda_peak_allocated_mib, ours_ckpt.cuda_peak_allocated_mib),
        ),
        ("tracked peak (MiB)", None, (ours_plain.tracked_peak_mib, ours_ckpt.tracked_peak_mib)),
        (
            "validation accuracy (%)",
            (article.val_accuracy_plain, article.val_accuracy_checkpointed),
            (ours_plain.val_accuracy, ours_ckpt.val_accuracy),
        ),
    ]
    header = (
        f"{'figure':<34} {'article plain':>13} {'article ckpt':>12} {'ratio':>6}"
        f" {'ours plain':>11} {'ours ckpt':>10} {'ratio':>6}"
    )
    lines = [header, "-" * len(header)]
    for name, quoted, ours in rows:
        if quoted is None:
            quoted_cells = f"{'not reported':>13} {'':>12} {'':>6}"
        else:
            quoted_cells = (
                f"{_cell(quoted[0]):>13} {_cell(quoted[1]):>12}"
                f" {_cell(ratio(quoted[1], quoted[0]), 2):>6}"
            )
        lines.append(
            f"{name:<34} {quoted_cells} {_cell(ours[0]):>11} {_cell(ours[1]):>10}"
            f" {_cell(ratio(ours[1], ours[0]), 2):>6}"
        )
    return "\n".join(lines)


def epoch_timing(history: History) -> Timing:
    """The training pass of every epoch of a run: its range is the noise of one epoch's time."""
    if not history.records:
        raise ValueError(f"history {history.label!r} has no epochs: train at least one")
    return Timing.of([record.seconds for record in history.records])


def sgd_momentum_state_bytes(model: nn.Module) -> int:
    """Tensor bytes an epoch's state holds for SGD with momentum: the ``state_dict`` plus one
    momentum buffer per trainable parameter (the files add a few KB of pickling and RNG state)."""
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    momentum = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + momentum


def run_state_report(runs: Path, saved: bool, model: nn.Module, profile_name: str) -> str:
    """What the runs left under ``runs``; where the profile saves no state, what it would weigh.

    Why both: a laptop's two-epoch lesson should not fill its disk with 1 GB a run, and the
    learner should still see what the article's ``torch.save`` per epoch costs.
    """
    if saved:
        files = sorted(p.relative_to(runs) for p in runs.rglob("*.pt"))
        size = sum((runs / p).stat().st_size for p in files) / MiB
        count = f"{len(files)} file" + ("" if len(files) == 1 else "s")
        return f"{count}, {size:.0f} MiB under {runs}: {[str(p) for p in files]}"
    per_run = sgd_momentum_state_bytes(model) / MiB
    return (
        f"profile {profile_name} wrote no training state: an epoch's weights and SGD momentum "
        f"are {per_run:,.0f} MiB a run (tensor bytes, counted, not written); the gpu and article "
        f"profiles keep the latest epoch's under {runs}"
    )


def comparison_statements(
    plain: History,
    checkpointed: History,
    article: VGG16Figures = ARTICLE,
    flops_ratio: float | None = None,
) -> list[str]:
    """What our two runs say about the article's claims, computed from the measured numbers;
    ``flops_ratio`` (checkpointed over plain step FLOPs, from dry runs) is the time expected."""
    ours_plain, ours_ckpt = summarize_run(plain), summarize_run(checkpointed)
    time_ratio = ours_ckpt.seconds_per_epoch / ours_plain.seconds_per_epoch
    plain_epochs, ckpt_epochs = epoch_timing(plain), epoch_timing(checkpointed)
    statements = [
        f"Time: our checkpointed epochs took {100 * (time_ratio - 1):+.0f}% against the plain "
        f"run on average (article: {100 * (article.time_ratio - 1):+.0f}% measured, about "
        f"+{100 * article.claimed_slowdown:.0f}% claimed in general). Epochs took "
        f"{plain_epochs.describe(digits=1)} plain, {ckpt_epochs.describe(digits=1)} "
        f"checkpointed: the ratio above is of their means, the table's"
        + ("." if flops_ratio is None else f"; the FLOPs predict x{flops_ratio:.2f}.")
    ]
    for name, plain_mib, ckpt_mib in (
        ("tracked peak", ours_plain.tracked_peak_mib, ours_ckpt.tracked_peak_mib),
        (
            "CUDA peak allocated",
            ours_plain.cuda_peak_allocated_mib,
            ours_ckpt.cuda_peak_allocated_mib,
        ),
        ("NVML used", ours_plain.nvml_used_mib, ours_ckpt.nvml_used_mib),
    ):
        if plain_mib is None or ckpt_mib is None:
            statements.append(f"Memory ({name}): not measurable on this machine.")
            continue
        statements.append(
            f"Memory ({name}): our checkpointed run used {100 * ckpt_mib / plain_mib:.1f}% of the "
            f"plain run's {plain_mib:.1f} MiB (article, NVML: {100 * article.memory_ratio:.1f}%)."
        )
    gap = ours_ckpt.val_accuracy - ours_plain.val_accuracy
    statements.append(
        f"Accuracy: plain {ours_plain.val_accuracy:.1f}%, checkpointed "
        f"{ours_ckpt.val_accuracy:.1f}% (difference {gap:+.1f} points; article: 79% both)."
    )
    return statements


def plot_ratio_comparison(
    plain: History, checkpointed: History, article: VGG16Figures = ARTICLE
) -> Figure:
    """Checkpointed / plain ratios of time and memory, ours beside the article's.

    Ratios compare across hardware where absolute seconds and MiB cannot.
    """
    ours_plain, ours_ckpt = summarize_run(plain), summarize_run(checkpointed)
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    plt.close(fig)  # detached, as tutorial_utils.display.plotting does
    time_bars = {
        "article\n(measured)": article.time_ratio,
        "article\n(claimed)": 1 + article.claimed_slowdown,
        "ours": ours_ckpt.seconds_per_epoch / ours_plain.seconds_per_epoch,
    }
    memory_bars = {"article\nNVML": article.memory_ratio}
    for name, plain_mib, ckpt_mib in (
        ("ours\ntracked", ours_plain.tracked_peak_mib, ours_ckpt.tracked_peak_mib),
        (
            "ours CUDA\nallocated",
            ours_plain.cuda_peak_allocated_mib,
            ours_ckpt.cuda_peak_allocated_mib,
        ),
        ("ours\nNVML", ours_plain.nvml_used_mib, ours_ckpt.nvml_used_mib),
    ):
        if plain_mib and ckpt_mib is not None:
            memory_bars[name] = ckpt_mib / plain_mib
    for ax, bars, title in (
        (time_ax, time_bars, "time per epoch: checkpointed / plain"),
        (memory_ax, memory_bars, "memory: checkpointed / plain"),
    ):
        colors = ["#999999" if name.startswith("article") else "C0" for name in bars]
        ax.bar(list(bars), list(bars.values()), color=colors)
        for position, value in enumerate(bars.values()):
            ax.annotate(f"{value:.2f}", (position, value), ha="center", va="bottom", fontsize=9)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, max(1.5, 1.1 * max(bars.values())))
    fig.suptitle(
        "Checkpointing (segments=2) against the plain run; grey: quoted from the article\n"
        + figure_subtitle(),
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def fresh_cuda_state(device: torch.device | str) -> str:
    """Free what the previous run left on the GPU before the next one starts.

    The article restarts the notebook before its checkpointed run, because NVML ("memory used",
    as nvidia-smi shows it) counts everything the process holds: blocks the caching allocator
    kept from the first run would be counted against the second. Collecting the dead Python
    objects, returning the cached blocks (``empty_cache``) and resetting the allocator's peaks
    gives each run the same starting state without a restart. On a CPU there is nothing to free.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return (
            f"{device.type}: no CUDA state to reset (NVML and the CUDA peaks exist only on a GPU)"
        )
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_reserved(device) / MiB
    return f"{device}: cache emptied, peaks reset; the allocator now holds {held:,.1f} MiB"
