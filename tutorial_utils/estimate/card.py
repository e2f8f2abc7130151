"""A GPU card's memory and what the caching allocator can have of it (no torch needed).

The CUDA context (the driver's state and the kernels it has loaded) sits outside PyTorch's caching
allocator: a fixed cost per GPU model and driver, held before the first tensor. Everything else
(tensors, cuBLAS's workspaces, the allocator's rounding, splits and cache) is in the replay of
the dry run through the emulated allocator (``measurement.allocator``), so a card's budget is its
memory less the context, less what you hold back for other processes (``--reserve``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tutorial_utils.measurement.allocator import (
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACE_HOPPER_BYTES,
)

GiB = 2**30

# The CUDA context, quoted (not measured here). A figure for a GPU model where one was found;
# the figure for any GPU since CUDA 11.7's lazy module loading (PyTorch's default since 1.13)
# otherwise: the larger of two quotes by the same maintainer ("~300MB" in
# pytorch/pytorch#107667, "around 400MB" in #109888, both 2023), read as MiB.
ANY_GPU_CONTEXT_BYTES = 400 * 2**20
ANY_GPU_CONTEXT_SOURCE = (
    '"around 400MB if CUDA >= 11.7 is used and lazy module loading enabled", any GPU '
    "(ptrblck, github.com/pytorch/pytorch/issues/109888, 2023)"
)


@dataclass(frozen=True)
class GpuModel:
    """What the estimate needs to know of a GPU model besides its memory."""

    name: str
    hopper: bool = False  # compute capability 9.0: cuBLAS takes a 32 MiB workspace
    context_bytes: int | None = None  # quoted for this model; None: not quoted
    context_source: str = ""


# No per-model figure of the context with lazy loading was found; the figures quoted for
# single cards (an RTX 3090's 1687 MB, a GTX 1080's 721 MB, pytorch/pytorch#55277) predate it.
GPUS = {
    "any": GpuModel("any GPU"),
    "t4": GpuModel("T4"),
    "l4": GpuModel("L4"),
    "a100": GpuModel("A100"),
    "h100": GpuModel("H100", hopper=True),
    "h200": GpuModel("H200", hopper=True),
    "rtx-3090": GpuModel("RTX 3090"),
    "rtx-4090": GpuModel("RTX 4090"),
}


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
        if self.gpu not in GPUS:
            raise ValueError(f"--gpu must be one of {', '.join(GPUS)}, got {self.gpu!r}")

    @property
    def model(self) -> GpuModel:
        return GPUS[self.gpu]

    @property
    def context_bytes(self) -> int:
        """The CUDA context, quoted: for this GPU model where quoted, else for any GPU."""
        quoted = self.model.context_bytes
        return ANY_GPU_CONTEXT_BYTES if quoted is None else quoted

    @property
    def context_source(self) -> str:
        if self.model.context_bytes is not None:
            return self.model.context_source
        return ANY_GPU_CONTEXT_SOURCE

    @property
    def workspace_bytes(self) -> int:
        """cuBLAS's workspace per thread that multiplies matrices (the allocator serves it)."""
        return CUBLAS_WORKSPACE_HOPPER_BYTES if self.model.hopper else CUBLAS_WORKSPACE_BYTES

    @property
    def budget_bytes(self) -> int:
        """What ``cudaMalloc`` can give the caching allocator: the card less the CUDA context
        and the reserve."""
        return self.total_bytes - self.context_bytes - self.reserve_bytes

    def describe(self) -> str:
        """Two lines: the budget, then where the context's figure comes from."""
        held = f", less {self.reserve_bytes / GiB:,.2f} GiB held back" if self.reserve_bytes else ""
        segments = "expandable segments" if self.expandable_segments else "default segments"
        per_model = "" if self.model.context_bytes is not None else "; not quoted per GPU model"
        return (
            f"card {self.name} ({self.model.name}) = {self.total_bytes / GiB:,.1f} GiB, less the "
            f"CUDA context {self.context_bytes / GiB:,.2f} GiB{held} = "
            f"{self.budget_bytes / GiB:,.2f} GiB the caching allocator can reserve ({segments}; "
            f"cuBLAS workspaces {self.workspace_bytes / 2**20:,.3g} MiB a thread)\n"
            f"CUDA context quoted, not measured: {self.context_source}{per_model}"
            + ("; held back: --reserve, assumed" if self.reserve_bytes else "")
        )


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|mib|mb|g|m)?\s*$", re.IGNORECASE)


def parse_bytes(text: str, default_unit: str = "gb") -> int:
    """``24GB`` / ``24GiB`` / ``24`` (GiB: a card sold as "24GB" has 24 GiB, e.g. an RTX 4090's
    25,757,220,864 bytes) or ``512MB`` / ``512MiB`` (MiB)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 24GB or 512MB, got {text!r}")
    value, unit = float(match.group(1)), (match.group(2) or default_unit).lower()
    return int(value * (GiB if unit.startswith("g") else 2**20))


def parse_card(
    card: str, reserve: str = "0", gpu: str = "any", expandable_segments: bool = False
) -> Card:
    """A card from ``--card 24GB``, ``--reserve 10%`` (of the card) or ``--reserve 1.5GB`` (held
    back besides the CUDA context; default none), ``--gpu h100`` (the model: its quoted context
    and cuBLAS workspace) and ``--expandable-segments``."""
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
    result = Card(card.strip(), total, held, gpu.strip().lower(), expandable_segments)
    if result.budget_bytes <= 0:
        raise ValueError(
            f"--reserve {reserve} and the CUDA context leave nothing of the {card} card"
        )
    return result
