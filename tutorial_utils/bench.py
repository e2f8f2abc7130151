"""``python -m tutorial_utils bench``: memory and time with and without checkpointing, side by side.

For the article's VGG16 (10 top-level modules), the flat VGG16 (40 modules, so more segment
counts mean something) and NetA, at the active profile's sizes, one training step per setting is
measured with ``measure_step`` in one run, and every figure is also given as a ratio to the same
model without checkpointing.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import time

import torch

from tutorial_utils.memory import MB, measure_step, sweep_segments
from tutorial_utils.models import NetA, flatten_vgg16, vgg16_classifier
from tutorial_utils.planner import planner_bench_rows
from tutorial_utils.profiles import Profile, describe_device, get_profile

DOGCAT_CLASSES, CIFAR_CLASSES = 2, 10
ARTICLE_SEGMENTS = (0, 2)
FLAT_SEGMENTS = (0, 2, 4, round(math.sqrt(40)), 10)  # sqrt(40 modules) ~ 6


def _inputs(batch: int, side: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(batch, 3, side, side, generator=generator),
        torch.randint(0, classes, (batch,), generator=generator),
    )


def _row(model: str, setting: str, record) -> dict:
    return {
        "model": model,
        "checkpointing": setting,
        "batch": record.batch_size,
        "tracked_peak_mb": record.peak_bytes / MB,
        "activation_peak_mb": record.activation_peak_bytes / MB,
        "cuda_peak_allocated_mb": None
        if record.cuda_peak_allocated is None
        else record.cuda_peak_allocated / MB,
        "nvml_used_mb": record.nvml_used_mb,
        "step_seconds": record.seconds,
    }


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each figure divided by the same model's figure without checkpointing (the first row)."""
    for name in ("tracked_peak_mb", "activation_peak_mb", "cuda_peak_allocated_mb", "step_seconds"):
        base = rows[0][name]
        for row in rows:
            row[name.rsplit("_", 1)[0] + "_ratio"] = (
                None if base in (None, 0) or row[name] is None else row[name] / base
            )
    return rows


def run_bench(
    profile: Profile | str | None = None, device: torch.device | str | None = None
) -> list[dict]:
    """One row per model and checkpoint setting, measured now at the profile's sizes."""
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    repeats = 1 if profile.name == "ci" else 3  # ci: keep the whole run near a minute
    batch = profile.sweep_batch_size
    torch.manual_seed(0)
    rows = []

    article = vgg16_classifier(DOGCAT_CLASSES, layout="article")
    inputs, targets = _inputs(batch, profile.image_size, DOGCAT_CLASSES)
    for name, model, counts in (
        ("VGG16 (article, 10 modules)", article, ARTICLE_SEGMENTS),
        ("VGG16 (flat, 40 modules)", flatten_vgg16(article), FLAT_SEGMENTS),
    ):
        records = sweep_segments(model, inputs, targets, counts, device=device, repeats=repeats)
        rows += add_ratios([_row(name, f"{r.segments} segments", r) for r in records])
    del article, model, records

    inputs, targets = _inputs(batch, profile.cifar_image_size, CIFAR_CLASSES)
    neta_rows = []
    for use_checkpoint in (False, True):
        torch.manual_seed(0)
        model = NetA(use_checkpoint=use_checkpoint, use_reentrant=False)
        report = measure_step(model, inputs, targets, device=device, repeats=repeats)
        setting = "5 checkpointed segments" if use_checkpoint else "none"
        neta_rows.append(_row("NetA", setting, report))
    return rows + add_ratios(neta_rows)


COLUMNS = (
    ("model", "model", "{}"),
    ("checkpointing", "checkpointing", "{}"),
    ("batch", "batch", "{}"),
    ("tracked_peak_mb", "tracked peak MB", "{:.1f}"),
    ("tracked_peak_ratio", "ratio", "{:.2f}"),
    ("activation_peak_mb", "activation peak MB", "{:.1f}"),
    ("activation_peak_ratio", "ratio", "{:.2f}"),
    ("cuda_peak_allocated_mb", "CUDA peak allocated MB", "{:.1f}"),
    ("cuda_peak_allocated_ratio", "ratio", "{:.2f}"),
    ("nvml_used_mb", "NVML used MB", "{:.0f}"),
    ("step_seconds", "step s", "{:.3f}"),
    ("step_ratio", "ratio", "{:.2f}"),
)


PLANNER_COLUMNS = (
    ("checkpointing", "strategy", "{}"),
    ("batch", "batch", "{}"),
    ("tracked_peak_mb", "tracked peak MB", "{:.1f}"),
    ("added_mb", "grads + activations MB", "{:.1f}"),
    ("predicted_added_mb", "predicted MB", "{:.1f}"),
    ("added_ratio", "vs none", "{:.2f}"),
    ("added_vs_best_uniform", "vs best uniform", "{:.2f}"),
    ("step_seconds", "step s", "{:.3f}"),
    ("step_ratio", "vs none", "{:.2f}"),
    ("step_vs_best_uniform", "vs best uniform", "{:.2f}"),
)


def format_table(rows: list[dict], columns=COLUMNS) -> str:
    """A markdown table of bench rows; n/a where a figure is absent on this machine."""
    header = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join(" --- " if fmt == "{}" else " ---: " for _, _, fmt in columns) + "|"
    lines = [header, rule]
    for row in rows:
        cells = ["n/a" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hardware_line(device: torch.device | str | None = None) -> str:
    """What the figures were measured on."""
    return (
        f"{describe_device(device)}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs visible, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)"
    )


def bench_main(
    profile_name: str | None = None, image_size: int | None = None, batch_size: int | None = None
) -> int:
    """Print the profile, the hardware and the table; the exit status.

    ``image_size``/``batch_size`` override the profile's sizes, e.g. 224 px on a CPU to see
    the regime where activations, not parameters, set the peak."""
    profile = get_profile(profile_name)
    overrides = {}
    if image_size:
        overrides.update(image_size=image_size, cifar_image_size=image_size)
    if batch_size:
        overrides.update(sweep_batch_size=batch_size)
    profile = dataclasses.replace(profile, **overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"profile: {profile.name} ({profile.description})")
    print(
        f"sizes: VGG16 {profile.image_size} px, NetA {profile.cifar_image_size} px, "
        f"batch {profile.sweep_batch_size}; SGD momentum 0.9, cross-entropy"
    )
    print(f"hardware: {hardware_line(device)}")
    started = time.perf_counter()
    rows = run_bench(profile, device)
    print()
    print(format_table(rows))
    print()
    print(
        "tracked peak: live tensor bytes followed op by op (parameters, gradients, optimizer "
        "state, activations); activation peak: the most activations/other bytes alive at once; "
        "CUDA peak allocated: torch.cuda.max_memory_allocated; NVML used: "
        "whole-device memory after the step, as nvidia-smi shows it. Ratios are to the same "
        f"model without checkpointing. Measured in {time.perf_counter() - started:.0f} s."
    )
    started = time.perf_counter()
    planner_rows = planner_bench_rows(profile)
    print()
    print(f"Planner on VGG16 (flat, 40 modules), {profile.image_size} px:")
    print()
    print(format_table(planner_rows, PLANNER_COLUMNS))
    print()
    print(
        "grads + activations: the part of the tracked peak a checkpoint plan can change; "
        "predicted: the planner's cost model for it; best uniform: the checkpoint_sequential "
        f"split with the lowest tracked peak measured. Measured in "
        f"{time.perf_counter() - started:.0f} s."
    )
    return 0
