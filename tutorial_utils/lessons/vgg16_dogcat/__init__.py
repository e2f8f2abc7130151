"""The mechanics behind notebook 02 (VGG16 on dogs vs cats), one module per part of the notebook.

Section 1's experiment lives in the notebook's own cells, on ``tutorial_utils.tools`` alone; the
rest imports this one name (``from tutorial_utils.lessons import vgg16_dogcat as lesson``). The
parts: ``activations`` (section 2's step op by op, saved activations drawn, dry-run sweeps;
``saved_activations`` measures them in ``measurement.saved_tensors``), ``runs`` (the article's two
training runs against its figures), ``panel`` (the segment explorer) and ``pitfalls`` (reentrant
mode, Dropout, the last segment).
"""

from tutorial_utils.lessons.vgg16_dogcat.activations import (
    ARTICLE_BATCH,
    ARTICLE_INPUT,
    after_forward_bytes,
    article_batch,
    best_uniform_split,
    checkpointed_flops_ratio,
    dry_run_sweep,
    format_sweep,
    plot_saved_activations,
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
    dropout_segments,
    forward_call_counts,
    gradients_per_segment,
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
from tutorial_utils.measurement.saved_tensors import (
    ActivationAccount,
    ModuleActivations,
    saved_activations,
)

__all__ = [
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
    "after_forward_bytes",
    "article_batch",
    "best_uniform_split",
    "checkpointed_flops_ratio",
    "comparison_statements",
    "comparison_table",
    "dropout_segments",
    "dry_run_sweep",
    "epoch_timing",
    "format_sweep",
    "forward_call_counts",
    "fresh_cuda_state",
    "gradients_per_segment",
    "plot_ratio_comparison",
    "plot_saved_activations",
    "run_state_report",
    "saved_activations",
    "sgd_momentum_state_bytes",
    "sizes_for",
    "sqrt_rule",
    "step_timelines",
    "summarize_run",
]
