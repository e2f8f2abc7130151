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
from tutorial_utils.units import GiB

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
    """What the estimate needs to know of a GPU model besides its memory: its allocator's fixed
    costs, its compute capability (which SDPA kernel it runs), and its quoted peaks (the
    predicted step time)."""

    name: str
    # what cuBLAS takes from the caching allocator per thread (CublasHandlePool.cpp's default:
    # 32 MiB on compute capability 9.0, 8 MiB + 128 KiB elsewhere)
    workspace_bytes: int = CUBLAS_WORKSPACE_BYTES
    context_bytes: int | None = None  # quoted for this model; None: not quoted
    context_source: str = ""
    sm: tuple[int, int] | None = None  # compute capability; None: the CPU's SDPA kernels
    memory_bytes: int | None = None  # the card's memory, --card's default for this GPU
    memory_source: str = ""
    # quoted peaks, dense (no sparsity), FLOP/s: tensor-core fp16 and bf16 with float32
    # accumulation (None: no bf16 tensor cores), and plain fp32 (PyTorch's default matmul
    # precision does not use TF32); memory bandwidth in bytes/s
    fp16_flops: float | None = None
    bf16_flops: float | None = None
    fp32_flops: float | None = None
    bandwidth: float | None = None
    peaks_source: str = ""


def _sold_as(gb: int) -> int:
    """A card sold as ``gb`` GB, read as GiB (see ``parse_bytes``)."""
    return gb * GiB


_DATASHEET = "NVIDIA {} datasheet"
# No per-model figure of the context with lazy loading was found; the figures quoted for
# single cards (an RTX 3090's 1687 MB, a GTX 1080's 721 MB, pytorch/pytorch#55277) predate it.


def _card(
    name: str,
    sm: tuple[int, int],
    sold_gb: int,
    tensor_flops: float,
    fp32_flops: float,
    bandwidth: float,
    peaks_source: str,
    memory_bytes: int | None = None,
    memory_source: str = "",
) -> GpuModel:
    """A card sold as ``sold_gb`` GB (``memory_bytes`` where its usable memory is quoted) with
    bf16 tensor cores as fast as its fp16 ones."""
    hopper = sm == (9, 0)
    return GpuModel(
        name,
        workspace_bytes=CUBLAS_WORKSPACE_HOPPER_BYTES if hopper else CUBLAS_WORKSPACE_BYTES,
        sm=sm,
        memory_bytes=memory_bytes or _sold_as(sold_gb),
        memory_source=memory_source,
        fp16_flops=tensor_flops,
        bf16_flops=tensor_flops,
        fp32_flops=fp32_flops,
        bandwidth=bandwidth,
        peaks_source=peaks_source,
    )


_SXM = _DATASHEET + ", SXM"
_WHITEPAPER = "NVIDIA {} whitepaper (tensor FP16/BF16, FP32 accumulate)"
GPUS = {
    "any": GpuModel("any GPU"),
    "cpu": GpuModel("no GPU named: the CPU's SDPA kernels"),
    "t4": GpuModel(  # no bf16 tensor cores
        "T4",
        sm=(7, 5),
        # 16 GB sold; ECC holds 1/16 of GDDR6 back: deviceQuery reads 15,843,721,216 bytes
        memory_bytes=15_843_721_216,
        memory_source="deviceQuery on a T4 (16 GB less ECC)",
        fp16_flops=65e12,
        fp32_flops=8.1e12,
        bandwidth=320e9,
        peaks_source=_DATASHEET.format("T4"),
    ),
    # name, compute capability, GB sold, fp16/bf16 tensor and fp32 FLOP/s, bytes/s, source
    "a10g": _card("A10G", (8, 6), 24, 70e12, 31.2e12, 600e9,
                  "AWS's A10G has no NVIDIA datasheet; as tabled by baseten.co/blog/"
                  "nvidia-a10-vs-a10g-for-ml-model-inference"),
    "l4": _card("L4", (8, 9), 24, 121e12, 30.3e12, 300e9, _DATASHEET.format("L4")),
    "a100-40gb": _card("A100 40GB", (8, 0), 40, 312e12, 19.5e12, 1555e9, _SXM.format("A100")),
    "a100-80gb": _card("A100 80GB", (8, 0), 80, 312e12, 19.5e12, 2039e9, _SXM.format("A100")),
    "h100": _card("H100", (9, 0), 80, 989e12, 67e12, 3.35e12, _SXM.format("H100")),
    "h200": _card("H200", (9, 0), 141, 989e12, 67e12, 4.8e12, _SXM.format("H200")),
    "3090": _card("RTX 3090", (8, 6), 24, 71e12, 35.6e12, 936e9,
                  _WHITEPAPER.format("Ampere GA102")),
    "4090": _card("RTX 4090", (8, 9), 24, 165.2e12, 82.6e12, 1008e9,
                  _WHITEPAPER.format("Ada Lovelace architecture")),
    # added 2026-12-04; NVIDIA's own pages are not in the search tool, so each figure is quoted
    # from the page named, which reproduces the vendor's table
    "5090": _card("RTX 5090", (12, 0), 32, 209.5e12, 104.8e12, 1792e9,
                  "838 TFLOP/s FP16 tensor, sparse (spheron.network/blog/nvidia-rtx-5090-specs, "
                  "2026), halved for dense and halved again for fp32 accumulate, as on GeForce "
                  "cards (the 4090's whitepaper figure); 104.8 TFLOP/s fp32, 1,792 GB/s"),
    "l40s": _card("L40S", (8, 9), 48, 362e12, 91.6e12, 864e9,
                  "NVIDIA L40S datasheet table as listed by mullet.se (product 355414): "
                  "362.05 TFLOP/s BF16/FP16 tensor dense, 91.6 fp32, 864 GB/s"),
    "a6000": _card("RTX A6000", (8, 6), 48, 154.8e12, 38.7e12, 768e9,
                   "Microway's Ampere comparison as quoted by llmperf.net (154.8 TFLOP/s "
                   "FP16/BF16 tensor dense); 38.71 TFLOP/s fp32, 768 GB/s (sysrqmts.com)"),
    "b200": _card("B200", (10, 0), 180, 2250e12, 80e12, 8e12,
                  "HGX B200 at 1,000 W: 2,250 TFLOP/s BF16 tensor dense, 80 fp32 "
                  "(glennklockwood.com/garden/processors/B200); 8.0 TB/s (docs.vultr.com)",
                  memory_bytes=179 * GiB,
                  memory_source="nvidia-smi memory.total on an HGX B200, 179 GB, as Vultr's "
                  "docs list it (docs.vultr.com/inference-cookbook)"),
}  # fmt: skip
# the names --gpu took before the cards above had their memory
ALIASES = {
    "a100": "a100-40gb",
    "rtx-3090": "3090",
    "rtx-4090": "4090",
    "rtx-5090": "5090",
    "rtx-a6000": "a6000",
}
GPU_CHOICES = (*GPUS, *ALIASES)


def gpu_help() -> str:
    """``--gpu``'s help: the cards of ``GPUS``, with their compute capability and memory."""
    cards = [
        f"{key} (sm{model.sm[0]}{model.sm[1]}, {(model.memory_bytes or 0) / GiB:,.0f} GiB)"
        for key, model in GPUS.items()
        if model.sm is not None
    ]
    return ", ".join(cards)


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
        if self.gpu not in GPU_CHOICES:
            raise ValueError(f"--gpu must be one of {', '.join(GPU_CHOICES)}, got {self.gpu!r}")

    @property
    def model(self) -> GpuModel:
        return GPUS[ALIASES.get(self.gpu, self.gpu)]

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
        return self.model.workspace_bytes

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
    return int(value * (GiB if unit.startswith("g") else 2**20))


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
