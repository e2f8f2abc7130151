"""The mechanics behind notebook 02 (VGG16 on dogs vs cats): comparisons, accounting, pitfalls.

Each function answers one question the notebook asks of the first article's setup: how our two
runs compare with the figures the article quotes, where VGG16 keeps its activations, what a
``checkpoint_sequential`` split can save at best, and what goes wrong (or quietly right) with
reentrant checkpointing, in-place ReLUs, Dropout and the last segment.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn as nn
from matplotlib.figure import Figure
from torch.utils.checkpoint import checkpoint_sequential

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.articles.quoted import VGG16_ARTICLE, VGG16Figures
from tutorial_utils.checkpointing.segments import (
    forward_segments,
    segment_boundaries,
    validate_segments,
)
from tutorial_utils.display.plotting import figure_subtitle, plot_breakdown, plot_segment_sweep
from tutorial_utils.measurement.dry_run import on_meta
from tutorial_utils.measurement.step import StepReport, SweepRecord, measure_step, sweep_segments
from tutorial_utils.measurement.timing import Timing, time_verdict
from tutorial_utils.training.loop import History
from tutorial_utils.units import MB, ratio

# -- sizes per profile -----------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """What notebook 02 sweeps; image size, batch and epochs are the profile's own."""

    sweep_counts: tuple[int, ...]  # segment counts the flat-layout sweep measures first


def sizes_for(profile: Profile) -> Sizes:
    """Notebook 02's sizes: a short sweep in ``ci``, the article-scale counts on a GPU."""
    if profile.name == "ci":
        return Sizes(sweep_counts=(0, 2, 6))
    if profile.name == "cpu":
        return Sizes(sweep_counts=(0, 2, 4, 6, 10))
    return Sizes(sweep_counts=(0, 2, 4, 6, 8, 10, 20))  # gpu and article


# -- the article's figures and ours ----------------------------------------------------------


ARTICLE = VGG16_ARTICLE


@dataclass(frozen=True)
class RunSummary:
    """One training run reduced to the figures the article compares; None where not measured."""

    seconds_per_epoch: float
    tracked_peak_mb: float | None
    cuda_peak_allocated_mb: float | None
    nvml_used_mb: float | None
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
        tracked_peak_mb=_largest([r.tracked_peak_mb for r in records]),
        cuda_peak_allocated_mb=_largest([r.cuda_peak_allocated_mb for r in records]),
        nvml_used_mb=_largest([r.nvml_used_mb for r in records]),
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
            "NVML used (MB)",
            (article.nvml_mb_plain, article.nvml_mb_checkpointed),
            (ours_plain.nvml_used_mb, ours_ckpt.nvml_used_mb),
        ),
        (
            "CUDA peak allocated (MB)",
            None,
            (ours_plain.cuda_peak_allocated_mb, ours_ckpt.cuda_peak_allocated_mb),
        ),
        ("tracked peak (MB)", None, (ours_plain.tracked_peak_mb, ours_ckpt.tracked_peak_mb)),
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
        size = sum((runs / p).stat().st_size for p in files) / MB
        count = f"{len(files)} file" + ("" if len(files) == 1 else "s")
        return f"{count}, {size:.0f} MB under {runs}: {[str(p) for p in files]}"
    per_run = sgd_momentum_state_bytes(model) / MB
    return (
        f"profile {profile_name} wrote no training state: an epoch's weights and SGD momentum "
        f"are {per_run:,.0f} MB a run (tensor bytes, counted, not written); the gpu and article "
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
        f"checkpointed; fastest against fastest: "
        f"{time_verdict(ckpt_epochs, plain_epochs, flops_ratio)}."
    ]
    for name, plain_mb, ckpt_mb in (
        ("tracked peak", ours_plain.tracked_peak_mb, ours_ckpt.tracked_peak_mb),
        (
            "CUDA peak allocated",
            ours_plain.cuda_peak_allocated_mb,
            ours_ckpt.cuda_peak_allocated_mb,
        ),
        ("NVML used", ours_plain.nvml_used_mb, ours_ckpt.nvml_used_mb),
    ):
        if plain_mb is None or ckpt_mb is None:
            statements.append(f"Memory ({name}): not measurable on this machine.")
            continue
        statements.append(
            f"Memory ({name}): our checkpointed run used {100 * ckpt_mb / plain_mb:.1f}% of the "
            f"plain run's {plain_mb:.1f} MB (article, NVML: {100 * article.memory_ratio:.1f}%)."
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

    Ratios compare across hardware where absolute seconds and MB cannot.
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
    for name, plain_mb, ckpt_mb in (
        ("ours\ntracked", ours_plain.tracked_peak_mb, ours_ckpt.tracked_peak_mb),
        (
            "ours CUDA\nallocated",
            ours_plain.cuda_peak_allocated_mb,
            ours_ckpt.cuda_peak_allocated_mb,
        ),
        ("ours\nNVML", ours_plain.nvml_used_mb, ours_ckpt.nvml_used_mb),
    ):
        if plain_mb and ckpt_mb is not None:
            memory_bars[name] = ckpt_mb / plain_mb
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


# -- where the activations sit ---------------------------------------------------------------


@dataclass(frozen=True)
class ModuleActivations:
    """What one top-level module leaves for the backward pass, from autograd's own record."""

    index: int
    kind: str
    output_shape: tuple[int, ...]
    output_bytes: int
    saved_bytes: int  # storages this module saved first (a tensor saved twice counts once)


@dataclass
class ActivationAccount:
    """Autograd's saved tensors of one forward pass, per top-level module of a Sequential."""

    layers: list[ModuleActivations]
    input_shape: tuple[int, ...]
    device: str

    @property
    def total_saved_bytes(self) -> int:
        return sum(layer.saved_bytes for layer in self.layers)


def saved_activations(
    model: nn.Sequential, input_shape: Sequence[int], device: str | None = "meta"
) -> ActivationAccount:
    """Per top-level module, the bytes autograd saves for the backward pass (saved-tensor hooks).

    ``device="meta"`` runs a weightless copy on the meta device: nothing is computed or
    allocated, so the article's 224 px, batch-64 figures cost milliseconds, with autograd's real
    shapes and dtypes. ``device=None`` runs ``model`` itself where it is (a real forward).
    Parameters, and views of them such as a Linear's transposed weight, are not activations and
    are left out; a tensor saved by two modules (a ReLU's output, saved by the ReLU and by the next
    convolution) is counted once, for the first.
    """
    if len(input_shape) != 4 or any(int(side) <= 0 for side in input_shape):
        raise ValueError(f"input_shape must be (batch, channels, height, width), got {input_shape}")
    if device not in ("meta", None):
        raise ValueError(f"device must be 'meta' or None (the model's own), got {device!r}")
    run = on_meta(model) if device == "meta" else model
    run_device = next(run.parameters()).device
    parameter_keys = {p.untyped_storage()._cdata for p in run.parameters()}
    nbytes: dict[int, int] = {}
    saved_keys: list[set[int]] = [set() for _ in run]
    outputs: list[tuple[tuple[int, ...], int]] = [((), 0)] * len(run)
    current = [0]
    keep_alive: list[torch.Tensor] = []  # storage addresses stay unique while the pass runs

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in parameter_keys:
            nbytes.setdefault(storage._cdata, storage.nbytes())
            saved_keys[current[0]].add(storage._cdata)
        return tensor

    def before(index: int, args: tuple) -> None:
        current[0] = index
        keep_alive.append(args[0])

    def after(index: int, output: torch.Tensor) -> None:
        outputs[index] = (tuple(output.shape), output.numel() * output.element_size())

    handles = []
    for index, module in enumerate(run):
        handles.append(module.register_forward_pre_hook(lambda _m, a, i=index: before(i, a)))
        handles.append(module.register_forward_hook(lambda _m, _a, o, i=index: after(i, o)))
    was_training = run.training
    try:
        run.train()
        inputs = torch.zeros(tuple(int(s) for s in input_shape), device=run_device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = run(inputs)
        keep_alive.append(output)
    finally:
        run.train(was_training)
        for handle in handles:
            handle.remove()
    counted: set[int] = set()
    layers = []
    for index, module in enumerate(run):
        first = saved_keys[index] - counted
        counted |= first
        layers.append(
            ModuleActivations(
                index,
                type(module).__name__,
                outputs[index][0],
                outputs[index][1],
                sum(nbytes[key] for key in first),
            )
        )
    return ActivationAccount(layers, tuple(int(s) for s in input_shape), str(run_device))


def plot_saved_activations(accounts: dict[str, ActivationAccount]) -> Figure:
    """Saved activation MB per top-level module, one panel per input size."""
    fig, axes = plt.subplots(1, len(accounts), figsize=(6.5 * len(accounts), 4.2), squeeze=False)
    plt.close(fig)
    for ax, (title, account) in zip(axes[0], accounts.items(), strict=True):
        values = [layer.saved_bytes / MB for layer in account.layers]
        colors = [_KIND_COLORS.get(layer.kind, "#777777") for layer in account.layers]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xlabel("top-level module index (flat layout)")
        ax.set_ylabel("saved for backward (MB)")
        ax.set_title(f"{title}: {account.total_saved_bytes / MB:.1f} MB in all", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _KIND_COLORS.values()]
    axes[0][-1].legend(handles, list(_KIND_COLORS), fontsize=8)
    fig.suptitle("Where VGG16 keeps its activations\n" + figure_subtitle(), fontsize=11)
    fig.tight_layout()
    return fig


_KIND_COLORS = {
    "Conv2d": "#4c72b0",
    "ReLU": "#dd8452",
    "MaxPool2d": "#55a868",
    "Linear": "#c44e52",
    "Dropout": "#8172b3",
}


# -- one step, op by op, and sweeps, as dry runs at the article's size ------------------------

ARTICLE_INPUT = (3, 224, 224)  # the first article's images
ARTICLE_BATCH = 64


def checkpointed_flops_ratio(
    model: nn.Sequential, batch_size: int, image_size: int, segments: int = 2
) -> float:
    """Checkpointed over plain FLOPs of one training step, by dry run at the given size: the
    slowdown to expect when time is proportional to work."""
    inputs = torch.empty(batch_size, 3, image_size, image_size, device="meta")
    targets = torch.empty(batch_size, dtype=torch.long, device="meta")
    reports = step_timelines(model, inputs, targets, (0, segments))
    plain, checkpointed = reports["segments=0"], reports[f"segments={segments}"]
    return checkpointed.flops.overhead_vs(plain.flops)


def step_timelines(
    model: nn.Sequential,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    segment_counts: Sequence[int] = (0, 2),
) -> dict[str, StepReport]:
    """One training step per segment count with its op-by-op timeline, keyed "segments=k".

    ``inputs`` on the meta device make these dry runs (the model is copied there); elsewhere they
    are real steps of ``model`` itself, on the inputs' device.
    """
    run = on_meta(model) if inputs.device.type == "meta" else model
    return {
        f"segments={segments}": measure_step(
            run, inputs, targets, segments, time_step=False, record_timeline=True
        )
        for segments in segment_counts
    }


def after_forward_bytes(report: StepReport) -> int:
    """Live tracked bytes when the forward pass (and the loss) is done, from a step's timeline."""
    forward = [event.current_bytes for event in report.timeline or () if event.phase == "forward"]
    if not forward:
        raise ValueError("no forward ops in the timeline: measure with record_timeline=True")
    return forward[-1]


def article_batch(batch_size: int = ARTICLE_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the article's shape on the meta device: shapes only, no memory."""
    return (
        torch.empty(batch_size, *ARTICLE_INPUT, device="meta"),
        torch.empty(batch_size, dtype=torch.long, device="meta"),
    )


def dry_run_sweep(
    model: nn.Sequential, batch_size: int, segment_counts: Sequence[int]
) -> list[SweepRecord]:
    """``sweep_segments`` at the article's 224 px on a meta copy of ``model``: exact bytes, FLOPs."""
    inputs, targets = article_batch(batch_size)
    return sweep_segments(on_meta(model), inputs, targets, segment_counts, device="meta")


def best_uniform_split(records: Sequence[SweepRecord]) -> SweepRecord:
    """The measured record with the lowest tracked peak (fewest segments on ties)."""
    return min(records, key=lambda r: (r.peak_bytes, r.segments))


def format_sweep(records: Sequence[SweepRecord], chosen: int | None = None) -> str:
    """A sweep as a table, ratios to its plain record; time measured, or FLOPs in a dry run."""
    plain = next(r for r in records if r.segments in (0, 1))
    dry = plain.dry_run
    time_title = "GFLOP" if dry else "step s"
    ratio_title = "time/plain (FLOPs)" if dry else "time/plain"
    lines = [
        plain.source,
        f"{'segments':>8} {'peak MB':>9} {'activations MB':>15} {time_title:>8}"
        f" {'peak/plain':>11} {ratio_title:>19}",
    ]
    for record in sorted(records, key=lambda r: r.segments):
        if dry:
            work = f"{record.flops.total / 1e9:>8,.0f}"
            time_ratio = record.flops.overhead_vs(plain.flops)
        else:
            work, time_ratio = f"{record.seconds:>8.2f}", record.seconds / plain.seconds
        mark = "  <- chosen" if record.segments == chosen else ""
        lines.append(
            f"{record.segments:>8} {record.peak_bytes / MB:>9,.1f}"
            f" {record.breakdown['activations'] / MB:>15,.1f} {work}"
            f" {record.peak_bytes / plain.peak_bytes:>11.3f} {time_ratio:>19.2f}{mark}"
        )
    return "\n".join(lines)


# -- pitfalls --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentGradients:
    """How many of a segment's parameter tensors received a gradient."""

    start: int
    end: int
    checkpointed: bool
    with_gradient: int
    parameters: int


def gradients_per_segment(
    model: nn.Sequential,
    inputs: torch.Tensor,
    segments: int,
    *,
    use_reentrant: bool | None,
    input_requires_grad: bool,
) -> tuple[list[SegmentGradients], list[str]]:
    """Run torch's ``checkpoint_sequential`` forward + backward; count gradients per segment.

    ``use_reentrant=None`` leaves the argument out, to show torch's default. Returns the counts
    and the warnings torch raised (their text only, without file and line).
    """
    validate_segments(model, segments)
    model.zero_grad(set_to_none=True)
    x = inputs.detach().clone().requires_grad_(input_requires_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mode = {} if use_reentrant is None else {"use_reentrant": use_reentrant}
        output = checkpoint_sequential(model, max(segments, 1), x, **mode)
        output.sum().backward()
    bounds = segment_boundaries(len(model), segments)
    counts = []
    for position, (start, end) in enumerate(bounds):
        parameters = [p for module in model[start:end] for p in module.parameters()]
        counts.append(
            SegmentGradients(
                start,
                end,
                segments >= 2 and position < len(bounds) - 1,
                sum(p.grad is not None for p in parameters),
                len(parameters),
            )
        )
    model.zero_grad(set_to_none=True)
    return counts, [str(w.message) for w in caught]


def vgg16_flat_inplace(article_model: nn.Sequential) -> nn.Sequential:
    """The article model's modules with ``features`` unrolled as they come: ReLU(inplace=True)."""
    features, *rest = list(article_model.children())
    return nn.Sequential(*features.children(), *rest)


def inplace_modules_at_checkpoint_starts(model: nn.Sequential, segments: int) -> list[int]:
    """Indices of in-place modules that open a checkpointed segment (they modify its saved input)."""
    bounds = segment_boundaries(len(model), segments)
    checkpointed = bounds[:-1] if segments >= 2 else []
    return [start for start, _ in checkpointed if getattr(model[start], "inplace", False)]


def backward_error(model: nn.Sequential, inputs: torch.Tensor, segments: int) -> str | None:
    """``None`` if a non-reentrant checkpointed forward + backward runs, else the error's first line."""
    model.zero_grad(set_to_none=True)
    try:
        output = forward_segments(model, inputs, segments, use_reentrant=False)
        output.sum().backward()
    except RuntimeError as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    finally:
        model.zero_grad(set_to_none=True)
    return None


def dropout_segments(model: nn.Sequential, segments: int) -> list[tuple[int, int, bool]]:
    """``(start, end, checkpointed)`` of the segments that contain a Dropout."""
    bounds = segment_boundaries(len(model), segments)
    return [
        (start, end, segments >= 2 and position < len(bounds) - 1)
        for position, (start, end) in enumerate(bounds)
        if any(isinstance(module, nn.Dropout) for module in model[start:end])
    ]


def forward_call_counts(
    model: nn.Sequential, inputs: torch.Tensor, segments: int, *, use_reentrant: bool = False
) -> list[int]:
    """How often each module's forward completed in one forward + backward through torch's
    ``checkpoint_sequential`` (``segments=0``: a plain call). 2 = recomputed during backward."""
    counts = [0] * len(model)
    handles = [
        module.register_forward_hook(lambda *_, i=index: counts.__setitem__(i, counts[i] + 1))
        for index, module in enumerate(model)
    ]
    model.zero_grad(set_to_none=True)
    x = inputs.detach().clone().requires_grad_(use_reentrant)
    try:
        if segments == 0:
            output = model(x)
        else:
            output = checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant)
        output.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return counts


@dataclass(frozen=True)
class TorchCheckpointSequential:
    """A ``CheckpointStrategy`` that calls torch's ``checkpoint_sequential`` for any count >= 1.

    ``forward_segments`` runs a plain forward for 0 and 1; this runs torch's own function even
    for 1, to show that torch itself checkpoints nothing there.
    """

    segments: int

    def forward(
        self, model: nn.Sequential, x: torch.Tensor, use_reentrant: bool, preserve_rng_state: bool
    ) -> torch.Tensor:
        return checkpoint_sequential(
            model,
            self.segments,
            x,
            use_reentrant=use_reentrant,
            preserve_rng_state=preserve_rng_state,
        )


# -- the flat layout, explored ---------------------------------------------------------------


ARTICLE_SCALE = "the article's size: 224 px (dry run)"
MACHINE_SCALE = "this machine: the profile's size (real steps)"
SCALES = (ARTICLE_SCALE, MACHINE_SCALE)


@dataclass
class SegmentExplorer:
    """Training steps of one model at (scale, segments, batch size), kept as they are measured.

    Two scales: real steps on this machine at the profile's size (``make_batch``: memory and
    time), or dry runs at the article's 224 px (exact memory and FLOPs, any batch, in a fraction
    of a second). ``show(segments, batch_size, scale)`` measures what is missing (the chosen
    count, the plain run and ``initial_counts``) and returns the table, the sweep figure and the
    breakdown of the chosen setting against the plain run: what the notebook's panel displays.
    """

    model: nn.Sequential
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    initial_counts: Sequence[int] = (0, 2)
    records: dict[tuple[str, int, int], SweepRecord] = field(default_factory=dict)

    def measure(
        self, segment_counts: Sequence[int], batch_size: int, scale: str = MACHINE_SCALE
    ) -> list[SweepRecord]:
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
        missing = [s for s in segment_counts if (scale, s, batch_size) not in self.records]
        if missing:
            for segments in missing:
                validate_segments(self.model, segments)
            if scale == ARTICLE_SCALE:
                measured = dry_run_sweep(self.model, batch_size, missing)
            else:
                inputs, targets = self.make_batch(batch_size)
                measured = sweep_segments(self.model, inputs, targets, missing)
            for record in measured:
                self.records[(scale, record.segments, batch_size)] = record
        return [self.records[(scale, s, batch_size)] for s in segment_counts]

    def measured_at(self, batch_size: int, scale: str) -> list[SweepRecord]:
        return sorted(
            (r for (c, _, b), r in self.records.items() if b == batch_size and c == scale),
            key=lambda r: r.segments,
        )

    def show(
        self, segments: int, batch_size: int, scale: str = MACHINE_SCALE
    ) -> tuple[str, Figure, Figure]:
        self.measure(sorted({0, segments, *self.initial_counts}), batch_size, scale)
        measured = self.measured_at(batch_size, scale)
        plain = self.records[(scale, 0, batch_size)]
        size = "224 px" if scale == ARTICLE_SCALE else "the profile's size"
        subtitle = f"flat VGG16, {size}, batch {batch_size} · {figure_subtitle(plain.device)}"
        sweep = plot_segment_sweep(measured, n_modules=len(self.model), subtitle=subtitle)
        breakdown = plot_breakdown(
            {
                "no checkpointing": plain,
                f"segments={segments}": self.records[(scale, segments, batch_size)],
            },
            subtitle=subtitle,
        )
        text = f"batch {batch_size}, {scale}\n" + format_sweep(measured, chosen=segments)
        return text, sweep, breakdown


def sqrt_rule(n_modules: int) -> int:
    """The segment count nearest sqrt(n), notebook 01's optimum for equal layers."""
    return max(2, round(math.sqrt(n_modules)))
