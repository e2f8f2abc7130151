"""What one decoder block keeps, measured and by Korthikanti et al.'s formula, and the dry run's
attention kernel checked against a real CPU step."""

from __future__ import annotations

import contextlib

from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING
from tutorial_utils.display.tables import text_table
from tutorial_utils.estimate.models import (
    build_causal_lm,
    decoder_blocks,
)
from tutorial_utils.lessons.checkpointing_a_transformer.models import (
    CausalLM,
)
from tutorial_utils.lessons.checkpointing_a_transformer.strategies import token_batch
from tutorial_utils.measurement.meta_attention import dry_run_context, unpacked_batches_on_meta
from tutorial_utils.measurement.saved_tensors import OUTSIDE, saved_bytes_per_module
from tutorial_utils.measurement.step import next_token_loss
from tutorial_utils.measurement.tracker import TensorMemoryTracker
from tutorial_utils.units import MiB

__all__ = ["attention_paths", "block_saved_bytes", "korthikanti_layer_bytes", "layer_formula_table"]

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


def block_saved_bytes(model: CausalLM, batch: int, sequence: int) -> dict[str, int]:
    """Bytes each decoder block saves for backward (no checkpointing), measured in a forward.

    On the meta device (a dry run) the attention kernel is the one a CPU step would run.
    """
    device = next(model.parameters()).device.type
    ids = token_batch(batch, sequence, device, model.config.vocab_size)
    blocks = {f"block {i}": block for i, block in enumerate(decoder_blocks(model))}
    context = dry_run_context() if device == "meta" else contextlib.nullcontext()
    with context, NO_CHECKPOINTING.applied(model):
        return saved_bytes_per_module(model, blocks, lambda: next_token_loss(model(ids), ids))


def layer_formula_table(
    model: CausalLM, batch: int, sequence: int, *, element_bytes: int, dropout: bool
) -> str:
    """One block's saved bytes: counted in a dry run (a prediction, not a measurement), the
    paper's eq. (1), and the derivation redone with this model's dtype, dropout and attention
    kernel."""
    saved = block_saved_bytes(model, batch, sequence)
    config = model.config
    hidden, heads = config.hidden_size, config.num_attention_heads
    counted = saved["block 0"]
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
        "dry run (saved-tensor hooks, block 0)": counted,
        "Korthikanti eq. (1): sbh(34 + 5as/h), 16-bit, dropout": paper,
        adapted_label: adapted,
    }
    width = max(map(len, figures))
    in_blocks = sum(v for k, v in saved.items() if k != OUTSIDE)
    lines = [
        f"one decoder block, batch {batch}, sequence {sequence}, hidden {hidden}, {heads} heads:"
    ]
    lines += [f"  {label:<{width}}  {value / MiB:>9,.1f} MiB" for label, value in figures.items()]
    lines.append(f"  dry run / same derivation: {counted / adapted:.2f}")
    lines.append(
        f"  all {len(decoder_blocks(model))} blocks (dry run): {in_blocks / MiB:,.1f} MiB; outside "
        f"the blocks (embeddings, head, loss): {saved[OUTSIDE] / MiB:,.1f} MiB"
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
    rows = [
        (label, f"{peak / MiB:.2f}", f"{peak / real - 1:+.1%}") for label, peak in peaks.items()
    ]
    title = f"forward + backward, batch {batch}, sequence {sequence}: tracked peak"
    return title + "\n" + text_table(("run", "MiB", "vs real"), rows)
