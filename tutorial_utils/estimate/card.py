"""A GPU card's memory and what the caching allocator can have of it (no torch needed).

The facts of each GPU (memory, compute capability, peaks, CUDA context, cuBLAS's workspace) are
rows of one table, ``tutorial_utils.gpus``; this module turns ``--card``, ``--gpu`` and
``--reserve`` into a budget. The CUDA context (the driver's state and the kernels it has loaded)
sits outside PyTorch's caching allocator: a fixed cost per GPU and driver, held before the first
tensor. Everything else
(tensors, cuBLAS's workspaces, the allocator's rounding, splits and cache) is in the replay of
the dry run through the emulated allocator (``measurement.allocator``), so a card's budget is its
memory less the context, less what you hold back for other processes (``--reserve``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tutorial_utils.gpus import (
    ALIASES,
    ANY_GPU_CONTEXT_BYTES,
    ANY_GPU_CONTEXT_SOURCE,
    GPU_CHOICES,
    GPUS,
    GpuModel,
    cublas_workspace_per_call,
    gpu_choices,
    gpu_help,
)
from tutorial_utils.units import GiB, MiB

__all__ = [
    "ALIASES",
    "ANY_GPU_CONTEXT_BYTES",
    "ANY_GPU_CONTEXT_SOURCE",
    "Card",
    "FROM_GPU",
    "GPUS",
    "GPU_CHOICES",
    "GpuModel",
    "gpu_help",
    "parse_bytes",
    "parse_card",
]

FROM_GPU = "from --gpu"  # a card's name when its memory is the GPU's


@dataclass(frozen=True)
class Card:
    """A GPU's memory and what the caching allocator can reserve of it (``budget_bytes``).

    ``reserve_bytes`` is memory you hold back for what runs beside the step outside PyTorch's
    allocator (other processes, NCCL's buffers): an assumption you set, 0 unless you do.
    ``expandable_segments`` replays the allocator as ``PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True`` runs it."""

    name: str
    total_bytes: int
    reserve_bytes: int = 0
    gpu: str = "any"
    expandable_segments: bool = False

    def __post_init__(self) -> None:
        if self.gpu not in gpu_choices():
            raise ValueError(f"--gpu must be one of {', '.join(gpu_choices())}, got {self.gpu!r}")

    @property
    def model(self) -> GpuModel:
        return GPUS[ALIASES.get(self.gpu, self.gpu)]

    @property
    def context_bytes(self) -> int:
        """The CUDA context, quoted: for this GPU's generation where measured, else any GPU's."""
        return self.model.context_bytes

    @property
    def context_source(self) -> str:
        return self.model.context_source

    @property
    def workspace_bytes(self) -> int:
        """cuBLAS's workspace, which the allocator serves: per call, or per thread that
        multiplies matrices (``workspace_per_call``)."""
        return self.model.workspace_bytes

    @property
    def workspace_per_call(self) -> bool:
        """Whether the installed torch gives each cuBLAS call its own workspace."""
        return cublas_workspace_per_call()

    @property
    def budget_bytes(self) -> int:
        """What ``cudaMalloc`` can give the caching allocator: the card less the CUDA context
        and the reserve."""
        return self.total_bytes - self.context_bytes - self.reserve_bytes

    def describe(self) -> str:
        """Two lines: the budget, then where the context's figure comes from."""
        held = f", less {self.reserve_bytes / GiB:,.2f} GiB held back" if self.reserve_bytes else ""
        segments = "expandable segments" if self.expandable_segments else "default segments"
        return (
            f"card {self.name} ({self.model.name}) = {self.total_bytes / GiB:,.1f} GiB, less the "
            f"CUDA context {self.context_bytes / GiB:,.2f} GiB{held} = "
            f"{self.budget_bytes / GiB:,.2f} GiB the caching allocator can reserve ({segments}; "
            f"cuBLAS workspaces {self.workspace_bytes / MiB:,.3g} MiB a "
            f"{'call' if self.workspace_per_call else 'thread'})\n"
            f"CUDA context quoted, not measured: {self.context_source}"
            + ("; held back: --reserve, assumed" if self.reserve_bytes else "")
            + self._describe_gpu()
        )

    def _describe_gpu(self) -> str:
        """A line on the GPU's compute capability and quoted peaks, where it has them."""
        model = self.model
        if model.sm is None:
            return ""
        peaks = [
            f"{flops / 1e12:,.4g} TFLOP/s {name}"
            for name, flops in (
                ("fp16", model.fp16_flops),
                ("bf16", model.bf16_flops),
                ("fp32", model.fp32_flops),
            )
            if flops
        ]
        memory = model.memory_source or "the size it is sold as, read as GiB (as --card reads it)"
        return (
            f"\n{model.name}: compute capability {model.sm[0]}.{model.sm[1]}; quoted peaks, dense: "
            f"{', '.join(peaks)}, {(model.bandwidth or 0) / 1e9:,.0f} GB/s ({model.peaks_source})"
            + (f"; memory: {memory}" if self.name == FROM_GPU else "")
        )


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|mib|mb|g|m)?\s*$", re.IGNORECASE)


def parse_bytes(text: str, default_unit: str = "gb") -> int:
    """``24GB`` / ``24GiB`` / ``24`` (GiB: a card sold as "24GB" has 24 GiB, e.g. an RTX 4090's
    25,757,220,864 bytes) or ``512MB`` / ``512MiB`` (MiB)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 24GB or 512MB, got {text!r}")
    value, unit = float(match.group(1)), (match.group(2) or default_unit).lower()
    return int(value * (GiB if unit.startswith("g") else MiB))


def parse_card(
    card: str | None, reserve: str = "0", gpu: str = "any", expandable_segments: bool = False
) -> Card:
    """A card from ``--card 24GB``, ``--reserve 10%`` (of the card) or ``--reserve 1.5GB`` (held
    back besides the CUDA context; default none), ``--gpu h100`` (the model: its quoted context
    and cuBLAS workspace, its SDPA kernels, its memory when ``card`` is None; else 24GB) and
    ``--expandable-segments``."""
    gpu = gpu.strip().lower()
    model = GPUS.get(ALIASES.get(gpu, gpu))
    if card is None and model is not None and model.memory_bytes is not None:
        card, total = FROM_GPU, model.memory_bytes
    else:
        card = card or "24GB"
        total = parse_bytes(card)
    if total <= 0:
        raise ValueError(f"--card must be positive, got {card!r}")
    text = reserve.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            raise ValueError(f"--reserve: expected e.g. 10% or 1.5GB, got {reserve!r}") from None
        if not 0 <= share < 100:
            raise ValueError(f"--reserve must be between 0% and 100%, got {reserve!r}")
        held = int(total * share / 100)
    else:
        held = parse_bytes(text)
    result = Card(card.strip(), total, held, gpu, expandable_segments)
    if result.budget_bytes <= 0:
        raise ValueError(
            f"--reserve {reserve} and the CUDA context leave nothing of the {card} card"
        )
    return result
