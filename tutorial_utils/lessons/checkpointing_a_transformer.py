"""Notebook 06's mechanics: a ``transformers`` model checkpointed the ways people do it today.

Models are built from configs with random weights (``AutoModelForCausalLM.from_config``: nothing
is downloaded), at full size on the meta device (dry runs: exact tensor bytes and FLOPs, no
time) and at a small size on the CPU (real steps: time). Every strategy is a setting of
``activation_checkpointing_enable`` (``TransformerStrategy.apply``), so the same step function
measures all of them; rows carry how they were obtained (``source``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import transformers
from matplotlib.figure import Figure
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig
from transformers.modeling_layers import GradientCheckpointingLayer

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.blocks import checkpointed_blocks
from tutorial_utils.checkpointing.selective import (
    ATTENTION_OPS,
    MATRIX_PRODUCT_OPS,
    selective_context_fn,
)
from tutorial_utils.display.plotting import figure_subtitle
from tutorial_utils.display.tables import columns_table, text_table
from tutorial_utils.display.widgets import RunPanel, batch_size_slider, int_slider
from tutorial_utils.lessons.choosing_what_to_checkpoint import pareto_front
from tutorial_utils.measurement.batch_search import largest_fitting
from tutorial_utils.measurement.gradients import named_gradients
from tutorial_utils.measurement.meta_attention import dry_run_context, unpacked_batches_on_meta
from tutorial_utils.measurement.saved_tensors import OUTSIDE, saved_bytes_per_module
from tutorial_utils.measurement.step import StepReport, measure_step, next_token_loss
from tutorial_utils.measurement.timing import Timing, time_interleaved, time_verdict
from tutorial_utils.measurement.tracker import CATEGORIES, MemoryLimitExceeded, TensorMemoryTracker
from tutorial_utils.units import MB, ratio

GB = 1e9  # cards are sold in decimal gigabytes
ATTENTION = "sdpa"  # what transformers picks by default, and what users run


# -- sizes per profile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """What runs for real on this machine; dry runs are at full size in every profile."""

    small_layers: int  # the small Llama of the real steps
    small_hidden: int
    small_batch: int
    small_sequence: int
    repeats: int  # timed steps per strategy (the fastest is reported)
    fit_strategies: tuple[str, ...]  # strategies searched for the longest sequence (all: ())


SIZES = {
    "ci": Sizes(2, 128, 2, 128, 1, ("none", "every block (default)")),
    "cpu": Sizes(4, 256, 2, 256, 7, ()),
    "gpu": Sizes(8, 512, 8, 1024, 7, ()),
    "article": Sizes(8, 512, 8, 1024, 7, ()),
}


def sizes_for(profile: Profile) -> Sizes:
    """This notebook's sizes for a profile; ``TUTORIAL_STEPS`` caps the timed repeats."""
    try:
        sizes = SIZES[profile.name]
    except KeyError:
        raise ValueError(
            f"no notebook-06 sizes for profile {profile.name!r}: add it to SIZES "
            f"(known: {', '.join(SIZES)})"
        ) from None
    return replace(sizes, repeats=profile.capped(sizes.repeats) or sizes.repeats)


# -- the models ----------------------------------------------------------------------------------


def gpt2_small_config(**overrides) -> GPT2Config:
    """GPT-2 small (124 M parameters, 12 layers, hidden 768, 12 heads, context 1024)."""
    return GPT2Config(bos_token_id=0, eos_token_id=0, use_cache=False, **overrides)


def llama_1b_config(**overrides) -> LlamaConfig:
    """A Llama-3.2-1B-shaped model: 16 layers, hidden 2048, 32 query / 8 key-value heads of 64,
    SwiGLU MLP of 8192, vocabulary 128,256, tied embeddings (1.24 B parameters)."""
    sizes = {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "use_cache": False,
    }
    return LlamaConfig(**{**sizes, **overrides})


def small_llama_config(layers: int = 4, hidden: int = 128) -> LlamaConfig:
    """The same architecture at a size a CPU trains in well under a second a step."""
    return llama_1b_config(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        vocab_size=1000,
        max_position_embeddings=4096,
    )


def small_gpt2_config(layers: int = 2, hidden: int = 128) -> GPT2Config:
    """GPT-2 (with its dropout) at a CPU's size."""
    return gpt2_small_config(n_layer=layers, n_embd=hidden, n_head=4, vocab_size=1000)


def build_causal_lm(
    config, device: str = "cpu", dtype: torch.dtype | None = None, seed: int = 0
) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` with random weights, SDPA attention, in train mode.

    On ``device="meta"`` nothing is allocated or initialised: a model of any size in a second.
    """
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION, dtype=dtype)
    return model.train()


def add_lora(
    model: nn.Module,
    rank: int = 8,
    targets: Sequence[str] | None = None,
    *,
    start_trained: bool = False,
) -> nn.Module:
    """LoRA adapters (``peft``) on a frozen base: only the adapters train.

    ``peft`` starts every adapter's B at zero, which makes A's first gradient exactly zero;
    ``start_trained`` draws B as after some training, so every adapter has a gradient to compare.
    """
    targets = list(targets or ["q_proj", "k_proj", "v_proj", "o_proj"])
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0)
    with warnings.catch_warnings():  # peft reads a property transformers has renamed
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        lora = get_peft_model(model, config)
    if start_trained:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, parameter in lora.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
    return lora


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated layers ``transformers`` checkpoints (``GradientCheckpointingLayer``)."""
    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no GradientCheckpointingLayer blocks")
    return blocks


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def adamw(parameters) -> torch.optim.Optimizer:
    """Fine-tuning's optimizer: AdamW over the parameters that train."""
    return torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=1e-4)


def describe_model(model: nn.Module) -> str:
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in trainable_parameters(model))
    dtype = next(model.parameters()).dtype
    blocks = len(decoder_blocks(model))
    return (
        f"{type(model).__name__}: {total / 1e6:,.1f} M parameters ({trained / 1e6:,.2f} M trained), "
        f"{blocks} decoder blocks, {str(dtype).removeprefix('torch.')}, attention {ATTENTION}"
    )


# -- the strategies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerStrategy:
    """One way to checkpoint a ``transformers`` model: a call of ``activation_checkpointing_enable``."""

    name: str
    kind: str  # none | full | every-n | selective | offload
    use_reentrant: bool = False
    every_n_layers: int = 1
    saved_ops: frozenset = field(default_factory=frozenset)
    offload: bool = False

    def checkpoint_kwargs(self) -> dict:
        """What goes to ``torch.utils.checkpoint.checkpoint`` through transformers."""
        kwargs: dict = {"use_reentrant": self.use_reentrant}
        if self.saved_ops:
            kwargs["context_fn"] = selective_context_fn(self.saved_ops)
        return kwargs

    def apply(self, model: nn.Module) -> nn.Module:
        """Switch ``model`` to this strategy (from whatever it had before)."""
        if self.offload and next(model.parameters()).device.type != "cuda":
            raise ValueError(f"{self.name!r} moves activations off a GPU: run it on CUDA")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if base.is_activation_checkpointing:
            base.activation_checkpointing_disable()
        base.disable_input_require_grads()  # enabling adds the hook: "none" must not keep it
        if self.kind != "none":
            base.activation_checkpointing_enable(
                activation_checkpointing_kwargs=self.checkpoint_kwargs(),
                every_n_layers=self.every_n_layers,
                offload=self.offload,
            )
        return model


def strategy_menu(layers: int, *, on_cuda: bool = False) -> list[TransformerStrategy]:
    """None, every block (reentrant and not), every 2nd and 4th block, two selective policies,
    and offloading where there is a GPU to offload from."""
    menu = [
        TransformerStrategy("none", "none"),
        TransformerStrategy("every block, use_reentrant=True", "full", use_reentrant=True),
        TransformerStrategy("every block (default)", "full"),
    ]
    menu += [
        TransformerStrategy(f"every {nth} block", "every-n", every_n_layers=n)
        for n, nth in ((2, "2nd"), (4, "4th"))
        if n < layers
    ]
    menu += [
        TransformerStrategy("selective: save matmuls", "selective", saved_ops=MATRIX_PRODUCT_OPS),
        TransformerStrategy(
            "selective: save matmuls + attention",
            "selective",
            saved_ops=MATRIX_PRODUCT_OPS | ATTENTION_OPS,
        ),
    ]
    if on_cuda:
        menu.append(TransformerStrategy("every block, offloaded", "offload", offload=True))
    return menu


OFFLOAD_NOTE = (
    "offloading (activation_checkpointing_enable(offload=True)) keeps the checkpoints in pinned "
    "host memory instead of GPU memory; on a CPU they are in host memory already, so there is "
    "nothing to measure here: not run"
)


# -- one step, every strategy ---------------------------------------------------------------------


def token_batch(batch: int, sequence: int, device: str, vocab_size: int) -> torch.Tensor:
    """Random token ids (values only matter on a real device)."""
    if batch < 1 or sequence < 2:
        raise ValueError(f"need batch >= 1 and sequence >= 2 tokens, got {batch}, {sequence}")
    if device == "meta":
        return torch.empty(batch, sequence, dtype=torch.long, device="meta")
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (batch, sequence), generator=generator).to(device)


def lm_step(
    model: nn.Module,
    strategy: TransformerStrategy,
    batch: int,
    sequence: int,
    *,
    repeats: int = 1,
    timed: bool = True,
    limit_bytes: int | None = None,
    record_timeline: bool = False,
) -> StepReport:
    """One AdamW training step of ``model`` under ``strategy``: a dry run on meta, else real
    (``timed``: the fastest of ``repeats`` untracked steps, after a warm-up)."""
    device = next(model.parameters()).device.type
    ids = token_batch(batch, sequence, device, model.config.vocab_size)
    strategy.apply(model)
    return measure_step(
        model,
        ids,
        ids,
        0,
        adamw(model.parameters()),
        next_token_loss,
        device,
        repeats=repeats,
        time_step=timed and device != "meta" and limit_bytes is None,
        limit_bytes=limit_bytes,
        record_timeline=record_timeline,
    )


def strategy_rows(
    model: nn.Module,
    menu: Sequence[TransformerStrategy],
    batch: int,
    sequence: int,
    *,
    repeats: int = 1,
) -> list[dict]:
    """One ``lm_step`` per strategy, as rows; ratios to the first (which should be "none").

    On a real device the memory comes from one tracked step each, and the time from ``repeats``
    rounds that alternate the strategies, one timed step each (after a warm-up), so that a shared
    machine's changing load falls on all of them; the fastest of each is reported.
    """
    reports = [lm_step(model, strategy, batch, sequence, timed=False) for strategy in menu]
    device = next(model.parameters()).device.type
    timings: list[Timing | None] = [None] * len(menu)
    if device != "meta":
        ids = token_batch(batch, sequence, device, model.config.vocab_size)
        steps, switches = {}, {}
        for index, strategy in enumerate(menu):
            optimizer = adamw(model.parameters())

            def step(optimizer=optimizer) -> None:
                optimizer.zero_grad(set_to_none=True)
                next_token_loss(model(ids), ids).backward()
                optimizer.step()

            switches[index] = partial(strategy.apply, model)  # untimed, before each turn
            switches[index]()
            step()  # warm-up: creates AdamW's state
            steps[index] = step
        sync = torch.cuda.synchronize if device == "cuda" else lambda: None
        measured = time_interleaved(steps, repeats, sync, setups=switches)
        model.zero_grad(set_to_none=True)
        timings = [measured[index] for index in range(len(menu))]
    rows = []
    for strategy, report, timing in zip(menu, reports, timings, strict=True):
        rows.append(
            {
                "checkpointing": strategy.name,
                "kind": strategy.kind,
                "tracked_peak_mb": report.peak_mb,
                "activations_mb": report.breakdown["activations"] / MB,
                "activation_peak_mb": report.activation_peak_mb,
                "step_seconds": None if timing is None else timing.fastest,
                "step_timing": timing,
                "recompute_gflop": None if report.flops is None else report.flops.recompute / 1e9,
                "step_gflop": None if report.flops is None else report.flops.total / 1e9,
                "source": report.source,
            }
        )
    menu[0].apply(model)
    base = rows[0]
    for row in rows:
        row["peak_ratio"] = row["tracked_peak_mb"] / base["tracked_peak_mb"]
        row["time_ratio"] = ratio(row["step_seconds"], base["step_seconds"])
        row["flops_ratio"] = ratio(row["step_gflop"], base["step_gflop"])
    return rows


DRY_COLUMNS = (
    ("checkpointing", "strategy", "{}"),
    ("tracked_peak_mb", "peak MB", "{:,.0f}"),
    ("activation_peak_mb", "activations MB", "{:,.0f}"),
    ("peak_ratio", "peak vs none", "{:.2f}"),
    ("recompute_gflop", "recompute GFLOP", "{:,.0f}"),
    ("flops_ratio", "FLOPs vs none", "{:.2f}"),
)
REAL_COLUMNS = (
    ("checkpointing", "strategy", "{}"),
    ("tracked_peak_mb", "peak MB", "{:,.1f}"),
    ("activation_peak_mb", "activations MB", "{:,.1f}"),
    ("peak_ratio", "peak vs none", "{:.2f}"),
    ("step_seconds", "step s", "{:.3f}"),
    ("time_ratio", "time vs none", "{:.2f}"),
)


def breakdown_table(reports: dict[str, StepReport]) -> str:
    """The tracked peak of each step split by category, in MB, headed by how it was obtained."""
    names = {"optimizer_state": "optimizer", "activations": "activations/other"}
    width = max(map(len, reports))
    header = f"{'':<{width}}" + "".join(f"  {names.get(c, c):>17}" for c in CATEGORIES)
    lines = [next(iter(reports.values())).source, header + f"  {'tracked peak':>13}"]
    for label, report in reports.items():
        cells = "".join(f"  {report.breakdown[c] / MB:>17,.0f}" for c in CATEGORIES)
        lines.append(f"{label:<{width}}{cells}  {report.peak_mb:>13,.0f}")
    return "\n".join(lines)


def rows_table(rows: Sequence[dict]) -> str:
    """Rows as an aligned table headed by how they were obtained (FLOPs for dry runs, seconds
    for real steps)."""
    columns = DRY_COLUMNS if rows[0]["step_seconds"] is None else REAL_COLUMNS
    return rows[0]["source"] + "\n" + columns_table(rows, columns)


def real_against_dry_run_table(real_rows: Sequence[dict], dry_rows: Mapping[str, dict]) -> str:
    """Each real step's time against the first strategy's, read against the repeats' noise and
    the dry run's FLOP ratio, and how far its tracked peak is from the dry run's."""
    reference = real_rows[0]["step_timing"]
    if reference is None:
        raise ValueError("the real rows have no timings: measure them on a real device")
    rows = []
    for real in real_rows:
        dry = dry_rows.get(real["checkpointing"])
        flops = None if dry is None else dry["flops_ratio"]
        peak_gap = (
            "no dry run (offloading)"
            if dry is None
            else f"{(real['tracked_peak_mb'] - dry['tracked_peak_mb']) * MB:,.0f} bytes"
        )
        rows.append(
            (
                real["checkpointing"],
                real["step_timing"].describe(),
                time_verdict(real["step_timing"], reference, flops),
                peak_gap,
            )
        )
    header = ("strategy", "step time, fastest (range)", "time vs none", "peak real - dry run")
    return text_table(header, rows, "lllr")


KIND_STYLES = {
    "none": ("black", "s"),
    "full": ("#4c72b0", "o"),
    "every-n": ("#8c8c8c", "D"),
    "selective": ("#55a868", "^"),
    "offload": ("#8172b3", "v"),
}


def plot_strategies(rows: Sequence[dict], title: str, highlight: str | None = None) -> Figure:
    """Peak against recompute FLOPs for every strategy (dry runs), the Pareto front joined."""
    if any(row["recompute_gflop"] is None for row in rows):
        raise ValueError("rows without FLOPs: plot the rows of a dry run (a model on meta)")
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    plt.close(fig)
    for kind, (color, marker) in KIND_STYLES.items():
        points = [row for row in rows if row["kind"] == kind]
        if points:
            ax.scatter(
                [r["recompute_gflop"] for r in points],
                [r["tracked_peak_mb"] / 1024 for r in points],
                c=color,
                marker=marker,
                s=50,
                label=kind,
                zorder=3,
            )
    front = pareto_front(rows, "recompute_gflop", "tracked_peak_mb")
    ax.step(
        [r["recompute_gflop"] for r in front],
        [r["tracked_peak_mb"] / 1024 for r in front],
        where="post",
        color="#c44e52",
        alpha=0.4,
        label="Pareto front",
    )
    labels: dict[tuple[float, float], list[str]] = {}  # strategies on the same point share one
    for row in rows:
        point = (row["recompute_gflop"], row["tracked_peak_mb"] / 1024)
        labels.setdefault(point, []).append(row["checkpointing"])
    for point, names in labels.items():
        chosen = highlight in names
        ax.annotate(
            " = ".join(names),
            point,
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8 if chosen else 7,
            fontweight="bold" if chosen else "normal",
        )
        if chosen:
            ax.scatter(
                [point[0]],
                [point[1]],
                s=260,
                facecolors="none",
                edgecolors="#c44e52",
                linewidths=2,
                zorder=4,
            )
    ax.set_xlabel("recompute GFLOP per step (counted in the dry run)")
    ax.set_ylabel("tracked peak (GiB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"{title}\n{rows[0]['source']} · {figure_subtitle('meta')}", fontsize=10)
    fig.tight_layout()
    return fig


class StrategyExplorer:
    """Sliders for sequence length, batch and strategy over dry runs of one model on meta.

    ``compute(sequence, batch, strategy)`` runs every strategy at that size once (cached), and
    returns the Pareto plot with the chosen strategy ringed and its row against "none".
    """

    def __init__(
        self, model: nn.Module, title: str, *, sequence: int, batch: int, max_sequence: int
    ):
        self.model = model
        self.title = title
        self.menu = strategy_menu(len(decoder_blocks(model)))
        self.computed: dict[tuple[int, int], list[dict]] = {}
        names = [s.name for s in self.menu]
        strategy = widgets.SelectionSlider(
            options=names,
            value=names[2],
            description="strategy",
            continuous_update=False,
            style={"description_width": "initial"},
            layout=widgets.Layout(width="100%", max_width="640px"),
        )
        controls = {
            "sequence": int_slider("sequence length (tokens)", sequence, 64, max_sequence),
            "batch": batch_size_slider(max_batch=32, value=batch),
            "strategy": strategy,
        }
        self.panel = RunPanel(controls, self.compute, title=title)
        self.widget = self.panel.widget

    def rows(self, sequence: int, batch: int) -> list[dict]:
        key = (sequence, batch)
        if key not in self.computed:
            self.computed[key] = strategy_rows(self.model, self.menu, batch, sequence)
        return self.computed[key]

    def compute(self, sequence: int, batch: int, strategy: str) -> tuple[Figure, str]:
        rows = self.rows(sequence, batch)
        chosen = next(row for row in rows if row["checkpointing"] == strategy)
        figure = plot_strategies(
            rows, f"{self.title}: batch {batch}, sequence {sequence}", highlight=strategy
        )
        text = (
            f"{strategy}: peak {chosen['tracked_peak_mb']:,.0f} MB ({chosen['peak_ratio']:.2f}x "
            f"none), recompute {chosen['recompute_gflop']:,.0f} GFLOP "
            f"({chosen['flops_ratio']:.2f}x the step's FLOPs without checkpointing)"
        )
        return figure, text


# -- what one block keeps, measured and by formula -------------------------------------------------


def korthikanti_layer_bytes(
    sequence: int,
    batch: int,
    hidden: int,
    heads: int,
    *,
    element_bytes: int = 2,
    dropout: bool = True,
    attention_matrix: bool = True,
) -> int:
    """Activation bytes one transformer layer saves, by Korthikanti et al. 2022, eq. (1).

    The paper's case (the defaults: 16-bit activations, 1-byte dropout masks, the s x s attention
    matrix materialised, no recomputation) is ``s*b*h*(34 + 5*a*s/h)``: attention 11sbh + 5as^2b,
    MLP 19sbh, two LayerNorms 4sbh. The same derivation with other assumptions: elements of
    ``element_bytes``, no dropout masks or dropout outputs, no attention matrix (a fused kernel).
    """
    e, m = element_bytes, (1 if dropout else 0)
    sbh = sequence * batch * hidden
    attention = (5 * e + m) * sbh  # QKV input, Q, K, V, output-projection input, dropout mask
    mlp = (9 * e + m) * sbh  # first linear's input (h), GeLU input (4h), second's input (4h), mask
    norms = 2 * e * sbh
    matrix = heads * sequence * sequence * batch * ((2 * e + m) if dropout else e)
    return attention + mlp + norms + (matrix if attention_matrix else 0)


def block_saved_bytes(model: nn.Module, batch: int, sequence: int) -> dict[str, int]:
    """Bytes each decoder block saves for backward (no checkpointing), measured in a forward.

    On the meta device (a dry run) the attention kernel is the one a CPU step would run.
    """
    device = next(model.parameters()).device.type
    ids = token_batch(batch, sequence, device, model.config.vocab_size)
    blocks = {f"block {i}": block for i, block in enumerate(decoder_blocks(model))}
    TransformerStrategy("none", "none").apply(model)
    context = dry_run_context() if device == "meta" else contextlib.nullcontext()
    with context:
        return saved_bytes_per_module(model, blocks, lambda: next_token_loss(model(ids), ids))


def layer_formula_table(
    model: nn.Module, batch: int, sequence: int, *, element_bytes: int, dropout: bool
) -> str:
    """One block's saved bytes: measured (dry run), the paper's eq. (1), and the derivation
    redone with this model's dtype, dropout and attention kernel."""
    saved = block_saved_bytes(model, batch, sequence)
    config = model.config
    hidden, heads = config.hidden_size, config.num_attention_heads
    measured = saved["block 0"]
    paper = korthikanti_layer_bytes(sequence, batch, hidden, heads)
    fused = not dropout  # SDPA on a CPU: the flash kernel without dropout, math with it
    adapted = korthikanti_layer_bytes(
        sequence,
        batch,
        hidden,
        heads,
        element_bytes=element_bytes,
        dropout=dropout,
        attention_matrix=not fused,
    )
    adapted_label = (
        f"same derivation: {element_bytes}-byte elements, "
        f"{'dropout' if dropout else 'no dropout'}, {'no ' if fused else ''}s x s matrix"
    )
    figures = {
        "measured (dry run, saved-tensor hooks, block 0)": measured,
        "Korthikanti eq. (1): sbh(34 + 5as/h), 16-bit, dropout": paper,
        adapted_label: adapted,
    }
    width = max(map(len, figures))
    in_blocks = sum(v for k, v in saved.items() if k != OUTSIDE)
    lines = [
        f"one decoder block, batch {batch}, sequence {sequence}, hidden {hidden}, {heads} heads:"
    ]
    lines += [f"  {label:<{width}}  {value / MB:>9,.1f} MB" for label, value in figures.items()]
    lines.append(f"  measured / same derivation: {measured / adapted:.2f}")
    lines.append(
        f"  all {len(decoder_blocks(model))} blocks (measured): {in_blocks / MB:,.1f} MB; outside "
        f"the blocks (embeddings, head, loss): {saved[OUTSIDE] / MB:,.1f} MB"
    )
    return "\n".join(lines)


def attention_paths(config, batch: int, sequence: int) -> str:
    """One forward and backward at a small size: a real CPU step against two dry runs, one with
    the kernel a CPU would take (what every dry run here uses) and one with meta's default."""
    peaks = {}
    runs = (
        ("real step on the CPU (measured)", "cpu", contextlib.nullcontext),
        ("dry run, the CPU's kernel choice", "meta", dry_run_context),
        ("dry run, meta's default (math path)", "meta", unpacked_batches_on_meta),
    )
    for label, device, context in runs:
        model = build_causal_lm(config, device)
        ids = token_batch(batch, sequence, device, config.vocab_size)
        tracker = TensorMemoryTracker(model, device=device)
        with context(), tracker:
            next_token_loss(model(ids), ids).backward()
        peaks[label] = tracker.peak_bytes
    real = peaks[runs[0][0]]
    width = max(map(len, peaks))
    lines = [f"forward + backward, batch {batch}, sequence {sequence}: tracked peak"]
    for label, peak in peaks.items():
        lines.append(f"  {label:<{width}}  {peak / MB:>8.2f} MB  ({peak / real - 1:+.1%} vs real)")
    return "\n".join(lines)


# -- the pitfalls ---------------------------------------------------------------------------------


@dataclass
class GradientCheck:
    """One way of running the LoRA model: which trainable parameters got a gradient."""

    name: str
    missing: list[str]  # trainable parameters whose .grad is None
    trainable: int
    max_difference: float | None  # largest |grad - reference grad| over the others
    warnings: list[str]
    error: str | None = None

    @property
    def matches(self) -> bool:
        """Every trainable parameter has the un-checkpointed run's gradient (to 1e-5)."""
        return (
            self.error is None
            and not self.missing
            and self.max_difference is not None
            and self.max_difference < 1e-5
        )


def _gradients(model: nn.Module, ids: torch.Tensor) -> tuple[dict, list[str], str | None]:
    model.zero_grad(set_to_none=True)
    caught: list[str] = []
    error = None
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        try:
            next_token_loss(model(ids), ids).backward()
        except RuntimeError as failure:
            error = str(failure).splitlines()[0]
    caught = sorted({str(r.message) for r in records})
    return named_gradients(model), caught, error


def lora_pitfall(model: nn.Module, sequence: int = 32, batch: int = 2) -> list[GradientCheck]:
    """Frozen base + LoRA + reentrant checkpointing, by hand and through ``transformers``.

    The reference is the un-checkpointed run. A hand-written reentrant wrapper around every
    block fails (the loss has no gradient path); around every other block it runs silently and
    the first block's adapters get none. The fixes: ``enable_input_require_grads()``, or
    ``use_reentrant=False``; and ``activation_checkpointing_enable`` does the first by itself.
    """
    base = model.get_base_model()
    ids = token_batch(batch, sequence, "cpu", base.config.vocab_size)
    blocks = decoder_blocks(model)
    reference, _, _ = _gradients(model, ids)

    def check(name: str, grads, caught, error) -> GradientCheck:
        missing = [n for n, g in grads.items() if g is None]
        present = [(g, reference[n]) for n, g in grads.items() if g is not None]
        difference = max((float((g - r).abs().max()) for g, r in present), default=None)
        return GradientCheck(name, missing, len(grads), difference, caught, error)

    checks = [check("no checkpointing (the reference)", reference, [], None)]
    cases: list[tuple[str, Callable[[], contextlib.AbstractContextManager]]] = [
        (
            "by hand, reentrant, every block",
            lambda: checkpointed_blocks(blocks, use_reentrant=True),
        ),
        (
            "by hand, reentrant, every other block",
            lambda: checkpointed_blocks(blocks[::2], use_reentrant=True),
        ),
        (
            "fix 1: by hand, reentrant, every block + enable_input_require_grads()",
            lambda: _with_input_require_grads(base, blocks),
        ),
        (
            "fix 2: by hand, use_reentrant=False, every block",
            lambda: checkpointed_blocks(blocks, use_reentrant=False),
        ),
        (
            "activation_checkpointing_enable(use_reentrant=True)",
            lambda: _through_transformers(base, use_reentrant=True),
        ),
    ]
    for name, setting in cases:
        with setting():
            checks.append(check(name, *_gradients(model, ids)))
    return checks


@contextlib.contextmanager
def _with_input_require_grads(base: nn.Module, blocks: list[nn.Module]) -> Iterator[None]:
    base.enable_input_require_grads()
    try:
        with checkpointed_blocks(blocks, use_reentrant=True):
            yield
    finally:
        base.disable_input_require_grads()


@contextlib.contextmanager
def _through_transformers(base: nn.Module, use_reentrant: bool) -> Iterator[None]:
    base.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": use_reentrant}
    )
    try:
        yield
    finally:
        base.activation_checkpointing_disable()
        base.disable_input_require_grads()


def pitfall_table(checks: Sequence[GradientCheck]) -> str:
    """Each run: trainable parameters without a gradient, and whether the rest match."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'run':<{width}}  {'no grad':>9}  gradients equal the reference"]
    for c in checks:
        if c.error:
            verdict = f"no: backward failed ({c.error})"
        elif c.missing:
            verdict = f"no: {len(c.missing)} of {c.trainable} missing (first: {c.missing[0]})"
        else:
            verdict = f"yes (max |difference| {c.max_difference:.1e})"
        missing = "all" if c.error else f"{len(c.missing)}/{c.trainable}"
        lines.append(f"{c.name:<{width}}  {missing:>9}  {verdict}")
    return "\n".join(lines)


def checkpointing_messages(model: nn.Module, ids: torch.Tensor) -> list[str]:
    """What transformers and torch print when a checkpointed model is called with
    ``use_cache=True`` through the deprecated ``gradient_checkpointing_enable`` alias."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    hf_logging = transformers.utils.logging
    hf_logging.disable_default_handler()  # collected here, not printed to stderr as well
    hf_logging.warning_once.cache_clear()  # shown once per process otherwise
    try:
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            model.gradient_checkpointing_enable()
            model(ids, use_cache=True)
    finally:
        logger.removeHandler(handler)
        hf_logging.enable_default_handler()
        model.activation_checkpointing_disable()
    return [str(r.message) for r in records if r.category is FutureWarning] + messages


def default_use_reentrant(model: nn.Module) -> bool:
    """What ``activation_checkpointing_enable()`` with no arguments passes to ``checkpoint``."""
    model.activation_checkpointing_enable()
    try:
        return decoder_blocks(model)[0]._gradient_checkpointing_func.keywords["use_reentrant"]
    finally:
        model.activation_checkpointing_disable()


def versions() -> str:
    import peft

    return f"transformers {transformers.__version__}, peft {peft.__version__}"


# -- how far it goes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """The longest sequence whose step fits a card, found by dry runs."""

    strategy: str
    card: str
    budget_bytes: int
    sequence: int  # tokens; 0 if not even one unit fits
    peak_bytes: int | None  # the dry run's peak at ``sequence``
    trials: int  # dry runs that searched for it (besides the two shared predicting ones)


def longest_sequences(
    model: nn.Module,
    strategy: TransformerStrategy,
    budgets: dict[str, int],
    *,
    batch: int = 1,
    unit: int = 256,
    max_sequence: int = 131072,
) -> list[Fit]:
    """For each card in ``budgets``, the longest multiple of ``unit`` tokens whose step's tracked
    peak fits its budget.

    Two dry runs predict a start (the peak grows about linearly in the sequence once attention
    keeps no s x s matrix), then ``largest_fitting`` confirms each answer by dry runs that stop as
    soon as they exceed the budget: the answers are measured, the line only saves trials.
    """
    if not budgets or min(budgets.values()) <= 0 or unit < 2:
        raise ValueError(f"need positive budgets_bytes and unit >= 2, got {budgets}, {unit}")
    low, high = (lm_step(model, strategy, batch, n * unit).peak_bytes for n in (1, 2))
    slope = max(high - low, 1)
    fits = []
    for card, budget in budgets.items():
        peaks: dict[int, int] = {}  # units -> peak bytes of the trials that fit
        tried: list[int] = []

        def fits_in(units: int, budget: int = budget, peaks: dict = peaks, tried=tried) -> bool:
            tried.append(units)
            try:
                report = lm_step(model, strategy, batch, units * unit, limit_bytes=budget)
            except MemoryLimitExceeded:
                return False
            peaks[units] = report.peak_bytes
            return True

        start = max(1, math.floor(1 + (budget - low) / slope))
        best = largest_fitting(fits_in, max_sequence // unit, start=start)
        fits.append(Fit(strategy.name, card, budget, best * unit, peaks.get(best), len(tried)))
    return fits


def card_budget(gib: int) -> int:
    """A card's tensor budget: its memory less 10% for the CUDA context, kernel workspaces and
    the allocator's fragmentation, which the tracker does not see (an assumption, not measured)."""
    return int(0.9 * gib * 2**30)


def fit_table(fits: Sequence[Fit]) -> str:
    cards = list(dict.fromkeys(f.card for f in fits))
    names = list(dict.fromkeys(f.strategy for f in fits))
    by = {(f.strategy, f.card): f for f in fits}
    width = max(len(n) for n in names)
    header = f"{'strategy':<{width}}" + "".join(f"  {card:>22}" for card in cards)
    lines = [header]
    for name in names:
        cells = []
        for card in cards:
            fit = by[(name, card)]
            cells.append(f"{fit.sequence:>9,} tokens ({fit.trials:>2} runs)")
        lines.append(f"{name:<{width}}" + "".join(f"  {c:>22}" for c in cells))
    return "\n".join(lines)
