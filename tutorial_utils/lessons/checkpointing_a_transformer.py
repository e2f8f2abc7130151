"""Notebook 06's Going deeper: a ``transformers`` model at full size, predicted by dry runs.

The core is the notebook's own copy cells (``tutorial_utils.tools`` alone). What is here is what
several cells, the panel and the tests share: models built from configs (random weights, nothing
downloaded), one AdamW step under each way to checkpoint (on meta a dry run: exact bytes and
FLOPs, no time, a prediction), their tables, the strategy panel, and the longest sequence on a
card by ``estimate``'s engine (a test holds it equal to the command's ``--json``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias, TypedDict

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from peft import PeftModel
from transformers import GPT2Config, LlamaConfig, PreTrainedModel

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.selective import ATTENTION_OPS, MATRIX_PRODUCT_OPS
from tutorial_utils.checkpointing.strategy import (
    NO_CHECKPOINTING,
    Strategy,
    every_nth_block,
    offloaded,
    selective,
)
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.tables import columns_table, text_table
from tutorial_utils.display.widgets import RunPanel, int_slider, wide_layout
from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, build_model, estimate
from tutorial_utils.estimate.models import PRESETS, decoder_blocks
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.measurement.step import StepReport, measure_step, next_token_loss
from tutorial_utils.measurement.tracker import CATEGORIES
from tutorial_utils.units import MiB, ratio

__all__ = [
    "CausalLM",
    "LMStrategyRow",
    "Sizes",
    "StrategyExplorer",
    "adamw",
    "breakdown_table",
    "fit_table",
    "gpt2_small_config",
    "llama_1b_config",
    "lm_step",
    "plot_strategies",
    "longest_sequences",
    "rows_table",
    "small_gpt2_config",
    "sizes_for",
    "small_llama_config",
    "strategy_rows",
    "token_batch",
    "transformer_menu",
]


# a transformers causal LM, bare or with peft's adapters: it has a ``config`` and the methods
CausalLM: TypeAlias = PreTrainedModel | PeftModel


@dataclass(frozen=True)
class Sizes:
    """What a profile runs beyond the core (whose copy cells size by device)."""

    fit_strategies: tuple[str, ...]  # --strategies spellings searched for the longest sequence


def sizes_for(profile: Profile) -> Sizes:
    """The ``ci`` profile searches two strategies for the longest sequence; the others, four."""
    if profile.name == "ci":
        return Sizes(("none", "every-block"))
    return Sizes(("none", "every-block", "every-2", "selective"))


def gpt2_small_config(**overrides: object) -> GPT2Config:
    """GPT-2 small (124 M parameters, 12 layers, hidden 768, 12 heads, context 1024)."""
    return GPT2Config(bos_token_id=0, eos_token_id=0, use_cache=False, **overrides)


def llama_1b_config(**overrides: object) -> LlamaConfig:
    """Llama-3.2-1B's published shape (``estimate.models.PRESETS``, with its source); no cache."""
    published = {k: v for k, v in PRESETS["llama-3.2-1b"].items() if k != "model_type"}
    training = {"bos_token_id": 0, "eos_token_id": 0, "use_cache": False}
    return LlamaConfig(**{**published, **training, **overrides})


def small_llama_config(layers: int = 4, hidden: int = 128) -> LlamaConfig:
    """The same architecture at a size a CPU trains in well under a second a step."""
    return llama_1b_config(hidden_size=hidden, intermediate_size=4 * hidden,
                           num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=hidden // 4, vocab_size=1000, max_position_embeddings=4096)  # fmt: skip


def small_gpt2_config(layers: int = 2, hidden: int = 128) -> GPT2Config:
    """GPT-2 (with its dropout) at a CPU's size."""
    return gpt2_small_config(n_layer=layers, n_embd=hidden, n_head=4, vocab_size=1000)


def adamw(parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Fine-tuning's optimizer: AdamW over the parameters that train."""
    return torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=1e-4)


def token_batch(batch: int, sequence: int, device: str, vocab_size: int) -> torch.Tensor:
    """Random token ids (values only matter on a real device)."""
    if batch < 1 or sequence < 2:
        raise ValueError(f"need batch >= 1 and sequence >= 2 tokens, got {batch}, {sequence}")
    if device == "meta":
        return torch.empty(batch, sequence, dtype=torch.long, device="meta")
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (batch, sequence), generator=generator).to(device)


def transformer_menu(layers: int, *, on_cuda: bool = False) -> list[Strategy]:
    """None, every block (reentrant and not), every 2nd and 4th block, two selective policies,
    and offloading where there is a GPU; each applied through the model's own method."""
    menu = [
        NO_CHECKPOINTING,
        every_nth_block(1, use_reentrant=True, name="every block, use_reentrant=True"),
        every_nth_block(1, name="every block (default)"),
        *(every_nth_block(n) for n in (2, 4) if n < layers),
        selective(MATRIX_PRODUCT_OPS, name="selective: save matmuls"),
        selective(MATRIX_PRODUCT_OPS | ATTENTION_OPS, name="selective: save matmuls + attention"),
    ]
    return [*menu, offloaded()] if on_cuda else menu


def lm_step(model: CausalLM, strategy: Strategy, batch: int, sequence: int) -> StepReport:
    """One AdamW training step of a causal LM under ``strategy``, tracked: a dry run on meta,
    else a real step (untimed: the notebook times real steps with ``tools.time_turns``)."""
    device = next(model.parameters()).device.type
    ids = token_batch(batch, sequence, device, model.config.vocab_size)
    return measure_step(model, ids, ids, strategy, optimizer_factory=adamw,
                        loss_fn=next_token_loss, device=device, time_step=False)  # fmt: skip


class LMStrategyRow(TypedDict):
    """One strategy's ``lm_step`` as a table row: MiB and GFLOP (None where not counted)."""

    checkpointing: str
    tracked_peak_mib: float
    activation_peak_mib: float
    recompute_gflop: float | None
    step_gflop: float | None
    peak_ratio: float  # to the first row's ("none")
    flops_ratio: float | None
    source: str


def strategy_rows(
    model: CausalLM, menu: Sequence[Strategy], batch: int, sequence: int
) -> list[LMStrategyRow]:
    """One ``lm_step`` per strategy, as rows; ratios to the first (which should be "none")."""
    reports = [lm_step(model, strategy, batch, sequence) for strategy in menu]
    flops = [None if r.flops is None else r.flops.total / 1e9 for r in reports]
    return [
        {
            "checkpointing": strategy.name,
            "tracked_peak_mib": report.peak_mib,
            "activation_peak_mib": report.activation_peak_bytes / MiB,
            "recompute_gflop": None if report.flops is None else report.flops.recompute / 1e9,
            "step_gflop": total,
            "peak_ratio": report.peak_mib / reports[0].peak_mib,
            "flops_ratio": ratio(total, flops[0]),
            "source": report.source,
        }
        for strategy, report, total in zip(menu, reports, flops, strict=True)
    ]


def rows_table(rows: Sequence[LMStrategyRow]) -> str:
    """Rows as an aligned table headed by how they were obtained."""
    columns = (
        ("checkpointing", "strategy", "{}"),
        ("tracked_peak_mib", "peak MiB", "{:,.0f}"),
        ("activation_peak_mib", "activations MiB", "{:,.0f}"),
        ("peak_ratio", "peak vs none", "{:.2f}"),
        ("recompute_gflop", "recompute GFLOP", "{:,.0f}"),
        ("flops_ratio", "FLOPs vs none", "{:.2f}"),
    )
    return rows[0]["source"] + "\n" + columns_table(rows, columns)


def breakdown_table(reports: Mapping[str, StepReport]) -> str:
    """The tracked peak of each step split by category, in MiB, headed by how it was obtained."""
    names = {"optimizer_state": "optimizer", "activations": "activations/other"}
    rows = [
        (label, *(f"{r.breakdown[c] / MiB:,.0f}" for c in CATEGORIES), f"{r.peak_mib:,.0f}")
        for label, r in reports.items()
    ]
    header = ("MiB", *(names.get(c, c) for c in CATEGORIES), "tracked peak")
    return next(iter(reports.values())).source + "\n" + text_table(header, rows)


def plot_strategies(rows: Sequence[LMStrategyRow], title: str) -> Figure:
    """Two bars per strategy: its predicted peak and the FLOPs it recomputes (dry runs)."""
    if any(row["recompute_gflop"] is None for row in rows):
        raise ValueError("rows without FLOPs: plot the rows of a dry run (a model on meta)")
    names = [row["checkpointing"] for row in rows][::-1]  # "none" on top
    fig, (peak_ax, flops_ax) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    plt.close(fig)  # detached: shown once by the panel
    peak_ax.barh(names, [row["tracked_peak_mib"] for row in rows][::-1], color="#4c72b0")
    peak_ax.set_xlabel("tracked peak (MiB, predicted)")
    flops_ax.barh(names, [row["recompute_gflop"] for row in rows][::-1], color="#c44e52")
    flops_ax.set_xlabel("recomputed GFLOP per step (counted)")
    for ax in (peak_ax, flops_ax):
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlim(left=0)
    fig.suptitle(f"{title}\n{rows[0]['source']} · {figure_subtitle('meta')}", fontsize=10)
    fig.tight_layout()
    return fig


class StrategyExplorer:
    """Models, a batch and a sequence length: Run dry-runs every strategy of the menu there
    (cached per choice) and returns the bars and the table."""

    def __init__(self, models: Mapping[str, CausalLM], *, batch: int, sequence: int) -> None:
        self.models = dict(models)
        self.computed: dict[tuple[str, int, int], list[LMStrategyRow]] = {}
        controls = {
            "batch": int_slider("batch", batch, 1, 64),
            "sequence": int_slider("sequence length (tokens)", sequence, 2, 16384),
            "model": widgets.Dropdown(
                options=list(self.models), description="model", layout=wide_layout()
            ),  # fmt: skip
        }
        self.panel = RunPanel(controls, self.compute, title="Every strategy, dry-run (predicted)")
        self.widget = self.panel.widget

    def compute(self, batch: int, sequence: int, model: str) -> tuple[Figure, str]:
        lm = self.models[model]
        context = getattr(lm.config, "max_position_embeddings", None)
        if context is not None and sequence > context:
            raise ValueError(f"{model} reads at most {context:,} tokens (its context)")
        key = (model, batch, sequence)
        if key not in self.computed:
            menu = transformer_menu(len(decoder_blocks(lm)))
            self.computed[key] = strategy_rows(lm, menu, batch, sequence)
        rows, heading = self.computed[key], f"{model}, batch {batch} x {sequence}"
        return plot_strategies(rows, heading), f"{heading}\n{rows_table(rows)}"


def longest_sequences(
    workload: Workload, strategies: Sequence[str], cards: Sequence[str]
) -> dict[tuple[str, str], tuple[int, int]]:
    """(strategy name, card) -> (longest sequence, dry runs that found it): what
    ``python -m tutorial_utils estimate ... --strategies S --card C`` reads (0: not even 256)."""
    if not strategies or not cards:
        raise ValueError("give at least one strategy (e.g. 'none') and one card (e.g. '16GB')")
    parsed = [parse_strategy(name) for name in strategies]
    model = build_model(workload)  # once, on meta, for every card
    fits = {}
    for card in cards:
        result = estimate(workload, parsed, parse_card(card), model=model, search=True)
        for row in result.rows:
            if row.report is not None:
                fits[row.strategy.name, card] = (row.largest or 0, row.trials)
    return fits


def fit_table(fits: Mapping[tuple[str, str], tuple[int, int]]) -> str:
    """The longest sequence of each strategy (rows) on each card (columns), with its dry runs."""
    names = list(dict.fromkeys(name for name, _ in fits))
    cards = list(dict.fromkeys(card for _, card in fits))
    rows = [
        (name, *(f"{fits[name, c][0]:,} tokens ({fits[name, c][1]} runs)" for c in cards))
        for name in names
    ]
    return text_table(("strategy", *cards), rows)
