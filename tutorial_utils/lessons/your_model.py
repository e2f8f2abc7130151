"""Notebook 07's mechanics: your model's training memory per strategy, against your card.

Everything here is a thin layer over ``tutorial_utils.estimate`` (what ``python -m
tutorial_utils estimate`` runs): a panel to choose the model and the run, a chart of each
strategy's peak by category against the card; ``estimate.report.cuda_comparison`` puts one real
step on CUDA beside its dry run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch.nn as nn
from matplotlib.figure import Figure

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.widgets import RunPanel, int_slider, wide_layout
from tutorial_utils.estimate.card import GPUS, parse_card
from tutorial_utils.estimate.estimator import (
    PRECISIONS,
    QLORA,
    Estimate,
    Workload,
    build_model,
    estimate,
    largest_fit,
)
from tutorial_utils.estimate.models import PRESETS
from tutorial_utils.estimate.report import CATEGORY_LABELS, estimate_table
from tutorial_utils.estimate.strategies import DEFAULT_STRATEGIES
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import GiB

__all__ = ["GPU_CARD", "SIZES", "Sizes", "YourModelPanel", "plot_estimate", "sizes_for"]

_CARDS = ("8GB", "12GB", "16GB", "24GB", "40GB", "48GB", "80GB")
GPU_CARD = "the GPU's own"  # the card's memory as --gpu names it (the command without --card)
_CLASSIFIERS = ("resnet18", "resnet50", "convnext_tiny", "vit_b_16")
_CATEGORY_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52")


@dataclass(frozen=True)
class Sizes:
    """What the notebook dry-runs (any size is cheap on meta) and runs for real on a GPU."""

    preset: str  # the language model the panel opens with
    sequence: int
    lora_rank: int
    classifier: str
    image_size: int
    classifier_batch: int
    search_max_sequence: int  # the longest-sequence search stops here
    gpu_check_preset: str  # the real CUDA step beside its dry run (small: fits any GPU)
    gpu_check_sequence: int


SIZES = {
    "ci": Sizes("gpt2", 512, 8, "resnet18", 64, 8, 1024, "gpt2", 256),
    "cpu": Sizes("llama-3.1-8b", 4096, 16, "resnet50", 224, 32, 32768, "gpt2", 512),
    "gpu": Sizes("llama-3.1-8b", 4096, 16, "resnet50", 224, 64, 131072, "llama-3.2-1b", 1024),
    "article": Sizes("llama-3.1-8b", 4096, 16, "resnet50", 224, 64, 131072, "llama-3.2-1b", 1024),
}


def sizes_for(profile: Profile | str) -> Sizes:
    """This notebook's sizes for a profile (a ``Profile`` or its name)."""
    name = profile if isinstance(profile, str) else profile.name
    try:
        return SIZES[name]
    except KeyError:
        raise ValueError(
            f"no notebook-07 sizes for profile {name!r}: add it to SIZES (known: {', '.join(SIZES)})"
        ) from None


def plot_estimate(result: Estimate, highlight: str | None = None) -> Figure:
    """Each measured strategy's peak, stacked by category, against the card and its budget."""
    measured = [(row.strategy.name, row.report) for row in result.rows if row.report is not None]
    if not measured:
        raise ValueError("no strategy was measured: include at least one besides offload")
    fig, ax = plt.subplots(figsize=(9.5, 1.2 + 0.55 * len(measured)))
    plt.close(fig)
    names = [name for name, _ in measured]
    reports = [report for _, report in measured]
    left = [0.0] * len(measured)
    for category, color in zip(CATEGORIES, _CATEGORY_COLORS, strict=True):
        widths = [report.breakdown[category] / GiB for report in reports]
        ax.barh(names, widths, left=left, color=color, label=CATEGORY_LABELS[category])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    card = result.card
    ax.axvline(card.total_bytes / GiB, color="black", linewidth=1.5, label=f"card {card.name}")
    ax.axvline(card.budget_bytes / GiB, color="black", linestyle="--", lw=1, label="card's budget")
    for index, name in enumerate(names):
        if name == highlight:
            ax.get_yticklabels()[index].set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlim(0, 1.08 * max(max(left), card.total_bytes / GiB))
    ax.set_xlabel("peak of one training step (GiB), by what is alive at the peak")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(axis="x", alpha=0.3)
    subtitle = f"{reports[0].source} · {figure_subtitle('meta')}"
    fig.suptitle(f"{result.model_description}\n{subtitle}", fontsize=9)
    fig.tight_layout()
    return fig


class YourModelPanel:
    """Model, batch, size, precision (QLoRA's nf4 too), LoRA rank, strategy, card, GPU model and
    allocator mode: the command's choices. Run dry-runs every strategy (``estimate``), draws them
    against the card and searches the chosen strategy's largest fit. Models are built once per
    (model, precision, LoRA rank, image size) and reused."""

    def __init__(self, sizes: Sizes, *, model: str | None = None) -> None:
        self.sizes = sizes
        self.models: dict[tuple[str, str, int, int], nn.Module] = {}
        names = [s.name for s in DEFAULT_STRATEGIES]
        models = [f"hf:{name}" for name in PRESETS] + [f"torchvision:{c}" for c in _CLASSIFIERS]

        def dropdown(description: str, options: Sequence[str], value: str) -> widgets.Dropdown:
            return widgets.Dropdown(
                options=options, value=value, description=description, layout=wide_layout()
            )

        controls = {
            "model": dropdown("model", models, model or f"hf:{sizes.preset}"),
            "batch": int_slider("batch", 1, 1, 256),
            "size": int_slider("sequence (tokens) or image side (px)", sizes.sequence, 32, 32768),
            "precision": dropdown("precision", (*PRECISIONS, QLORA), "bf16"),
            "lora_rank": int_slider("LoRA rank (0: full fine-tuning)", sizes.lora_rank, 0, 64),
            "strategy": dropdown("strategy", names, names[1]),
            "card": dropdown("card", (*_CARDS, GPU_CARD), "24GB"),
            "gpu": dropdown("GPU", tuple(GPUS), "any"),
            "expandable_segments": widgets.Checkbox(
                value=False, description="expandable segments (the allocator's mode)"
            ),
            "reserve_percent": int_slider("held back: % of the card (assumed)", 0, 0, 50),
        }
        self.panel = RunPanel(controls, self.compute, title="Will it fit?")
        self.widget = self.panel.widget

    def compute(self, model: str, batch: int, size: int, precision: str, lora_rank: int,
                strategy: str, card: str, gpu: str, expandable_segments: bool,
                reserve_percent: int) -> tuple[Figure, str]:  # fmt: skip
        classifier = model.startswith("torchvision:")
        workload = Workload(model, batch=batch, size=size, precision=precision,
                            lora_rank=0 if classifier else lora_rank)  # fmt: skip
        key = (model, precision, workload.lora_rank, size if classifier else 0)
        if key not in self.models:
            self.models[key] = build_model(workload)
        chosen_card = parse_card(None if card == GPU_CARD else card, f"{reserve_percent}%",
                                 gpu=gpu, expandable_segments=expandable_segments)  # fmt: skip
        result = estimate(
            workload, DEFAULT_STRATEGIES, chosen_card, model=self.models[key], search=False
        )
        chosen = next(row for row in result.rows if row.strategy.name == strategy)
        text = estimate_table(result)
        if chosen.report is not None:
            limit = 1024 if classifier else self.sizes.search_max_sequence
            best, trials = largest_fit(self.models[key], workload, chosen.strategy,
                                       result.card.budget_bytes, max_size=limit)  # fmt: skip
            what = "largest batch" if classifier else "longest sequence"
            text += f"\n{strategy}: {what} that fits the card: {best:,} ({trials} dry runs)"
        return plot_estimate(result, highlight=strategy), text
