"""A dry run as the chosen GPU would run it: its attention kernels and its predicted step time.

``--gpu`` names a card (a row of ``tutorial_utils.gpus.GPUS``): its compute capability decides which SDPA kernel each
attention call runs (``measurement.gpu_attention``'s rules for the installed torch), so the dry
run keeps what that kernel keeps; its quoted peak FLOP/s and bandwidth, each at a share that
published training runs reach (``COMPUTE_SHARES``, ``BANDWIDTH_SHARE``), turn the dry run's ops
into seconds by the project's roofline (``planning.roofline``: each op charged the larger of its
FLOPs over the FLOP rate and its bytes moved over the bandwidth). The seconds are a prediction,
never a measurement: ops are charged one at a time (no overlap, no cache reuse, no launch
overhead), the shares are calibrated on A100 and H100 runs only (docs/VALIDATION.md), and what
the dry run does not run (fused or compiled kernels, bitsandbytes' 4-bit matmuls, collectives
between GPUs) is not timed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from tutorial_utils.estimate.card import Card
from tutorial_utils.measurement.gpu_attention import (
    SdpaRules,
    describe_kernels,
    gpu_attention_rules,
    recording_kernels,
)
from tutorial_utils.measurement.phases import current_phase, declared_phase
from tutorial_utils.planning.roofline import Machine, RooflineCounter

__all__ = [
    "BANDWIDTH_SHARE",
    "COMPUTE_SHARES",
    "GpuRun",
    "StepRoofline",
    "as_gpu_runs",
    "compute_share",
    "describe_rules",
    "gpu_run",
    "quoted_machine",
    "sdpa_rules",
]


# The share of a card's quoted dense tensor-core peak that a training step's matmuls and fused
# attention reach, by compute capability: the median hardware FLOP utilisation (HFU) of
# MosaicML llm-foundry's MPT 7B and 13B rows at 2,048-8,192 tokens on 8 GPUs (FSDP, bf16,
# FlashAttention), scripts/train/benchmarking/README.md @ 061f2c7. MPT's step is almost all
# matmuls and attention, so its HFU stands for what those ops reach; HFU counts attention's
# whole S x S product, as published.
COMPUTE_SHARES: dict[tuple[int, int], tuple[float, str]] = {
    (8, 0): (0.7287, "llm-foundry's A100 HFU"),  # median of 6 rows, 59.57-76.82%
    (9, 0): (0.4952, "llm-foundry's H100 HFU"),  # median of 5 rows, 39.79-55.47%
}
UNCALIBRATED_SM = (8, 0)  # other cards take the A100's share: no source calibrates them
# The share of the quoted bandwidth that the ops bound by memory (norms, rotary embeddings,
# activations, dropout, casts, the optimizer) reach. Fitted so that torchtitan's Llama 2 13B
# (no checkpointing) and Llama 3 8B (selective op) runs on A100 80GB are predicted with errors
# of equal size and opposite sign (docs/VALIDATION.md: the two "fit" rows; the rest held out).
BANDWIDTH_SHARE = 0.65


def sdpa_rules(card: Card) -> SdpaRules | None:
    """The SDPA rules of the card's GPU under the installed torch; None: the CPU's kernels."""
    sm = card.model.sm
    return None if sm is None else SdpaRules.installed(sm)


def describe_rules(card: Card) -> str:
    """Whose kernels the dry run's attention follows, in one line."""
    rules = sdpa_rules(card)
    if rules is None:
        return "attention: the CPU's SDPA kernel choice (no GPU named; --gpu NAME for a GPU's)"
    cudnn = rules.cudnn_version
    version = f"cuDNN {cudnn // 10000}.{cudnn // 100 % 100}"
    whose = (
        f"the CUDA 13 wheel's {version} (assumed: this torch has no cuDNN)"
        if rules.assumed
        else f"this torch's {version}"
    )
    return (
        f"attention: the SDPA kernel the {card.model.name} (sm{rules.sm[0]}{rules.sm[1]}) picks "
        f"by torch {rules.torch_versions}'s sdp_utils rules"
        + ("" if rules.read_for_this_torch else " (nearest to this torch's, assumed)")
        + f", with {whose}; "
        "the dry run keeps what that kernel keeps for backward"
    )


def compute_share(card: Card) -> tuple[float, str]:
    """The share of the card's quoted peak FLOP/s a training step's matmuls reach, and whose
    runs say so (``COMPUTE_SHARES``; other cards take the A100's, uncalibrated)."""
    sm = card.model.sm
    if sm in COMPUTE_SHARES:
        return COMPUTE_SHARES[sm]
    share, _ = COMPUTE_SHARES[UNCALIBRATED_SM]
    which = "this card" if sm is None else f"sm{sm[0]}{sm[1]}"
    return share, f"not calibrated for {which}: the A100's share"


def quoted_machine(card: Card, precision: str) -> Machine | None:
    """The card's quoted peaks for the step's compute precision, at the shares published runs
    reach (``compute_share``, ``BANDWIDTH_SHARE``); None without quoted figures (no GPU
    named)."""
    model = card.model
    if model.bandwidth is None or model.fp32_flops is None:
        return None
    compute = "bf16" if precision == "nf4" else precision.removeprefix("amp-")  # QLoRA: bf16
    flops = {"fp16": model.fp16_flops, "bf16": model.bf16_flops}.get(compute, model.fp32_flops)
    which = f"{compute} tensor cores, dense" if compute != "fp32" else "fp32"
    if flops is None:  # bf16 on a card without bf16 tensor cores (a T4)
        flops, which = model.fp32_flops, "fp32: no bf16 tensor cores"
    share, share_source = compute_share(card)
    return Machine(
        name=model.name,
        flops_per_second=flops * share,
        bytes_per_second=model.bandwidth * BANDWIDTH_SHARE,
        source=(
            f"predicted, not measured: the dry run's ops by roofline at {share:.0%} of "
            f"{flops / 1e12:,.4g} TFLOP/s ({which}; {share_source}) and {BANDWIDTH_SHARE:.0%} "
            f"of {model.bandwidth / 1e9:,.0f} GB/s (fitted on torchtitan's A100 runs); not "
            "timed: fused or compiled kernels, 4-bit matmuls, collectives, launch overhead; "
            "errors against published runs: docs/VALIDATION.md"
        ),
    )


class StepRoofline(RooflineCounter):
    """The roofline of the step's own ops: work outside its declared phases (the optimizer
    state a dry run primes before the step, with one optimizer step on zero gradients) is not
    charged."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if declared_phase() is None and current_phase() == "forward":  # not in the step
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


@dataclass
class GpuRun:
    """What a dry run did on the chosen GPU: the attention kernels it ran and, with quoted
    peaks, its predicted seconds."""

    kernels: list[str] = field(default_factory=list)
    predicted_seconds: float | None = None

    @property
    def kernel(self) -> str:
        return describe_kernels(self.kernels)


@contextlib.contextmanager
def as_gpu_runs(card: Card) -> Iterator[None]:
    """Inside it, dry runs' attention follows the card's GPU (the CPU's with none named)."""
    with gpu_attention_rules(sdpa_rules(card)):
        yield


@contextlib.contextmanager
def gpu_run(card: Card, precision: str) -> Iterator[GpuRun]:
    """One dry run on ``card``: fills in the kernels it ran and its predicted seconds."""
    run = GpuRun()
    machine = quoted_machine(card, precision)
    counter = StepRoofline(machine) if machine is not None else None
    with as_gpu_runs(card), recording_kernels() as kernels:
        with counter if counter is not None else contextlib.nullcontext():
            yield run
    run.kernels = list(kernels)
    run.predicted_seconds = None if counter is None else counter.seconds
