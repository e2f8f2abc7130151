"""Notebook 06's Going deeper: a ``transformers`` model at full size, predicted by dry runs.

The notebook's core (the Trainer flag, the model's method, LoRA, the reentrant pitfall, the
timings) is written in its copy cells with ``tutorial_utils.tools`` alone. What is here serves the
rest: models built from configs with random weights (nothing is downloaded), at full size on the
meta device (dry runs: exact tensor bytes and FLOPs, no time: predictions, not measurements). One
module per job: ``models``, ``strategies`` (the menu of ``Strategy`` values, each applied through
``activation_checkpointing_enable``; one step under each, their tables), ``layer_memory`` (one block against Korthikanti et al.'s
formula, the attention kernel check against a real CPU step), ``pitfalls`` (what the installed
``transformers`` says and defaults to), ``reach`` (the longest sequence on a card, by ``estimate``'s engine), ``snapshot_timeline`` (a
memory snapshot drawn offline) and
``explorer`` (every strategy at the batch and sequence a learner picks, in a panel); the notebook
imports every name from here."""

from tutorial_utils.estimate.models import (
    ATTENTION,
    add_lora,
    build_causal_lm,
    decoder_blocks,
    describe_model,
    trainable_parameters,
)
from tutorial_utils.lessons.checkpointing_a_transformer.explorer import (
    StrategyExplorer,
    plot_strategies,
)
from tutorial_utils.lessons.checkpointing_a_transformer.layer_memory import (
    attention_paths,
    block_saved_bytes,
    korthikanti_layer_bytes,
    layer_formula_table,
)
from tutorial_utils.lessons.checkpointing_a_transformer.models import (
    SIZES,
    Sizes,
    adamw,
    gpt2_small_config,
    llama_1b_config,
    sizes_for,
    small_gpt2_config,
    small_llama_config,
)
from tutorial_utils.lessons.checkpointing_a_transformer.pitfalls import (
    checkpointing_messages,
    default_use_reentrant,
    versions,
)
from tutorial_utils.lessons.checkpointing_a_transformer.reach import (
    Fit,
    fit_table,
    longest_sequences,
)
from tutorial_utils.lessons.checkpointing_a_transformer.snapshot_timeline import (
    plot_snapshot_timeline,
)
from tutorial_utils.lessons.checkpointing_a_transformer.strategies import (
    DRY_COLUMNS,
    OFFLOAD_NOT_RUN,
    breakdown_table,
    lm_step,
    rows_table,
    strategy_rows,
    token_batch,
    transformer_menu,
)

__all__ = [
    "ATTENTION",
    "DRY_COLUMNS",
    "Fit",
    "OFFLOAD_NOT_RUN",
    "SIZES",
    "Sizes",
    "StrategyExplorer",
    "adamw",
    "add_lora",
    "attention_paths",
    "block_saved_bytes",
    "breakdown_table",
    "build_causal_lm",
    "checkpointing_messages",
    "decoder_blocks",
    "default_use_reentrant",
    "describe_model",
    "fit_table",
    "gpt2_small_config",
    "korthikanti_layer_bytes",
    "layer_formula_table",
    "llama_1b_config",
    "lm_step",
    "longest_sequences",
    "plot_snapshot_timeline",
    "plot_strategies",
    "rows_table",
    "sizes_for",
    "small_gpt2_config",
    "small_llama_config",
    "transformer_menu",
    "strategy_rows",
    "token_batch",
    "trainable_parameters",
    "versions",
]
