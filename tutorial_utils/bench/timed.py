"""The bench's real steps at the active profile's sizes (memory, measured time, and the time ratio
their FLOPs predict), the planner's menu measured, and ``bench_main``, which prints every table."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import torch

from tutorial_utils.articles.models import (
    NetA,
    flatten_vgg16,
    vgg16_classifier,
)
from tutorial_utils.articles.profiles import Profile, get_profile
from tutorial_utils.bench.dry_runs import (
    batchnorm_bench,
    dry_run_bench,
    print_dry_run_bench,
)
from tutorial_utils.bench.rows import (
    ARTICLE_SEGMENTS,
    CIFAR_CLASSES,
    DOGCAT_CLASSES,
    FLAT_SEGMENTS,
    NETA_SETTINGS,
    ROW_COLUMNS,
    VGG16_ARTICLE,
    VGG16_FLAT,
    BenchRow,
    Columns,
    add_ratios,
    bench_row,
    counted_gflop,
    image_batch,
    segment_rows,
)
from tutorial_utils.checkpointing.strategy import (
    Strategy,
    equal_segments,
)
from tutorial_utils.display.tables import columns_table
from tutorial_utils.estimate.timing import estimate_bench, print_estimate_bench
from tutorial_utils.measurement.devices import default_device, hardware_line
from tutorial_utils.measurement.dry_run import dry_run_step
from tutorial_utils.measurement.step import (
    measure_step,
    sweep_strategies,
)
from tutorial_utils.measurement.timing import load_average_line
from tutorial_utils.planning.planner import Plan
from tutorial_utils.planning.strategies import (
    StrategyRow,
    family,
    measure_strategies,
    strategy_menu,
)

__all__ = ["bench_main", "COLUMNS", "dry_run_gflop", "run_bench"]


def dry_run_gflop(
    model: torch.nn.Module, input_shape: Sequence[int], strategy: Strategy | None = None
) -> float:
    """GFLOP of the same step as a dry run (a meta copy: the model is left alone)."""
    return counted_gflop(dry_run_step(model, input_shape, strategy))


def run_bench(
    profile: Profile | str | None = None, device: torch.device | str | None = None
) -> list[BenchRow]:
    """One row per model and checkpoint setting, measured now at the profile's sizes, each with
    its step's GFLOP from a dry run at the same shape (``step_gflop``, ratio ``flops_ratio``)."""
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    repeats = 1 if profile.name == "ci" else 3  # ci: keep the whole run near a minute
    batch = profile.sweep_batch_size
    torch.manual_seed(0)
    rows: list[BenchRow] = []

    article = vgg16_classifier(DOGCAT_CLASSES, layout="article")
    inputs, targets = image_batch(batch, profile.image_size, DOGCAT_CLASSES)
    for name, sequential, counts in (
        (VGG16_ARTICLE, article, ARTICLE_SEGMENTS),
        (VGG16_FLAT, flatten_vgg16(article), FLAT_SEGMENTS),
    ):
        splits = [equal_segments(k) for k in counts]
        records = sweep_strategies(
            sequential, inputs, targets, splits, device=device, repeats=repeats
        )
        gflop = [dry_run_gflop(sequential, inputs.shape, split) for split in splits]
        rows += segment_rows(name, records, gflop)
    del article, sequential, records

    inputs, targets = image_batch(batch, profile.cifar_image_size, CIFAR_CLASSES)
    neta_rows = []
    for setting, use_checkpoint in NETA_SETTINGS.items():
        torch.manual_seed(0)
        model = NetA(use_checkpoint=use_checkpoint, use_reentrant=False)
        report = measure_step(model, inputs, targets, device=device, repeats=repeats)
        row = bench_row("NetA", setting, report)
        row["step_gflop"] = dry_run_gflop(model, inputs.shape)
        neta_rows.append(row)
    return rows + add_ratios(neta_rows)


COLUMNS: Columns = (
    *ROW_COLUMNS,
    ("tracked_peak_ratio", "ratio", "{:.2f}"),
    ("activation_peak_mib", "activation peak MiB", "{:.1f}"),
    ("activation_peak_ratio", "ratio", "{:.2f}"),
    ("cuda_peak_allocated_mib", "CUDA peak allocated MiB", "{:.1f}"),
    ("cuda_peak_allocated_ratio", "ratio", "{:.2f}"),
    ("nvml_used_mib", "NVML used MiB", "{:.0f}"),
    ("step_seconds", "step s (measured)", "{:.3f}"),
    ("step_ratio", "time ratio (measured)", "{:.2f}"),
    ("step_gflop", "GFLOP (dry run)", "{:.1f}"),
    ("flops_ratio", "time ratio (predicted from FLOPs)", "{:.2f}"),
)

PLANNER_COLUMNS: Columns = (
    ("checkpointing", "strategy", "{}"),
    ("batch", "batch", "{}"),
    ("tracked_peak_mib", "tracked peak MiB", "{:.1f}"),
    ("added_mib", "grads + activations MiB", "{:.1f}"),
    ("predicted_added_mib", "predicted MiB", "{:.1f}"),
    ("added_ratio", "vs none", "{:.2f}"),
    ("added_vs_best_uniform", "vs best uniform", "{:.2f}"),
    ("step_seconds", "step s", "{:.3f}"),
    ("step_ratio", "vs none", "{:.2f}"),
    ("step_vs_best_uniform", "vs best uniform", "{:.2f}"),
)


def bench_main(
    profile_name: str | None = None, image_size: int | None = None, batch_size: int | None = None
) -> int:
    """Print the hardware, the dry-run table, the real table and the planner's; the exit status.

    ``image_size``/``batch_size`` override the profile's sizes of the real steps (the dry runs
    are at the articles' sizes always), e.g. 224 px on a CPU to time the regime where
    activations, not parameters, set the peak."""
    started = time.perf_counter()
    profile = get_profile(profile_name)
    if image_size:
        profile = dataclasses.replace(profile, image_size=image_size, cifar_image_size=image_size)
    if batch_size:
        profile = dataclasses.replace(profile, sweep_batch_size=batch_size)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"profile: {profile.name} ({profile.description})")
    print(f"hardware: {hardware_line(device)}; {load_average_line()}")
    print()
    print_dry_run_bench(dry_run_bench())
    print()
    print("BatchNorm after one real training step, NetA as a Sequential at 32 px, batch 4 (CPU):")
    print()
    print(batchnorm_bench())

    _print_timed(
        f"Real steps on {device}, measured: VGG16 {profile.image_size} px, NetA "
        f"{profile.cifar_image_size} px, batch {profile.sweep_batch_size}; SGD momentum 0.9, "
        "cross-entropy:",
        lambda: run_bench(profile, device),
        COLUMNS,
        "tracked peak: live tensor bytes followed op by op (parameters, gradients, optimizer "
        "state, activations); activation peak: the most activations/other bytes alive at once; "
        "CUDA peak allocated: torch.cuda.max_memory_allocated; NVML used: "
        "whole-device memory after the step, as nvidia-smi shows it. Ratios are to the same "
        "model without checkpointing. Step time measured (fastest of the timed steps); its "
        "ratio predicted from FLOPs is the same step's FLOPs over the plain step's, counted by "
        "a dry run at the same shape.",
    )
    _print_timed(
        f"Planner on VGG16 (flat, 40 modules), {profile.image_size} px, measured:",
        lambda: planner_bench_rows(profile),
        PLANNER_COLUMNS,
        "grads + activations: the part of the tracked peak a checkpoint plan can change; "
        "predicted: the planner's cost model for it; best uniform: the checkpoint_sequential "
        "split with the lowest tracked peak measured.",
    )
    print()
    print_estimate_bench(estimate_bench())
    print()
    print(
        f"Whole bench: {time.perf_counter() - started:.0f} s on {hardware_line(device)}; "
        f"{load_average_line()}."
    )
    return 0


def _print_timed(
    title: str, make_rows: Callable[[], Sequence[Mapping[str, object]]], columns: Columns, note: str
) -> None:
    """A titled table with its note and the seconds it took to measure."""
    started = time.perf_counter()
    rows = make_rows()
    print()
    print(title)
    print()
    print(columns_table(rows, columns, "markdown"))
    print()
    print(f"{note} Measured in {time.perf_counter() - started:.0f} s.")


def planner_bench_rows(profile: Profile | str | None = None) -> list[StrategyRow]:
    """Bench rows for flat VGG16 at the profile's size: none, the best uniform splits, sqrt(n),
    the planner at its least peak and at two budgets, measured in one run.

    The uniform splits measured are those the cost model ranks best (one in the ci profile,
    three elsewhere: all 39 would take minutes); ratios are to no checkpointing and to the best
    uniform split tracked (sqrt(n) included).
    """
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    device = default_device()
    torch.manual_seed(0)
    model = vgg16_classifier(2, layout="flat").to(device)
    generator = torch.Generator().manual_seed(0)
    batch, side = profile.sweep_batch_size, profile.image_size
    inputs = torch.randn(batch, 3, side, side, generator=generator).to(device)
    targets = torch.randint(0, 2, (batch,), generator=generator).to(device)
    quick = profile.name == "ci"
    menu = strategy_menu(model, inputs, budget_fractions=(0.5,) if quick else (1 / 3, 2 / 3))
    families = {s.name: family(s, len(model)) for s in menu}
    uniform = sorted(
        (s for s in menu if families[s.name] == "uniform"),
        key=lambda s: cast(Plan, s.predicted).predicted_peak_bytes,
    )[: 1 if quick else 3]
    chosen = [menu[0], *uniform, *(s for s in menu if families[s.name] in ("sqrt(n)", "planned"))]
    return measure_strategies(
        model,
        inputs,
        targets,
        chosen,
        model_name="VGG16 (flat, 40 modules)",
        repeats=1 if quick else 3,
    )
