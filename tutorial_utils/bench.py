"""``python -m tutorial_utils bench``: memory and time with and without checkpointing, side by side.

Two tables, because no one machine shows both halves of the trade-off at the articles' sizes,
and a BatchNorm check:

* **Dry runs at the articles' sizes** (``DRY_RUN_LABEL``): the first article's VGG16 at 224 px,
  batch 64, SGD momentum (article layout, flat layout's segment counts, the best uniform split,
  the planner one level and nested, selective checkpointing, torch.compile's partition at three
  memory budgets, and the floor no plan can beat) and the second article's
  NetA at 224 px with Adam (batches 23 and 31, and its largest batch under the 2.5 GB card). The
  meta device gives exact tensor bytes and FLOPs, no time, in seconds on any machine.
* **Real steps at the active profile's sizes** on this machine: memory and measured step time,
  each row with the time ratio its FLOPs predict (a dry run of the same step) beside the measured
  one, so the reader sees how far FLOPs explain time.
* **BatchNorm after one real step** of NetA at 32 px under each strategy: which update the
  running statistics twice, and how far the statistics land from the plain step's.

Every figure is also given as a ratio to the same model without checkpointing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NotRequired, TypedDict, cast

import torch

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import (
    NETA_SEGMENTS,
    NetA,
    deep_tanh_chain,
    flatten_vgg16,
    neta_as_sequential,
    vgg16_classifier,
)
from tutorial_utils.articles.profiles import Profile, get_profile
from tutorial_utils.articles.quoted import NETA_ARTICLE
from tutorial_utils.checkpointing.strategy import (
    Strategy,
    equal_segments,
    scheduled,
    selective,
)
from tutorial_utils.display.tables import Column, columns_table
from tutorial_utils.estimate.timing import estimate_bench, print_estimate_bench
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.batchnorm import batchnorm_updates
from tutorial_utils.measurement.devices import default_device, hardware_line
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.step import (
    DRY_RUN_LABEL,
    StepReport,
    default_optimizer,
    measure_step,
    sweep_strategies,
)
from tutorial_utils.measurement.timing import load_average_line
from tutorial_utils.planning.budget import plan_checkpoints
from tutorial_utils.planning.compile_budget import compile_budget_strategy
from tutorial_utils.planning.limits import peak_floor
from tutorial_utils.planning.nested import one_level_against_nested
from tutorial_utils.planning.planner import Plan
from tutorial_utils.planning.profile import profile_sequential
from tutorial_utils.planning.strategies import (
    StrategyRow,
    family,
    measure_strategies,
    strategy_menu,
)
from tutorial_utils.units import MiB, ratio

__all__ = [
    "add_ratios",
    "ARTICLE_BATCH",
    "ARTICLE_CARD_BYTES",
    "ARTICLE_SIDE",
    "batchnorm_bench",
    "bench_main",
    "BenchRow",
    "COLUMNS",
    "Columns",
    "deep_chain_name",
    "DOGCAT_CLASSES",
    "dry_run_bench",
    "DRY_RUN_COLUMNS",
    "DryRunBench",
    "NETA_CHECKPOINTED",
    "print_dry_run_bench",
    "RatioFigure",
    "RatioKey",
    "VGG16_ARTICLE",
    "VGG16_FLAT",
]

DOGCAT_CLASSES, CIFAR_CLASSES = 2, 10
ARTICLE_SEGMENTS = (0, 2)
FLAT_MODULES = 40
FLAT_SEGMENTS = (0, 2, 4, round(math.sqrt(FLAT_MODULES)), 10)  # sqrt(40 modules) ~ 6

ARTICLE_SIDE, ARTICLE_BATCH = 224, 64  # the first article's VGG16 step
SELECTIVE_REGIONS = (4, 6, 10)
NETA_ARTICLE_BATCHES = (23, 31)  # the second article's largest batches, plain and checkpointed
ARTICLE_CARD_BYTES = NETA_ARTICLE.card_bytes
DEEP_CHAIN_PAIRS, DEEP_CHAIN_BATCH = 128, 4096  # issue 23's chain: 257 modules

VGG16_ARTICLE, VGG16_FLAT = "VGG16 (article, 10 modules)", "VGG16 (flat, 40 modules)"
NETA_CHECKPOINTED = f"{NETA_SEGMENTS} checkpointed segments"


class BenchRow(TypedDict):
    """One step of a bench table (``_row``): MiB, seconds and GFLOP, None where not measured."""

    model: str
    checkpointing: str
    batch: int
    tracked_peak_mib: float
    activation_peak_mib: float | None  # None on the floor row: a bound, not a step
    cuda_peak_allocated_mib: NotRequired[float | None]  # this and the next two: not on the floor
    nvml_used_mib: NotRequired[float | None]
    step_seconds: NotRequired[float | None]
    step_gflop: float | None
    source: str
    # ratios to the same model without checkpointing (``add_ratios``)
    tracked_peak_ratio: NotRequired[float | None]
    activation_peak_ratio: NotRequired[float | None]
    cuda_peak_allocated_ratio: NotRequired[float | None]
    step_ratio: NotRequired[float | None]
    flops_ratio: NotRequired[float | None]


RatioFigure = Literal[
    "tracked_peak_mib",
    "activation_peak_mib",
    "cuda_peak_allocated_mib",
    "step_seconds",
    "step_gflop",
]
RatioKey = Literal[
    "tracked_peak_ratio",
    "activation_peak_ratio",
    "cuda_peak_allocated_ratio",
    "step_ratio",
    "flops_ratio",
]

# Each figure and the key of its ratio to the step without checkpointing.
RATIO_OF: dict[RatioFigure, RatioKey] = {
    "tracked_peak_mib": "tracked_peak_ratio",
    "activation_peak_mib": "activation_peak_ratio",
    "cuda_peak_allocated_mib": "cuda_peak_allocated_ratio",
    "step_seconds": "step_ratio",
    "step_gflop": "flops_ratio",
}


def _inputs(batch: int, side: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(batch, 3, side, side, generator=generator),
        torch.randint(0, classes, (batch,), generator=generator),
    )


def _row(model: str, setting: str, record: StepReport) -> BenchRow:
    return {
        "model": model,
        "checkpointing": setting,
        "batch": record.batch_size,
        "tracked_peak_mib": record.peak_bytes / MiB,
        "activation_peak_mib": record.activation_peak_bytes / MiB,
        "cuda_peak_allocated_mib": (
            None if record.cuda is None else record.cuda.peak_allocated_bytes / MiB
        ),
        "nvml_used_mib": record.nvml.used_mib,
        "step_seconds": record.seconds,
        "step_gflop": None if record.flops is None else record.flops.total / 1e9,
        "source": record.source,
    }


def add_ratios(rows: list[BenchRow], base: BenchRow | None = None) -> list[BenchRow]:
    """Each figure divided by the same figure of ``base`` (default: the first row, which should be
    the model without checkpointing); None where either is absent."""
    base = rows[0] if base is None else base
    for row in rows:
        for name, ratio_key in RATIO_OF.items():
            row[ratio_key] = ratio(row.get(name), base.get(name))
    return rows


# -- real steps at the profile's sizes ------------------------------------------------------------


def _counted_gflop(report: StepReport) -> float:
    """The GFLOP a dry run counted (every dry run counts them)."""
    if report.flops is None:
        raise ValueError(f"no FLOPs were counted in this {report.source} step")
    return report.flops.total / 1e9


def _dry_run_gflop(
    model: torch.nn.Module, input_shape: Sequence[int], strategy: Strategy | None = None
) -> float:
    """GFLOP of the same step as a dry run (a meta copy: the model is left alone)."""
    return _counted_gflop(dry_run_step(model, input_shape, strategy))


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
    inputs, targets = _inputs(batch, profile.image_size, DOGCAT_CLASSES)
    for name, sequential, counts in (
        (VGG16_ARTICLE, article, ARTICLE_SEGMENTS),
        (VGG16_FLAT, flatten_vgg16(article), FLAT_SEGMENTS),
    ):
        splits = [equal_segments(k) for k in counts]
        records = sweep_strategies(
            sequential, inputs, targets, splits, device=device, repeats=repeats
        )
        group = [_row(name, f"{r.strategy.segments} segments", r) for r in records]
        for row, split in zip(group, splits, strict=True):
            row["step_gflop"] = _dry_run_gflop(sequential, inputs.shape, split)
        rows += add_ratios(group)
    del article, sequential, records

    inputs, targets = _inputs(batch, profile.cifar_image_size, CIFAR_CLASSES)
    neta_rows = []
    for use_checkpoint in (False, True):
        torch.manual_seed(0)
        model = NetA(use_checkpoint=use_checkpoint, use_reentrant=False)
        report = measure_step(model, inputs, targets, device=device, repeats=repeats)
        row = _row("NetA", NETA_CHECKPOINTED if use_checkpoint else "none", report)
        row["step_gflop"] = _dry_run_gflop(model, inputs.shape)
        neta_rows.append(row)
    return rows + add_ratios(neta_rows)


# -- dry runs at the articles' sizes --------------------------------------------------------------


@dataclasses.dataclass
class DryRunBench:
    """The dry-run table and what is printed around it."""

    rows: list[BenchRow]
    vgg16_step_seconds: float  # wall time of one dry-run step, article VGG16, 224 px, batch 64
    floor: str  # limits.PeakFloor.describe() for the flat VGG16, and the planner's distance to it
    neta_max_batch: dict[str, int]  # "none" / NETA_CHECKPOINTED -> largest batch under the card
    seconds: float  # wall time of the whole dry-run part
    cpu_seconds: float  # its CPU time: the cost without other work on a shared machine


def vgg16_dry_run_rows() -> tuple[list[BenchRow], float, str]:
    """The first article's step at its size: rows, one step's wall time, the floor's description.

    Article layout at 0 and 2 segments; flat layout at ``FLAT_SEGMENTS``, the best of every
    uniform split 2..40 (least peak, then fewest FLOPs), the planner's least-peak plan,
    ``SELECTIVE_REGIONS`` and the floor (``limits.peak_floor``). SGD momentum, as the article.
    """
    shape = (ARTICLE_BATCH, 3, ARTICLE_SIDE, ARTICLE_SIDE)
    article = build_on_meta(lambda: vgg16_classifier(DOGCAT_CLASSES, layout="article"))
    started = time.perf_counter()
    reports = [dry_run_step(article, shape)]
    step_seconds = time.perf_counter() - started
    reports.append(dry_run_step(article, shape, equal_segments(ARTICLE_SEGMENTS[1])))
    rows = add_ratios([_row(VGG16_ARTICLE, f"{r.strategy.segments} segments", r) for r in reports])

    flat = build_on_meta(lambda: vgg16_classifier(DOGCAT_CLASSES, layout="flat"))
    inputs = torch.empty(shape, device="meta")
    targets = torch.empty(ARTICLE_BATCH, dtype=torch.long, device="meta")
    splits = [equal_segments(k) for k in (0, *range(2, FLAT_MODULES + 1))]
    sweep = sweep_strategies(flat, inputs, targets, splits)
    by_count = {record.strategy.segments: record for record in sweep}
    best = min(sweep[1:], key=lambda r: (r.peak_bytes, _counted_gflop(r), r.strategy.segments))
    sqrt_n = FLAT_SEGMENTS[3]
    group = [
        _row(VGG16_FLAT, f"{k} segments (sqrt n)" if k == sqrt_n else f"{k} segments", by_count[k])
        for k in FLAT_SEGMENTS
    ]
    group.append(
        _row(VGG16_FLAT, f"best uniform: {best.strategy.segments} segments (of 2..40)", best)
    )
    plan = plan_checkpoints(flat, inputs)
    planned = dry_run_step(flat, shape, scheduled(plan))
    group.append(
        _row(
            VGG16_FLAT,
            f"planner, least peak ({len(plan.boundaries)} segments, "
            f"{plan.checkpointed_segments} checkpointed)",
            planned,
        )
    )
    nested = plan_checkpoints(flat, inputs, nested=True)
    group.append(
        _row(
            VGG16_FLAT,
            f"nested, least peak (runs {max(nested.runs)}x)",
            dry_run_step(flat, shape, scheduled(nested)),
        )
    )
    for regions in SELECTIVE_REGIONS:
        report = dry_run_step(flat, shape, selective(regions=regions))
        group.append(_row(VGG16_FLAT, f"selective, {regions} regions", report))
    for budget in (0.0, 0.5, 1.0):  # torch.compile's memory budgets, partitioned graph run op by op
        report = dry_run_step(flat, shape, compile_budget_strategy(budget))
        group.append(_row(VGG16_FLAT, f"compile budget {budget:.1f} (op by op)", report))
    floor = peak_floor(flat, inputs, targets, optimizer_factory=default_optimizer)
    group.append(
        {
            "model": VGG16_FLAT,
            "checkpointing": "floor: no plan goes below",
            "batch": ARTICLE_BATCH,
            "tracked_peak_mib": floor.floor_mib,
            "activation_peak_mib": None,  # a bound on the total, not a step: nothing else
            "step_gflop": None,
            "source": "lower bound from a dry run (limits.peak_floor)",
        }
    )
    planner = f"the planner's least-peak plan is {floor.distance(planned.peak_bytes)}"
    return rows + add_ratios(group), step_seconds, f"{floor.describe()}; {planner}"


def _neta_report(use_checkpoint: bool, batch: int) -> StepReport:
    model = build_on_meta(lambda: NetA(use_checkpoint=use_checkpoint, use_reentrant=False))
    shape = (batch, 3, ARTICLE_SIDE, ARTICLE_SIDE)
    return dry_run_step(model, shape, optimizer_factory=adam_optimizer)


def neta_dry_run_rows() -> tuple[list[BenchRow], dict[str, int]]:
    """The second article's NetA at 224 px with Adam: rows and the largest batch per setting.

    Batches 23 and 31 plain and with the five checkpointed segments (ratios at the same batch),
    then each setting's largest batch under ``ARTICLE_CARD_BYTES`` by dry-run batch search
    (no plain step at that batch to compare with: ratios n/a).
    """
    settings = {"none": False, NETA_CHECKPOINTED: True}
    rows: list[BenchRow] = []
    for batch in NETA_ARTICLE_BATCHES:
        group = [_row("NetA", name, _neta_report(on, batch)) for name, on in settings.items()]
        rows += add_ratios(group)
    largest = {}
    for name, on in settings.items():
        result = find_max_batch_size(
            functools.partial(NetA, use_checkpoint=on, use_reentrant=False),
            (3, ARTICLE_SIDE, ARTICLE_SIDE),
            ARTICLE_CARD_BYTES,
            device="meta",
            optimizer_factory=adam_optimizer,
        )
        largest[name] = result.batch_size
        label = f"{name}, largest batch under {ARTICLE_CARD_BYTES // MiB} MiB"
        rows.append(_row("NetA", label, _neta_report(on, result.batch_size)))
    return rows, largest


def deep_chain_name(pairs: int) -> str:
    return f"deep chain ({2 * pairs + 1} modules)"


def deep_chain_dry_run_rows(pairs: int = DEEP_CHAIN_PAIRS) -> list[BenchRow]:
    """Where one level is not enough: ``pairs`` x (Linear(256, 256), Tanh) and a head at batch
    ``DEEP_CHAIN_BATCH``, without checkpointing, the one-level plan of least peak, and the
    nested plan of least activation memory within one extra forward pass of recompute."""
    chain = build_on_meta(lambda: deep_tanh_chain(pairs))
    shape = (DEEP_CHAIN_BATCH, 256)
    profile = profile_sequential(chain, torch.empty(shape, device="meta"))
    comparison = one_level_against_nested(chain, shape, profile)
    name = deep_chain_name(pairs)
    labels = {
        "one level": "one level, least peak",
        "nested": "nested, least peak within one forward pass more",
    }
    rows = [_row(name, "none", dry_run_step(chain, shape))]
    for key, label in labels.items():
        runs = max(comparison.plans[key].runs)
        rows.append(_row(name, f"{label} (runs {runs}x)", comparison.reports[key]))
    return add_ratios(rows)


def batchnorm_bench() -> str:
    """NetA as a Sequential at 32 px, batch 4, one real CPU step per strategy: the BatchNorm
    layers updated twice and the running statistics against the plain step's."""
    torch.manual_seed(0)
    neta = neta_as_sequential(NetA())
    inputs, targets = torch.randn(4, 3, 32, 32), torch.randint(0, CIFAR_CLASSES, (4,))
    sample = inputs.to("meta")
    strategies = {
        "segments=4 (checkpoint_sequential)": equal_segments(4, keep_batchnorm=False),
        "equal_segments(4)": equal_segments(4),
        "planner, least peak": scheduled(plan_checkpoints(neta, sample)),
        "nested, least peak": scheduled(plan_checkpoints(neta, sample, nested=True)),
        "selective(regions=3)": selective(regions=3),
        "compile budget 0.50": compile_budget_strategy(0.5),
    }
    return batchnorm_updates(neta, inputs, targets, strategies)


def dry_run_bench(deep_chain_pairs: int = DEEP_CHAIN_PAIRS) -> DryRunBench:
    """Every dry-run row at the articles' sizes, and the deep chain's, timed (wall and CPU)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    vgg_rows, step_seconds, floor = vgg16_dry_run_rows()
    neta_rows, largest = neta_dry_run_rows()
    deep_rows = deep_chain_dry_run_rows(deep_chain_pairs)
    return DryRunBench(
        vgg_rows + neta_rows + deep_rows,
        step_seconds,
        floor,
        largest,
        time.perf_counter() - started,
        time.process_time() - cpu_started,
    )


# -- printing -------------------------------------------------------------------------------------

Columns = Sequence[Column]  # markdown tables (display.tables): n/a where a figure is absent here

COLUMNS: Columns = (
    ("model", "model", "{}"),
    ("checkpointing", "checkpointing", "{}"),
    ("batch", "batch", "{}"),
    ("tracked_peak_mib", "tracked peak MiB", "{:.1f}"),
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

DRY_RUN_COLUMNS: Columns = (
    ("model", "model", "{}"),
    ("checkpointing", "checkpointing", "{}"),
    ("batch", "batch", "{}"),
    ("tracked_peak_mib", "tracked peak MiB", "{:.1f}"),
    ("tracked_peak_ratio", "ratio to none", "{:.2f}"),
    ("activation_peak_mib", "activation peak MiB", "{:.1f}"),
    ("step_gflop", "GFLOP per step", "{:.0f}"),
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


def print_dry_run_bench(bench: DryRunBench) -> None:
    """The dry-run table with what each figure is and how long it took."""
    plain, checkpointed = (bench.neta_max_batch[k] for k in ("none", NETA_CHECKPOINTED))
    print(
        f"Dry runs at the articles' sizes, {DRY_RUN_LABEL}. VGG16: {ARTICLE_SIDE} px, batch "
        f"{ARTICLE_BATCH}, SGD momentum 0.9 (the first article); NetA: {ARTICLE_SIDE} px, Adam "
        "(the second article); cross-entropy."
    )
    print()
    print(columns_table(bench.rows, DRY_RUN_COLUMNS, "markdown"))
    print()
    print(
        "ratio to none: to the same model without checkpointing at the same batch (n/a for the "
        "largest-batch rows, which have no plain twin). Predicted time ratio: the step's FLOPs "
        "over the plain step's (torch.utils.flop_counter formulas, counted in the dry run); ops "
        "without a formula count 0 (ReLU, pooling, BatchNorm, the optimizer), so selective "
        "checkpointing, which recomputes only those, is predicted at no extra time."
    )
    print(
        "Compile budget: torch.compile's min-cut partition at that "
        "activation_memory_budget (planning.compile_budget.CompileBudget), its graph run op by op "
        "as aot_eager_decomp_partition runs it; Inductor's fused kernels are not measured."
    )
    print(
        "Floor (flat VGG16; limits.peak_floor: a lower bound for every plan, from a dry run of "
        f"each module's backward alone): {bench.floor}."
    )
    print(
        f"NetA's largest batch under {ARTICLE_CARD_BYTES // MiB} MiB (dry-run batch search, tracked "
        f"tensor bytes): {plain} plain, {checkpointed} checkpointed (x{checkpointed / plain:.2f}); "
        f"the article's card gave {NETA_ARTICLE_BATCHES[0]} and {NETA_ARTICLE_BATCHES[1]} "
        "(a real card also keeps memory no tensor owns: notebook 03)."
    )
    print(
        f"Deep chain: (Linear(256, 256), Tanh) pairs and a Linear(256, 10) head at batch "
        f"{DEEP_CHAIN_BATCH}, where one level is not enough (notebook 04, section 7): the nested "
        "plan of least activation peak that recomputes at most one forward pass more than the "
        "one-level plan of least peak (planning.nested); runs Nx: the most times a module runs."
    )
    print(
        f"A dry run of VGG16 (article layout) at {ARTICLE_SIDE} px, batch {ARTICLE_BATCH} took "
        f"{bench.vgg16_step_seconds:.2f} s; the dry-run part took {bench.seconds:.1f} s "
        f"({bench.cpu_seconds:.1f} s of CPU time)."
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
