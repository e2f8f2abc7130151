"""Notebook 02's panel (VGG16 on dogs vs cats): the segment explorer and the dry-run sweep it
shares with the notebook's Going deeper table. The rest of the notebook is in its own cells."""

from tutorial_utils.lessons.vgg16_dogcat.panel import (
    ARTICLE_SCALE,
    MACHINE_SCALE,
    SCALES,
    SegmentExplorer,
    Sizes,
    dry_run_sweep,
    format_sweep,
    sizes_for,
)

__all__ = [
    "ARTICLE_SCALE",
    "MACHINE_SCALE",
    "SCALES",
    "SegmentExplorer",
    "Sizes",
    "dry_run_sweep",
    "format_sweep",
    "sizes_for",
]
