"""Which SDPA kernel a GPU would run, and a dry run that keeps what that kernel keeps.

On a CUDA tensor ``scaled_dot_product_attention`` picks its kernel at run time
(``select_sdp_backend``) by the card's compute capability, the dtype, the head dimension, the mask
and dropout, and what the installed torch and cuDNN support; each kernel saves different tensors
for backward. A dry run on the meta device cannot ask (there is no card), so ``choose_kernel``
replays the rules of ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: the priority order
(flash, memory-efficient, math, cuDNN, from ``aten/src/ATen/Context.h``; cuDNN moved first by
``check_prefer_cudnn_attention`` with a runtime cuDNN newer than 9.15, as torch's CUDA 13
wheels ship: 9.24 with 2.14, 9.26 with 2.15.0+cu132) and each backend's ``check_*`` filters used
below. Which compute capabilities each check admits is data, one set per range of torch
versions, in the GPU table (``tutorial_utils.gpus.SDPA_RULES``: torch 2.14 and 2.15, with its
source); a torch outside every range follows the nearest set, and says so
(``SdpaRules.read_for_this_torch``).

What each kernel keeps for backward is what autograd saves around its meta function in the
installed torch (the formula generated from ``tools/autograd/derivatives.yaml``), hand-worked in
``tests/test_gpu_kernels.py``: every kernel keeps q, k, v and its output, plus: flash a float32
log-sum-exp [B, H, S] and its RNG state (two uint64 tensors, 24 bytes); memory-efficient a float32
log-sum-exp [B, H, S rounded up to 32] and a philox seed and offset; cuDNN float32 statistics
[B, H, S, 1] and a seed and offset; the math path is made of ordinary ops, so autograd keeps its
S x S softmax and float32 copies of q, k and v (it computes fp16 and bf16 in float32).

The filters reproduced are those that a dense training step can fail: the architecture range,
dtype, head dimension (size, alignment, the sm86/89/120 backward limit), a mask (flash takes
none), causal with unequal lengths, cuDNN's dropout resolution and shape limits. Not reproduced:
nested tensors, ROCm, user switches (``torch.backends.cuda.enable_*_sdp``), deterministic mode,
storage offsets (q, k, v are assumed aligned, as a projection's views are), the copy of a
mask the memory-efficient path pads to an aligned length.

``attention_on_meta`` runs the chosen kernel's own meta function (``_scaled_dot_product_
flash_attention`` and the others have one), so autograd saves exactly the tensors above;
``gpu_attention_rules`` turns it on for dry runs (``meta_attention`` asks ``active_rules``), and
``recording_kernels`` lists the kernels a step ran.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tutorial_utils.gpus import SdpaRuleSet, Sm, sdpa_rule_set

__all__ = [
    "active_rules",
    "attention_on_meta",
    "AttentionCall",
    "choose_kernel",
    "describe_kernels",
    "device_rules",
    "gpu_attention_rules",
    "note_kernel",
    "recording_kernels",
    "runtime_cudnn_version",
    "SdpaRules",
    "WHEEL_CUDNN_VERSION",
]

KERNELS = ("flash", "efficient", "cudnn", "math")
KERNEL_LABELS = {  # short: a table's column
    "flash": "flash",
    "efficient": "mem-efficient",
    "cudnn": "cuDNN",
    "math": "math S x S",
    "cpu-flash": "CPU flash",
    "cpu-math": "CPU math SxS",
}
# What torch 2.14's CUDA 13.0 wheel ships (nvidia-cudnn-cu13 9.24.0.43): assumed where the
# installed torch has no cuDNN to ask (a CPU-only build), as a GPU machine would pip-install it.
WHEEL_CUDNN_VERSION = 92400


def runtime_cudnn_version() -> int:
    """The cuDNN the installed torch would load (e.g. 92400 for 9.24), 0 without one; readable
    without a GPU."""
    try:
        return int(torch.backends.cudnn.version() or 0)
    except (RuntimeError, OSError):
        return 0


@dataclass(frozen=True)
class SdpaRules:
    """What the kernel choice depends on besides the tensors: the card's compute capability,
    the installed torch's CUDA and cuDNN, and its rule set (``table``, from the GPU table)."""

    sm: Sm
    cudnn_version: int = 0
    cuda_major: int = 13
    assumed: bool = False  # the versions are the CUDA wheel's, not this torch's
    table: SdpaRuleSet = field(default_factory=lambda: sdpa_rule_set()[0])
    read_for_this_torch: bool = True  # False: this torch is outside every rule set's range

    @classmethod
    def installed(cls, sm: Sm, torch_version: str | None = None) -> SdpaRules:
        """The rules for a card of compute capability ``sm`` under the installed torch (or
        ``torch_version``'s rule set); a CPU-only build: under the CUDA 13 wheel, with its cuDNN."""
        table, exact = sdpa_rule_set(torch_version)
        cudnn = runtime_cudnn_version()
        if not cudnn or torch.version.cuda is None:
            return cls(sm, WHEEL_CUDNN_VERSION, 13, True, table, exact)
        return cls(sm, cudnn, int(torch.version.cuda.split(".")[0]), False, table, exact)

    @property
    def torch_versions(self) -> str:
        """The torch versions the rule set was read for, in words ("2.14 to 2.15")."""
        first, last = self.table.torch_versions
        return first if first == last else f"{first} to {last}"

    @property
    def prefers_cudnn(self) -> bool:
        """``check_prefer_cudnn_attention``: cuDNN first on the table's majors (sm90 and sm10x)
        with cuDNN > 9.15 (CUDA 12 builds: only minor versions 0 and 3)."""
        major, minor = self.sm
        if self.cudnn_version <= 91500 or major not in self.table.cudnn_first_majors:
            return False
        return self.cuda_major >= 13 or minor in (0, 3)

    def order(self) -> tuple[str, ...]:
        if self.prefers_cudnn:
            return ("cudnn", "flash", "efficient", "math")
        return ("flash", "efficient", "math", "cudnn")


def device_rules(device: torch.device) -> SdpaRules | None:
    """The rules of ``device``'s GPU under the installed torch; None off CUDA."""
    if device.type != "cuda":
        return None
    return SdpaRules.installed(torch.cuda.get_device_capability(device))


@dataclass(frozen=True)
class AttentionCall:
    """The facts of one SDPA call the filters read."""

    dtype: torch.dtype
    head_dim_qk: int
    head_dim_v: int
    seq_q: int
    seq_k: int
    batch: int
    heads: int
    has_mask: bool = False
    dropout_p: float = 0.0
    is_causal: bool = False
    requires_grad: bool = True

    @classmethod
    def of(cls, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False) -> AttentionCall:
        return cls(
            query.dtype,
            query.shape[-1],
            value.shape[-1],
            query.shape[-2],
            key.shape[-2],
            query.shape[0],
            query.shape[1],
            attn_mask is not None,
            dropout_p,
            is_causal,
            torch.is_grad_enabled()
            and any(t.requires_grad for t in (query, key, value) if t is not None),
        )


def _in_range(sm: Sm, bounds: tuple[Sm, Sm]) -> bool:
    return bounds[0] <= sm <= bounds[1]


_HALF = (torch.float16, torch.bfloat16)


def can_use_flash(rules: SdpaRules, call: AttentionCall) -> bool:
    """``can_use_flash_attention``: the table's range (sm80-sm121), fp16/bf16, no mask, equal
    head dims <= 256, no causal mask over unequal lengths, and the sm86-89/120-121 backward
    limit."""
    d = call.head_dim_qk
    table = rules.table
    if not _in_range(rules.sm, table.flash) or call.dtype not in _HALF or call.has_mask:
        return False
    if d != call.head_dim_v or d > 256:
        return False
    if call.is_causal and call.seq_q != call.seq_k:
        return False
    limited = any(_in_range(rules.sm, bounds) for bounds in table.flash_backward_head_limit)
    if call.requires_grad and limited:
        return d <= 192 or (call.dropout_p == 0.0 and d > 224)
    return True


def _gemm_alignment(rules: SdpaRules, dtype: torch.dtype) -> int:
    """``minimum_gemm_alignment``: the head dimension's required multiple."""
    half = dtype in _HALF
    tensor_cores = rules.sm[0] >= 8 or (rules.sm[0] >= 7 and half)
    alignment = 4 if rules.sm[0] >= 8 else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def can_use_efficient(rules: SdpaRules, call: AttentionCall) -> bool:
    """``can_use_mem_efficient_attention``: the table's range (sm50-sm121); fp16/fp32 (bf16 too
    from sm80); head dims equal for q and k and multiples of the GEMM alignment; masks and
    dropout accepted."""
    if not _in_range(rules.sm, rules.table.efficient):
        return False
    bf16 = rules.sm >= rules.table.efficient_bf16_from
    dtypes = (torch.float16, torch.float32) + ((torch.bfloat16,) if bf16 else ())
    if call.dtype not in dtypes:
        return False
    alignment = _gemm_alignment(rules, call.dtype)
    return call.head_dim_qk % alignment == 0 and call.head_dim_v % alignment == 0


def can_use_cudnn(rules: SdpaRules, call: AttentionCall) -> bool:
    """``can_use_cudnn_attention``: cuDNN 9 or newer, the table's range (sm80-sm121), fp16/bf16,
    dropout a multiple of 1/16, batch and heads <= 65535, head dims multiples of 8 and <= 128
    (256 on the table's sm90/sm10x with cuDNN > 9.22; backward then takes <= 128, 192/128 or
    256/256), key length not 1."""
    v = rules.cudnn_version
    table = rules.table
    if v < 90000 or (call.dropout_p > 0 and 91100 < v < 91400):
        return False
    if not _in_range(rules.sm, table.cudnn) or call.dtype not in _HALF:
        return False
    if call.dropout_p * 16 != math.floor(call.dropout_p * 16):
        return False
    if call.batch > 65535 or call.heads > 65535 or call.seq_k == 1:
        return False
    dq, dv = call.head_dim_qk, call.head_dim_v
    hopper_like = any(_in_range(rules.sm, bounds) for bounds in table.cudnn_wide_heads)
    late_sm, late_cudnn = table.cudnn_wide_heads_late
    d256 = hopper_like and v > 92200 and not (rules.sm == late_sm and v <= late_cudnn)
    limit = 256 if d256 else (192 if hopper_like and v >= 91100 and (dq, dv) == (192, 128) else 128)
    if dq > limit or dv > limit or dq % 8 or dv % 8:
        return False
    if d256 and call.requires_grad:
        return (dq <= 128 and dv <= 128) or (dq, dv) in ((192, 128), (256, 256))
    return True


_CHECKS = {"flash": can_use_flash, "efficient": can_use_efficient, "cudnn": can_use_cudnn}


def choose_kernel(rules: SdpaRules, call: AttentionCall) -> str:
    """``select_sdp_backend``: the first kernel in the priority order whose filters pass."""
    for kernel in rules.order():
        if kernel == "math" or _CHECKS[kernel](rules, call):
            return kernel
    return "math"


def attention_on_meta(
    rules: SdpaRules,
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` on meta tensors through the kernel the card would run
    (as ``attention.cpp`` calls it: flash pads head dims to a multiple of 8; a boolean mask
    becomes an additive one)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
    kernel = choose_kernel(
        rules, AttentionCall.of(query, key, value, attn_mask, dropout_p, is_causal)
    )
    _note(kernel)
    aten = torch.ops.aten
    needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if kernel == "flash":
        size = query.shape[-1]
        padded = [F.pad(t, (0, -size % 8)) if size % 8 else t for t in (query, key, value)]
        scale = scale if scale is not None else 1 / math.sqrt(size)
        out = aten._scaled_dot_product_flash_attention(*padded, dropout_p, is_causal, scale=scale)[
            0
        ]
        return out[..., :size] if size % 8 else out
    if kernel == "efficient":
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, needs_lse, dropout_p, is_causal, scale=scale
        )[0]
    if kernel == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(
            query, key, value, attn_mask, needs_lse, dropout_p, is_causal, scale=scale
        )[0]
    return aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


# Process-wide, not per thread: checkpoints recompute attention in autograd's threads, and a
# forked worker inherits what its parent set.
_ACTIVE: list[SdpaRules] = []
_RECORDED: list[list[str]] = []


def active_rules() -> SdpaRules | None:
    """The GPU rules dry runs follow now, or None (a CPU's kernels)."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def gpu_attention_rules(rules: SdpaRules | None) -> Iterator[None]:
    """Inside it, dry runs' attention runs the kernel ``rules`` choose (None: the CPU's)."""
    if rules is None:
        yield
        return
    _ACTIVE.append(rules)
    try:
        yield
    finally:
        _ACTIVE.pop()


def _note(kernel: str) -> None:
    for kernels in _RECORDED:
        kernels.append(kernel)


def note_kernel(kernel: str) -> None:
    """Record a kernel a dry run ran (``meta_attention`` notes the CPU's)."""
    _note(kernel)


@contextlib.contextmanager
def recording_kernels() -> Iterator[list[str]]:
    """A list that fills with the attention kernels run inside it, one name per call."""
    kernels: list[str] = []
    _RECORDED.append(kernels)
    try:
        yield kernels
    finally:
        _RECORDED.remove(kernels)


def describe_kernels(kernels: list[str]) -> str:
    """The kernels a step ran, in words ("-" for none: a model without SDPA)."""
    names = list(dict.fromkeys(kernels))
    return "+".join(KERNEL_LABELS.get(name, name) for name in names) if names else "-"
