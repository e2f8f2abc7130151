"""Notebook 03's panel: which of NetA's five segments to checkpoint, at which batch and scale.

The second article's question is which batch fits its 2.5 GB card with checkpointing on. The
panel answers it for any choice of segments at two scales, as notebook 02's panel does: the
article's own 224 px by dry run (exact tensor bytes, FLOPs in place of time, any batch in a
fraction of a second), or real steps at the profile's image size on this machine, where the card
is scaled to the image size (``card_budget``) and the step is timed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import ipywidgets as widgets
import torch

from tutorial_utils.articles.models import NETA_SEGMENTS, NetA, count_parameters
from tutorial_utils.display.widgets import RunPanel, batch_size_slider, budget_slider, wide_layout
from tutorial_utils.lessons.cifar10_neta.card import (
    ARTICLE_CARD_BYTES,
    ARTICLE_IMAGE_SIZE,
    SEGMENT_LAYERS,
    card_budget,
)
from tutorial_utils.lessons.cifar10_neta.strategies import Strategy, strategy_cost
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.step import DRY_RUN_LABEL, adam_optimizer
from tutorial_utils.units import MB

ARTICLE_SCALE = "the article's size: 224 px (dry run)"
MACHINE_SCALE = "this machine: the profile's size (real steps)"
SCALES = (ARTICLE_SCALE, MACHINE_SCALE)


@dataclass(frozen=True)
class SegmentChoice:
    """One step at one batch with the chosen segments checkpointed, and the largest batch that
    fits the budget, with and without checkpointing."""

    segments: frozenset[int]
    scale: str
    image_size: int
    batch_size: int
    peak_bytes: int  # tracked peak of the step
    activation_bytes: int  # the most activation bytes alive during forward and backward
    cost: str  # the step's measured time, or its FLOPs over the plain step's (dry run)
    budget_bytes: int
    max_batch: int
    plain_max_batch: int

    def describe(self) -> str:
        chosen = ", ".join(f"seg{i}" for i in sorted(self.segments)) or "none"
        how = DRY_RUN_LABEL if self.scale == ARTICLE_SCALE else "measured: real steps"
        return (
            f"checkpointed: {chosen} · {self.image_size} px · {how}\n"
            f"batch {self.batch_size}: step peak {self.peak_bytes / MB:.1f} MiB, activation peak "
            f"(forward + backward) {self.activation_bytes / MB:.1f} MiB, {self.cost}\n"
            f"largest batch within {self.budget_bytes / MB:.0f} MiB: {self.max_batch} "
            f"(no checkpointing: {self.plain_max_batch})"
        )


@functools.lru_cache(maxsize=64)
def _largest_batch(
    chosen: frozenset[int], image_size: int, budget: int, max_batch: int, device: str
) -> int:
    """The search is deterministic (tracked bytes), so the panel asks it once per setting."""
    return find_max_batch_size(
        lambda: NetA(use_checkpoint=chosen, use_reentrant=False),
        (3, image_size, image_size),
        budget,
        max_batch=max_batch,
        device=device,
    ).batch_size


def evaluate_segment_choice(
    segments: Iterable[int],
    card_bytes: int,
    batch_size: int,
    image_size: int,
    max_batch: int = 256,
    device: torch.device | str = "cpu",
    scale: str = MACHINE_SCALE,
) -> SegmentChoice:
    """The chosen segments at ``scale``: at the article's, dry runs at 224 px against the whole
    ``card_bytes``; on this machine, a timed step at ``image_size`` against the card scaled to
    that size. The largest batches come from ``find_max_batch_size`` (dry runs at 224 px)."""
    chosen = frozenset(segments)
    if not chosen <= set(range(NETA_SEGMENTS)):
        raise ValueError(f"NetA segments are 0..{NETA_SEGMENTS - 1}, got {sorted(chosen)}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if scale == ARTICLE_SCALE:
        image_size, budget, device = ARTICLE_IMAGE_SIZE, card_bytes, "meta"
        shape = (batch_size, 3, image_size, image_size)
        reports = [
            dry_run_step(
                build_on_meta(functools.partial(NetA, use_checkpoint=s, use_reentrant=False)),
                shape,
                optimizer_factory=adam_optimizer,
            )
            for s in (chosen, frozenset())
        ]
        step, plain = reports
        peak, activations = step.peak_bytes, step.activation_peak_bytes
        assert step.flops is not None and plain.flops is not None  # dry runs count FLOPs
        cost = f"FLOPs x{step.flops.overhead_vs(plain.flops):.2f} the plain step's"
    else:
        budget = card_budget(image_size, card_bytes)
        generator = torch.Generator().manual_seed(0)
        inputs = torch.rand(batch_size, 3, image_size, image_size, generator=generator)
        targets = torch.randint(0, 10, (batch_size,), generator=generator)
        strategy = Strategy(f"segments {sorted(chosen)}", chosen)
        measured = strategy_cost(strategy, inputs.to(device), targets.to(device), repeats=1)
        peak, activations = measured.peak_bytes, measured.activation_bytes
        cost = f"step {measured.timing.describe()}"
    return SegmentChoice(
        chosen,
        scale,
        image_size,
        batch_size,
        peak,
        activations,
        cost,
        budget,
        _largest_batch(chosen, image_size, budget, max_batch, str(device)),
        _largest_batch(frozenset(), image_size, budget, max_batch, str(device)),
    )


def segment_checkboxes(
    checked: Iterable[int] = range(NETA_SEGMENTS),
) -> dict[str, widgets.Checkbox]:
    """One Checkbox per NetA segment, keyed seg0..seg4 as ``segment_panel``'s compute expects."""
    checked = set(checked)
    return {
        f"seg{i}": widgets.Checkbox(value=i in checked, description=f"seg{i}: {layers}")
        for i, layers in enumerate(SEGMENT_LAYERS)
    }


def segment_panel(
    batch_size: int,
    image_size: int,
    card_mib: float = ARTICLE_CARD_BYTES / MB,
    max_batch: int = 256,
    device: torch.device | str = "cpu",
    scale: str = ARTICLE_SCALE,
) -> RunPanel:
    """Batch and card sliders, a scale, five segment checkboxes; Run measures the choice."""

    def compute(batch_size: int, card_mib: float, scale: str, **checked: bool) -> str:
        segments = {int(name[3:]) for name, on in checked.items() if on}
        choice = evaluate_segment_choice(
            segments, int(card_mib * MB), batch_size, image_size, max_batch, device, scale
        )
        return choice.describe()

    static_mb = 4 * 4 * count_parameters(NetA()) / MB
    controls = {
        "batch_size": batch_size_slider(max_batch=max_batch, value=min(batch_size, max_batch)),
        "card_mib": budget_slider(
            max_mb=round(2 * card_mib),
            value=round(card_mib),
            min_mb=round(static_mb) + 1,
            description="card memory at 224 px (MiB)",
        ),
        "scale": widgets.Dropdown(
            options=SCALES, value=scale, description="scale", layout=wide_layout()
        ),
        **segment_checkboxes(),
    }
    return RunPanel(controls, compute, title="Which NetA segments to checkpoint, at which batch")
