"""The ways to checkpoint a ``transformers`` model (each a call of
``activation_checkpointing_enable``), one training step under each, and their tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn as nn

from tutorial_utils.checkpointing.selective import (
    ATTENTION_OPS,
    MATRIX_PRODUCT_OPS,
    selective_context_fn,
)
from tutorial_utils.checkpointing.transformers_api import (
    disable_checkpointing,
    enable_checkpointing,
)
from tutorial_utils.display.tables import columns_table, text_table
from tutorial_utils.lessons.checkpointing_a_transformer.models import (
    CausalLM,
    adamw,
)
from tutorial_utils.measurement.gradients import named_gradients
from tutorial_utils.measurement.step import StepReport, measure_step, next_token_loss
from tutorial_utils.measurement.timing import Timing, time_interleaved, time_verdict
from tutorial_utils.measurement.tracker import CATEGORIES, TensorMemoryTracker
from tutorial_utils.units import MB, ratio

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

    def apply(self, model: CausalLM) -> CausalLM:
        """Switch ``model`` to this strategy (from whatever it had before)."""
        if self.offload and next(model.parameters()).device.type != "cuda":
            raise ValueError(f"{self.name!r} moves activations off a GPU: run it on CUDA")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        disable_checkpointing(base)  # and the input hook enabling adds: "none" must not keep it
        if self.kind != "none":
            enable_checkpointing(
                base,
                self.checkpoint_kwargs(),
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
    model: CausalLM,
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
    model: CausalLM,
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
    rows: list[dict[str, Any]] = []
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
    ("tracked_peak_mb", "peak MiB", "{:,.0f}"),
    ("activation_peak_mb", "activations MiB", "{:,.0f}"),
    ("peak_ratio", "peak vs none", "{:.2f}"),
    ("recompute_gflop", "recompute GFLOP", "{:,.0f}"),
    ("flops_ratio", "FLOPs vs none", "{:.2f}"),
)
REAL_COLUMNS = (
    ("checkpointing", "strategy", "{}"),
    ("tracked_peak_mb", "peak MiB", "{:,.1f}"),
    ("activation_peak_mb", "activations MiB", "{:,.1f}"),
    ("peak_ratio", "peak vs none", "{:.2f}"),
    ("step_seconds", "step s", "{:.3f}"),
    ("time_ratio", "time vs none", "{:.2f}"),
)


def breakdown_table(reports: dict[str, StepReport]) -> str:
    """The tracked peak of each step split by category, in MiB, headed by how it was obtained."""
    names = {"optimizer_state": "optimizer", "activations": "activations/other"}
    rows = [
        (
            label,
            *(f"{report.breakdown[c] / MB:,.0f}" for c in CATEGORIES),
            f"{report.peak_mb:,.0f}",
        )
        for label, report in reports.items()
    ]
    header = ("MiB", *(names.get(c, c) for c in CATEGORIES), "tracked peak")
    return next(iter(reports.values())).source + "\n" + text_table(header, rows)


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


def activation_peak_and_gradients(
    model: nn.Module, ids: torch.Tensor
) -> tuple[int, dict[str, torch.Tensor | None]]:
    """One forward and backward of a causal LM on ``ids`` as the model is set up now: the most
    activation memory alive at any moment (bytes, measured) and the trainable parameters' gradients."""
    model.zero_grad(set_to_none=True)
    with TensorMemoryTracker(model, inputs=(ids,)) as tracker:
        next_token_loss(model(ids), ids).backward()
    gradients = named_gradients(model)
    model.zero_grad(set_to_none=True)
    return tracker.activation_peak_bytes, gradients
