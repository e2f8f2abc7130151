"""Every figure the two articles report, each written once, with where it comes from.

Lessons, notebooks, the bench and the profiles read the articles' numbers from here, so a
reader can check each one against the two articles in one place and a comparison never
quotes a figure typed twice. Nothing here was measured by this project.
"""

from __future__ import annotations

from dataclasses import dataclass

from tutorial_utils.units import MiB

__all__ = ["NETA_ARTICLE", "NetAFigures", "ToyGraphFigures", "VGG16_ARTICLE", "VGG16Figures"]


@dataclass(frozen=True)
class ToyGraphFigures:
    """The first article's toy summation graph: values held to compute the sum."""

    nodes_stored_plain: int = 7  # "all 7 nodes are kept"
    nodes_stored_freeing: int = 3  # freeing each sum's inputs once it is computed


@dataclass(frozen=True)
class VGG16Figures:
    """The first article: VGG16, dog-cat ImageFolder, 224 px, batch 64, segments=2 (GPU unnamed)."""

    image_size: int = 224
    batch_size: int = 64
    epochs: int = 10
    strategy: str = "segments-2"  # checkpoint_sequential(modules, 2, images), as the CLI spells it
    nvml_mib_plain: float = 14222.125  # NVML "memory used", printed as MB (MiB: bytes / 2**20)
    nvml_mib_checkpointed: float = 10550.125
    epoch_seconds_plain: float = 5 * 60  # "about 5 minutes"
    epoch_seconds_checkpointed: float = 6 * 60 + 45  # "about 6 min 45 s"
    val_accuracy_plain: float = 79  # percent
    val_accuracy_checkpointed: float = 79
    claimed_slowdown: float = 0.20  # its summary: "generally about 20% longer"

    @property
    def memory_ratio(self) -> float:
        return self.nvml_mib_checkpointed / self.nvml_mib_plain

    @property
    def time_ratio(self) -> float:
        return self.epoch_seconds_checkpointed / self.epoch_seconds_plain


@dataclass(frozen=True)
class NetAFigures:
    """The second article: NetA on CIFAR-10 upsampled to 224 px, 5 checkpointed segments."""

    image_size: int = 224
    strategy: str = "segments-5"  # NetA's own five checkpointed segments, as the CLI spells it
    card_bytes: int = 2560 * MiB  # "only 2.5G usable" of a GTX 970M 3 GB under Windows
    max_batch_plain: int = 23
    max_batch_checkpointed: int = 31

    @property
    def max_batch(self) -> dict[str, int]:
        """The largest batches, keyed as the notebooks label the two runs."""
        return {"no checkpoint": self.max_batch_plain, "checkpoint": self.max_batch_checkpointed}


TOY_GRAPH = ToyGraphFigures()
VGG16_ARTICLE = VGG16Figures()
NETA_ARTICLE = NetAFigures()
