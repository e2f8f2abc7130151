"""The mechanics behind notebook 02 (VGG16 on dogs vs cats), one module per part of the notebook.

The notebook imports this one name (``from tutorial_utils.lessons import vgg16_dogcat as
lesson``); the parts: ``runs`` (the two training runs against the article's figures),
``step_time`` (a checkpointed step timed against a plain one), ``activations`` (one step op by
op, saved activations, dry-run sweeps), ``panel`` (the segment explorer) and ``pitfalls``.
"""

from tutorial_utils.lessons.vgg16_dogcat.activations import (
    ARTICLE_BATCH,
    ARTICLE_INPUT,
    ActivationAccount,
    ModuleActivations,
    after_forward_bytes,
    article_batch,
    best_uniform_split,
    checkpointed_flops_ratio,
    dry_run_sweep,
    format_sweep,
    plot_saved_activations,
    saved_activations,
    step_timelines,
)
from tutorial_utils.lessons.vgg16_dogcat.panel import (
    ARTICLE_SCALE,
    MACHINE_SCALE,
    SCALES,
    SegmentExplorer,
    sqrt_rule,
)
from tutorial_utils.lessons.vgg16_dogcat.pitfalls import (
    SegmentGradients,
    TorchCheckpointSequential,
    backward_error,
    dropout_segments,
    forward_call_counts,
    gradients_per_segment,
    inplace_modules_at_checkpoint_starts,
    vgg16_flat_inplace,
)
from tutorial_utils.lessons.vgg16_dogcat.runs import (
    ARTICLE,
    RunSummary,
    Sizes,
    comparison_statements,
    comparison_table,
    epoch_timing,
    fresh_cuda_state,
    plot_ratio_comparison,
    run_state_report,
    sgd_momentum_state_bytes,
    sizes_for,
    summarize_run,
)
from tutorial_utils.lessons.vgg16_dogcat.step_time import (
    StepTimes,
    time_plain_and_checkpointed,
    vgg16_convolutional,
)

__all__ = [
    "StepTimes",
    "fresh_cuda_state",
    "time_plain_and_checkpointed",
    "vgg16_convolutional",
    "ARTICLE",
    "ARTICLE_BATCH",
    "ARTICLE_INPUT",
    "ARTICLE_SCALE",
    "ActivationAccount",
    "MACHINE_SCALE",
    "ModuleActivations",
    "RunSummary",
    "SCALES",
    "SegmentExplorer",
    "SegmentGradients",
    "Sizes",
    "TorchCheckpointSequential",
    "after_forward_bytes",
    "article_batch",
    "backward_error",
    "best_uniform_split",
    "checkpointed_flops_ratio",
    "comparison_statements",
    "comparison_table",
    "dropout_segments",
    "dry_run_sweep",
    "epoch_timing",
    "format_sweep",
    "forward_call_counts",
    "gradients_per_segment",
    "inplace_modules_at_checkpoint_starts",
    "plot_ratio_comparison",
    "plot_saved_activations",
    "run_state_report",
    "saved_activations",
    "sgd_momentum_state_bytes",
    "sizes_for",
    "sqrt_rule",
    "step_timelines",
    "summarize_run",
    "vgg16_flat_inplace",
]
