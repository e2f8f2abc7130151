"""The GPUs the package knows, in one table, each fact with its source (standard library only).

Three tables, each written once and read by every layer that needs it:

* ``GPUS``: one row per card ``estimate --gpu`` offers (its memory, compute capability and
  quoted peaks); the command line's choices and help and the README's list of cards are made
  from it (``gpu_help``, ``cards_markdown``);
* ``GENERATIONS``: what follows from a compute capability for every card of it: the generation's
  name and its CUDA context, where a source measured it;
* the rules of the installed torch that pick by compute capability, one set per range of torch
  versions: ``CUBLAS_RULES`` (the cuBLAS workspace the caching allocator serves) and
  ``SDPA_RULES`` (which attention kernels a card can run, read by
  ``measurement.gpu_attention``).

A new card is one row of ``GPUS`` (and a ``GENERATIONS`` row if its compute capability is new);
``tests/test_gpus.py`` adds one in a fixture and sees it in the choices, the help and the README.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import TypeVar

from tutorial_utils.units import GiB, MiB

__all__ = [
    "ALIASES",
    "ANY_GPU_CONTEXT_BYTES",
    "ANY_GPU_CONTEXT_SOURCE",
    "CUBLAS_RULES",
    "CublasRule",
    "GENERATIONS",
    "GPU_CHOICES",
    "GPUS",
    "Generation",
    "GpuModel",
    "SDPA_RULES",
    "SdpaRuleSet",
    "Sm",
    "cards_markdown",
    "cublas_rule",
    "cublas_workspace_bytes",
    "cublas_workspace_per_call",
    "cublaslt_workspace_bytes",
    "generation",
    "gpu_choices",
    "gpu_help",
    "installed_torch_version",
    "sdpa_rule_set",
]

Sm = tuple[int, int]  # a compute capability: (major, minor)
SmRange = tuple[Sm, Sm]  # inclusive, as sdp_utils.cpp's check_sm_version reads its bounds


# -- the CUDA context, per generation where a source measured it ---------------------------------

# Any GPU since CUDA 11.7's lazy module loading (PyTorch's default since 1.13): the larger of two
# quotes by the same maintainer ("~300MB" in pytorch/pytorch#107667, "around 400MB" in #109888,
# both 2023), read as MiB.
ANY_GPU_CONTEXT_BYTES = 400 * MiB
ANY_GPU_CONTEXT_SOURCE = (
    '"around 400MB if CUDA >= 11.7 is used and lazy module loading enabled", any GPU '
    "(ptrblck, github.com/pytorch/pytorch/issues/109888, 2023)"
)


@dataclass(frozen=True)
class Generation:
    """What every card of one compute capability shares: its generation's name and the CUDA
    context (the driver's state and the kernels loaded, outside PyTorch's allocator) where a
    source measured one on a card of it; None: the any-GPU quote stands."""

    name: str
    context_bytes: int | None = None
    context_source: str = ""


# Turing, Ampere data centre, Hopper and Blackwell: no bare-context measurement with torch 2.x
# found (searched 2026-12-04, docs/ESTIMATE.md's "Not yet done"); the any-GPU quote stands.
GENERATIONS: dict[Sm, Generation] = {
    (7, 5): Generation("Turing"),
    (8, 0): Generation("Ampere data centre"),
    (8, 6): Generation(
        "Ampere",
        256 * MiB,
        "256 MiB in nvidia-smi for a process that only created its context, RTX 3090, torch "
        "2.7.1+cu128, driver 610.43 (github.com/invoke-ai/InvokeAI/issues/9413, 2026); kernels "
        "loaded later, lazily, add to it",
    ),
    (8, 9): Generation(
        "Ada Lovelace",
        426 * MiB,
        "426 MiB in nvidia-smi after torch.cuda.mem_get_info, RTX 6000 Ada, torch 2.10.0+cu130 "
        "(github.com/unslothai/unsloth-zoo/pull/1053, 2026); kernels loaded later, lazily, add "
        "to it",
    ),
    (9, 0): Generation("Hopper"),
    (10, 0): Generation("Blackwell data centre"),
    (12, 0): Generation("Blackwell GeForce"),
}


def generation(sm: Sm) -> Generation:
    """The generation of compute capability ``sm``; a clear error for one not in the table."""
    try:
        return GENERATIONS[sm]
    except KeyError:
        raise ValueError(
            f"compute capability {sm[0]}.{sm[1]} has no row in tutorial_utils/gpus.py's "
            "GENERATIONS: add one"
        ) from None


# -- the installed torch's rules, per range of torch versions -------------------------------------


def installed_torch_version() -> str:
    """The installed torch's version ("2.15.0"), read without importing torch; "" without one."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _minor(version: str) -> tuple[int, int]:
    """``"2.15.0+cu130"`` -> (2, 15); (0, 0) for what does not parse."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


@dataclass(frozen=True)
class CublasRule:
    """What the caching allocator serves cuBLAS for ATen's matrix products
    (``aten/src/ATen/cuda/CublasHandlePool.cpp``, no ``CUBLAS_WORKSPACE_CONFIG``,
    ``CUBLASLT_WORKSPACE_SIZE`` or ``TORCH_CUBLAS_WORKSPACE_CACHE`` set): ``large_bytes`` on the
    compute capabilities listed (``large_sms``, or every minor of ``large_majors``),
    ``default_bytes`` elsewhere. ``per_call``: each cuBLAS call takes the workspace for itself and
    gives it back when it returns, and a call cuBLASLt runs (``tracker.runs_on_cublaslt``) takes
    ``lt_bytes`` once per thread and keeps it; else the first call of a thread, either library's,
    takes the workspace and keeps it. ``torch_versions``: the first and last minor versions of
    torch it was read for."""

    torch_versions: tuple[str, str]
    source: str
    default_bytes: int
    large_bytes: int = 0
    large_sms: tuple[Sm, ...] = ()
    large_majors: tuple[int, ...] = ()
    per_call: bool = False
    lt_bytes: int = 0

    def workspace_bytes(self, sm: Sm | None) -> int:
        large = sm is not None and (sm in self.large_sms or sm[0] in self.large_majors)
        return self.large_bytes if large else self.default_bytes


_CHOSEN_DEFAULT_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8", 8 MiB + 128 KiB
_CHOSEN_LARGE_BYTES = 4096 * 8 * 1024  # 32 MiB

CUBLAS_RULES = (
    CublasRule(
        ("2.0", "2.14"),
        'parseChosenWorkspaceSize: ":4096:2:16:8 default, 32MiB for Hopper" (sm90 only), '
        "every cuBLAS handle's workspace from the caching allocator, kept per (handle, stream) "
        "(pytorch/pytorch at 26a39059), as the project read it for torch 2.14.1",
        default_bytes=_CHOSEN_DEFAULT_BYTES,
        large_bytes=_CHOSEN_LARGE_BYTES,
        large_sms=((9, 0),),
    ),
    CublasRule(
        ("2.15", "2.15"),
        "CublasHandlePool.cpp with TORCH_CUBLAS_WORKSPACE_CACHE (isCUDABlasWorkspaceCachingEnabled:"
        ' "default false" on CUDA): ATen\'s cuBLAS calls take getCurrentCUDABlasHandleWithWorkspace,'
        ' which "owns an eager workspace" of getChosenWorkspaceSize() from the caching allocator '
        'for the call and frees it after; parseChosenWorkspaceSize: ":4096:2:16:8 default, 32MiB '
        'for Hopper and Blackwell" (compute capability majors 9 to 12). Read in a copy of '
        "pytorch/pytorch's source (commit not identified) and checked 2026-12-04 in torch "
        "2.15.0's libtorch_cuda.so (disassembly: 0x820000 bytes, 0x2000000 where major - 9 < 4; "
        "every gemm_internal_cublas* and bgemm_internal_cublas* calls "
        "getCurrentCUDABlasHandleWithWorkspace). An addmm that cuBLASLt runs (a 1-D bias: "
        "Blas.cpp's isInputCompliesAddmmCudaLt) takes getCUDABlasLtWorkspace's instead: "
        "CUBLASLT_WORKSPACE_SIZE's default 1024 KiB, kept per (handle, stream)",
        default_bytes=_CHOSEN_DEFAULT_BYTES,
        large_bytes=_CHOSEN_LARGE_BYTES,
        large_majors=(9, 10, 11, 12),
        per_call=True,
        lt_bytes=1024 * 1024,
    ),
)


@dataclass(frozen=True)
class SdpaRuleSet:
    """Where ``scaled_dot_product_attention``'s kernels run, by compute capability, as
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` of the torch versions named checks
    it (each field names the check it reproduces); ``measurement.gpu_attention`` applies them with
    the call's dtype, shapes and the runtime cuDNN."""

    torch_versions: tuple[str, str]  # first and last minor versions of torch it covers
    source: str
    flash: SmRange  # check_flash_attention_hardware_support
    efficient: SmRange  # check_mem_efficient_hardware_support
    efficient_bf16_from: Sm  # can_use_mem_efficient_attention: bf16 from sm80
    cudnn: SmRange  # check_cudnn_hardware_support
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
    flash_backward_head_limit: tuple[SmRange, ...]
    cudnn_first_majors: tuple[int, ...]  # check_prefer_cudnn_attention (with cuDNN > 9.15)
    cudnn_wide_heads: tuple[SmRange, ...]  # check_cudnn_tensor_shapes' is_sm90_or_sm10x
    cudnn_wide_heads_late: tuple[Sm, int]  # is_unsupported_sm107: that sm only after this cuDNN


SDPA_RULES = (
    SdpaRuleSet(
        ("2.14", "2.15"),
        "pytorch/pytorch sdp_utils.cpp at commit 001f694a, read 2026-12-03; the ranges checked "
        "2026-12-04 against the warnings compiled into torch 2.15.0's libtorch_cuda.so",
        flash=((8, 0), (12, 1)),
        efficient=((5, 0), (12, 1)),
        efficient_bf16_from=(8, 0),
        cudnn=((8, 0), (12, 1)),
        flash_backward_head_limit=(((8, 6), (8, 9)), ((12, 0), (12, 1))),
        cudnn_first_majors=(9, 10),
        cudnn_wide_heads=(((9, 0), (9, 0)), ((10, 0), (10, 9))),
        cudnn_wide_heads_late=((10, 7), 92500),
    ),
)


_Rule = TypeVar("_Rule", CublasRule, SdpaRuleSet)


def _covering(rules: tuple[_Rule, ...], version: str) -> tuple[_Rule, bool]:
    """The rule set whose range holds ``version``, and whether one did (else the nearest)."""
    wanted = _minor(version)
    for rule in rules:
        first, last = (_minor(v) for v in rule.torch_versions)
        if first <= wanted <= last:
            return rule, True
    nearest = min(rules, key=lambda r: abs(_minor(r.torch_versions[1])[1] - wanted[1]))
    return nearest, False


def sdpa_rule_set(version: str | None = None) -> tuple[SdpaRuleSet, bool]:
    """The SDPA rules of torch ``version`` (None: the installed one) and whether they were read
    for it (False: the nearest set read, assumed)."""
    return _covering(SDPA_RULES, installed_torch_version() if version is None else version)


def cublas_rule(version: str | None = None) -> tuple[CublasRule, bool]:
    """The cuBLAS workspace rule of torch ``version`` (None: the installed one), as
    ``sdpa_rule_set``."""
    return _covering(CUBLAS_RULES, installed_torch_version() if version is None else version)


def cublas_workspace_bytes(sm: Sm | None, version: str | None = None) -> int:
    """cuBLAS's workspace on a card of compute capability ``sm`` (None: no GPU named, the
    default size) under torch ``version`` (None: the installed one): per call or per thread,
    as ``cublas_workspace_per_call`` says."""
    return cublas_rule(version)[0].workspace_bytes(sm)


def cublaslt_workspace_bytes(version: str | None = None) -> int:
    """The workspace a thread's cuBLASLt calls keep under torch ``version`` (None: the installed
    one) where cuBLAS calls take theirs per call; 0 where both share the thread's."""
    return cublas_rule(version)[0].lt_bytes


def cublas_workspace_per_call(version: str | None = None) -> bool:
    """Whether torch ``version``'s (None: the installed one) cuBLAS calls each take the workspace
    for the call (True) or a thread's first call takes it and keeps it (False)."""
    return cublas_rule(version)[0].per_call


# -- the cards -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    """One card: its compute capability (which kernels it runs, its generation), its memory and
    its quoted peaks (the predicted step time), each with its source."""

    name: str
    sm: Sm | None = None  # None: no GPU named (the CPU's SDPA kernels, any GPU's context)
    memory_bytes: int | None = None  # --card's default for this GPU
    memory_source: str = ""
    # quoted peaks, dense (no sparsity), FLOP/s: tensor-core fp16 and bf16 with float32
    # accumulation (None: no bf16 tensor cores), and plain fp32 (PyTorch's default matmul
    # precision does not use TF32); memory bandwidth in bytes/s
    fp16_flops: float | None = None
    bf16_flops: float | None = None
    fp32_flops: float | None = None
    bandwidth: float | None = None
    peaks_source: str = ""

    @property
    def generation(self) -> Generation | None:
        return None if self.sm is None else generation(self.sm)

    @property
    def context_bytes(self) -> int:
        """The CUDA context, quoted: for this card's generation where measured, else any GPU's."""
        quoted = self.generation.context_bytes if self.generation else None
        return ANY_GPU_CONTEXT_BYTES if quoted is None else quoted

    @property
    def context_source(self) -> str:
        quoted = self.generation
        if quoted is not None and quoted.context_bytes is not None:
            return f"{quoted.name}: {quoted.context_source}"
        return ANY_GPU_CONTEXT_SOURCE + "; not measured for this GPU's generation"

    @property
    def workspace_bytes(self) -> int:
        """cuBLAS's workspace under the installed torch (per call or per thread: its rule's)."""
        return cublas_workspace_bytes(self.sm)


def _card(
    name: str,
    sm: Sm,
    sold_gb: int,
    tensor_flops: float,
    fp32_flops: float,
    bandwidth: float,
    peaks_source: str,
    memory_bytes: int | None = None,
    memory_source: str = "",
) -> GpuModel:
    """A card sold as ``sold_gb`` GB (read as GiB, as ``--card`` reads it; ``memory_bytes`` where
    its usable memory is quoted) with bf16 tensor cores as fast as its fp16 ones."""
    return GpuModel(
        name,
        sm=sm,
        memory_bytes=memory_bytes or sold_gb * GiB,
        memory_source=memory_source,
        fp16_flops=tensor_flops,
        bf16_flops=tensor_flops,
        fp32_flops=fp32_flops,
        bandwidth=bandwidth,
        peaks_source=peaks_source,
    )


_DATASHEET = "NVIDIA {} datasheet"
_SXM = _DATASHEET + ", SXM"
_WHITEPAPER = "NVIDIA {} whitepaper (tensor FP16/BF16, FP32 accumulate)"
# the memory NVML reports (nvidia-smi's total), as Modal tables it for each GPU it rents
_SMI_TOTAL = (
    "nvidia-smi memory.total, as tabled at thundergolfer.com/blog/nvidia-gpu-memory-capacity"
)
GPUS: dict[str, GpuModel] = {
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
    "l4": _card("L4", (8, 9), 24, 121e12, 30.3e12, 300e9, _DATASHEET.format("L4"),
                memory_bytes=23_034 * MiB, memory_source=_SMI_TOTAL),
    "a100-40gb": _card("A100 40GB", (8, 0), 40, 312e12, 19.5e12, 1555e9, _SXM.format("A100"),
                       memory_source=_SMI_TOTAL),
    "a100-80gb": _card("A100 80GB", (8, 0), 80, 312e12, 19.5e12, 2039e9, _SXM.format("A100"),
                       memory_source=_SMI_TOTAL),
    "h100": _card("H100", (9, 0), 80, 989e12, 67e12, 3.35e12, _SXM.format("H100"),
                  memory_bytes=81_559 * MiB, memory_source=_SMI_TOTAL),
    "h200": _card("H200", (9, 0), 141, 989e12, 67e12, 4.8e12, _SXM.format("H200"),
                  memory_bytes=143_771 * MiB, memory_source=_SMI_TOTAL),
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
                  "362.05 TFLOP/s BF16/FP16 tensor dense, 91.6 fp32, 864 GB/s",
                  memory_bytes=46_068 * MiB, memory_source=_SMI_TOTAL),
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


def gpu_choices() -> tuple[str, ...]:
    """``--gpu``'s choices: every row of ``GPUS``, then the aliases."""
    return (*GPUS, *ALIASES)


GPU_CHOICES = gpu_choices()


def _named_cards() -> list[tuple[str, GpuModel, Sm]]:
    return [(key, model, model.sm) for key, model in GPUS.items() if model.sm is not None]


def gpu_help() -> str:
    """``--gpu``'s help: the cards of ``GPUS``, with their compute capability and memory."""
    return ", ".join(
        f"{key} (sm{sm[0]}{sm[1]}, {(model.memory_bytes or 0) / GiB:,.0f} GiB)"
        for key, model, sm in _named_cards()
    )


def cards_markdown() -> str:
    """The README's list of cards: one table row per card of ``GPUS``."""
    rows = [
        "| `--gpu` | card | compute capability | memory GiB | bf16 TFLOP/s, dense | GB/s | "
        "CUDA context MiB |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for key, model, sm in _named_cards():
        bf16 = f"{model.bf16_flops / 1e12:,.0f}" if model.bf16_flops else "none"
        measured = generation(sm).context_bytes is not None
        context = f"{model.context_bytes / MiB:,.0f}" + ("" if measured else " (any GPU)")
        rows.append(
            f"| `{key}` | {model.name} | {sm[0]}.{sm[1]}, {generation(sm).name} | "
            f"{(model.memory_bytes or 0) / GiB:,.1f} | {bf16} | "
            f"{(model.bandwidth or 0) / 1e9:,.0f} | {context} |"
        )
    return "\n".join(rows)
