"""The SDPA kernel a GPU would pick, and what each kernel keeps for backward, hand-worked."""

from __future__ import annotations

import re

import pytest
import torch

from tutorial_utils.__main__ import main
from tutorial_utils.estimate.card import parse_card
from tutorial_utils.estimate.estimator import Workload, estimate
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.gpu_check.kernels import KERNEL_COLUMNS, compare_call, kernel_failures
from tutorial_utils.measurement.gpu_attention import (
    AttentionCall,
    SdpaRules,
    attention_on_meta,
    choose_kernel,
    gpu_attention_rules,
    recording_kernels,
)
from tutorial_utils.measurement.meta_attention import dry_run_context

T4, A10G, L4, A100, H100 = (7, 5), (8, 6), (8, 9), (8, 0), (9, 0)
CUDNN_9_24 = 92400


def call(dtype=torch.bfloat16, head_dim=128, **kw) -> AttentionCall:
    fields = dict(seq_q=4096, seq_k=4096, batch=1, heads=32, is_causal=True) | kw
    return AttentionCall(dtype, head_dim, head_dim, **fields)


@pytest.mark.parametrize(
    ("sm", "dtype", "head_dim", "kernel"),
    [
        (T4, torch.float16, 128, "efficient"),  # no flash before sm80
        (T4, torch.float32, 128, "efficient"),
        (T4, torch.bfloat16, 128, "math"),  # efficient takes bf16 from sm80 only
        (T4, torch.float16, 100, "math"),  # fp16 head dims must be multiples of 8
        (A100, torch.bfloat16, 128, "flash"),
        (A100, torch.float32, 128, "efficient"),  # flash and cuDNN: fp16/bf16 only
        (A10G, torch.bfloat16, 208, "efficient"),  # sm86 backward: flash needs <= 192
        (A10G, torch.bfloat16, 256, "flash"),  # ... or > 224 without dropout
        (H100, torch.bfloat16, 128, "cudnn"),  # cuDNN first on sm90 with cuDNN > 9.15
        (H100, torch.bfloat16, 96 + 4, "flash"),  # cuDNN: multiples of 8; flash pads
        (H100, torch.float32, 128, "efficient"),
    ],
)
def test_kernel_choice_by_card_dtype_and_head_dim(sm, dtype, head_dim, kernel) -> None:
    assert choose_kernel(SdpaRules(sm, CUDNN_9_24), call(dtype, head_dim)) == kernel


def test_older_cudnn_leaves_hopper_on_flash_and_a_mask_leaves_flash() -> None:
    assert choose_kernel(SdpaRules(H100, 91000), call()) == "flash"
    assert choose_kernel(SdpaRules(A100, CUDNN_9_24), call(has_mask=True)) == "efficient"
    assert choose_kernel(SdpaRules(A10G, CUDNN_9_24), call(head_dim=256, dropout_p=0.1)) == (
        "efficient"
    )
    # CUDA 12 builds prefer cuDNN only on sm90/sm100/sm103 (minor 0 or 3)
    assert not SdpaRules((10, 1), CUDNN_9_24, cuda_major=12).prefers_cudnn


B, H, S, D = 2, 4, 100, 64  # S not a multiple of 32: efficient pads its log-sum-exp


def saved_bytes(sm: tuple[int, int], dtype: torch.dtype) -> tuple[str, int]:
    """(kernel, bytes autograd keeps) of one SDPA call on meta under ``sm``'s rules."""
    q, k, v = (
        torch.empty(B, H, S, D, dtype=dtype, device="meta", requires_grad=True) for _ in "qkv"
    )
    kept: dict[int, int] = {}  # by storage: two views of one tensor count once

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    with (
        recording_kernels() as kernels,
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        attention_on_meta(SdpaRules(sm, CUDNN_9_24), q, k, v, is_causal=True)
    return kernels[0], sum(kept.values())


QKVO_BF16 = 4 * B * H * S * D * 2  # q, k, v and the output, 2 bytes each


def flash_rng_bytes() -> int:
    """The RNG state flash returns and keeps: in torch 2.14 a [2] and a [] uint64 (24 bytes);
    older releases (this project supports 2.9) returned a philox seed and offset instead."""
    q = torch.empty(1, 1, 8, 8, dtype=torch.bfloat16, device="meta")
    outputs = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q)
    return sum(t.numel() * t.element_size() for t in outputs[6:8])


FLASH_RNG = flash_rng_bytes()


def test_saved_bytes_per_kernel_hand_worked() -> None:
    # flash: q, k, v, out + float32 logsumexp [B, H, S] + RNG state (2 + 1 uint64)
    assert saved_bytes(A100, torch.bfloat16) == ("flash", QKVO_BF16 + B * H * S * 4 + FLASH_RNG)
    # cuDNN: q, k, v, out + float32 stats [B, H, S, 1] + seed and offset (int64)
    assert saved_bytes(H100, torch.bfloat16) == ("cudnn", QKVO_BF16 + B * H * S * 4 + 2 * 8)
    # memory-efficient: logsumexp padded to a multiple of 32 (100 -> 128) + seed and offset
    assert saved_bytes(T4, torch.float16) == ("efficient", QKVO_BF16 + B * H * 128 * 4 + 2 * 8)
    # math on a T4 in bf16: computed in float32, autograd keeps float32 copies of q, k and v
    # (as [B*H, S, D] batches) and the S x S softmax; not the bf16 inputs nor the output
    assert saved_bytes(T4, torch.bfloat16) == ("math", 3 * B * H * S * D * 4 + B * H * S * S * 4)


def test_dry_run_of_sdpa_follows_the_active_rules() -> None:
    q = torch.empty(1, 2, 64, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    with dry_run_context(), recording_kernels() as kernels:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        with gpu_attention_rules(SdpaRules(A100, CUDNN_9_24)):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert kernels == ["cpu-flash", "flash"]


@pytest.fixture
def tiny_llama(tiny_config) -> str:
    """A Llama at a CPU's size: head dim 16, grouped-query (4 heads, 2 kv)."""
    return tiny_config("llama")


def rows_of(out: str) -> dict[str, list[str]]:
    """The table's rows by strategy: the cells after the name, split on two spaces or more."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("strategy "))
    rows = {}
    for line in lines[start + 1 :]:
        for name in ("none", "every block"):
            if line.startswith(name + " "):
                rows[name] = re.split(r"\s{2,}|\s(?=[-+\d])", line[24:].strip())
    return rows


def test_t4_and_h100_rows_differ_and_name_their_kernels(tiny_llama, capsys) -> None:
    arguments = ["estimate", "--hf-config", tiny_llama, "--seq", "128", "--no-search"]
    arguments += ["--strategies", "none,every-block", "--jobs", "1"]
    outs = {}
    for gpu in ("t4", "h100", "cpu"):
        assert main([*arguments, "--gpu", gpu]) == 0
        outs[gpu] = capsys.readouterr().out
    t4, h100, cpu = (rows_of(outs[gpu])["none"] for gpu in ("t4", "h100", "cpu"))
    # cuDNN where this torch's cuDNN is newer than 9.15 (2.14's wheel: 9.24), else flash
    hopper = "cuDNN" if SdpaRules.installed(H100).prefers_cudnn else "flash"
    assert t4[0] == "math S x S" and h100[0] == hopper and cpu[0] == "CPU flash"
    assert t4 != h100
    assert "card from --gpu (T4) = 14.8 GiB" in outs["t4"]  # the card's memory, no --card
    assert "predicted, not measured" in outs["h100"] and "50% of 989 TFLOP/s" in outs["h100"]
    assert "no quoted peaks" in outs["cpu"] and "CPU's SDPA kernel choice" in outs["cpu"]


def test_predicted_time_grows_with_recompute(tiny_llama) -> None:
    workload = Workload(f"hf:{tiny_llama}", size=128, precision="bf16")
    card = parse_card(None, gpu="h100")
    result = estimate(
        workload, [parse_strategy("none"), parse_strategy("every-block")], card, search=False
    )
    none, every = (row.gpu for row in result.rows)
    assert none is not None and every is not None
    assert none.predicted_seconds is not None and every.predicted_seconds is not None
    assert every.predicted_seconds > none.predicted_seconds
    kernel = "cudnn" if SdpaRules.installed(H100).prefers_cudnn else "flash"
    assert none.kernels == [kernel] * 2  # one call per block
    assert every.kernels == [kernel] * 4  # ... and each again when its block recomputes


def test_a_t4_keeps_more_than_an_h100_for_the_same_model(tiny_llama) -> None:
    """bf16 on a T4 runs the math path, which keeps S x S matrices; cuDNN on an H100 does not."""
    workload = Workload(f"hf:{tiny_llama}", size=128, precision="bf16")
    kept = {}
    for gpu in ("t4", "h100"):
        (row,) = estimate(
            workload, [parse_strategy("none")], parse_card("8GB", gpu=gpu), search=False
        ).rows
        assert row.report is not None
        kept[gpu] = row.report.activation_peak_bytes
    # the math path's float32 S x S softmax [1, 4, 128, 128], one per block (2) at least
    assert kept["t4"] - kept["h100"] >= 2 * 4 * 128 * 128 * 4


def test_kernel_check_compares_a_real_call_with_its_dry_run() -> None:
    """The GPU check's comparison, run on the CPU: the CPU's flash kernel keeps what an A100's
    flash keeps but its RNG state (3 uint64), within the tolerance; a mismatch is named."""
    shape = (1, 2, 64, 64)
    row = compare_call(
        SdpaRules(A100, CUDNN_9_24), torch.device("cpu"), shape, torch.bfloat16, False
    )
    assert row["rules"] == row["torch"] == "flash"
    real_bytes = 4 * 2 * 64 * 64 * 2 + 2 * 64 * 4  # q, k, v, out; float32 logsumexp
    assert row["real_mib"] * 2**20 == real_bytes
    assert row["dry_run_mib"] * 2**20 == real_bytes + FLASH_RNG
    assert kernel_failures([row]) == []
    wrong = dict(row, torch="efficient", saved_error=0.01)
    assert kernel_failures([wrong]) == [
        "bfloat16 d=64 causal flag: rules pick flash, torch runs efficient",
        "bfloat16 d=64 causal flag: dry run keeps 0.06 MiB, real kernel 0.06 MiB",
    ]


def test_the_gpu_check_reports_the_kernel_comparison() -> None:
    """The GPU check's kernels section renders a row as the comparison makes it."""
    import dataclasses
    import importlib.util
    from pathlib import Path

    from tutorial_utils.gpu_check.report import Table, render_table

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_for_kernels", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert "kernels" in [section.key for section in script.SECTIONS]
    row = compare_call(
        SdpaRules(A100, CUDNN_9_24), torch.device("cpu"), (1, 2, 64, 64), torch.bfloat16, True
    )
    table = Table("kernels", KERNEL_COLUMNS, [row])
    lines = render_table(dataclasses.asdict(table))
    # on the CPU torch runs its flash kernel with a mask; the A100's rules pick efficient
    assert "| bfloat16 | 64 | additive | efficient | flash | 0.07 | 0.07 | +0.02% |" in lines


def test_a_torch_without_cudnn_assumes_the_cuda_wheels(monkeypatch) -> None:
    """A CPU-only torch has no cuDNN to ask: the rules take the CUDA 13 wheel's, and say so."""
    from tutorial_utils.measurement import gpu_attention

    monkeypatch.setattr(gpu_attention, "runtime_cudnn_version", lambda: 0)
    rules = SdpaRules.installed(H100)
    assert rules.assumed and rules.cudnn_version == gpu_attention.WHEEL_CUDNN_VERSION
    assert choose_kernel(rules, call()) == "cudnn"


def test_the_step_roofline_charges_only_the_steps_phases() -> None:
    """Work before the step (a dry run primes the optimizer state with one optimizer step) is
    not charged; the same op inside the step is, at the roofline: 2 MiB moved at 1 GB/s."""
    from tutorial_utils.estimate.gpu_step import StepRoofline
    from tutorial_utils.measurement.phases import step_phase
    from tutorial_utils.planning.roofline import Machine

    x = torch.empty(2**18, device="meta")  # 1 MiB of float32
    with StepRoofline(Machine("m", 1e12, 1e9, "test")) as counter:
        x.neg()
        assert counter.seconds == 0
        with step_phase("optimizer"):
            x.neg()
    assert counter.seconds == pytest.approx(2 * 2**20 / 1e9)


def test_quoted_peaks_follow_the_compute_precision() -> None:
    """bf16 and nf4 (dequantized to bf16) take the bf16 tensor-core peak, fp32 the fp32 one; a
    T4 has no bf16 tensor cores: its bf16 runs at the fp32 figure. FLOP/s are at the share
    llm-foundry's runs reach on the card's generation (the A100's where none is calibrated),
    bandwidth at the share fitted on torchtitan's A100 runs."""
    from tutorial_utils.estimate.gpu_step import BANDWIDTH_SHARE, COMPUTE_SHARES, quoted_machine

    h100, t4 = parse_card(None, gpu="h100"), parse_card(None, gpu="t4")
    hopper, ampere = COMPUTE_SHARES[(9, 0)][0], COMPUTE_SHARES[(8, 0)][0]
    rates = {p: quoted_machine(h100, p).flops_per_second for p in ("bf16", "nf4", "fp32")}
    assert rates == {"bf16": 989e12 * hopper, "nf4": 989e12 * hopper, "fp32": 67e12 * hopper}
    assert quoted_machine(h100, "bf16").bytes_per_second == 3.35e12 * BANDWIDTH_SHARE
    assert quoted_machine(t4, "amp-bf16").flops_per_second == 8.1e12 * ampere
    assert quoted_machine(t4, "amp-fp16").flops_per_second == 65e12 * ampere
    assert "not calibrated for sm75" in quoted_machine(t4, "amp-fp16").source
    assert quoted_machine(parse_card("24GB"), "bf16") is None  # no GPU named
