"""The bench's dry runs at the articles' sizes: VGG16 at 224 px, batch 64 (both layouts, the best
uniform split, the planner, selective checkpointing, torch.compile's budgets, the floor), NetA at
224 px with Adam and its largest batch under the 2.5 GB card, and the deep chain, one level
against nested; exact tensor bytes and FLOPs, no time."""

from __future__ import annotations

import dataclasses
import functools
import time

import torch

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.models import (
    NetA,
    deep_tanh_chain,
    neta_as_sequential,
    vgg16_classifier,
)
from tutorial_utils.bench.rows import (
    ARTICLE_BATCH,
    ARTICLE_CARD_BYTES,
    ARTICLE_SEGMENTS,
    ARTICLE_SIDE,
    CIFAR_CLASSES,
    DEEP_CHAIN_BATCH,
    DEEP_CHAIN_PAIRS,
    DOGCAT_CLASSES,
    FLAT_MODULES,
    FLAT_SEGMENTS,
    NETA_ARTICLE_BATCHES,
    NETA_CHECKPOINTED,
    NETA_SETTINGS,
    ROW_COLUMNS,
    SELECTIVE_REGIONS,
    VGG16_ARTICLE,
    VGG16_FLAT,
    BenchRow,
    Columns,
    add_ratios,
    bench_row,
    counted_gflop,
    segment_rows,
)
from tutorial_utils.checkpointing.strategy import (
    equal_segments,
    scheduled,
    selective,
)
from tutorial_utils.display.tables import columns_table
from tutorial_utils.measurement.batch_search import find_max_batch_size
from tutorial_utils.measurement.batchnorm import batchnorm_updates
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.step import (
    DRY_RUN_LABEL,
    StepReport,
    default_optimizer,
    sweep_strategies,
)
from tutorial_utils.planning.budget import plan_checkpoints
from tutorial_utils.planning.compile_budget import compile_budget_strategy
from tutorial_utils.planning.limits import peak_floor
from tutorial_utils.planning.nested import one_level_against_nested
from tutorial_utils.planning.profile import profile_sequential
from tutorial_utils.units import MiB

__all__ = [
    "batchnorm_bench",
    "deep_chain_name",
    "dry_run_bench",
    "DRY_RUN_COLUMNS",
    "DryRunBench",
    "print_dry_run_bench",
]


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
    rows = segment_rows(VGG16_ARTICLE, reports)

    flat = build_on_meta(lambda: vgg16_classifier(DOGCAT_CLASSES, layout="flat"))
    inputs = torch.empty(shape, device="meta")
    targets = torch.empty(ARTICLE_BATCH, dtype=torch.long, device="meta")
    group = _flat_uniform_rows(flat, inputs, targets)
    plan = plan_checkpoints(flat, inputs)
    planned = dry_run_step(flat, shape, scheduled(plan))
    group.append(
        bench_row(
            VGG16_FLAT,
            f"planner, least peak ({len(plan.boundaries)} segments, "
            f"{plan.checkpointed_segments} checkpointed)",
            planned,
        )
    )
    group += _flat_other_rows(flat, inputs)
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


def _flat_uniform_rows(
    flat: torch.nn.Sequential, inputs: torch.Tensor, targets: torch.Tensor
) -> list[BenchRow]:
    """The flat VGG16 at ``FLAT_SEGMENTS`` and the best of every uniform split 2..40 (least peak,
    then fewest FLOPs)."""
    splits = [equal_segments(k) for k in (0, *range(2, FLAT_MODULES + 1))]
    sweep = sweep_strategies(flat, inputs, targets, splits)
    by_count = {record.strategy.segments: record for record in sweep}
    best = min(sweep[1:], key=lambda r: (r.peak_bytes, counted_gflop(r), r.strategy.segments))
    sqrt_n = FLAT_SEGMENTS[3]
    group = [
        bench_row(
            VGG16_FLAT, f"{k} segments (sqrt n)" if k == sqrt_n else f"{k} segments", by_count[k]
        )
        for k in FLAT_SEGMENTS
    ]
    best_name = f"best uniform: {best.strategy.segments} segments (of 2..40)"
    return [*group, bench_row(VGG16_FLAT, best_name, best)]


def _flat_other_rows(flat: torch.nn.Sequential, inputs: torch.Tensor) -> list[BenchRow]:
    """The flat VGG16 under the nested plan of least peak, selective checkpointing at
    ``SELECTIVE_REGIONS`` and torch.compile's budgets (its partitioned graph run op by op)."""
    shape = tuple(inputs.shape)
    nested = plan_checkpoints(flat, inputs, nested=True)
    rows = [
        bench_row(
            VGG16_FLAT,
            f"nested, least peak (runs {max(nested.runs)}x)",
            dry_run_step(flat, shape, scheduled(nested)),
        )
    ]
    for regions in SELECTIVE_REGIONS:
        report = dry_run_step(flat, shape, selective(regions=regions))
        rows.append(bench_row(VGG16_FLAT, f"selective, {regions} regions", report))
    for budget in (0.0, 0.5, 1.0):
        report = dry_run_step(flat, shape, compile_budget_strategy(budget))
        rows.append(bench_row(VGG16_FLAT, f"compile budget {budget:.1f} (op by op)", report))
    return rows


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
    rows: list[BenchRow] = []
    for batch in NETA_ARTICLE_BATCHES:
        group = [
            bench_row("NetA", name, _neta_report(on, batch)) for name, on in NETA_SETTINGS.items()
        ]
        rows += add_ratios(group)
    largest = {}
    for name, on in NETA_SETTINGS.items():
        result = find_max_batch_size(
            functools.partial(NetA, use_checkpoint=on, use_reentrant=False),
            (3, ARTICLE_SIDE, ARTICLE_SIDE),
            ARTICLE_CARD_BYTES,
            device="meta",
            optimizer_factory=adam_optimizer,
        )
        largest[name] = result.batch_size
        label = f"{name}, largest batch under {ARTICLE_CARD_BYTES // MiB} MiB"
        rows.append(bench_row("NetA", label, _neta_report(on, result.batch_size)))
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
    rows = [bench_row(name, "none", dry_run_step(chain, shape))]
    for key, label in labels.items():
        runs = max(comparison.plans[key].runs)
        rows.append(bench_row(name, f"{label} (runs {runs}x)", comparison.reports[key]))
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


DRY_RUN_COLUMNS: Columns = (
    *ROW_COLUMNS,
    ("tracked_peak_ratio", "ratio to none", "{:.2f}"),
    ("activation_peak_mib", "activation peak MiB", "{:.1f}"),
    ("step_gflop", "GFLOP per step", "{:.0f}"),
    ("flops_ratio", "time ratio (predicted from FLOPs)", "{:.2f}"),
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
