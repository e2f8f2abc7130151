"""What notebook 03 calls beyond its cells: its core writes its code in the cells.

``segments_panel``: tick which of NetA's five segments to checkpoint, pick a batch, click Run: the
notebook's NetA measured plain and with those segments (saved bytes, training peak, time);
``article_card``: the article's 2.5 GB card at its 224 px by dry run, the reserves that would give
its 23 and 31 (with a slider over them), and reentrant against non-reentrant checkpointing;
``bn_statistics``: BatchNorm's statistics with the package's two fixes, in both checkpoint modes.
"""

from tutorial_utils.lessons.cifar10_neta.article_card import (
    ARTICLE_CARD_BYTES,
    ARTICLE_IMAGE_SIZE,
    ARTICLE_MAX_BATCH,
    CARD_MODELS,
    MAX_RESERVE_MIB,
    REENTRANT_CHECKPOINT,
    SEG0_CHANNELS,
    PeakTable,
    ReserveFit,
    ReserveRun,
    article_card_tables,
    article_step_timelines,
    checkpoint_modes,
    dry_run_peak_table,
    largest_batches,
    plot_peak_tables,
    reserve_fit,
    reserve_panel,
    reserve_view,
)
from tutorial_utils.lessons.cifar10_neta.bn_statistics import (
    Batch,
    batchnorm_runs,
    format_batchnorm_runs,
)
from tutorial_utils.lessons.cifar10_neta.segments_panel import (
    SegmentsRun,
    forward_with,
    measure_segments,
    segments_panel,
)

__all__ = [
    "ARTICLE_CARD_BYTES",
    "ARTICLE_IMAGE_SIZE",
    "ARTICLE_MAX_BATCH",
    "Batch",
    "CARD_MODELS",
    "MAX_RESERVE_MIB",
    "PeakTable",
    "REENTRANT_CHECKPOINT",
    "ReserveFit",
    "ReserveRun",
    "SEG0_CHANNELS",
    "SegmentsRun",
    "article_card_tables",
    "article_step_timelines",
    "batchnorm_runs",
    "checkpoint_modes",
    "dry_run_peak_table",
    "format_batchnorm_runs",
    "forward_with",
    "largest_batches",
    "measure_segments",
    "plot_peak_tables",
    "reserve_fit",
    "reserve_panel",
    "reserve_view",
    "segments_panel",
]
