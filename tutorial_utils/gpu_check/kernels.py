"""SDPA kernels, the rules against torch: ``measurement.gpu_attention`` replays torch's kernel
choice for a card it cannot ask; on a GPU it can be asked. For a grid of calls (dtype, head size,
a mask or a causal flag) this puts the rules' kernel beside ``torch.ops.aten._fused_sdp_choice``
(what ``scaled_dot_product_attention`` runs), and the bytes a dry run keeps for backward beside
those the real call keeps (unique storages, counted by ``tools.SavedTensors``).
"""

from __future__ import annotations

from typing import Annotated, TypedDict

import torch
import torch.nn.functional as F

from tutorial_utils.gpu_check.report import (
    DRY_RUN,
    MEASURED,
    Outcome,
    Shown,
    Table,
    columns_of,
    relative_error,
)
from tutorial_utils.gpu_check.runner import Budget, Section
from tutorial_utils.measurement.gpu_attention import (
    AttentionCall,
    SdpaRules,
    choose_kernel,
    device_rules,
    gpu_attention_rules,
)
from tutorial_utils.measurement.meta_attention import dry_run_context
from tutorial_utils.tools import saved_bytes
from tutorial_utils.units import MiB

__all__ = [
    "compare_call",
    "KERNEL_COLUMNS",
    "kernel_failures",
    "KernelRow",
    "SECTION",
]

# torch's SDPBackend values (torch.nn.attention.SDPBackend) by the rules' names
TORCH_BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
CASES = tuple(
    (dtype, head_dim, masked)
    for dtype in (torch.float16, torch.bfloat16, torch.float32)
    for head_dim in (64, 100, 128, 256)
    for masked in (False, True)
)
SAVED_TOLERANCE = 0.001  # kernels' RNG states are a few bytes; the rest must match
RULES = "dry run: measurement.gpu_attention's rules"


class KernelRow(TypedDict):
    dtype: Annotated[str, Shown("dtype")]
    head_dim: Annotated[int, Shown("head dim", "{:d}")]
    mask: Annotated[str, Shown("mask")]
    rules: Annotated[str, Shown("rules' kernel", "{}", RULES)]
    torch: Annotated[str, Shown("torch's kernel", "{}", MEASURED)]
    dry_run_mib: Annotated[float, Shown("kept, dry run MiB", "{:.2f}", DRY_RUN)]
    real_mib: Annotated[float, Shown("kept, real MiB", "{:.2f}", MEASURED)]
    saved_error: Annotated[float | None, Shown("error", "{:+.2%}", DRY_RUN)]


KERNEL_COLUMNS = columns_of(KernelRow)


NO_PARAMETERS = torch.nn.Module()  # attention alone: nothing to leave out of the count


def compare_call(
    rules: SdpaRules, device: torch.device, shape: tuple[int, ...], dtype: torch.dtype, masked: bool
) -> KernelRow:
    """One call on ``device`` and on meta: the kernels chosen and the bytes kept."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in "qkv")
    seq = shape[-2]
    mask = torch.zeros(seq, seq, device=device, dtype=dtype) if masked else None
    causal = not masked
    choice = int(torch.ops.aten._fused_sdp_choice(q, k, v, mask, 0.0, causal))
    real = saved_bytes(
        NO_PARAMETERS, lambda: F.scaled_dot_product_attention(q, k, v, mask, is_causal=causal)
    )
    mq, mk, mv = (t.detach().to("meta").requires_grad_() for t in (q, k, v))
    meta_mask = None if mask is None else mask.to("meta")
    with dry_run_context(), gpu_attention_rules(rules):
        dry = saved_bytes(
            NO_PARAMETERS,
            lambda: F.scaled_dot_product_attention(mq, mk, mv, meta_mask, is_causal=causal),
        )
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "head_dim": shape[-1],
        "mask": "additive" if masked else "causal flag",
        "rules": choose_kernel(rules, AttentionCall.of(q, k, v, mask, 0.0, causal)),
        "torch": TORCH_BACKENDS.get(choice, f"backend {choice}"),
        "dry_run_mib": dry / MiB,
        "real_mib": real / MiB,
        "saved_error": relative_error(dry, real),
    }


def kernel_rows(
    device: torch.device, batch: int = 2, heads: int = 8, seq: int = 1024
) -> list[KernelRow]:
    """Each case's kernel by the rules and by torch, and the bytes kept, dry run and real."""
    rules = device_rules(device)
    if rules is None:
        raise ValueError(f"kernel_rows needs a CUDA device, got {device}")
    rows = []
    for dtype, head_dim, masked in CASES:
        rows.append(compare_call(rules, device, (batch, heads, seq, head_dim), dtype, masked))
        torch.cuda.empty_cache()
    return rows


def kernel_failures(rows: list[KernelRow]) -> list[str]:
    """A row fails where the rules pick another kernel than torch, or the bytes kept differ
    by more than ``SAVED_TOLERANCE``."""
    failures = []
    for row in rows:
        label = f"{row['dtype']} d={row['head_dim']} {row['mask']}"
        if row["rules"] != row["torch"]:
            failures.append(f"{label}: rules pick {row['rules']}, torch runs {row['torch']}")
        error = row["saved_error"]
        if error is None or abs(error) > SAVED_TOLERANCE:
            failures.append(
                f"{label}: dry run keeps {row['dry_run_mib']:.2f} MiB, real kernel "
                f"{row['real_mib']:.2f} MiB"
            )
    return failures


def kernels_section(budget: Budget) -> Outcome:
    """The SDPA kernel the estimate's rules pick against torch's own choice on this GPU."""
    rows = kernel_rows(torch.device("cuda"))
    notes = [
        "Rules: measurement/gpu_attention.py's replay of torch 2.14's sdp_utils.cpp for this "
        "GPU's compute capability and the installed cuDNN. Torch: aten._fused_sdp_choice on CUDA "
        "tensors (batch 2, 8 heads, 1,024 tokens). Kept: distinct storages autograd saves for "
        "backward of one scaled_dot_product_attention call, the dry run's (meta) and the real one."
    ]
    table = Table("SDPA kernels: the rules against torch", KERNEL_COLUMNS, rows)
    return Outcome([table], notes, kernel_failures(rows))


SECTION = Section("kernels", "SDPA kernels: the rules against torch", kernels_section)
